"""The broker's other endpoints (docs/PROTOCOL.md): offsets, message lookups, topics, subscription groups,
the tables a slave syncs from, client heartbeats, runtime info, HA status and metrics.

JSON in and out, except message lookups (binary stored records) and ``/metrics`` (Prometheus text). Every bad
argument is INVALID_PARAMETER naming it; an absent offset or message is QUERY_NOT_FOUND.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.metadata.subscription_groups import SubscriptionGroupConfig
from broker.metadata.topics import SYSTEM_TOPICS
from broker.metrics import CONTENT_TYPE
from broker.pull_processor import INT64_MAX, checked_name
from broker.sendback import ensure_retry_topics
from client.errors import MessageIllegalError, QueryNotFoundError
from client.protocol.asgi import ArgumentError, Request, Response, json_response
from client.protocol.codec import decode_offset_msg_id
from client.protocol.route import TopicConfig

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["AdminProcessor"]

log = logging.getLogger(__name__)

MAX_QUEUE_NUMS = 1024
MAX_OFFSETS_PER_COMMIT = 100_000
MAX_QUERY_NUM = 1024


def _field(obj: Mapping[str, Any], key: str, typ: type, *, default: Any = None, lo: int | None = None,
           hi: int | None = None) -> Any:
    """One JSON field, type-checked; raises ArgumentError naming it."""
    v = obj.get(key, default)
    if v is None:
        raise ArgumentError(f"JSON field {key!r} is missing")
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ArgumentError(f"JSON field {key!r}={v} is outside [{lo}, {hi}]")
    elif not isinstance(v, typ):
        raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not a {typ.__name__}")
    return v


class AdminProcessor:
    """Handlers for every broker endpoint except ``/send`` and ``/pull``."""

    def __init__(self, ctrl: BrokerController) -> None:
        self._ctrl = ctrl

    def routes(self) -> dict[tuple[str, str], Any]:
        return {
            ("GET", "/offset/consumer"): self.query_consumer_offset,
            ("POST", "/offset/consumer"): self.update_consumer_offsets,
            ("GET", "/offset/min"): self.min_offset,
            ("GET", "/offset/max"): self.max_offset,
            ("GET", "/offset/search"): self.search_offset,
            ("GET", "/offset/storetime"): self.store_time,
            ("GET", "/message"): self.message_by_id,
            ("GET", "/message/key"): self.messages_by_key,
            ("GET", "/message/uniq"): self.messages_by_uniq_key,
            ("POST", "/topic"): self.update_topic,
            ("GET", "/topics"): self.all_topics,
            ("POST", "/subscription-group"): self.update_group,
            ("GET", "/subscription-groups"): self.all_groups,
            ("GET", "/offsets"): self.all_offsets,
            ("GET", "/delay-offsets"): self.all_delay_offsets,
            ("POST", "/heartbeat"): self.heartbeat,
            ("GET", "/runtime"): self.runtime,
            ("GET", "/ha"): self.ha_status,
            ("GET", "/metrics"): self.metrics,
        }

    # --- offsets ------------------------------------------------------------------------------------------

    def _queue_args(self, request: Request) -> tuple[str, int]:
        topic = checked_name("topic", request.arg("topic"))
        return topic, request.int_arg("queueId", lo=0, hi=2**31 - 1)

    async def query_consumer_offset(self, request: Request) -> Response:
        group = checked_name("group", request.arg("group"))
        topic, queue_id = self._queue_args(request)
        offset = self._ctrl.offsets.query(group, topic, queue_id)
        if offset is None:
            raise QueryNotFoundError(f"no offset committed by group {group} for topic {topic} queue {queue_id} "
                                     f"on broker {self._ctrl.config.broker_name} ({self._ctrl.addr})")
        return json_response({"offset": offset})

    async def update_consumer_offsets(self, request: Request) -> Response:
        body = request.json()
        group = checked_name("group", _field(body, "group", str))
        entries = _field(body, "offsets", list)
        if len(entries) > MAX_OFFSETS_PER_COMMIT:
            raise ArgumentError(f"{len(entries)} offsets in one request, more than {MAX_OFFSETS_PER_COMMIT}")
        parsed: list[tuple[str, int, int]] = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ArgumentError(f"offsets[{i}] is not an object")
            topic = checked_name("topic", _field(e, "topic", str))
            parsed.append((topic, _field(e, "queueId", int, lo=0, hi=2**31 - 1),
                           _field(e, "offset", int, lo=0, hi=INT64_MAX)))
        for topic, queue_id, offset in parsed:
            self._ctrl.offsets.commit(group, topic, queue_id, offset)
        return json_response({"updated": len(parsed)})

    async def min_offset(self, request: Request) -> Response:
        topic, queue_id = self._queue_args(request)
        return json_response({"offset": self._ctrl.store.get_min_offset_in_queue(topic, queue_id)})

    async def max_offset(self, request: Request) -> Response:
        topic, queue_id = self._queue_args(request)
        self._ctrl.dispatch.catch_up()  # a message whose send returned counts (read-your-writes, as pulls)
        return json_response({"offset": self._ctrl.store.get_max_offset_in_queue(topic, queue_id)})

    async def search_offset(self, request: Request) -> Response:
        topic, queue_id = self._queue_args(request)
        ts = request.int_arg("timestamp", lo=0, hi=INT64_MAX)
        self._ctrl.dispatch.catch_up()
        return json_response({"offset": self._ctrl.store.get_offset_in_queue_by_time(topic, queue_id, ts)})

    async def store_time(self, request: Request) -> Response:
        """``{"timestamp": ms}``: when the message at ``offset`` of the queue was stored (22 when absent)."""
        topic, queue_id = self._queue_args(request)
        offset = request.int_arg("offset", lo=0, hi=INT64_MAX)
        self._ctrl.dispatch.catch_up()
        ts = self._ctrl.store.get_store_timestamp(topic, queue_id, offset)
        if ts < 0:
            raise QueryNotFoundError(f"no message at offset {offset} of {topic}:{queue_id} on broker "
                                     f"{self._ctrl.config.broker_name} ({self._ctrl.addr})")
        return json_response({"timestamp": ts})

    # --- messages -----------------------------------------------------------------------------------------

    async def message_by_id(self, request: Request) -> Response:
        ctrl = self._ctrl
        if "offsetMsgId" in request.query:
            msg_id = request.query["offsetMsgId"]
            try:
                _, phy = decode_offset_msg_id(msg_id)
            except MessageIllegalError as e:
                raise ArgumentError(f"query argument 'offsetMsgId': {e.message}") from None
        elif "phyOffset" in request.query:
            phy = request.int_arg("phyOffset", lo=0, hi=INT64_MAX)
        else:
            raise ArgumentError("missing query argument 'offsetMsgId' (or 'phyOffset')")
        record = ctrl.store.look_message_by_offset(phy) if phy >= 0 else None
        if record is None:
            raise QueryNotFoundError(f"no message at commit-log offset {phy} on broker {ctrl.config.broker_name} "
                                     f"({ctrl.addr})")
        return Response(bytes(record))

    async def _query(self, request: Request, key_arg: str) -> Response:
        ctrl = self._ctrl
        topic = checked_name("topic", request.arg("topic"))
        key = request.arg(key_arg)
        if not key or len(key) > 1024:
            raise ArgumentError(f"query argument {key_arg!r} must be 1 to 1024 characters")
        max_num = request.int_arg("maxNum", 32, lo=1, hi=MAX_QUERY_NUM)
        begin = request.int_arg("begin", 0, lo=0, hi=INT64_MAX)
        end = request.int_arg("end", INT64_MAX, lo=0, hi=INT64_MAX)
        ctrl.dispatch.catch_up()  # the index is built by dispatch
        result = ctrl.store.query_message(topic, key, max_num, begin, end)
        if not result.records:
            raise QueryNotFoundError(f"no message of topic {topic} with {key_arg} {key!r} on broker "
                                     f"{ctrl.config.broker_name} ({ctrl.addr})")
        return Response(b"".join(bytes(r) for r in result.records))

    async def messages_by_key(self, request: Request) -> Response:
        return await self._query(request, "key")

    async def messages_by_uniq_key(self, request: Request) -> Response:
        return await self._query(request, "msgId")

    # --- topics and groups --------------------------------------------------------------------------------

    async def update_topic(self, request: Request) -> Response:
        ctrl = self._ctrl
        body = request.json()
        name = _field(body, "topicName", str)
        try:
            name = checked_name("topic", name)
        except ArgumentError as e:
            raise MessageIllegalError(e.message) from None
        if name in SYSTEM_TOPICS:
            raise ArgumentError(f"the topic[{name}] is conflict with system topic")
        tc = TopicConfig(
            name,
            _field(body, "readQueueNums", int, default=8, lo=1, hi=MAX_QUEUE_NUMS),
            _field(body, "writeQueueNums", int, default=8, lo=1, hi=MAX_QUEUE_NUMS),
            _field(body, "perm", int, default=6, lo=0, hi=15),
            _field(body, "topicSysFlag", int, default=0, lo=0, hi=2**31 - 1),
            _field(body, "order", bool, default=False),
        )
        if ctrl.topics.update(tc):
            log.info("topic %s created or updated: %s", name, tc)
            await ctrl.register_now()
        return json_response({"topic": tc.to_json()})

    async def all_topics(self, request: Request) -> Response:
        return json_response(self._ctrl.topics.to_json())

    async def update_group(self, request: Request) -> Response:
        body = request.json()
        checked_name("group", _field(body, "groupName", str))
        try:
            config = SubscriptionGroupConfig.from_json(body)
        except ValueError as e:
            raise ArgumentError(f"subscription group: {e}") from None
        for name, value in (("brokerId", config.broker_id),
                            ("whichBrokerWhenConsumeSlowly", config.which_broker_when_consume_slowly),
                            ("retryQueueNums", config.retry_queue_nums), ("retryMaxTimes", config.retry_max_times)):
            if not 0 <= value <= 2**31 - 1:
                raise ArgumentError(f"JSON field {name!r}={value} is outside [0, {2**31 - 1}]")
        self._ctrl.groups.update(config)
        return json_response(config.to_json())

    async def all_groups(self, request: Request) -> Response:
        return json_response(self._ctrl.groups.to_json())

    async def all_offsets(self, request: Request) -> Response:
        return json_response(self._ctrl.offsets.to_json())

    async def all_delay_offsets(self, request: Request) -> Response:
        return json_response(self._ctrl.delay_offsets.to_json())

    # --- clients and status -------------------------------------------------------------------------------

    async def heartbeat(self, request: Request) -> Response:
        body = request.json()
        client_id = _field(body, "clientId", str)
        if not client_id or len(client_id) > 255:
            raise ArgumentError("JSON field 'clientId' must be 1 to 255 characters")
        producers = body.get("producerGroups") or []
        consumers = body.get("consumerGroups") or []
        if not isinstance(producers, list) or not all(isinstance(g, str) for g in producers):
            raise ArgumentError("JSON field 'producerGroups' must be a list of group names")
        if not isinstance(consumers, list):
            raise ArgumentError("JSON field 'consumerGroups' must be a list")
        for i, c in enumerate(consumers):
            if not isinstance(c, dict):
                raise ArgumentError(f"consumerGroups[{i}] is not an object")
            checked_name("group", _field(c, "group", str))
            subs = c.get("subscriptions") or []
            if not isinstance(subs, list) or not all(isinstance(s, dict) and isinstance(s.get("topic"), str)
                                                     for s in subs):
                raise ArgumentError(f"consumerGroups[{i}].subscriptions must be a list of {{topic, expression}}")
        for g in producers:
            checked_name("group", g)
        timeout_ms = body.get("heartbeatTimeoutMs")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool)
                                       or timeout_ms <= 0):
            raise ArgumentError("JSON field 'heartbeatTimeoutMs' must be a positive integer (ms)")
        self._ctrl.clients.heartbeat(client_id, producers, consumers, timeout_ms)
        ensure_retry_topics(self._ctrl, consumers)
        return json_response({})

    async def runtime(self, request: Request) -> Response:
        return json_response(self._ctrl.runtime_info())

    async def ha_status(self, request: Request) -> Response:
        return json_response(self._ctrl.ha_status())

    async def metrics(self, request: Request) -> Response:
        self._ctrl.refresh_gauges()
        return Response(self._ctrl.metrics.render(), 200, CONTENT_TYPE)
