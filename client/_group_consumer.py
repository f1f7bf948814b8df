"""``GroupConsumer``: RocketMQ's lite pull consumer -- subscribe (or assign), ``poll``, commit -- in a group.

Clustering: every ``rebalance_interval_s`` each instance reads the group's client ids from a broker
(``GET /consumer/ids``, fed by the heartbeats of the client instance) and the topic's queues from the route,
and takes its share with the allocation strategy (AllocateMessageQueueAveragely by default). A queue that
leaves is committed first (its consumed offset, never the prefetched one); a queue that arrives starts from
the committed offset, so a hand-over skips nothing (it may repeat what was in flight: at least once).
Broadcasting: every instance holds every queue and keeps offsets in a local file.

All pulls go through :class:`client.PullConsumer` (read/write-split node choice, broker-down isolation, the
commit-offset piggy-back); a bounded set of pull threads serves the held queues round robin, each queue's
prefetch bounded by ``pull_threshold_for_queue`` / ``pull_threshold_size_for_queue_mib``.

:class:`SyncEngine` is the machinery (rebalance, pulls, commits); ``GroupConsumer`` adds ``poll`` on top of
it and :class:`client.PushConsumer` a worker pool.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import httpx

from client import _requests as rq
from client._consume_core import GroupConsumerConfig, GroupCore, consume_timestamp_ms, run_quietly
from client._consumer import PullConsumer
from client._instance import ClientConfig, ClientInstance, ClientState, with_credentials
from client._metrics import ClientMetrics
from client._offset_store import LocalFileOffsetStore
from client._orderly import QueueLocker
from client._rebalance import MessageModel, ProcessQueue, plan_start_offset, retry_topic
from common.codes import MASTER_ID, PullStatus
from common.errors import ClientClosedError, ClientError, InvalidParameterError, RouteNotFoundError
from common.message import MessageExt, MessageQueue
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["GroupConsumer", "SyncEngine", "consumer_ids_url", "parse_consumer_ids"]

log = logging.getLogger(__name__)

_NAMED_LOCK = threading.Lock()
_NAMED: dict[tuple[str, str, Credentials | None], ClientInstance] = {}
_GROUPS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()
_FLOW_CONTROL_DELAY_S = 0.05  # RocketMQ PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL
_PAUSED_DELAY_S = 0.1
#: Close waits this long at most for a pull thread; one parked in a broker long poll (up to ``pull_suspend_s``)
#: is abandoned: it ends when the broker answers, and then touches nothing (RocketMQ drops such a response too).
_CLOSE_JOIN_PULL_S = 0.3
#: A topic expected to get queues (a send-back created ``%RETRY%<group>``; a subscribed topic without a route
#: yet) is looked at again this soon, doubling up to ``rebalance_interval_s``.
_SOON_FIRST_S = 1.0


def consumer_ids_url(addr: str, group: str) -> str:
    return f"http://{addr}/consumer/ids?group={rq.q(group)}"


def parse_consumer_ids(resp: httpx.Response, addr: str) -> list[str]:
    """``{"clientIds": [...]}`` -> the sorted ids.

    Raises:
        ProtocolViolationError: the answer lacks a list of strings.
    """
    obj = rq.json_of(resp, addr)
    ids = obj.get("clientIds")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise rq.ProtocolViolationError(f"{addr} answered consumer ids without a 'clientIds' list", broker_addr=addr)
    return sorted(ids)


def id_query_addrs(client: Any, topic: str) -> list[str]:
    """Where to ask for a group's client ids: a member of each group of the topic, masters first."""
    route = client.topic_route(topic)
    if route is None:
        return []
    out = []
    for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
        if bd.broker_addrs:
            out.append(bd.broker_addrs.get(MASTER_ID) or bd.broker_addrs[min(bd.broker_addrs)])
    return out


def claim_group(instance: Any, group: str) -> None:
    """One consumer per group per client instance: two would compute the same share and pull it twice."""
    with _GROUPS_LOCK:
        groups = _GROUPS.setdefault(instance, set())
        if group in groups:
            raise ClientError(f"consumer group {group} already has a consumer on client instance "
                              f"{instance.client_id}; give this one another instance_name")
        groups.add(group)


def release_group(instance: Any, group: str) -> None:
    with _GROUPS_LOCK:
        _GROUPS.get(instance, set()).discard(group)
    # Leave the group on the brokers now, so the other instances rebalance without us at once.
    instance.unregister_consumer_group(group)


def acquire_instance(namesrv_addr: str, cfg: GroupConsumerConfig, client_config: ClientConfig | None
                     ) -> ClientInstance:
    """The shared client instance, or the one named ``cfg.instance_name`` (created on first use)."""
    ccfg = attrs.evolve(client_config or ClientConfig(), heartbeat_broker_interval_s=cfg.heartbeat_interval_s)
    if cfg.instance_name is None:
        return ClientInstance.acquire(namesrv_addr, ccfg)
    key = (namesrv_addr, cfg.instance_name, ccfg.credentials)
    with _NAMED_LOCK, ClientInstance._registry_lock:
        inst = _NAMED.get(key)
        if inst is None or inst.state is not ClientState.OPENED:
            inst = ClientInstance(namesrv_addr, ccfg)
            inst._start()
            _NAMED[key] = inst
        inst.refcount += 1
        return inst


class _BoundPullConsumer(PullConsumer):
    """A PullConsumer on a given client instance (the pull path, offsets and range queries are reused).

    It borrows the engine's reference to the instance and holds none of its own: ``close`` must not release
    it (a second release closed the instance shared with every other client of the process).
    """

    def __init__(self, group: str, namesrv_addr: str, instance: ClientInstance, metrics: ClientMetrics) -> None:
        super().__init__(group, namesrv_addr)
        self._bound = instance
        self._metrics = metrics  # the engine's: its consumer's stats() show the pulls

    def _open(self) -> None:
        self._client = self._bound
        self._client.register_consumer(self.group)
        self._metrics.bind(self._client)
        self._state = ClientState.OPENED

    def close(self) -> None:
        """Mark closed; the engine releases the instance it acquired."""
        with self._lock:
            self._state = ClientState.CLOSED


class _Scheduler:
    """Queues due for a pull, earliest first; pull threads take from it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, ProcessQueue]] = []
        self._seq = itertools.count()
        self._stopped = False

    def add(self, pq: ProcessQueue, delay_s: float = 0.0) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), pq))
            self._cond.notify()

    def next(self, timeout_s: float) -> ProcessQueue | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    return heapq.heappop(self._heap)[2]
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                if wait <= 0 or (now >= deadline):
                    return None
                self._cond.wait(wait)
            return None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class SyncEngine:
    """Rebalance, pull threads and commits of one sync consumer.

    Args:
        config: the consumer's settings.
        namesrv_addr: nameservers, ``;``-separated.
        client_config: settings of the client instance (when this consumer creates it).
        deliver: called from a pull thread with ``(pq, generation, messages)`` after each pull that found some.
        subscribe_retry_topic: also consume ``%RETRY%<group>`` (push consumers in clustering mode).
        lock_queues: lock queues on their masters before holding them, renew the locks, unlock on hand-over and
            close (orderly push consumers in clustering mode; see :mod:`client._orderly`).
        on_locked: called after each renewal of the locks (consumption of queues locked again resumes).
    """

    def __init__(self, config: GroupConsumerConfig, namesrv_addr: str, client_config: ClientConfig | None,
                 deliver: Callable[[ProcessQueue, int, list[MessageExt]], None], *,
                 subscribe_retry_topic: bool = False, lock_queues: bool = False,
                 on_locked: Callable[[], None] | None = None) -> None:
        self.config = config
        self.namesrv_addr = namesrv_addr
        self.core = GroupCore(config)
        self._client_config = client_config
        self._deliver = deliver
        self._retry = subscribe_retry_topic and config.message_model is MessageModel.CLUSTERING
        self._lock_queues = lock_queues and config.message_model is MessageModel.CLUSTERING
        self._on_locked = on_locked
        self.locker: QueueLocker | None = None
        """The queue locks (orderly push consumers in clustering mode), set at start."""
        self.state = ClientState.UNOPENED
        self.client: ClientInstance | None = None
        self.puller: PullConsumer | None = None
        self.local_store: LocalFileOffsetStore | None = None
        self._sched = _Scheduler()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
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
        self._soon_gap_s = _SOON_FIRST_S
        self._soon_at: float | None = None
        """When the next out-of-period rebalance is due (None: none asked for)."""
        self._last_soon_run = float("-inf")

    @property
    def group(self) -> str:
        return self.config.group

    # --- lifecycle ---

    def start(self) -> None:
        with self._lock:
            if self.state is ClientState.CLOSED:
                raise ClientClosedError(f"consumer {self.group} is closed; create a new one")
            if self.state is ClientState.OPENED:
                raise ClientError(f"consumer {self.group} is already started")
            client = acquire_instance(self.namesrv_addr, self.config, self._client_config)
            try:
                claim_group(client, self.group)
            except ClientError:
                client.release()
                raise
            self.client = client
            self.puller = _BoundPullConsumer(self.group, self.namesrv_addr, client, self.metrics).start()
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
            self.state = ClientState.OPENED
        self._spawn(self._background, "rebalance")
        for i in range(self.config.pull_thread_nums):
            self._spawn(self._pull_loop, f"pull-{i}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"splitmq-{self.group}-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def check_open(self) -> tuple[ClientInstance, PullConsumer]:
        if self.state is not ClientState.OPENED or self.client is None or self.puller is None:
            raise ClientClosedError(f"consumer {self.group} is {self.state.value.lower()}: start it first")
        return self.client, self.puller

    def close(self, deadline: float) -> None:
        """Stop the threads (waiting until ``deadline``), commit consumed offsets, release the instance."""
        with self._lock:
            if self.state is not ClientState.OPENED:
                self.state = ClientState.CLOSED
                return
            self.state = ClientState.CLOSED
        self._stop.set()
        self._wake.set()
        self._sched.stop()
        # A pull thread may be parked in a long poll: wait briefly, then leave it (it exits on its answer).
        join_until = min(deadline, time.monotonic() + _CLOSE_JOIN_PULL_S)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, join_until - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive() and t is not threading.current_thread()]
        if stuck:
            log.debug("%s: %d threads still in a request at close (abandoned): %s", self.group, len(stuck), stuck)
        run_quietly(lambda: self.persist_offsets(all_held=True), f"final commit of {self.group}", log)
        if self.locker is not None:  # after the commit: the next owner starts after the last message consumed
            locker = self.locker
            run_quietly(lambda: locker.unlock(self.core.held()), f"unlock of {self.group}'s queues", log)
        assert self.client is not None and self.puller is not None
        release_group(self.client, self.group)
        self.puller.close()
        self.client.release()

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

    def wake_rebalance(self) -> None:
        """Rebalance now (a subscription changed)."""
        with self._lock:
            self._soon_at = time.monotonic()
        self._wake.set()

    def expect_queues(self, topic: str) -> None:
        """``topic`` should have queues for this group now (a send-back just wrote to ``%RETRY%<group>``): when
        none are known yet, rebalance at once instead of at the next period -- at most once per
        ``_SOON_FIRST_S``, however many send-backs ask."""
        client = self.client
        if client is None or self._stop.is_set() or client.routes.subscribe_info(topic):
            return
        with self._lock:
            at = max(time.monotonic(), self._last_soon_run + _SOON_FIRST_S)
            if self._soon_at is None or at < self._soon_at:
                self._soon_at = at
        self._wake.set()

    def _rebalance_soon(self) -> None:
        """A subscribed topic has no route yet: rebalance again after a gap that doubles up to the period."""
        with self._lock:
            at = time.monotonic() + self._soon_gap_s
            self._soon_gap_s = min(self._soon_gap_s * 2, self.config.rebalance_interval_s)
            if self._soon_at is None or at < self._soon_at:
                self._soon_at = at

    # --- background: rebalance + periodic commit ---

    def _background(self) -> None:
        cfg = self.config
        client, _ = self.check_open()
        run_quietly(client.send_heartbeat_to_all_brokers, "first heartbeat", log)
        next_rebalance = 0.0
        next_commit = time.monotonic() + cfg.auto_commit_interval_s
        next_lock = time.monotonic() + cfg.rebalance_lock_interval_s
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                soon_due = self._soon_at is not None and now >= self._soon_at
                if soon_due:
                    self._soon_at = None
                    self._last_soon_run = now
            if now >= next_rebalance or soon_due:
                run_quietly(self.rebalance, f"rebalance of {self.group}", log)
                next_rebalance = time.monotonic() + cfg.rebalance_interval_s
            if cfg.auto_commit and now >= next_commit:
                run_quietly(self.persist_offsets, f"offset commit of {self.group}", log)
                next_commit = time.monotonic() + cfg.auto_commit_interval_s
            if self.locker is not None and now >= next_lock:
                run_quietly(self._renew_locks, f"lock renewal of {self.group}", log)
                next_lock = time.monotonic() + cfg.rebalance_lock_interval_s
            due = min(next_rebalance, next_commit if cfg.auto_commit else next_rebalance)
            if self.locker is not None:
                due = min(due, next_lock)
            with self._lock:
                if self._soon_at is not None:
                    due = min(due, self._soon_at)
            self._wake.wait(max(0.01, due - time.monotonic()))

    def _renew_locks(self) -> None:
        """Lock every held queue again (RocketMQ's ``lockAll``), then let consumption resume where it may."""
        assert self.locker is not None
        self.locker.lock(self.core.held())
        if self._on_locked is not None:
            self._on_locked()

    def rebalance(self) -> None:
        """One rebalance round over every subscribed topic (or the manual assignment)."""
        client, _ = self.check_open()
        core = self.core
        self.rebalance_count += 1
        if core.assigned_mode:
            with core.lock:
                wanted = set(core.manual_queues)
            self._apply(None, wanted)
            return
        topics = core.topics()
        resolved = True
        for topic in topics:
            if self._stop.is_set():
                return
            wanted_or_none = self._allocate(client, topic)
            if wanted_or_none is not None:
                self._apply(topic, wanted_or_none)
            else:
                resolved = False
        if resolved:
            with self._lock:
                self._soon_gap_s = _SOON_FIRST_S
        for mq in core.held():
            if mq.topic not in topics:
                self._drop(mq)

    def _allocate(self, client: ClientInstance, topic: str) -> set[MessageQueue] | None:
        try:
            mqs = client.subscribe_queues_or_fetch(topic)
        except RouteNotFoundError:
            # A topic created a moment ago (a retry topic made by the first heartbeat or send-back) is not
            # in the nameserver yet: look again soon rather than a whole period later.
            log.debug("no route for %s yet (group %s)", topic, self.group)
            self._rebalance_soon()
            return None
        if self.config.message_model is MessageModel.BROADCASTING:
            return set(mqs)
        cids = self._consumer_ids(client, topic)
        if cids is None:
            return None
        if client.client_id not in cids:
            # The brokers have not heard us yet (just started, or a broker restarted): heartbeat and wait a
            # round (soon, not a whole period later) rather than drop every queue, which RocketMQ would do.
            client.send_heartbeat_to_all_brokers()
            self._rebalance_soon()
            return None
        return set(self.config.allocate_strategy.allocate(self.group, client.client_id, list(mqs), cids))

    def _consumer_ids(self, client: ClientInstance, topic: str) -> list[str] | None:
        for addr in id_query_addrs(client, topic):
            try:
                return parse_consumer_ids(client.http.get(consumer_ids_url(addr, self.group)), addr)
            except httpx.HTTPError as e:
                log.info("consumer ids of %s from %s: %s", self.group, addr, rq.map_transport_error(e, addr, "ids"))
            except ClientError as e:
                log.warning("consumer ids of %s from %s: %s", self.group, addr, e)
        return None

    def _apply(self, topic: str | None, wanted: set[MessageQueue]) -> None:
        held = self.core.held(topic)
        for mq in sorted(held - wanted):
            self._drop(mq)
        new = sorted(wanted - held)
        if self.locker is not None and new:
            granted = self.locker.lock(new)  # a queue another instance still holds waits for the next round
            new = [mq for mq in new if mq in granted]
        for mq in new:
            if self._stop.is_set():
                return
            try:
                start = self.start_offset(mq)
            except ClientError as e:
                log.warning("%s: cannot read the start offset of %s, retrying next round: %s", self.group, mq, e)
                continue
            pq = self.core.add_queue(mq, start)
            if pq is not None:
                log.info("%s now holds %s from offset %d", self.group, mq, start)
                self._sched.add(pq)

    def _drop(self, mq: MessageQueue) -> None:
        locker = self.locker
        if locker is None:
            self._hand_over(mq)
            return
        # Orderly: wait for the queue's running callback, commit what it consumed, and only then unlock, so the
        # next owner neither runs alongside it nor consumes its last batch again.
        with locker.idle(mq) as idle:
            if not idle:
                log.info("%s: a callback of %s is still running; handing it over at the next rebalance",
                         self.group, mq)
                return
            self._hand_over(mq)
        run_quietly(lambda: locker.unlock([mq]), f"unlock of {mq}", log)

    def _hand_over(self, mq: MessageQueue) -> None:
        offset = self.core.drop_queue(mq)
        if offset < 0:
            return
        log.info("%s hands over %s at consumed offset %d", self.group, mq, offset)
        run_quietly(lambda: self.commit_one(mq, offset), f"hand-over commit of {mq}", log)

    def start_offset(self, mq: MessageQueue) -> int:
        """``computePullFromWhere`` with I/O: committed offset, else the policy's query."""
        _, puller = self.check_open()
        if self.local_store is not None:
            committed = self.local_store.read(mq)
        else:
            committed = puller.fetch_consume_offset(mq)
        plan = plan_start_offset(self.config.consume_from_where, committed, mq.topic)
        if plan.kind == "offset":
            return plan.offset
        if plan.kind == "max":
            return puller.max_offset(mq)
        return puller.search_offset(mq, consume_timestamp_ms(self.config, int(time.time() * 1000)))

    # --- offsets ---

    def commit_one(self, mq: MessageQueue, offset: int) -> None:
        if self.local_store is not None:
            self.local_store.table.update(mq, offset, increase_only=False)
            self.local_store.persist()
            return
        _, puller = self.check_open() if self.state is ClientState.OPENED else (None, self.puller)
        assert puller is not None
        puller.update_consume_offset(mq, offset)

    def persist_offsets(self, *, all_held: bool = False) -> list[MessageQueue]:
        """Send changed offsets (every held one with ``all_held``); returns the queues whose commit failed."""
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
        puller = self.puller
        assert puller is not None
        failed = []
        for mq, off in sorted(dirty.items()):
            try:
                puller.update_consume_offset(mq, off)
            except ClientError as e:
                failed.append(mq)
                log.info("commit of %s at %d failed: %s", mq, off, e)
        core.offsets.mark_dirty(failed)
        return failed

    # --- pulls ---

    def schedule(self, pq: ProcessQueue, delay_s: float = 0.0) -> None:
        self._sched.add(pq, delay_s)

    def _pull_loop(self) -> None:
        while not self._stop.is_set():
            pq = self._sched.next(0.5)
            if pq is None or not self.core.live(pq):
                continue
            try:
                delay = self._pull_once(pq)
            except Exception as e:  # a pull thread must survive anything a server answers
                if self._stop.is_set():
                    return
                log.warning("pull of %s failed: %s", pq.mq, e)
                delay = self.config.pull_delay_on_error_s
            if self.core.live(pq) and not self._stop.is_set():
                self._sched.add(pq, delay)

    def _pull_once(self, pq: ProcessQueue) -> float:
        cfg = self.config
        core = self.core
        if pq.paused:
            return _PAUSED_DELAY_S
        with core.lock:
            why = pq.over_threshold(cfg.pull_threshold_for_queue, cfg.threshold_bytes)
            gen, offset = pq.generation, pq.next_pull_offset
        if why is not None:
            self.flow_control_count += 1
            log.debug("flow control on %s: %s", pq.mq, why)
            return _FLOW_CONTROL_DELAY_S
        _, puller = self.check_open()
        flt = core.filter_of(pq.mq.topic)
        began = time.monotonic()
        self.pull_count += 1
        try:
            r = puller.pull(pq.mq, offset, cfg.pull_batch_size, flt.selector,
                            suspend_timeout_s=cfg.pull_suspend_s or None)
        except ClientError as e:
            log.info("pull of %s at %d failed: %s", pq.mq, offset, e)
            return cfg.pull_delay_on_error_s
        if self._stop.is_set():
            return 0.0  # closed while the pull was parked: its answer is dropped, nothing is delivered
        if r.pull_status is PullStatus.FOUND:
            self.pulled_messages += len(r.msg_found_list)
        added, delay = core.after_pull(pq, gen, offset, r, time.monotonic() - began, self.group)
        if added:
            self._deliver(pq, gen, added)
        return delay


class GroupConsumer:
    """A lite pull consumer in a consumer group (RocketMQ ``DefaultLitePullConsumer``).

    ::

        with GroupConsumer("my-group", "127.0.0.1:9876", consume_from_where="FIRST_OFFSET") as c:
            c.subscribe("TopicTest", "TagA || TagB")
            while running:
                for msg in c.poll(timeout_s=1.0):
                    handle(msg)          # a crash before the next poll re-delivers this batch

    Args:
        group: consumer group.
        namesrv_addr: nameservers, ``;``-separated.
        client_config: settings of the client instance (when this consumer creates it).
        credentials: the account that signs every request (``client.Credentials``); None: unsigned.
        **kwargs: :class:`GroupConsumerConfig` fields (``message_model``, ``consume_from_where``,
            ``allocate_strategy``, ``heartbeat_interval_s``, ``rebalance_interval_s``, ``auto_commit``,
            ``pull_threshold_for_queue``, ``instance_name``...).
    """

    def __init__(self, group: str, namesrv_addr: str, *, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        self.config = GroupConsumerConfig(group, **kwargs)
        self._avail = threading.Condition()
        self._engine = SyncEngine(self.config, namesrv_addr, with_credentials(client_config, credentials),
                                  self._on_pulled)
        self._next_auto_commit = 0.0

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    @property
    def state(self) -> ClientState:
        """UNOPENED until ``start``, then OPENED, then CLOSED."""
        return self._engine.state

    @property
    def client(self) -> ClientInstance:
        """The client instance this consumer uses."""
        return self._engine.check_open()[0]

    @property
    def pull_consumer(self) -> PullConsumer:
        """The pull machinery underneath (``pull_from_which_node_table`` and friends)."""
        return self._engine.check_open()[1]

    def start(self) -> GroupConsumer:
        """Join the group and start pulling. Raises ClientError when already started or closed."""
        self._engine.start()
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_s
        return self

    def __enter__(self) -> GroupConsumer:
        if self.state is ClientState.UNOPENED:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Acknowledge the last poll, commit, leave the group; bounded by ``close_timeout_s``. Idempotent."""
        if self.state is ClientState.OPENED:
            self._engine.core.ack_polled()
        self._engine.close(time.monotonic() + self.config.close_timeout_s)
        with self._avail:
            self._avail.notify_all()

    # --- subscription ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector = "*") -> None:
        """Consume ``topic``: ``*``, ``TagA || TagB``, or a :class:`MessageSelector` (``MessageSelector.sql(...)``:
        the broker filters on message properties); queues come from rebalancing."""
        flt = self._engine.core.subscribe(topic, sub_expression)
        if self.state is ClientState.OPENED:
            self.client.consumer_uses_topic(self.group, topic, flt.selector)
            self._engine.wake_rebalance()

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``; its queues are handed over at the next rebalance (now)."""
        self._engine.core.unsubscribe(topic)
        self._engine.wake_rebalance()

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Hold exactly ``queues`` (no rebalance, no group sharing)."""
        self._engine.core.assign(queues)
        self._engine.wake_rebalance()

    def assignment(self) -> set[MessageQueue]:
        """The queues this instance holds now."""
        return self._engine.core.held()

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of ``topic``."""
        return self.pull_consumer.fetch_subscribe_message_queues(topic)

    # --- consuming ---

    def _on_pulled(self, pq: ProcessQueue, generation: int, msgs: list[MessageExt]) -> None:
        self._engine.core.offer(pq, generation, msgs)
        with self._avail:
            self._avail.notify()

    def poll(self, timeout_s: float = 5.0) -> list[MessageExt]:
        """Messages pulled for this instance, waiting up to ``timeout_s``; ``[]`` when none arrived.

        Calling ``poll`` acknowledges the batch the previous call returned (auto commit sends it later).

        Raises:
            ClientClosedError: the consumer is not started or is closed.
            InvalidParameterError: ``timeout_s`` < 0.
        """
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise InvalidParameterError(f"timeout_s must be >= 0, got {timeout_s!r}")
        self._engine.check_open()
        core = self._engine.core
        core.ack_polled()
        if self.config.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_s
            run_quietly(self._engine.persist_offsets, f"auto commit of {self.group}", log)
        deadline = time.monotonic() + timeout_s
        while True:
            msgs = core.take_polled(self.config.max_poll_messages)
            if msgs:
                metrics = self._engine.metrics
                if metrics.on:
                    for topic, n in collections.Counter(m.topic for m in msgs).items():
                        metrics.consumed_messages(topic, n)
                return msgs
            left = deadline - time.monotonic()
            if left <= 0 or self.state is not ClientState.OPENED:
                return []
            with self._avail:
                if not core.has_cached():
                    self._avail.wait(left)

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Commit every message returned by ``poll`` so far (or exactly ``offsets``) to the brokers, now.

        Raises:
            ClientError: a commit failed (the offsets stay pending for the next commit).
        """
        engine = self._engine
        engine.check_open()
        if offsets is None:
            engine.core.ack_polled()
            failed = engine.persist_offsets()
            if failed:
                raise ClientError(f"commit of {self.group} failed for {sorted(map(str, failed))}; "
                                  "they stay pending for the next commit")
            return
        for mq, off in offsets.items():
            engine.core.offsets.update(mq, off, increase_only=False)
            engine.commit_one(mq, off)

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq`` on the broker (-1 when none)."""
        return self.pull_consumer.fetch_consume_offset(mq)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Next ``poll`` of ``mq`` starts at ``offset``.

        Raises:
            InvalidParameterError: ``mq`` is not held, or ``offset`` is outside ``[min_offset, max_offset]``.
        """
        puller = self.pull_consumer
        pq = self._engine.core.pqs.get(mq)
        if pq is None:
            raise InvalidParameterError(f"seek: {mq} is not assigned to this consumer ({self.assignment()})")
        lo, hi = puller.min_offset(mq), puller.max_offset(mq)
        if not isinstance(offset, int) or not lo <= offset <= hi:
            raise InvalidParameterError(f"seek offset {offset!r} of {mq} is outside [{lo}, {hi}]")
        self._engine.core.reset_queue(pq, offset)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        """Next ``poll`` of ``mq`` starts at its smallest stored offset."""
        self.seek(mq, self.pull_consumer.min_offset(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        """Next ``poll`` of ``mq`` starts after its last stored message."""
        self.seek(mq, self.pull_consumer.max_offset(mq))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop pulling and returning ``queues`` (they stay held) until :meth:`resume`."""
        self._engine.core.set_paused(queues, True)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """Pull and return ``queues`` again (what was pulled before the pause comes first)."""
        self._engine.core.set_paused(queues, False)
        with self._avail:
            self._avail.notify_all()

    def rebalance_now(self) -> None:
        """Rebalance at once instead of at the next period (synchronously)."""
        self._engine.rebalance()

    def stats(self) -> dict[str, Any]:
        """See :meth:`SyncEngine.stats` (docs/METRICS.md)."""
        return self._engine.stats()

    def __repr__(self) -> str:
        return f"GroupConsumer({self.group!r}, state={self.state.value}, queues={len(self.assignment())})"
