"""``PullConsumer`` and ``AsyncPullConsumer``: pulls with read/write splitting, offsets, range queries.

Choosing the member of a broker group (docs/BEHAVIOUR.md 3.3, 3.5, 3.6):

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
import threading
import types
from collections.abc import Mapping
from typing import Any

import attrs

from client import _requests as rq
from client._instance import (
    AsyncClientInstance,
    ClientConfig,
    ClientInstance,
    ClientState,
    _InstanceCore,
    with_credentials,
)
from client._lifecycle import AsyncLifecycle, SyncLifecycle
from client._metrics import ClientMetrics
from client._ops import member_call_op, pull_op
from client._rebalance import TagFilter
from client._requests import Answer, Op, PullResult
from client._routing import PullNodeTable, normalize_namesrv_addr, pull_refused
from common.codes import MASTER_ID
from common.errors import InvalidParameterError, QueryNotFoundError
from common.message import MessageQueue
from common.properties import validate_group, validate_topic
from common.requests import PullRequestHeader
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["AsyncPullConsumer", "ConsumerConfig", "PullConsumer"]

#: Messages per pull at most (RocketMQ caps a pull batch at 32 by default; the broker may cap it lower).
MAX_PULL_NUMS = 1024


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
def _tag_filter(sub_expression: str | MessageSelector) -> TagFilter:
    try:
        return TagFilter.parse(sub_expression)
    except ValueError as e:
        raise InvalidParameterError(str(e)) from None


def _offset_or_unset(resp: Answer, addr: str) -> int:
    """A committed offset; -1 when the group never committed one."""
    try:
        return rq.parse_offset(resp, addr)
    except QueryNotFoundError:
        return -1


class _ConsumerBase:
    """State and operations shared by both pull consumers; every call is an operation
    (:data:`client._requests.Op`) the instance's ``drive`` runs."""

    _kind = "consumer"

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool, default_broker_id: int,
                 client_config: ClientConfig | None, **kwargs: Any) -> None:
        self.config = ConsumerConfig(group, connect_broker_by_user, default_broker_id, **kwargs)
        self.namesrv_addr = normalize_namesrv_addr(namesrv_addr)  # a bad address fails here, not at a send
        self._client_config = client_config
        self._nodes = PullNodeTable(connect_broker_by_user=connect_broker_by_user,
                                    default_broker_id=default_broker_id)
        self._committed: dict[MessageQueue, int] = {}
        self._state = ClientState.UNOPENED
        self._metrics = ClientMetrics("consumer", self.config.group)

    def stats(self) -> dict[str, Any]:
        """This consumer's metrics as plain dicts: pulls by the member that served them, lag per queue, route
        refreshes and members marked down (docs/METRICS.md). Cheap: it copies counters."""
        return self._metrics.snapshot()

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    @property
    def state(self) -> ClientState:
        """UNOPENED until the first use (or ``start``), then OPENED, then CLOSED."""
        return self._state

    @property
    def pull_from_which_node_table(self) -> Mapping[MessageQueue, int]:
        """Read-only live view of ``pullFromWhichNodeTable``."""
        return types.MappingProxyType(self._nodes.table)

    def recalculate_pull_from_which_node(self, mq: MessageQueue) -> int:
        """The member id the next pull of ``mq`` asks for (before down-member avoidance)."""
        return self._nodes.recalculate(mq)

    # --- operations ---

    def _queues_op(self, core: _InstanceCore, topic: str) -> Op[list[MessageQueue]]:
        validate_topic(topic)
        core.consumer_uses_topic(self.group, topic)
        return list((yield from core.subscribe_queues_op(topic)))

    def _pull_op(self, core: _InstanceCore, mq: MessageQueue, offset: int, max_nums: int,
                 sub_expression: str | MessageSelector,
                 timeout_s: float | None, suspend_timeout_s: float | None) -> Op[PullResult]:
        mq = _check_pull_args(mq, offset, max_nums)
        flt = _tag_filter(sub_expression)
        header = PullRequestHeader.of(
            self.group, mq.topic, mq.queue_id, offset, max_nums, sub_expression=flt.expression,
            expression_type=flt.expression_type,
            commit_offset=self._committed.get(mq),
            suspend_timeout_ms=int(suspend_timeout_s * 1000) if suspend_timeout_s else None)
        timeout = (timeout_s if timeout_s is not None else self.config.pull_timeout_s) + (suspend_timeout_s or 0.0)
        result = yield from pull_op(core, self._nodes, mq, header, timeout, rq.parse_pull, pull_refused)
        if self._metrics.on:
            self._metrics.pulled(mq.topic, mq.broker_name, mq.queue_id, result.served_by_broker_id,
                                 len(result.msg_found_list), result.max_offset, result.next_begin_offset)
        # The broker filters by tag hash, so a tag whose Java hash collides with a subscribed one gets through
        # (RocketMQ's processPullResult filters again).
        tags = flt.tags
        if tags is None or not result.msg_found_list:
            return result
        kept = [m for m in result.msg_found_list if m.tags in tags]
        return result if len(kept) == len(result.msg_found_list) else attrs.evolve(result, msg_found_list=kept)

    def _commit_op(self, core: _InstanceCore, mq: MessageQueue, offset: int) -> Op[None]:
        if not isinstance(offset, int) or offset < 0:
            raise InvalidParameterError(f"offset must be an int >= 0, got {offset!r}")
        yield from member_call_op(core, mq, "commit offset", "POST", "/offset/consumer", rq.json_of,
                                  rq.commit_offset_body(self.group, mq, offset))
        self._committed[mq] = offset

    def _committed_op(self, core: _InstanceCore, mq: MessageQueue) -> Op[int]:
        return (yield from member_call_op(core, mq, "fetch consume offset", "GET",
                                          rq.offset_target("consumer", mq, group=self.group), _offset_or_unset))

    def _offset_op(self, core: _InstanceCore, mq: MessageQueue, kind: str, timestamp_ms: int | None = None
                   ) -> Op[int]:
        return (yield from member_call_op(core, mq, f"{kind} offset", "GET",
                                          rq.offset_target(kind, mq, timestamp_ms=timestamp_ms), rq.parse_offset))


class PullConsumer(SyncLifecycle, _ConsumerBase):
    """A synchronous pull consumer (RocketMQ ``DefaultMQPullConsumer`` / lite pull).

    Args:
        group: consumer group.
        namesrv_addr: nameservers, ``;``-separated.
        connect_broker_by_user: pin every pull to ``default_broker_id``.
        default_broker_id: the pinned member.
        client_config: settings of the shared client instance (used when this consumer creates it).
        credentials: the account that signs every request (``client.Credentials``); None: unsigned.
        **kwargs: more :class:`ConsumerConfig` fields (``pull_timeout_s``).
    """

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool = False,
                 default_broker_id: int = MASTER_ID, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, connect_broker_by_user=connect_broker_by_user,
                         default_broker_id=default_broker_id,
                         client_config=with_credentials(client_config, credentials), **kwargs)
        self._lock = threading.Lock()
        self._client: ClientInstance | None = None

    def _attach(self, client: ClientInstance) -> None:
        client.register_consumer(self.group)
        self._metrics.bind(client)

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
        return client.drive(self._queues_op(client, topic))

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32,
             sub_expression: str | MessageSelector = "*", *,
             timeout_s: float | None = None, suspend_timeout_s: float | None = None) -> PullResult:
        """Pull up to ``max_nums`` messages of ``mq`` from ``offset``.

        Args:
            mq: the queue.
            offset: first logical offset wanted.
            max_nums: messages at most.
            sub_expression: ``*`` or ``TagA || TagB``, or a :class:`MessageSelector` (``MessageSelector.sql(...)``
                for a property filter the broker evaluates).
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
        return client.drive(self._pull_op(client, mq, offset, max_nums, sub_expression, timeout_s,
                                          suspend_timeout_s))

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """Commit ``offset`` for this group (to the master, or to a slave when the master is gone)."""
        client = self._ensure_open()
        client.drive(self._commit_op(client, mq, offset))

    def fetch_consume_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq``, -1 when never committed."""
        client = self._ensure_open()
        return client.drive(self._committed_op(client, mq))

    def min_offset(self, mq: MessageQueue) -> int:
        """Smallest logical offset still stored in ``mq``."""
        client = self._ensure_open()
        return client.drive(self._offset_op(client, mq, "min"))

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last logical offset of ``mq``."""
        client = self._ensure_open()
        return client.drive(self._offset_op(client, mq, "max"))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """First offset of ``mq`` stored at or after ``timestamp_ms``."""
        client = self._ensure_open()
        return client.drive(self._offset_op(client, mq, "search", timestamp_ms))


class AsyncPullConsumer(AsyncLifecycle, _ConsumerBase):
    """The asyncio twin of :class:`PullConsumer` (same arguments; methods are coroutines; ``async with``)."""

    def __init__(self, group: str, namesrv_addr: str, *, connect_broker_by_user: bool = False,
                 default_broker_id: int = MASTER_ID, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, connect_broker_by_user=connect_broker_by_user,
                         default_broker_id=default_broker_id,
                         client_config=with_credentials(client_config, credentials), **kwargs)
        self._client: AsyncClientInstance | None = None

    def _attach(self, client: AsyncClientInstance) -> None:
        client.register_consumer(self.group)
        self._metrics.bind(client)

    async def close(self) -> None:
        """See :meth:`PullConsumer.close`."""
        was_open = self._state is ClientState.OPENED
        self._state = ClientState.CLOSED
        if was_open and self._client is not None:
            await self._client.release()

    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`PullConsumer.fetch_subscribe_message_queues`."""
        client = self._ensure_open()
        return await client.drive(self._queues_op(client, topic))

    async def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32,
             sub_expression: str | MessageSelector = "*", *,
                   timeout_s: float | None = None, suspend_timeout_s: float | None = None) -> PullResult:
        """See :meth:`PullConsumer.pull`."""
        client = self._ensure_open()
        return await client.drive(self._pull_op(client, mq, offset, max_nums, sub_expression, timeout_s,
                                                suspend_timeout_s))

    async def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`PullConsumer.update_consume_offset`."""
        client = self._ensure_open()
        await client.drive(self._commit_op(client, mq, offset))

    async def fetch_consume_offset(self, mq: MessageQueue) -> int:
        """See :meth:`PullConsumer.fetch_consume_offset`."""
        client = self._ensure_open()
        return await client.drive(self._committed_op(client, mq))

    async def min_offset(self, mq: MessageQueue) -> int:
        """See :meth:`PullConsumer.min_offset`."""
        client = self._ensure_open()
        return await client.drive(self._offset_op(client, mq, "min"))

    async def max_offset(self, mq: MessageQueue) -> int:
        """See :meth:`PullConsumer.max_offset`."""
        client = self._ensure_open()
        return await client.drive(self._offset_op(client, mq, "max"))

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """See :meth:`PullConsumer.search_offset`."""
        client = self._ensure_open()
        return await client.drive(self._offset_op(client, mq, "search", timestamp_ms))
