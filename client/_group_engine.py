"""The engine of a group consumer, written once: its state, its decisions and every request it makes.

Clustering: every ``rebalance_interval_s`` each instance reads the group's client ids from a broker
(``GET /consumer/ids``, fed by the heartbeats of the client instance) and the topic's queues from the route,
and takes its share with the allocation strategy (AllocateMessageQueueAveragely by default). A queue that
leaves is committed first (its consumed offset, never the prefetched one); a queue that arrives starts from
the committed offset, so a hand-over skips nothing (it may repeat what was in flight: at least once).
Broadcasting: every instance holds every queue and keeps offsets in a local file.

:class:`GroupEngine` holds what both engines do -- the rebalance round, the allocation, where a queue starts,
the commits, the final steps of a close -- as operations (:data:`client._requests.Op`) the client instance's
``drive`` runs, and :class:`RebalanceClock` decides when a background job is due. The twins keep only how they
wait: :class:`client._group_consumer.SyncEngine` pulls from a bounded set of threads round robin and runs the
background jobs on a thread; :class:`client._async_group_consumer.AsyncEngine` runs one task per held queue and
one for the background jobs.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs

from client import _requests as rq
from client._consume_core import GroupConsumerConfig, GroupCore, consume_timestamp_ms
from client._consumer import _ConsumerBase
from client._instance import ClientConfig, ClientState, _InstanceCore
from client._metrics import ClientMetrics
from client._offset_store import LocalFileOffsetStore
from client._orderly import QueueLocker
from client._rebalance import MessageModel, ProcessQueue, plan_start_offset, retry_topic
from client._rebalance_clock import RebalanceClock
from client._requests import Answer, Op, PullResult, call_op
from client._routing import normalize_namesrv_addr
from common.codes import MASTER_ID, PullStatus
from common.errors import (
    ClientClosedError,
    ClientError,
    InvalidParameterError,
    RouteNotFoundError,
    TransportError,
)
from common.message import MessageExt, MessageQueue
from common.selector import MessageSelector

__all__ = ["GroupEngine", "claim_group", "id_query_addrs", "instance_config", "parse_consumer_ids",
           "release_group"]

log = logging.getLogger(__name__)

#: RocketMQ's PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL: a queue over a cache threshold is looked at again this soon.
FLOW_CONTROL_DELAY_S = 0.05
#: A paused queue is looked at again this soon (``resume`` does not wake its puller).
PAUSED_DELAY_S = 0.1

_GROUPS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()

ClientT = TypeVar("ClientT", bound=_InstanceCore)
PullerT = TypeVar("PullerT", bound=_ConsumerBase)


class Flag(Protocol):
    """What the engines' shared code asks of a ``threading.Event`` or an ``asyncio.Event``: no waiting."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


def parse_consumer_ids(resp: Answer, addr: str) -> list[str]:
    """``{"clientIds": [...]}`` -> the sorted ids.

    Raises:
        ProtocolViolationError: the answer lacks a list of strings.
    """
    obj = rq.json_of(resp, addr)
    ids = obj.get("clientIds")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise rq.ProtocolViolationError(f"{addr} answered consumer ids without a 'clientIds' list", broker_addr=addr)
    return sorted(ids)


def id_query_addrs(client: _InstanceCore, topic: str) -> list[str]:
    """Where to ask for a group's client ids: a member of each group of the topic, masters first."""
    route = client.topic_route(topic)
    if route is None:
        return []
    out = []
    for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
        if bd.broker_addrs:
            out.append(bd.broker_addrs.get(MASTER_ID) or bd.broker_addrs[min(bd.broker_addrs)])
    return out


def claim_group(instance: _InstanceCore, group: str) -> None:
    """One consumer per group per client instance: two would compute the same share and pull it twice.

    Raises:
        ClientError: the instance has a consumer of ``group`` already.
    """
    with _GROUPS_LOCK:
        groups = _GROUPS.setdefault(instance, set())
        if group in groups:
            raise ClientError(f"consumer group {group} already has a consumer on client instance "
                              f"{instance.client_id}; give this one another instance_name")
        groups.add(group)


def release_group(instance: _InstanceCore, group: str) -> None:
    """Undo :func:`claim_group` (the consumer leaves the group on the brokers in :meth:`GroupEngine.closing_op`)."""
    with _GROUPS_LOCK:
        _GROUPS.get(instance, set()).discard(group)


def instance_config(config: GroupConsumerConfig, client_config: ClientConfig | None) -> ClientConfig:
    """The settings of a client instance a consumer creates: its heartbeat period is the consumer's."""
    return attrs.evolve(client_config or ClientConfig(), heartbeat_broker_interval_s=config.heartbeat_interval_s)


class GroupEngine(Generic[ClientT, PullerT]):
    """Rebalance, pulls and commits of one group consumer, but for the waiting (see the module docstring).

    Args:
        config: the consumer's settings.
        namesrv_addr: nameservers, ``;``-separated.
        client_config: settings of the client instance (when this consumer creates it).
        deliver: called with ``(pq, generation, messages)`` after each pull that found some.
        subscribe_retry_topic: also consume ``%RETRY%<group>`` (push consumers in clustering mode).
        lock_queues: lock queues on their masters before holding them, renew the locks, unlock on hand-over and
            close (orderly push consumers in clustering mode; see :mod:`client._orderly`).
        on_locked: called after each renewal of the locks (consumption of queues locked again resumes).
    """

    _stop: Flag
    """Set by close: no new pull, no new job."""
    _wake: Flag
    """Set to run the background jobs before the clock's wait ends."""

    def __init__(self, config: GroupConsumerConfig, namesrv_addr: str, client_config: ClientConfig | None,
                 deliver: Callable[[ProcessQueue, int, list[MessageExt]], None], *,
                 subscribe_retry_topic: bool = False, lock_queues: bool = False,
                 on_locked: Callable[[], None] | None = None) -> None:
        clustering = config.message_model is MessageModel.CLUSTERING
        self.config = config
        self.namesrv_addr = normalize_namesrv_addr(namesrv_addr)  # a bad address fails here, not at a send
        self.core = GroupCore(config)
        self._client_config = instance_config(config, client_config)
        self._deliver = deliver
        self._retry = subscribe_retry_topic and clustering
        self._lock_queues = lock_queues and clustering
        self._on_locked = on_locked
        self.locker: QueueLocker | None = None
        """The queue locks (orderly push consumers in clustering mode), set at start."""
        self.state = ClientState.UNOPENED
        self.client: ClientT | None = None
        self.puller: PullerT | None = None
        self.local_store: LocalFileOffsetStore | None = None
        self.clock = RebalanceClock(config, lock_renewal=self._lock_queues)
        self._greeted = False
        self.rebalance_count = 0
        self.pull_count = 0
        """Pull requests sent (flow control shows as this count standing still)."""
        self.pulled_messages = 0
        """Messages the pulls brought (before the tag re-check)."""
        self.flow_control_count = 0
        """Times a queue's pull was put off because its cache was over a threshold."""
        self.metrics = ClientMetrics("consumer", config.group)
        """Pulls (recorded by the puller), consumed messages and callback latency (by the consumer)."""
        self.metrics.cached = self._cached_by_topic
        self._tell_lock = threading.Lock()
        self._changes: list[tuple[str, set[MessageQueue]]] = []
        """Listener calls due, in order: ``(method name, queues)`` (see :meth:`next_changes`)."""
        self._telling = False

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    # --- lifecycle (no I/O) ---

    def check_open(self) -> tuple[ClientT, PullerT]:
        """The client instance and the puller.

        Raises:
            ClientClosedError: the consumer is not started, or is closed.
        """
        if self.state is not ClientState.OPENED or self.client is None or self.puller is None:
            raise ClientClosedError(f"consumer {self.group} is {self.state.value.lower()}: start it first")
        return self.client, self.puller

    def _parts(self) -> tuple[ClientT, PullerT]:
        """The client instance and the puller of a consumer that started (open or closing)."""
        assert self.client is not None and self.puller is not None, "the consumer never started"
        return self.client, self.puller

    def _check_startable(self) -> None:
        if self.state is ClientState.CLOSED:
            raise ClientClosedError(f"consumer {self.group} is closed; create a new one")
        if self.state is ClientState.OPENED:
            raise ClientError(f"consumer {self.group} is already started")

    def _opened(self, client: ClientT, puller: PullerT) -> None:
        """Start with ``client`` (the group claimed on it) and ``puller``: offsets, subscriptions, the clock."""
        self.client, self.puller = client, puller
        if self._lock_queues:
            self.locker = QueueLocker(self.group, client)
        if self.config.message_model is MessageModel.BROADCASTING:
            self.local_store = LocalFileOffsetStore(self.config.offset_store_dir,
                                                    self.config.instance_name or "DEFAULT", self.group)
            self.local_store.load()
        if self._retry:
            self.core.subscriptions.setdefault(retry_topic(self.group), self.core.filter_of(""))
        for topic in self.core.topics():
            client.consumer_uses_topic(self.group, topic, self.core.filter_of(topic).selector)
        self.clock.started()
        self.state = ClientState.OPENED

    # --- subscriptions and the clock ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector) -> None:
        """Add or replace a subscription; an open consumer heartbeats it and rebalances now."""
        flt = self.core.subscribe(topic, sub_expression)
        if self.state is ClientState.OPENED and self.client is not None:
            self.client.consumer_uses_topic(self.group, topic, flt.selector)
            self.wake_rebalance()

    def unsubscribe(self, topic: str) -> None:
        """Drop a subscription; its queues are handed over by a rebalance now."""
        self.core.unsubscribe(topic)
        self.wake_rebalance()

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Hold exactly ``queues`` (no group sharing), from a rebalance now."""
        self.core.assign(queues)
        self.wake_rebalance()

    def wake_rebalance(self) -> None:
        """Rebalance now (a subscription changed)."""
        self.clock.asked_now()
        self._wake.set()

    def expect_queues(self, topic: str) -> None:
        """``topic`` should have queues for this group now (a send-back just wrote to ``%RETRY%<group>``): when
        none are known yet, rebalance at once instead of at the next period -- at most once per
        :data:`SOON_FIRST_S`, however many send-backs ask."""
        client = self.client
        if client is None or self._stop.is_set() or client.routes.subscribe_info(topic):
            return
        self.clock.expect()
        self._wake.set()

    # --- counters ---

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring and tests: pulls sent, pulls put off by flow control, rebalances, and the
        messages / body bytes cached (pulled, not yet consumed) over every held queue; then the client metrics
        (:meth:`client._metrics.ClientMetrics.snapshot`: pulls by serving member, lag, consumed messages...)."""
        with self.core.lock:
            pqs = list(self.core.pqs.values())
            cached = sum(pq.msg_count for pq in pqs)
            cached_bytes = sum(pq.msg_size_bytes for pq in pqs)
        return {"pulls": self.pull_count, "pulledMessages": self.pulled_messages,
                "flowControlled": self.flow_control_count,
                "rebalances": self.rebalance_count, "queues": len(pqs), "cachedMessages": cached,
                "cachedBytes": cached_bytes, **self.metrics.snapshot()}

    def _cached_by_topic(self) -> dict[str, tuple[int, int]]:
        """Messages and body bytes cached per topic (read when OpenTelemetry collects)."""
        out: dict[str, tuple[int, int]] = {}
        with self.core.lock:
            for mq, pq in self.core.pqs.items():
                n, b = out.get(mq.topic, (0, 0))
                out[mq.topic] = (n + pq.msg_count, b + pq.msg_size_bytes)
        return out

    def take_polled(self, max_messages: int | None = None) -> list[MessageExt]:
        """Lite pull: the cached messages ``poll`` returns now (at most ``max_messages``, by default
        ``max_poll_messages``), counted."""
        msgs = self.core.take_polled(max_messages or self.config.max_poll_messages)
        metrics = self.metrics
        if msgs and metrics.on:
            counts: dict[str, int] = {}
            for m in msgs:
                counts[m.topic] = counts.get(m.topic, 0) + 1
            for topic, n in counts.items():
                metrics.consumed_messages(topic, n)
        return msgs

    # --- the rebalance listener: its calls are queued by the operations, made by the shells after them ---

    def _changed(self, method: str, queues: set[MessageQueue]) -> None:
        if queues and self.config.rebalance_listener is not None:
            with self._tell_lock:
                self._changes.append((method, set(queues)))

    def begin_telling(self) -> bool:
        """Whether the caller is to make the listener calls due now (False: another thread or task is making
        them, and will make these too -- one at a time, in order)."""
        with self._tell_lock:
            if self._telling or not self._changes:
                return False
            self._telling = True
            return True

    def next_changes(self) -> list[tuple[str, set[MessageQueue]]]:
        """The listener calls due, oldest first; ``[]`` ends the caller's turn (see :meth:`begin_telling`)."""
        with self._tell_lock:
            changes, self._changes = self._changes, []
            if not changes:
                self._telling = False
            return changes

    def end_telling(self) -> None:
        """The teller stopped early (an exception went through it)."""
        with self._tell_lock:
            self._telling = False

    def listener_method(self, method: str) -> Callable[[set[MessageQueue]], Any]:
        """The listener's callback of that name."""
        return getattr(self.config.rebalance_listener, method)

    # --- pulls: the decisions around the request each engine makes ---

    def _launch(self, pq: ProcessQueue) -> None:
        """Start pulling a queue just held."""
        raise NotImplementedError

    def _forget(self, mq: MessageQueue) -> None:
        """Stop pulling a queue no longer held (its puller may also notice by itself)."""

    def _pull_start(self, pq: ProcessQueue) -> tuple[int, int] | float:
        """``(generation, offset)`` of the pull of ``pq`` to make now, or the seconds to wait instead (paused, or
        its cache over a threshold: flow control)."""
        cfg = self.config
        if pq.paused:
            return PAUSED_DELAY_S
        with self.core.lock:
            why = pq.over_threshold(cfg.pull_threshold_for_queue, cfg.threshold_bytes)
            generation, offset = pq.generation, pq.next_pull_offset
        if why is not None:
            self.flow_control_count += 1
            log.debug("flow control on %s: %s", pq.mq, why)
            return FLOW_CONTROL_DELAY_S
        self.pull_count += 1
        return generation, offset

    def _pulled(self, pq: ProcessQueue, generation: int, offset: int, result: PullResult, held_s: float) -> float:
        """Record a pull's answer and deliver what it found; returns the seconds before the next pull."""
        if self._stop.is_set():
            return 0.0  # closed while the pull was parked: its answer is dropped, nothing is delivered
        if result.pull_status is PullStatus.FOUND:
            self.pulled_messages += len(result.msg_found_list)
        added, delay = self.core.after_pull(pq, generation, offset, result, held_s, self.group)
        if added:
            self._deliver(pq, generation, added)
        return delay

    # --- operations ---

    def _quietly_op(self, op: Op[Any], what: str) -> Op[bool]:
        """Run ``op``; log and swallow any failure (background jobs must survive anything). True when it ended."""
        try:
            yield from op
            return True
        except Exception as e:
            log.warning("%s failed: %s", what, e)
            return False

    def round_op(self) -> Op[None]:
        """The background jobs :attr:`clock` says are due, each on its own (a failure is logged, the others run).
        The first round heartbeats first, so that the brokers list this client when it asks them."""
        client, _ = self._parts()
        if not self._greeted:
            self._greeted = True
            yield from self._quietly_op(client.heartbeat_op(), "first heartbeat")
        due = self.clock.take_due()
        if due.rebalance and not self._stop.is_set():
            yield from self._quietly_op(self.rebalance_op(), f"rebalance of {self.group}")
        if due.commit and not self._stop.is_set():
            yield from self._quietly_op(self.persist_offsets_op(), f"offset commit of {self.group}")
        if due.lock and not self._stop.is_set():
            yield from self._quietly_op(self._renew_locks_op(), f"lock renewal of {self.group}")

    def rebalance_op(self) -> Op[None]:
        """One rebalance round over every subscribed topic (or the manual assignment): every topic's share is
        computed first, then the queues leaving are handed over (each committed), then the new ones are held, so
        that the listener hears of a round's revoked queues, after their commits, before its assigned ones."""
        core = self.core
        self.rebalance_count += 1
        plan: list[tuple[str | None, set[MessageQueue]]] = []
        if core.assigned_mode:
            with core.lock:
                plan.append((None, set(core.manual_queues)))
            topics = None
        else:
            topics = core.topics()
            allocated_all = True
            for topic in topics:
                if self._stop.is_set():
                    return
                wanted_or_none = yield from self._allocate_op(topic)
                if wanted_or_none is None:
                    allocated_all = False
                else:
                    plan.append((topic, wanted_or_none))
            if allocated_all:
                self.clock.allocated_all()
        leaving = {mq for plan_topic, wanted in plan for mq in core.held(plan_topic) - wanted}
        if topics is not None:
            leaving.update(mq for mq in core.held() if mq.topic not in topics)
        revoked: set[MessageQueue] = set()
        for mq in sorted(leaving):
            if (yield from self._drop_op(mq)):
                revoked.add(mq)
        self._changed("on_queues_revoked", revoked)
        assigned: set[MessageQueue] = set()
        for plan_topic, wanted in plan:
            assigned.update((yield from self._hold_op(plan_topic, wanted)))
        self._changed("on_queues_assigned", assigned)

    def _allocate_op(self, topic: str) -> Op[set[MessageQueue] | None]:
        """This instance's share of ``topic``; None when it cannot be computed this round (nothing changes)."""
        client, _ = self._parts()
        try:
            mqs = yield from client.subscribe_queues_op(topic)
        except RouteNotFoundError:
            # A topic created a moment ago (a retry topic made by the first heartbeat or send-back) is not
            # in the nameserver yet: look again soon rather than a whole period later.
            log.debug("no route for %s yet (group %s)", topic, self.group)
            self.clock.retry_soon()
            return None
        if self.config.message_model is MessageModel.BROADCASTING:
            return set(mqs)
        cids = yield from self._consumer_ids_op(topic)
        if cids is None:
            return None
        if client.client_id not in cids:
            # The brokers have not heard us yet (just started, or a broker restarted): heartbeat and wait a
            # round (soon, not a whole period later) rather than drop every queue, which RocketMQ would do.
            yield from client.heartbeat_op()
            self.clock.retry_soon()
            return None
        return set(self.config.allocate_strategy.allocate(self.group, client.client_id, list(mqs), cids))

    def _consumer_ids_op(self, topic: str) -> Op[list[str] | None]:
        """The group's client ids from the first member of the topic's groups that answers; None when none did."""
        client, _ = self._parts()
        target = f"/consumer/ids?group={rq.q(self.group)}"
        for addr in id_query_addrs(client, topic):
            try:
                return (yield from call_op("GET", addr, target, f"consumer ids of {self.group} from {addr}",
                                           parse_consumer_ids))
            except TransportError as e:
                log.info("%s", e)
            except ClientError as e:
                log.warning("consumer ids of %s from %s: %s", self.group, addr, e)
        return None

    def _hold_op(self, topic: str | None, wanted: set[MessageQueue]) -> Op[set[MessageQueue]]:
        """Start holding the queues of ``wanted`` not held yet (of ``topic``; None: of every topic); returns the
        ones now held."""
        new = sorted(wanted - self.core.held(topic))
        if self.locker is not None and new:
            # A queue another instance still holds locked waits for the next round.
            granted = yield from self.locker.lock_op(new)
            new = [mq for mq in new if mq in granted]
        added = set()
        for mq in new:
            if self._stop.is_set():
                break
            try:
                start = yield from self._start_offset_op(mq)
            except ClientError as e:
                log.warning("%s: cannot read the start offset of %s, retrying next round: %s", self.group, mq, e)
                continue
            pq = self.core.add_queue(mq, start)
            if pq is not None:
                log.info("%s now holds %s from offset %d", self.group, mq, start)
                self._launch(pq)
                added.add(mq)
        return added

    def _drop_op(self, mq: MessageQueue) -> Op[bool]:
        """Hand ``mq`` over (its consumed offset committed); False when it stays held for now."""
        locker = self.locker
        if locker is None:
            return (yield from self._hand_over_op(mq))
        # Orderly (sync push consumers only, so this wait blocks a thread, never a loop): wait for the queue's
        # running callback, commit what it consumed, and only then unlock, so the next owner neither runs
        # alongside it nor consumes its last batch again.
        with locker.idle(mq) as idle:
            if not idle:
                log.info("%s: a callback of %s is still running; handing it over at the next rebalance",
                         self.group, mq)
                return False
            dropped = yield from self._hand_over_op(mq)
        yield from self._quietly_op(locker.unlock_op([mq]), f"unlock of {mq}")
        return dropped

    def _hand_over_op(self, mq: MessageQueue) -> Op[bool]:
        """Stop holding ``mq`` and commit its consumed offset; False when it was not held."""
        offset = self.core.drop_queue(mq)
        self._forget(mq)
        if offset < 0:
            return False
        log.info("%s hands over %s at consumed offset %d", self.group, mq, offset)
        yield from self._quietly_op(self.commit_one_op(mq, offset), f"hand-over commit of {mq}")
        return True

    def _start_offset_op(self, mq: MessageQueue) -> Op[int]:
        """``computePullFromWhere``: the committed offset, else the policy's (``consume_from_where``) query."""
        client, puller = self._parts()
        if self.local_store is not None:
            committed = self.local_store.read(mq)
        else:
            committed = yield from puller._committed_op(client, mq)
        plan = plan_start_offset(self.config.consume_from_where, committed, mq.topic)
        if plan.kind == "offset":
            return plan.offset
        if plan.kind == "max":
            return (yield from puller._offset_op(client, mq, "max"))
        return (yield from puller._offset_op(client, mq, "search",
                                             consume_timestamp_ms(self.config, int(time.time() * 1000))))

    def _renew_locks_op(self) -> Op[None]:
        """Lock every held queue again (RocketMQ's ``lockAll``), then let consumption resume where it may."""
        assert self.locker is not None
        yield from self.locker.lock_op(self.core.held())
        if self._on_locked is not None:
            self._on_locked()

    # --- offsets ---

    def commit_one_op(self, mq: MessageQueue, offset: int) -> Op[None]:
        """Commit ``offset`` of ``mq`` now (to the local file when broadcasting)."""
        if self.local_store is not None:
            self.local_store.table.update(mq, offset, increase_only=False)
            self.local_store.persist()
            return
        client, puller = self._parts()
        yield from puller._commit_op(client, mq, offset)

    def persist_offsets_op(self, *, all_held: bool = False) -> Op[list[MessageQueue]]:
        """Send changed offsets (every held one with ``all_held``); returns the queues whose commit failed (they
        stay pending for the next commit)."""
        core = self.core
        dirty = core.offsets.take_dirty()
        if all_held:
            dirty.update(core.snapshot_offsets())
        if not dirty:
            return []
        if self.local_store is not None:
            for mq, off in dirty.items():
                self.local_store.table.update(mq, off, increase_only=False)
            self.local_store.persist()
            return []
        client, puller = self._parts()
        failed: list[MessageQueue] = []
        pending = sorted(dirty)
        try:
            while pending:
                mq = pending[0]
                try:
                    yield from puller._commit_op(client, mq, dirty[mq])
                except ClientError as e:
                    failed.append(mq)
                    log.info("commit of %s at %d failed: %s", mq, dirty[mq], e)
                pending.pop(0)
        finally:  # also when the caller is cancelled in the middle: what was not sent stays pending
            core.offsets.mark_dirty(failed + pending)
        return failed

    def auto_commit_op(self) -> Op[None]:
        """Lite pull: the commit ``poll`` makes every ``auto_commit_interval_s`` (a failure is logged)."""
        if self.clock.poll_commit_due():
            yield from self._quietly_op(self.persist_offsets_op(), f"auto commit of {self.group}")

    def commit_op(self, offsets: Mapping[MessageQueue, int] | None) -> Op[None]:
        """Lite pull's ``commit``: everything ``poll`` returned so far, or exactly ``offsets``.

        Raises:
            ClientError: a commit failed (the offsets stay pending for the next commit).
        """
        core = self.core
        if offsets is None:
            core.ack_polled()
            failed = yield from self.persist_offsets_op()
            if failed:
                raise ClientError(f"commit of {self.group} failed for {sorted(map(str, failed))}; "
                                  "they stay pending for the next commit")
            return
        for mq, off in offsets.items():
            core.offsets.update(mq, off, increase_only=False)
            yield from self.commit_one_op(mq, off)

    def seek_op(self, mq: MessageQueue, offset: int) -> Op[None]:
        """Lite pull's ``seek``: the next pull of the held ``mq`` starts at ``offset``.

        Raises:
            InvalidParameterError: ``mq`` is not held, or ``offset`` is outside ``[min_offset, max_offset]``.
        """
        client, puller = self._parts()
        pq = self.core.pqs.get(mq)
        if pq is None:
            raise InvalidParameterError(f"seek: {mq} is not assigned to this consumer ({self.core.held()})")
        lo = yield from puller._offset_op(client, mq, "min")
        hi = yield from puller._offset_op(client, mq, "max")
        if not isinstance(offset, int) or not lo <= offset <= hi:
            raise InvalidParameterError(f"seek offset {offset!r} of {mq} is outside [{lo}, {hi}]")
        self.core.reset_queue(pq, offset)

    def closing_op(self) -> Op[None]:
        """The requests of a close, each best effort: the final commit of every held queue, the unlock of orderly
        queues (after the commit: the next owner starts after the last message consumed here), and leaving the
        group on every broker, so the other instances rebalance without waiting for our heartbeat timeout. The
        listener hears of every held queue as revoked after the final commit."""
        client, _ = self._parts()
        held = self.core.held()
        yield from self._quietly_op(self.persist_offsets_op(all_held=True), f"final commit of {self.group}")
        self._changed("on_queues_revoked", held)
        if self.locker is not None:
            yield from self._quietly_op(self.locker.unlock_op(self.core.held()), f"unlock of {self.group}'s queues")
        release_group(client, self.group)
        yield from self._quietly_op(client.unregister_consumer_group_op(self.group), f"unregister of {self.group}")
