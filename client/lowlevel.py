"""The low-level SDK: routes, and sends and pulls of raw batches, with the SDK's routing and retry rules.

For tools that need control or speed the producer and consumer objects don't give (the Spark connector, the
benchmarks): a send takes an already-encoded send batch (:func:`common.codec.encode_batch`, or items
laid out by hand), a pull returns the stored records as bytes (decode them with
:func:`common.codec.decode_records`, or not at all)::

    from client.lowlevel import BrokerClient

    with BrokerClient("127.0.0.1:9876") as c:
        sent = c.send_encoded("TopicTest", body, 3, group="tools")        # routed, retried as Producer.send
        mq = sent.message_queue
        got = c.pull_raw(mq, 0, group="tools-reader", max_nums=32)        # read/write split as PullConsumer.pull
        print(got.status, got.n_records, bytes(got.records[:16]))

The rules are the SDK's, each implemented once:

* send (:class:`SendAttempts`, docs/BEHAVIOUR.md 4.6): round robin over the topic's writable queues of groups with a
  master (the ``TBW102`` route while the topic does not exist), each attempt to a master, a failed attempt
  retried on another broker group ``retries`` times within ``timeout_s`` when its error is retriable
  (:data:`RETRY_RESPONSE_CODES` for broker answers); an explicit queue gets one attempt;
* pull (:func:`plan_pull`, docs/BEHAVIOUR.md 3.3 and decision 6): the member from :class:`PullNodeTable` (the broker's
  last suggestion for the queue, else the master), moved off a member found unreachable within
  ``broker_down_isolation_s`` (the slave serves while the master is down), a refusing slave's pull sent on to the
  master in the same call, the suggestion of every answer remembered; the commit offset only goes to a master;
* routes (:class:`RouteCache`): fetched from one nameserver at a time, kept when every nameserver is down or
  one says the topic does not exist (docs/BEHAVIOUR.md 6.6), fetched again when older than
  ``poll_name_server_interval_s`` on their next use (this client runs no background thread and sends no
  heartbeats).

The request formats are :mod:`common.requests`; the pure routing state and decisions are re-exported
here so callers that choose members themselves (:func:`find_broker_address_in_subscribe`) need no private name.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from types import TracebackType

import httpx

from client import _requests as rq
from client._instance import (
    AsyncClientInstance,
    ClientConfig,
    ClientInstance,
    _InstanceCore,
    with_credentials,
)
from client._ops import pull_op, send_op
from client._producer_core import (
    RETRY_RESPONSE_CODES,
    SendAttempts,
    SendWhere,
    check_batch,
    explicit_queue,
    group_among,
    group_for_key,
    is_retriable,
    key_group_names,
    may_be_stored,
    validate_message,
)
from client._requests import Op, PullResult, RawPullResult, RawSendResult, call_op
from client._routing import (
    DEFAULT_TOPIC,
    BrokerDownTable,
    FaultToleranceConfig,
    FindBrokerResult,
    LatencyFaultTolerance,
    PullNodeTable,
    PullPlan,
    PullTarget,
    QueueSelector,
    RouteCache,
    TopicPublishInfo,
    default_route_for,
    find_broker_address_in_subscribe,
    plan_pull,
    pull_refused,
    topic_route_to_publish_info,
    topic_route_to_subscribe_info,
)
from common.codes import PullStatus
from common.message import MessageQueue
from common.requests import PullRequestHeader, SendRequestHeader
from common.route import TopicRouteData
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = [
    "DEFAULT_TOPIC",
    "RETRY_RESPONSE_CODES",
    "AsyncBrokerClient",
    "BrokerClient",
    "BrokerDownTable",
    "FaultToleranceConfig",
    "FindBrokerResult",
    "LatencyFaultTolerance",
    "PullNodeTable",
    "PullPlan",
    "PullRequestHeader",
    "PullTarget",
    "QueueSelector",
    "RawPullResult",
    "RawSendResult",
    "RouteCache",
    "SendAttempts",
    "SendRequestHeader",
    "SendWhere",
    "TopicPublishInfo",
    "check_batch",
    "default_route_for",
    "find_broker_address_in_subscribe",
    "group_among",
    "group_for_key",
    "is_retriable",
    "key_group_names",
    "may_be_stored",
    "plan_pull",
    "raw_pull_refused",
    "topic_route_to_publish_info",
    "topic_route_to_subscribe_info",
    "validate_message",
]

_OFFSET_KINDS = frozenset({"min", "max", "search"})


def raw_pull_refused(result: RawPullResult, requested_offset: int) -> bool:
    """True when a raw pull answer is a member's refusal to serve (see :func:`client._routing.pull_refused`:
    NO_MATCHED_MSG that read nothing and sends the consumer to another member).

    Args:
        result: the answer.
        requested_offset: the offset the pull asked for.

    Returns:
        Whether the pull must go on to the member the answer suggests.
    """
    if result.status is not PullStatus.NO_MATCHED_MSG or result.n_records:
        return False
    return pull_refused(PullResult(result.status, result.next_begin_offset, result.min_offset, result.max_offset, [],
                                   result.suggest_which_broker_id, result.served_by_broker_id), requested_offset)


def _pull_header(mq: MessageQueue, offset: int, group: str, max_nums: int, max_bytes: int | None,
                 sub_expression: str | MessageSelector, commit_offset: int | None, suspend_timeout_ms: int | None
                 ) -> PullRequestHeader:
    selector = MessageSelector.of(sub_expression)
    return PullRequestHeader.of(group, mq.topic, mq.queue_id, offset, max_nums, sub_expression=selector.expression,
                                expression_type=selector.expression_type, commit_offset=commit_offset,
                                suspend_timeout_ms=suspend_timeout_ms, max_bytes=max_bytes)


class _LowLevelCore:
    """State, decisions and operations shared by the sync and async clients (no I/O here): each public call is
    an operation (:data:`client._requests.Op`) that the instance's ``drive`` runs."""

    def __init__(self, inst: _InstanceCore, *, latency_fault_enable: bool, fault_tolerance: FaultToleranceConfig | None,
                 rng: random.Random | None) -> None:
        self._core = inst
        self._selector = QueueSelector(rng=rng)
        self._fault = LatencyFaultTolerance(enabled=latency_fault_enable, config=fault_tolerance)
        self._pull_nodes = PullNodeTable()

    @property
    def namesrv_addr(self) -> str:
        """The ``;``-joined nameserver list."""
        return self._core.namesrv_addr

    @property
    def config(self) -> ClientConfig:
        """Timeouts, isolation time, route refresh period, connection bounds."""
        return self._core.config

    @property
    def routes(self) -> RouteCache:
        """The live route cache (``brokerAddrTable`` included)."""
        return self._core.routes

    @property
    def pull_nodes(self) -> PullNodeTable:
        """``pullFromWhichNodeTable``: the member each queue is pulled from next (updated by ``pull_raw``)."""
        return self._pull_nodes

    @property
    def broker_down(self) -> BrokerDownTable:
        """Members found unreachable, or refusing pulls, lately."""
        return self._core.broker_down

    # --- operations ---

    def _fetch_op(self, topic: str, refresh: bool) -> Op[None]:
        """Ask a nameserver for ``topic``'s route when ``refresh``, or when it was never asked or was asked
        ``poll_name_server_interval_s`` ago (this client runs no background refresh)."""
        core = self._core
        core.check_open()
        asked = core.route_asked_ms.get(topic)
        if refresh or asked is None or core.clock_ms() - asked >= self.config.poll_name_server_interval_s * 1000:
            yield from core.update_route_op(topic)

    def _route_op(self, topic: str, refresh: bool) -> Op[TopicRouteData]:
        yield from self._fetch_op(topic, refresh)
        core = self._core
        route = core.routes.route(topic)
        info = core.routes.publish_info(topic)
        if route is None or (info is not None and info.from_default_topic):  # a borrowed TBW102 route is no route
            raise core.no_route_error(topic)
        return route

    def _broker_addrs_op(self, topic: str, broker_name: str, refresh: bool) -> Op[dict[int, str]]:
        data = (yield from self._route_op(topic, refresh)).broker_data(broker_name)
        return dict(data.broker_addrs) if data else {}

    def _publish_info_op(self, topic: str, refresh: bool) -> Op[TopicPublishInfo]:
        yield from self._fetch_op(topic, refresh)
        return (yield from self._core.publish_info_op(topic))

    def _subscribe_queues_op(self, topic: str, refresh: bool) -> Op[tuple[MessageQueue, ...]]:
        yield from self._fetch_op(topic, refresh)
        return (yield from self._core.subscribe_queues_op(topic))

    def _send_op(self, topic: str, body: bytes, count: int, group: str, queue: MessageQueue | None,
                 timeout_s: float, retries: int, idempotent: bool = False, pinned: str | None = None,
                 where: SendWhere | None = None) -> Op[RawSendResult]:
        info = yield from self._publish_info_op(topic, False)
        run = SendAttempts(info, explicit_queue(queue, info.topic), time.monotonic() + timeout_s, group=group,
                           retries=retries, selector=self._selector, fault=self._fault, idempotent=idempotent,
                           pinned=pinned)
        try:
            mq, reply = yield from send_op(self._core, run, body, count)
        except Exception:
            if where is not None:
                where.group = run.pinned
            raise
        return RawSendResult(mq, reply)

    def _pull_op(self, mq: MessageQueue, offset: int, group: str, max_nums: int, max_bytes: int | None,
                 sub_expression: str | MessageSelector, timeout_s: float, commit_offset: int | None,
                 suspend_timeout_ms: int | None) -> Op[RawPullResult]:
        header = _pull_header(mq, offset, group, max_nums, max_bytes, sub_expression, commit_offset,
                              suspend_timeout_ms)
        timeout = timeout_s + (suspend_timeout_ms or 0) / 1000
        return (yield from pull_op(self._core, self._pull_nodes, mq, header, timeout, rq.parse_pull_raw,
                                   raw_pull_refused))

    @staticmethod
    def _pull_from_op(addr: str, mq: MessageQueue, offset: int, group: str, max_nums: int, max_bytes: int | None,
                      sub_expression: str | MessageSelector, timeout_s: float, commit_offset: int | None,
                      suspend_timeout_ms: int | None) -> Op[RawPullResult]:
        header = _pull_header(mq, offset, group, max_nums, max_bytes, sub_expression, commit_offset,
                              suspend_timeout_ms)
        return (yield from call_op("GET", addr, header.target(), f"pull of {mq} at {offset} from {addr}",
                                   lambda resp, a: rq.parse_pull_raw(resp, a, mq),
                                   timeout=timeout_s + (suspend_timeout_ms or 0) / 1000))

    @staticmethod
    def _queue_offset_op(addr: str, kind: str, mq: MessageQueue, timestamp_ms: int | None) -> Op[int]:
        if kind not in _OFFSET_KINDS:
            raise ValueError(f"offset kind must be one of {sorted(_OFFSET_KINDS)}, got {kind!r}")
        if (kind == "search") != (timestamp_ms is not None):
            raise ValueError("timestamp_ms is needed by, and only by, the 'search' offset kind")
        return (yield from call_op("GET", addr, rq.offset_target(kind, mq, timestamp_ms=timestamp_ms),
                                   f"{kind} offset of {mq} from {addr}", rq.parse_offset))

    @staticmethod
    def _group_identity_op(addr: str) -> Op[str | None]:
        obj = yield from call_op("GET", addr, "/identity", f"group identity of {addr}", rq.json_of)
        value = obj.get("groupIdentity")
        return value if isinstance(value, str) and value else None

    @staticmethod
    def _commit_offsets_op(addr: str, group: str, offsets: Iterable[tuple[MessageQueue, int]]) -> Op[None]:
        yield from call_op("POST", addr, "/offset/consumer", f"consumer offset commit to {addr}", rq.json_of,
                           rq.commit_offsets_body(group, offsets))


class BrokerClient(_LowLevelCore):
    """Routes, raw sends and raw pulls for one nameserver list; thread-safe.

    Args:
        namesrv_addr: ``host:port`` of the nameservers, ``;``-separated.
        config: timeouts, ``broker_down_isolation_s``, ``poll_name_server_interval_s``, connection bounds.
        transport: the HTTP transport (tests inject ``httpx.MockTransport``); the SDK's own by default.
        latency_fault_enable: isolate slow or failing brokers from sends (docs/BEHAVIOUR.md 4.5).
        fault_tolerance: the isolation tables when ``latency_fault_enable``.
        rng: random source of the nameserver and queue round-robin starts.
        clock_ms: monotonic clock of member isolation and route age (injected by tests).
        credentials: the account that signs every request (``client.Credentials``); None: unsigned.
    """

    def __init__(self, namesrv_addr: str, *, config: ClientConfig | None = None,
                 transport: httpx.BaseTransport | None = None, latency_fault_enable: bool = False,
                 fault_tolerance: FaultToleranceConfig | None = None, rng: random.Random | None = None,
                 clock_ms: Callable[[], int] | None = None, credentials: Credentials | None = None) -> None:
        self._inst = ClientInstance(namesrv_addr, with_credentials(config, credentials), transport=transport,
                                    rng=rng, clock_ms=clock_ms)
        super().__init__(self._inst, latency_fault_enable=latency_fault_enable, fault_tolerance=fault_tolerance,
                         rng=rng)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections. Idempotent; later calls raise ClientClosedError."""
        self._inst.close()

    # --- routes -------------------------------------------------------------------------------------------

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The topic's route (cached; fetched when absent, stale, or ``refresh``).

        Args:
            topic: the topic.
            refresh: ask a nameserver now (the cached route stays when none answers).

        Returns:
            The route.

        Raises:
            RouteNotFoundError: no route is known (the last nameserver error is in the message).
            ClientClosedError: the client is closed.
        """
        return self._inst.drive(self._route_op(topic, refresh))

    def broker_addrs(self, topic: str, broker_name: str, *, refresh: bool = False) -> dict[int, str]:
        """``{brokerId: addr}`` of one broker group in the topic's route (empty when the group is absent).

        Raises:
            RouteNotFoundError: no route is known.
        """
        return self._inst.drive(self._broker_addrs_op(topic, broker_name, refresh))

    def publish_info(self, topic: str, *, refresh: bool = False) -> TopicPublishInfo:
        """The topic's writable queues of groups with a master, or the ``TBW102`` route's for a new topic.

        Raises:
            RouteNotFoundError: neither route has a writable queue with a master.
        """
        return self._inst.drive(self._publish_info_op(topic, refresh))

    def subscribe_queues(self, topic: str, *, refresh: bool = False) -> tuple[MessageQueue, ...]:
        """The topic's readable queues on every group, master or not.

        Raises:
            RouteNotFoundError: no route is known.
        """
        return self._inst.drive(self._subscribe_queues_op(topic, refresh))

    # --- data path ----------------------------------------------------------------------------------------

    def send_encoded(self, topic: str, body: bytes, count: int, *, group: str, queue: MessageQueue | None = None,
                     timeout_s: float = 3.0, retries: int = 2, idempotent: bool = False,
                     pinned: str | None = None) -> RawSendResult:
        """Send one encoded batch of ``count`` messages of ``topic`` to a master, with the producer's retries.

        Args:
            topic: the messages' topic.
            body: the send batch (items of :mod:`common.codec`'s batch format, each with its
                ``UNIQ_KEY``).
            count: messages in ``body`` (the broker's reply must cover each).
            group: producer group named in the request.
            queue: send to this queue only, one attempt.
            timeout_s: bound on the whole send, all attempts included.
            retries: extra attempts on another broker group after a retriable failure.
            idempotent: the items carry ``SysFlag.IDEMPOTENT``: once an attempt may have stored them
                (:func:`may_be_stored`), the retries stay in its group (:class:`SendAttempts`). The reply may then
                carry each message's own place (``SendReply.placements``).
            pinned: send to a queue of this broker group only (a re-send of a batch that may be stored there; a
                caller's keys placed by :func:`group_for_key`).

        Returns:
            The queue that stored the batch and the broker's reply (codes 10/11/12 included: stored, not yet
            durable).

        Raises:
            SendFailedError: every attempt failed, or ``timeout_s`` ran out.
            BrokerError: a broker refused the batch with a code that is not retried.
            MessageIllegalError: ``queue`` is not a queue of ``topic``.
            RouteNotFoundError: the topic has no writable queue with a master.
        """
        return self._inst.drive(self._send_op(topic, body, count, group, queue, timeout_s, retries, idempotent,
                                              pinned))

    def pull_raw(self, mq: MessageQueue, offset: int, *, group: str, max_nums: int = 32,
                 max_bytes: int | None = None, sub_expression: str | MessageSelector = "*", timeout_s: float = 5.0,
                 commit_offset: int | None = None, suspend_timeout_ms: int | None = None) -> RawPullResult:
        """Pull from the member the SDK's read/write-split rules choose (module docstring); the records stay raw.

        Args:
            mq: the queue.
            offset: first offset wanted.
            group: consumer group.
            max_nums: messages at most.
            max_bytes: stored bytes at most (the broker's default when None).
            sub_expression: ``*`` or ``TagA || TagB`` (filtered by tag hash: recheck the tags when it matters), or
                a :class:`~common.selector.MessageSelector` (``MessageSelector.sql``: the broker filters).
            timeout_s: bound on each request (plus ``suspend_timeout_ms`` when long polling).
            commit_offset: the group's offset to store, sent only to a master.
            suspend_timeout_ms: long polling: the broker holds the pull this long when nothing is new.

        Returns:
            The answer; a refusal nobody overrode is returned as NO_MATCHED_MSG with the offset unchanged.

        Raises:
            BrokerNotFoundError: the group has no member in the route, even after a refresh.
            TransportError: no member could be reached.
            BrokerError: the broker refused the pull (unknown topic, bad queue id...).
        """
        return self._inst.drive(self._pull_op(mq, offset, group, max_nums, max_bytes, sub_expression, timeout_s,
                                              commit_offset, suspend_timeout_ms))

    def pull_raw_from(self, addr: str, mq: MessageQueue, offset: int, *, group: str, max_nums: int = 32,
                      max_bytes: int | None = None, sub_expression: str | MessageSelector = "*", timeout_s: float = 5.0,
                      commit_offset: int | None = None, suspend_timeout_ms: int | None = None) -> RawPullResult:
        """One pull from the member at ``addr`` chosen by the caller; no routing state is read or changed.

        Args are those of :meth:`pull_raw` plus ``addr`` (``host:port``); send ``commit_offset`` only to a master.

        Returns:
            The answer.

        Raises:
            TransportError: no answer (connection refused or timed out).
            BrokerError: the broker answered an error code.
        """
        return self._inst.drive(self._pull_from_op(addr, mq, offset, group, max_nums, max_bytes, sub_expression,
                                                   timeout_s, commit_offset, suspend_timeout_ms))

    # --- offsets ------------------------------------------------------------------------------------------

    def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None
                     ) -> int:
        """The ``min``, ``max`` or ``search`` (first stored at or after ``timestamp_ms``) offset of a queue on
        the member at ``addr``.

        Raises:
            ValueError: an unknown ``kind``, or ``timestamp_ms`` missing for (or given to other than) ``search``.
            TransportError: no answer.
            BrokerError: the broker answered an error code.
        """
        return self._inst.drive(self._queue_offset_op(addr, kind, mq, timestamp_ms))

    def group_identity(self, addr: str) -> str | None:
        """The identity of the store of the broker group the member at ``addr`` belongs to (``GET /identity``):
        minted by the group's first master, copied to its slaves, kept across restarts; another cluster, or a
        wiped store, has another. None while a slave has not copied its master's yet. Queue offsets only
        mean something in the store of one identity: keep it with offsets you keep.

        Raises:
            TransportError: no answer.
            BrokerError: the broker answered an error code.
        """
        return self._inst.drive(self._group_identity_op(addr))

    def commit_offsets(self, addr: str, group: str, offsets: Iterable[tuple[MessageQueue, int]]) -> None:
        """Store ``group``'s consumed offset of each queue on the member at ``addr`` (``POST /offset/consumer``).

        Raises:
            TransportError: no answer.
            BrokerError: the broker answered an error code.
        """
        self._inst.drive(self._commit_offsets_op(addr, group, offsets))


class AsyncBrokerClient(_LowLevelCore):
    """The asyncio twin of :class:`BrokerClient` (same arguments; I/O methods are coroutines; ``async with``).

    Use it on one event loop.
    """

    def __init__(self, namesrv_addr: str, *, config: ClientConfig | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, latency_fault_enable: bool = False,
                 fault_tolerance: FaultToleranceConfig | None = None, rng: random.Random | None = None,
                 clock_ms: Callable[[], int] | None = None, credentials: Credentials | None = None) -> None:
        self._inst = AsyncClientInstance(namesrv_addr, with_credentials(config, credentials), transport=transport,
                                         rng=rng, clock_ms=clock_ms)
        super().__init__(self._inst, latency_fault_enable=latency_fault_enable, fault_tolerance=fault_tolerance,
                         rng=rng)

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """See :meth:`BrokerClient.close`."""
        await self._inst.aclose()

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """See :meth:`BrokerClient.route`."""
        return await self._inst.drive(self._route_op(topic, refresh))

    async def broker_addrs(self, topic: str, broker_name: str, *, refresh: bool = False) -> dict[int, str]:
        """See :meth:`BrokerClient.broker_addrs`."""
        return await self._inst.drive(self._broker_addrs_op(topic, broker_name, refresh))

    async def publish_info(self, topic: str, *, refresh: bool = False) -> TopicPublishInfo:
        """See :meth:`BrokerClient.publish_info`."""
        return await self._inst.drive(self._publish_info_op(topic, refresh))

    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> tuple[MessageQueue, ...]:
        """See :meth:`BrokerClient.subscribe_queues`."""
        return await self._inst.drive(self._subscribe_queues_op(topic, refresh))

    async def send_encoded(self, topic: str, body: bytes, count: int, *, group: str,
                           queue: MessageQueue | None = None, timeout_s: float = 3.0, retries: int = 2,
                           idempotent: bool = False, pinned: str | None = None) -> RawSendResult:
        """See :meth:`BrokerClient.send_encoded`."""
        return await self._inst.drive(self._send_op(topic, body, count, group, queue, timeout_s, retries,
                                                    idempotent, pinned))

    async def pull_raw(self, mq: MessageQueue, offset: int, *, group: str, max_nums: int = 32,
                       max_bytes: int | None = None, sub_expression: str | MessageSelector = "*", timeout_s: float = 5.0,
                       commit_offset: int | None = None, suspend_timeout_ms: int | None = None) -> RawPullResult:
        """See :meth:`BrokerClient.pull_raw`."""
        return await self._inst.drive(self._pull_op(mq, offset, group, max_nums, max_bytes, sub_expression,
                                                    timeout_s, commit_offset, suspend_timeout_ms))

    async def pull_raw_from(self, addr: str, mq: MessageQueue, offset: int, *, group: str, max_nums: int = 32,
                            max_bytes: int | None = None, sub_expression: str | MessageSelector = "*", timeout_s: float = 5.0,
                            commit_offset: int | None = None, suspend_timeout_ms: int | None = None
                            ) -> RawPullResult:
        """See :meth:`BrokerClient.pull_raw_from`."""
        return await self._inst.drive(self._pull_from_op(addr, mq, offset, group, max_nums, max_bytes,
                                                         sub_expression, timeout_s, commit_offset,
                                                         suspend_timeout_ms))

    async def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None
                           ) -> int:
        """See :meth:`BrokerClient.queue_offset`."""
        return await self._inst.drive(self._queue_offset_op(addr, kind, mq, timestamp_ms))

    async def group_identity(self, addr: str) -> str | None:
        """See :meth:`BrokerClient.group_identity`."""
        return await self._inst.drive(self._group_identity_op(addr))

    async def commit_offsets(self, addr: str, group: str, offsets: Iterable[tuple[MessageQueue, int]]) -> None:
        """See :meth:`BrokerClient.commit_offsets`."""
        await self._inst.drive(self._commit_offsets_op(addr, group, offsets))
