"""The broker's admin endpoints (RocketMQ's ``AdminBrokerProcessor``, docs/PROTOCOL.md): queue offsets, message
lookups, topics, subscription groups, the tables a slave syncs from, runtime info, HA status and metrics.

JSON in and out, except message lookups (binary stored records) and ``/metrics`` (Prometheus text). Every bad
argument is INVALID_PARAMETER naming it; an absent offset or message is QUERY_NOT_FOUND. Reads that could miss a
message whose send has returned dispatch what is pending first (read-your-writes, as pulls do).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from broker.config import BrokerConfig
from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.metadata.topics import SYSTEM_TOPICS
from broker.metrics import CONTENT_TYPE
from broker.processor.args import INT32_MAX, INT64_MAX, ArgumentError, checked_name, json_field, queue_args
from broker.store.api import MessageStore
from common.codec import decode_offset_msg_id
from common.codes import DEFAULT_TRANSFER_TIMEOUT_MS, MAX_TRANSFER_TIMEOUT_MS
from common.errors import InvalidParameterError, MessageIllegalError, QueryNotFoundError
from common.route import TopicConfig
from remoting.router import Request, Response, json_response

__all__ = ["AdminProcessor", "StatusViews"]

log = logging.getLogger(__name__)

MAX_QUEUE_NUMS = 1024
MAX_QUERY_NUM = 1024


@attrs.frozen
class StatusViews:
    """The status pages, computed by their owner (the controller knows its registration and HA state)."""

    runtime: Callable[[], dict[str, Any]]
    """``GET /runtime``."""
    ha: Callable[[], dict[str, Any]]
    """``GET /ha``."""
    metrics: Callable[[], bytes]
    """``GET /metrics``: the Prometheus text, gauges refreshed."""
    dledger: Callable[[], dict[str, Any]] | None = None
    """``GET /dledger``: the DLedger member's status (None: not in DLedger mode)."""
    transfer_leadership: Callable[[str, float], Awaitable[dict[str, Any]]] | None = None
    """``POST /dledger/transfer?peer=ID[&timeoutMs=T]``: hand leadership to that peer within ``T`` ms (default
    :data:`~common.codes.DEFAULT_TRANSFER_TIMEOUT_MS`, at most
    :data:`~common.codes.MAX_TRANSFER_TIMEOUT_MS`); answers the new status."""
    identity: Callable[[], dict[str, Any]] | None = None
    """``GET /identity``: the group identity of the store (:mod:`broker.group_identity`)."""


class AdminProcessor:
    """Handlers for the admin endpoints of one broker.

    Args:
        config: the broker's configuration (its name in messages).
        addr: the broker's client address (in messages).
        store: queue offsets, stored times and message lookups.
        catch_up_dispatch: dispatches what is pending (before an offset or a key is looked up).
        topics / groups / offsets / delay_offsets: the metadata tables (updated here, or served to slaves).
        register_now: registers with the nameservers and waits (so a new topic is routable when the call
            returns).
        clean_now: runs a retention pass now (``POST /commitlog/clean``) and returns its report.
        status: the status pages.
    """

    def __init__(self, config: BrokerConfig, *, addr: str, store: MessageStore, catch_up_dispatch: Callable[[], bool],
                 topics: TopicConfigManager, groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager,
                 delay_offsets: DelayOffsetManager, register_now: Callable[[], Awaitable[None]],
                 clean_now: Callable[[], Awaitable[dict[str, Any]]], status: StatusViews) -> None:
        self._config = config
        self._addr = addr
        self._store = store
        self._catch_up_dispatch = catch_up_dispatch
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._delay_offsets = delay_offsets
        self._register_now = register_now
        self._clean_now = clean_now
        self._status = status

    def routes(self) -> dict[tuple[str, str], Any]:
        return {
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
            ("GET", "/runtime"): self.runtime,
            ("GET", "/identity"): self.identity,
            ("GET", "/ha"): self.ha_status,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/commitlog/clean"): self.clean_expired_files,
            ("GET", "/dledger"): self.dledger_status,
            ("POST", "/dledger/transfer"): self.transfer_leadership,
        }

    # --- offsets ------------------------------------------------------------------------------------------

    async def min_offset(self, request: Request) -> Response:
        topic, queue_id = queue_args(request)
        return json_response({"offset": self._store.get_min_offset_in_queue(topic, queue_id)})

    async def max_offset(self, request: Request) -> Response:
        topic, queue_id = queue_args(request)
        self._catch_up_dispatch()  # a message whose send returned counts (read-your-writes, as pulls)
        return json_response({"offset": self._store.get_max_offset_in_queue(topic, queue_id)})

    async def search_offset(self, request: Request) -> Response:
        topic, queue_id = queue_args(request)
        ts = request.int_arg("timestamp", lo=0, hi=INT64_MAX)
        self._catch_up_dispatch()
        return json_response({"offset": self._store.get_offset_in_queue_by_time(topic, queue_id, ts)})

    async def store_time(self, request: Request) -> Response:
        """``{"timestamp": ms}``: when the message at ``offset`` of the queue was stored (22 when absent)."""
        topic, queue_id = queue_args(request)
        offset = request.int_arg("offset", lo=0, hi=INT64_MAX)
        self._catch_up_dispatch()
        ts = self._store.get_store_timestamp(topic, queue_id, offset)
        if ts < 0:
            raise QueryNotFoundError(f"no message at offset {offset} of {topic}:{queue_id} on broker "
                                     f"{self._config.broker_name} ({self._addr})")
        return json_response({"timestamp": ts})

    # --- messages -----------------------------------------------------------------------------------------

    async def message_by_id(self, request: Request) -> Response:
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
        record = self._store.look_message_by_offset(phy) if phy >= 0 else None
        if record is None:
            raise QueryNotFoundError(f"no message at commit-log offset {phy} on broker {self._config.broker_name} "
                                     f"({self._addr})")
        return Response(bytes(record))

    async def _query(self, request: Request, key_arg: str) -> Response:
        topic = checked_name("topic", request.arg("topic"))
        key = request.arg(key_arg)
        if not key or len(key) > 1024:
            raise ArgumentError(f"query argument {key_arg!r} must be 1 to 1024 characters")
        max_num = request.int_arg("maxNum", 32, lo=1, hi=MAX_QUERY_NUM)
        begin = request.int_arg("begin", 0, lo=0, hi=INT64_MAX)
        end = request.int_arg("end", INT64_MAX, lo=0, hi=INT64_MAX)
        self._catch_up_dispatch()  # the index is built by dispatch
        result = self._store.query_message(topic, key, max_num, begin, end)
        if not result.records:
            raise QueryNotFoundError(f"no message of topic {topic} with {key_arg} {key!r} on broker "
                                     f"{self._config.broker_name} ({self._addr})")
        return Response(b"".join(bytes(r) for r in result.records))

    async def messages_by_key(self, request: Request) -> Response:
        return await self._query(request, "key")

    async def messages_by_uniq_key(self, request: Request) -> Response:
        return await self._query(request, "msgId")

    # --- topics and groups --------------------------------------------------------------------------------

    async def update_topic(self, request: Request) -> Response:
        body = request.json()
        name = json_field(body, "topicName", str)
        try:
            name = checked_name("topic", name)
        except ArgumentError as e:
            raise MessageIllegalError(e.message) from None
        if name in SYSTEM_TOPICS:
            raise ArgumentError(f"the topic[{name}] is conflict with system topic")
        tc = TopicConfig(
            name,
            json_field(body, "readQueueNums", int, default=8, lo=1, hi=MAX_QUEUE_NUMS),
            json_field(body, "writeQueueNums", int, default=8, lo=1, hi=MAX_QUEUE_NUMS),
            json_field(body, "perm", int, default=6, lo=0, hi=15),
            json_field(body, "topicSysFlag", int, default=0, lo=0, hi=INT32_MAX),
            json_field(body, "order", bool, default=False),
        )
        if self._topics.update(tc):
            log.info("topic %s created or updated: %s", name, tc)
            await self._register_now()
        return json_response({"topic": tc.to_json()})

    async def all_topics(self, request: Request) -> Response:
        return json_response(self._topics.to_json())

    async def update_group(self, request: Request) -> Response:
        body = request.json()
        checked_name("group", json_field(body, "groupName", str))
        try:
            config = SubscriptionGroupConfig.from_json(body)
        except ValueError as e:
            raise ArgumentError(f"subscription group: {e}") from None
        for name, value in (("brokerId", config.broker_id),
                            ("whichBrokerWhenConsumeSlowly", config.which_broker_when_consume_slowly),
                            ("retryQueueNums", config.retry_queue_nums), ("retryMaxTimes", config.retry_max_times)):
            if not 0 <= value <= INT32_MAX:
                raise ArgumentError(f"JSON field {name!r}={value} is outside [0, {INT32_MAX}]")
        self._groups.update(config)
        return json_response(config.to_json())

    async def all_groups(self, request: Request) -> Response:
        return json_response(self._groups.to_json())

    async def all_offsets(self, request: Request) -> Response:
        return json_response(self._offsets.to_json())

    async def all_delay_offsets(self, request: Request) -> Response:
        return json_response(self._delay_offsets.to_json())

    # --- status -------------------------------------------------------------------------------------------

    async def runtime(self, request: Request) -> Response:
        return json_response(self._status.runtime())

    async def identity(self, request: Request) -> Response:
        """``{"brokerName", "groupIdentity", "createdMs"}``: which store this group's queue offsets belong to
        (``groupIdentity`` null while a slave has not copied its master's yet)."""
        if self._status.identity is None:
            return json_response({"brokerName": self._config.broker_name, "groupIdentity": None, "createdMs": 0})
        return json_response(self._status.identity())

    async def clean_expired_files(self, request: Request) -> Response:
        """Run a retention pass now: delete the commit-log files that have expired, whatever the hour (RocketMQ's
        ``deleteExpiredCommitLog``); answers what it deleted."""
        return json_response(await self._clean_now())

    def _dledger_mode(self) -> None:
        if self._status.dledger is None or self._status.transfer_leadership is None:
            raise InvalidParameterError(f"broker {self._config.broker_name} ({self._addr}) is not in DLedger mode "
                                        "(enableDLegerCommitLog=false)")

    async def dledger_status(self, request: Request) -> Response:
        self._dledger_mode()
        assert self._status.dledger is not None
        return json_response(self._status.dledger())

    async def transfer_leadership(self, request: Request) -> Response:
        """Hand the group's leadership to ``peer`` (this broker must lead); answers once the peer leads."""
        self._dledger_mode()
        assert self._status.transfer_leadership is not None
        peer = request.query.get("peer", "")
        if not peer:
            raise InvalidParameterError("POST /dledger/transfer needs ?peer=ID (one of the group's dLegerPeers ids)")
        timeout_ms = request.int_arg("timeoutMs", DEFAULT_TRANSFER_TIMEOUT_MS, lo=100, hi=MAX_TRANSFER_TIMEOUT_MS)
        return json_response(await self._status.transfer_leadership(peer, timeout_ms / 1000))

    async def ha_status(self, request: Request) -> Response:
        return json_response(self._status.ha())

    async def metrics(self, request: Request) -> Response:
        return Response(self._status.metrics(), 200, CONTENT_TYPE)
