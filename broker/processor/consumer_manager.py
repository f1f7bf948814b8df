"""The consumer-management endpoints (RocketMQ's ``ConsumerManageProcessor`` and ``ClientManageProcessor``):
client heartbeats and unregistration, the members of a group, the committed consumer offsets, and when each
group last pulled each queue here.

:class:`broker.clients.ClientTable` records heartbeats and drops silent clients every
``CLIENT_EXPIRE_CHECK_S`` (10 s). Rebalancing needs the set as of now, so ``GET /consumer/ids`` filters by each
client's own timeout (its announced ``heartbeatTimeoutMs``, else RocketMQ's 120 s channel expiry) even if the
periodic sweep has not dropped it yet. Every instance of a group asks every broker and sorts the ids the same
way, so they all compute the same assignment.

A heartbeat of a push consumer also creates its group's ``%RETRY%`` topic (:func:`ensure_retry_topics`), as
RocketMQ's does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.clients import ClientInfo, ClientTable, LastPulls
from broker.config import BrokerConfig
from broker.metadata import ConsumerOffsetManager, SubscriptionGroupManager, TopicConfigManager
from broker.processor.args import (
    INT32_MAX,
    INT64_MAX,
    ArgumentError,
    broker_where,
    checked_name,
    json_field,
    queue_args,
)
from broker.retry import retry_topic
from broker.role import RoleState
from broker.tag_filter import check_expression
from common.codes import Perm
from common.errors import BrokerError, QueryNotFoundError
from common.selector import EXPRESSION_TYPES, SQL92, TAG
from remoting.router import Request, Response, json_response

__all__ = ["CLIENT_EXPIRE_MS", "MAX_OFFSETS_PER_COMMIT", "ConsumerManageProcessor", "ensure_retry_topics",
           "live_client_ids"]

log = logging.getLogger(__name__)

#: A client not heard from for this long is not part of its group (RocketMQ's 120 s channel expiry).
CLIENT_EXPIRE_MS = 120_000
#: Bound of the offsets one ``POST /offset/consumer`` may commit.
MAX_OFFSETS_PER_COMMIT = 100_000


def live_client_ids(clients: Mapping[str, ClientInfo], now_ms: int, expire_ms: int = CLIENT_EXPIRE_MS) -> list[str]:
    """The ids of ``clients`` heard from within their timeout (and never more than ``expire_ms``) of ``now_ms``,
    sorted (the rebalance order). A client seen exactly at its limit is still live, as in ClientTable.expire.
    """
    return sorted(cid for cid, info in clients.items()
                  if info.last_seen_ms >= now_ms - min(info.timeout_ms, expire_ms))


def ensure_retry_topics(consumer_groups: Sequence[Mapping[str, Any]], *, config: BrokerConfig, role: RoleState,
                        topics: TopicConfigManager, groups: SubscriptionGroupManager) -> list[str]:
    """Create ``%RETRY%<group>`` for each heartbeating group that subscribes it (a push consumer), as
    RocketMQ's heartbeat does: the group holds the retry queues from its first rebalance, so the first
    send-back's retry is pulled after its delay instead of after the next rebalance period.

    Nothing on a slave (it copies the master's topics), on an unwriteable broker, for a group that cannot be
    found or auto-created, or with ``retryQueueNums = 0``.

    Returns:
        The topics created (the caller asks for a registration when there are any).
    """
    if role.is_slave or not Perm.writeable(config.broker_permission):
        return []
    created = []
    for c in consumer_groups:
        group = c.get("group")
        if not isinstance(group, str):
            continue
        topic = retry_topic(group)
        if topics.get(topic) is not None:
            continue
        if not any(s.get("topic") == topic for s in c.get("subscriptions") or () if isinstance(s, Mapping)):
            continue
        sg = groups.find_or_create(group)
        if sg is None or sg.retry_queue_nums <= 0:
            continue
        topics.create_retry_topic(topic, sg.retry_queue_nums)
        log.info("created topic %s with %d queues for the heartbeat of group %s", topic, sg.retry_queue_nums,
                 group)
        created.append(topic)
    return created


def _check_heartbeat(body: Mapping[str, Any]) -> tuple[str, list[str], list[Any], Any]:
    """``(clientId, producerGroups, consumerGroups, heartbeatTimeoutMs)`` of a heartbeat body, checked."""
    client_id = json_field(body, "clientId", str)
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
        checked_name("group", json_field(c, "group", str))
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
    return client_id, producers, consumers, timeout_ms


class ConsumerManageProcessor:
    """Serves the client and consumer endpoints of one broker.

    Args:
        config: the broker's configuration (name and role in messages; retry topics only on a writeable master).
        addr: the broker's client address (in error messages).
        clients: the heartbeat table.
        offsets: the committed consumer offsets.
        last_pulls: when each group last pulled each queue (written by the pull processor).
        topics / groups: where a heartbeat creates a push consumer's retry topic.
        request_registration: asks for a registration soon (after a retry topic was created).
        clock_ms: the clock the client table stamps heartbeats with.
        expire_ms: silence after which a client is left out of its group.
    """

    def __init__(self, config: BrokerConfig, *, addr: str, clients: ClientTable, offsets: ConsumerOffsetManager,
                 last_pulls: LastPulls, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 request_registration: Callable[[], None], clock_ms: Callable[[], int],
                 expire_ms: int = CLIENT_EXPIRE_MS, role: RoleState | None = None) -> None:
        if expire_ms <= 0:
            raise ValueError(f"expire_ms must be > 0, got {expire_ms}")
        self._config = config
        self._role = role or RoleState(config.broker_role, config.broker_id)
        self._addr = addr
        self._clients = clients
        self._offsets = offsets
        self._last_pulls = last_pulls
        self._topics = topics
        self._groups = groups
        self._request_registration = request_registration
        self._clock_ms = clock_ms
        self._expire_ms = expire_ms

    def routes(self) -> dict[tuple[str, str], Any]:
        return {
            ("POST", "/heartbeat"): self.heartbeat,
            ("POST", "/client/unregister"): self.unregister,
            ("GET", "/consumer/ids"): self.consumer_ids,
            ("GET", "/consumer/pulls"): self.last_pulls,
            ("GET", "/offset/consumer"): self.query_consumer_offset,
            ("POST", "/offset/consumer"): self.update_consumer_offsets,
        }

    async def heartbeat(self, request: Request) -> Response:
        """``{"clientId", "producerGroups", "consumerGroups": [{"group", "subscriptions"}], "heartbeatTimeoutMs"}``."""
        client_id, producers, consumers, timeout_ms = _check_heartbeat(request.json())
        refused = self._check_sql_subscriptions(consumers)
        self._clients.heartbeat(client_id, producers, consumers, timeout_ms)
        if ensure_retry_topics(consumers, config=self._config, role=self._role, topics=self._topics,
                               groups=self._groups):
            self._request_registration()
        if refused:
            log.warning("client %s subscribes what this broker refuses to serve: %s", client_id, refused)
            return json_response({"refusedSubscriptions": refused})
        return json_response({})

    def _check_sql_subscriptions(self, consumers: list[Any]) -> list[dict[str, Any]]:
        """The SQL92 subscriptions of a heartbeat this broker would refuse to serve (a bad expression, or
        ``enablePropertyFilter=false``), each with the code and remark its pulls get.

        The heartbeat itself is kept, as RocketMQ keeps it: refusing it would take the client out of its group
        here, and a group whose members vanish is assigned nothing -- the silent failure this check exists to
        avoid. The pulls are refused with these errors.

        Raises:
            ArgumentError: an ``expressionType`` other than TAG or SQL92 (a malformed heartbeat).
        """
        refused: list[dict[str, Any]] = []
        for c in consumers:
            for s in c.get("subscriptions") or ():
                kind = s.get("expressionType", TAG)
                if kind not in EXPRESSION_TYPES:
                    raise ArgumentError(f"subscription expressionType must be TAG or SQL92, got {str(kind)[:40]!r}")
                if kind != SQL92:
                    continue
                try:
                    check_expression(str(s.get("expression", "")), kind, enabled=self._config.enable_property_filter,
                                     where=broker_where(self._config, self._addr, self._role))
                except BrokerError as e:
                    refused.append({"group": c["group"], "topic": s["topic"], "code": e.code, "remark": str(e)})
        return refused

    async def last_pulls(self, request: Request) -> Response:
        """``{"lastPullTimestamp": {"QUEUE_ID": ms}}``: the group's last pull of each queue of ``topic`` here."""
        group = checked_name("group", request.arg("group"))
        topic = checked_name("topic", request.arg("topic"))
        pulls = self._last_pulls.for_topic(group, topic)
        return json_response({"lastPullTimestamp": {str(q): ms for q, ms in sorted(pulls.items())}})

    async def unregister(self, request: Request) -> Response:
        """``{"clientId", "producerGroups": [..], "consumerGroups": [..]}`` -> ``{"removed": n}``."""
        body = request.json()
        client_id = body.get("clientId")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 255:
            raise ArgumentError("JSON field 'clientId' must be 1 to 255 characters")
        groups: dict[str, list[str]] = {}
        for key in ("producerGroups", "consumerGroups"):
            names = body.get(key) or []
            if not isinstance(names, list) or not all(isinstance(g, str) for g in names):
                raise ArgumentError(f"JSON field {key!r} must be a list of group names")
            groups[key] = [checked_name("group", g) for g in names]
        removed = self._clients.unregister(client_id, groups["producerGroups"], groups["consumerGroups"])
        if removed:
            log.info("client %s unregistered from %s", client_id, groups)
        return json_response({"removed": removed})

    async def consumer_ids(self, request: Request) -> Response:
        """``{"clientIds": [...]}``: the live members of ``group``, sorted."""
        group = checked_name("group", request.arg("group"))
        clients = self._clients.consumers.get(group, {})
        return json_response({"clientIds": live_client_ids(clients, self._clock_ms(), self._expire_ms)})

    async def query_consumer_offset(self, request: Request) -> Response:
        group = checked_name("group", request.arg("group"))
        topic, queue_id = queue_args(request)
        offset = self._offsets.query(group, topic, queue_id)
        if offset is None:
            raise QueryNotFoundError(f"no offset committed by group {group} for topic {topic} queue {queue_id} "
                                     f"on broker {self._config.broker_name} ({self._addr})")
        return json_response({"offset": offset})

    async def update_consumer_offsets(self, request: Request) -> Response:
        body = request.json()
        group = checked_name("group", json_field(body, "group", str))
        entries = json_field(body, "offsets", list)
        if len(entries) > MAX_OFFSETS_PER_COMMIT:
            raise ArgumentError(f"{len(entries)} offsets in one request, more than {MAX_OFFSETS_PER_COMMIT}")
        parsed: list[tuple[str, int, int]] = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ArgumentError(f"offsets[{i}] is not an object")
            topic = checked_name("topic", json_field(e, "topic", str))
            parsed.append((topic, json_field(e, "queueId", int, lo=0, hi=INT32_MAX),
                           json_field(e, "offset", int, lo=0, hi=INT64_MAX)))
        for topic, queue_id, offset in parsed:
            self._offsets.commit(group, topic, queue_id, offset)
        return json_response({"updated": len(parsed)})
