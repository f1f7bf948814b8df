"""``PullConsumer`` and ``AsyncPullConsumer``: pulls with read/write splitting, offsets, range queries.

Choosing the member of a broker group (SEMANTICS.md 3.3, 3.5, 3.6):

* pull: ``recalculate_pull_from_which_node(mq)`` (the user's pin, else the broker's last suggestion, else the
  master), moved off a member the client found unreachable within the last ``broker_down_isolation_s`` (but not
  onto a slave that refused a pull lately), then ``find_broker_address_in_subscribe(name, id, False)``; the route
  is refreshed once when that finds nothing. After every answer the broker's ``suggest_which_broker_id`` is stored
  for the queue. A connection failure marks the member down and the pull is tried once on another member of the
  group (if any) before the error surfaces; a slave's refusal (``slaveReadEnable=false``, master link up) sends
  the pull on to the master, and when nobody served it the refusal is returned as NO_MATCHED_MSG with the offset
  unchanged (:class:`client._routing.PullPlan`);
* offsets and range queries: the master when it is in the route and not marked down, else a slave.

The commit-offset bit of a pull is set only when the pull goes to the master.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

import attrs
import httpx

from client import _requests as rq
from client._instance import AsyncClientInstance, ClientConfig, ClientInstance, ClientState, _InstanceCore
from client._lifecycle import AsyncLifecycle, SyncLifecycle
from client._rebalance import TagFilter
from client._requests import PullResult
from client._routing import PullNodeTable, PullPlan, PullTarget, plan_pull, pull_refused
from client.errors import (
    BrokerNotFoundError,
    ClientError,
    InvalidParameterError,
    QueryNotFoundError,
)
from client.protocol.codes import MASTER_ID
from client.protocol.message import MessageQueue
from client.protocol.properties import validate_group, validate_topic

__all__ = ["AsyncPullConsumer", "ConsumerConfig", "PullConsumer"]

log = logging.getLogger(__name__)

#: Messages per pull at most (RocketMQ caps a pull batch at 32 by default; the broker may cap it lower).
MAX_PULL_NUMS = 1024


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _positive(_: Any, attribute: Any, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class ConsumerConfig:
    """A pull consumer's settings."""

    group: str = attrs.field(validator=lambda _, __, v: validate_group(v))
    """Consumer group."""
    connect_broker_by_user: bool = False
    """Pin every pull to ``default_broker_id`` (RocketMQ's lite-pull option)."""
    default_broker_id: int = MASTER_ID
    """The pinned member when ``connect_broker_by_user``."""
    pull_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """Bound on one pull without long polling (with it: the suspend time plus this)."""


_Target = PullTarget


def pull_plan(client: _InstanceCore, nodes: PullNodeTable, mq: MessageQueue) -> PullPlan | None:
    """The members to ask for a pull of ``mq`` (see :class:`client._routing.PullPlan`); None: none in the route."""
    return plan_pull(mq.broker_name, client.routes.broker_addrs(mq.broker_name), nodes.recalculate(mq),
                     client.broker_down, _now_ms(), pinned=nodes.connect_broker_by_user)


def admin_targets(client: _InstanceCore, broker_name: str) -> list[_Target]:
    """Master first when present and not down, then the other members (offsets and range queries)."""
    members = client.routes.broker_addrs(broker_name)
    if not members:
        return []
    now = _now_ms()
    up = [bid for bid in sorted(members) if not client.broker_down.is_down(broker_name, bid, now)]
    down = [bid for bid in sorted(members) if bid not in up]
    return [_Target(bid, members[bid], bid != MASTER_ID) for bid in (up + down)[:2]]


def _check_pull_args(mq: object, offset: int, max_nums: int) -> MessageQueue:
    if not isinstance(mq, MessageQueue):
        raise InvalidParameterError(f"mq must be a MessageQueue, got {type(mq).__name__}")
    validate_topic(mq.topic)
    if not isinstance(offset, int) or offset < 0:
        raise InvalidParameterError(f"pull offset must be an int >= 0, got {offset!r}")
    if not isinstance(max_nums, int) or not 1 <= max_nums <= MAX_PULL_NUMS:
        raise InvalidParameterError(f"max_nums must be in [1, {MAX_PULL_NUMS}], got {max_nums!r}")
    return mq


@functools.lru_cache(maxsize=256)
def _tag_filter(sub_expression: str) -> TagFilter:
    try:
        return TagFilter.parse(sub_expression)
    except ValueError as e:
        raise InvalidParameterError(str(e)) from None


class _ConsumerBase:
    _kind = "consumer"

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool, default_broker_id: int,
                 client_config: ClientConfig | None, **kwargs: Any) -> None:
        self.config = ConsumerConfig(group, connect_broker_by_user, default_broker_id, **kwargs)
        self.namesrv_addr = namesrv_addr
        self._client_config = client_config
        self._nodes = PullNodeTable(connect_broker_by_user=connect_broker_by_user,
                                    default_broker_id=default_broker_id)
        self._committed: dict[MessageQueue, int] = {}
        self._state = ClientState.UNOPENED

    @property
    def group(self) -> str:
        return self.config.group

    @property
    def state(self) -> ClientState:
        return self._state

    @property
    def pull_from_which_node_table(self) -> Mapping[MessageQueue, int]:
        """Read-only live view of ``pullFromWhichNodeTable``."""
        return types.MappingProxyType(self._nodes.table)

    def recalculate_pull_from_which_node(self, mq: MessageQueue) -> int:
        """The member id the next pull of ``mq`` asks for (before down-member avoidance)."""
        return self._nodes.recalculate(mq)

    def _pull_target(self, t: _Target, mq: MessageQueue, offset: int, max_nums: int, sub_expression: str,
                     suspend_timeout_s: float | None) -> str:
        commit = None if t.slave else self._committed.get(mq)
        suspend_ms = int(suspend_timeout_s * 1000) if suspend_timeout_s else None
        return rq.pull_target(self.group, mq, offset, max_nums, commit_offset=commit,
                              suspend_timeout_ms=suspend_ms, sub_expression=sub_expression)

    def _pull_timeout(self, timeout_s: float | None, suspend_timeout_s: float | None) -> float:
        base = timeout_s if timeout_s is not None else self.config.pull_timeout_s
        return base + (suspend_timeout_s or 0.0)

    def _finish_pull(self, mq: MessageQueue, result: PullResult, sub_expression: str) -> PullResult:
        """Remember the suggested member, and re-check tags: the broker filters by tag hash, so a tag whose Java
        hash collides with a subscribed one gets through (RocketMQ's ``processPullResult`` filters again)."""
        self._nodes.update(mq, result.suggest_which_broker_id)
        tags = _tag_filter(sub_expression).tags
        if tags is None or not result.msg_found_list:
            return result
        kept = [m for m in result.msg_found_list if m.tags in tags]
        return result if len(kept) == len(result.msg_found_list) else attrs.evolve(result, msg_found_list=kept)

    def _role(self, t: _Target) -> str:
        return "slave" if t.slave else "master"

    def _pull_failed(self, plan: PullPlan, mq: MessageQueue, t: _Target, e: httpx.HTTPError) -> ClientError:
        plan.failed(t, _now_ms())
        error = rq.map_transport_error(e, t.addr, f"pull {mq} from {self._role(t)} {mq.broker_name}[{t.broker_id}] "
                                                  f"{t.addr}")
        log.info("%s", error)
        return error

    def _pull_answered(self, plan: PullPlan, t: _Target, result: PullResult, offset: int) -> bool:
        """True when ``result`` is the pull's answer; False when ``t`` refused and the plan goes on."""
        refused = pull_refused(result, offset)
        if refused:
            log.debug("pull at %d refused by %s [%d], which suggests [%d]", offset, t.addr, t.broker_id,
                      result.suggest_which_broker_id)
        return plan.answered(t, refused=refused, suggest_which_broker_id=result.suggest_which_broker_id,
                             now_ms=_now_ms())

    def _pull_outcome(self, mq: MessageQueue, refusal: PullResult | None, error: ClientError | None,
                      sub_expression: str) -> PullResult:
        """No member served the pull: a refusal is an answer (the offset unchanged), else the transport error."""
        if refusal is not None:
            return self._finish_pull(mq, refusal, sub_expression)
        assert error is not None
        raise error


class PullConsumer(SyncLifecycle, _ConsumerBase):
    """A synchronous pull consumer (RocketMQ ``DefaultMQPullConsumer`` / lite pull).

    Args:
        group: consumer group.
        namesrv_addr: nameservers, ``;``-separated.
        connect_broker_by_user: pin every pull to ``default_broker_id``.
        default_broker_id: the pinned member.
        client_config: settings of the shared client instance (used when this consumer creates it).
        **kwargs: more :class:`ConsumerConfig` fields (``pull_timeout_s``).
    """

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool = False,
                 default_broker_id: int = MASTER_ID, client_config: ClientConfig | None = None,
                 **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, connect_broker_by_user=connect_broker_by_user,
                         default_broker_id=default_broker_id, client_config=client_config, **kwargs)
        self._lock = threading.Lock()
        self._client: ClientInstance | None = None

    def _attach(self, client: ClientInstance) -> None:
        client.register_consumer(self.group)

    def close(self) -> None:
        """Release the client instance. Idempotent."""
        with self._lock:
            was_open = self._state is ClientState.OPENED
            self._state = ClientState.CLOSED
        if was_open and self._client is not None:
            self._client.release()

    def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of ``topic`` on every group, master or not (route fetched when not cached).

        Raises:
            RouteNotFoundError: no nameserver knows the topic.
        """
        client = self._ensure_open()
        validate_topic(topic)
        client.consumer_uses_topic(self.group, topic)
        return list(client.subscribe_queues_or_fetch(topic))

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, sub_expression: str = "*", *,
             timeout_s: float | None = None, suspend_timeout_s: float | None = None) -> PullResult:
        """Pull up to ``max_nums`` messages of ``mq`` from ``offset``.

        Args:
            mq: the queue.
            offset: first logical offset wanted.
            max_nums: messages at most.
            sub_expression: ``*`` or ``TagA || TagB``.
            timeout_s: bound on the request (``pull_timeout_s`` when None).
            suspend_timeout_s: long polling: the broker holds the pull up to this long when nothing is new.

        Returns:
            A PullResult; NO_NEW_MSG / NO_MATCHED_MSG / OFFSET_ILLEGAL are values, not errors.

        Raises:
            BrokerNotFoundError: the group has no member in the route, even after a refresh.
            TransportError: the member (and the fallback member, if any) could not be reached; retriable.
            BrokerError: the broker refused the pull (unknown topic, bad queue id...).
        """
        client = self._ensure_open()
        mq = _check_pull_args(mq, offset, max_nums)
        plan = pull_plan(client, self._nodes, mq)
        if plan is None:
            client.update_topic_route_from_nameserver(mq.topic)
            plan = pull_plan(client, self._nodes, mq)
        if plan is None:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        timeout = self._pull_timeout(timeout_s, suspend_timeout_s)
        error: ClientError | None = None
        refusal: PullResult | None = None
        while (t := plan.next()) is not None:
            target = self._pull_target(t, mq, offset, max_nums, sub_expression, suspend_timeout_s)
            try:
                resp = client.exchange("GET", t.addr, target, timeout=timeout)
            except httpx.HTTPError as e:
                error = self._pull_failed(plan, mq, t, e)
                continue
            result = rq.parse_pull(resp, t.addr, mq)
            if self._pull_answered(plan, t, result, offset):
                return self._finish_pull(mq, result, sub_expression)
            refusal = result
        return self._pull_outcome(mq, refusal, error, sub_expression)

    def _admin_call(self, mq: MessageQueue, what: str, call: Any) -> Any:
        """Run ``call(target)`` on the master, or on a slave when the master is missing, down or unreachable."""
        client = self._ensure_open()
        targets = admin_targets(client, mq.broker_name)
        if not targets or MASTER_ID not in (client.routes.broker_addrs(mq.broker_name) or {}):
            client.update_topic_route_from_nameserver(mq.topic)
            targets = admin_targets(client, mq.broker_name)
        if not targets:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        error: ClientError | None = None
        for t in targets:
            try:
                return call(client, t)
            except httpx.HTTPError as e:
                client.broker_down.mark_down(mq.broker_name, t.broker_id, _now_ms())
                error = rq.map_transport_error(e, t.addr, f"{what} of {mq} at {self._role(t)} {t.addr}")
        assert error is not None
        raise error

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """Commit ``offset`` for this group (to the master, or to a slave when the master is gone)."""
        if not isinstance(offset, int) or offset < 0:
            raise InvalidParameterError(f"offset must be an int >= 0, got {offset!r}")
        body = rq.commit_offset_body(self.group, mq, offset)

        def call(client: ClientInstance, t: _Target) -> None:
            rq.json_of(client.http.post(f"http://{t.addr}/offset/consumer", content=body), t.addr)

        self._admin_call(mq, "commit offset", call)
        self._committed[mq] = offset

    def fetch_consume_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq``, -1 when never committed."""

        def call(client: ClientInstance, t: _Target) -> int:
            url = rq.offset_url(t.addr, "consumer", mq, group=self.group)
            try:
                return rq.parse_offset(client.http.get(url), t.addr)
            except QueryNotFoundError:
                return -1

        return int(self._admin_call(mq, "fetch consume offset", call))

    def _offset_query(self, mq: MessageQueue, kind: str, timestamp_ms: int | None = None) -> int:
        def call(client: ClientInstance, t: _Target) -> int:
            url = rq.offset_url(t.addr, kind, mq, timestamp_ms=timestamp_ms)
            return rq.parse_offset(client.http.get(url), t.addr)

        return int(self._admin_call(mq, f"{kind} offset", call))

    def min_offset(self, mq: MessageQueue) -> int:
        """Smallest logical offset still stored in ``mq``."""
        return self._offset_query(mq, "min")

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last logical offset of ``mq``."""
        return self._offset_query(mq, "max")

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """First offset of ``mq`` stored at or after ``timestamp_ms``."""
        return self._offset_query(mq, "search", timestamp_ms)


class AsyncPullConsumer(AsyncLifecycle, _ConsumerBase):
    """The asyncio twin of :class:`PullConsumer` (same arguments; methods are coroutines; ``async with``)."""

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool = False,
                 default_broker_id: int = MASTER_ID, client_config: ClientConfig | None = None,
                 **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, connect_broker_by_user=connect_broker_by_user,
                         default_broker_id=default_broker_id, client_config=client_config, **kwargs)
        self._client: AsyncClientInstance | None = None

    def _attach(self, client: AsyncClientInstance) -> None:
        client.register_consumer(self.group)

    async def close(self) -> None:
        was_open = self._state is ClientState.OPENED
        self._state = ClientState.CLOSED
        if was_open and self._client is not None:
            await self._client.release()

    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`PullConsumer.fetch_subscribe_message_queues`."""
        client = self._ensure_open()
        validate_topic(topic)
        client.consumer_uses_topic(self.group, topic)
        return list(await client.subscribe_queues_or_fetch(topic))

    async def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, sub_expression: str = "*", *,
                   timeout_s: float | None = None, suspend_timeout_s: float | None = None) -> PullResult:
        """See :meth:`PullConsumer.pull`."""
        client = self._ensure_open()
        mq = _check_pull_args(mq, offset, max_nums)
        plan = pull_plan(client, self._nodes, mq)
        if plan is None:
            await client.update_topic_route_from_nameserver(mq.topic)
            plan = pull_plan(client, self._nodes, mq)
        if plan is None:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        timeout = self._pull_timeout(timeout_s, suspend_timeout_s)
        error: ClientError | None = None
        refusal: PullResult | None = None
        while (t := plan.next()) is not None:
            target = self._pull_target(t, mq, offset, max_nums, sub_expression, suspend_timeout_s)
            try:
                resp = await client.exchange("GET", t.addr, target, timeout=timeout)
            except httpx.HTTPError as e:
                error = self._pull_failed(plan, mq, t, e)
                continue
            result = rq.parse_pull(resp, t.addr, mq)
            if self._pull_answered(plan, t, result, offset):
                return self._finish_pull(mq, result, sub_expression)
            refusal = result
        return self._pull_outcome(mq, refusal, error, sub_expression)

    async def _admin_call(self, mq: MessageQueue, what: str, call: Any) -> Any:
        client = self._ensure_open()
        targets = admin_targets(client, mq.broker_name)
        if not targets or MASTER_ID not in (client.routes.broker_addrs(mq.broker_name) or {}):
            await client.update_topic_route_from_nameserver(mq.topic)
            targets = admin_targets(client, mq.broker_name)
        if not targets:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        error: ClientError | None = None
        for t in targets:
            try:
                return await call(client, t)
            except httpx.HTTPError as e:
                client.broker_down.mark_down(mq.broker_name, t.broker_id, _now_ms())
                error = rq.map_transport_error(e, t.addr, f"{what} of {mq} at {self._role(t)} {t.addr}")
        assert error is not None
        raise error

    async def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`PullConsumer.update_consume_offset`."""
        if not isinstance(offset, int) or offset < 0:
            raise InvalidParameterError(f"offset must be an int >= 0, got {offset!r}")
        body = rq.commit_offset_body(self.group, mq, offset)

        async def call(client: AsyncClientInstance, t: _Target) -> None:
            rq.json_of(await client.http.post(f"http://{t.addr}/offset/consumer", content=body), t.addr)

        await self._admin_call(mq, "commit offset", call)
        self._committed[mq] = offset

    async def fetch_consume_offset(self, mq: MessageQueue) -> int:
        """See :meth:`PullConsumer.fetch_consume_offset`."""

        async def call(client: AsyncClientInstance, t: _Target) -> int:
            url = rq.offset_url(t.addr, "consumer", mq, group=self.group)
            try:
                return rq.parse_offset(await client.http.get(url), t.addr)
            except QueryNotFoundError:
                return -1

        return int(await self._admin_call(mq, "fetch consume offset", call))

    async def _offset_query(self, mq: MessageQueue, kind: str, timestamp_ms: int | None = None) -> int:
        async def call(client: AsyncClientInstance, t: _Target) -> int:
            return rq.parse_offset(await client.http.get(rq.offset_url(t.addr, kind, mq, timestamp_ms=timestamp_ms)),
                                   t.addr)

        return int(await self._admin_call(mq, f"{kind} offset", call))

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset_query(mq, "min")

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._offset_query(mq, "max")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._offset_query(mq, "search", timestamp_ms)
