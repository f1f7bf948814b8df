"""``GroupConsumer``: RocketMQ's lite pull consumer -- subscribe (or assign), ``poll``, commit -- in a group.

How a group shares its queues, where a queue starts and what is committed are
:class:`client._group_engine.GroupEngine`'s, shared with :class:`client.AsyncGroupConsumer`. All pulls go through
:class:`client.PullConsumer` (read/write-split node choice, broker-down isolation, the commit-offset
piggy-back); a bounded set of pull threads serves the held queues round robin, each queue's prefetch bounded by
``pull_threshold_for_queue`` / ``pull_threshold_size_for_queue_mib``.

:class:`SyncEngine` is the engine's threads; ``GroupConsumer`` adds ``poll`` on top of it and
:class:`client.PushConsumer` a worker pool.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from client._consume_core import ITER_COMMIT_CHECK_S, GroupConsumerConfig
from client._consumer import PullConsumer
from client._group_engine import GroupEngine, claim_group, parse_consumer_ids
from client._instance import ClientConfig, ClientInstance, ClientState, with_credentials
from client._metrics import ClientMetrics
from client._rebalance import ProcessQueue
from client._requests import Op
from common.errors import ClientClosedError, ClientError, InvalidParameterError
from common.message import MessageExt, MessageQueue
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["GroupConsumer", "SyncEngine", "parse_consumer_ids"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_NAMED_LOCK = threading.Lock()
_NAMED: dict[tuple[str, str, Credentials | None], ClientInstance] = {}
#: Close waits this long at most for a pull thread; one parked in a broker long poll (up to ``pull_suspend_s``)
#: is abandoned: it ends when the broker answers, and then touches nothing (RocketMQ drops such a response too).
_CLOSE_JOIN_PULL_S = 0.3


def acquire_instance(namesrv_addr: str, instance_name: str | None, config: ClientConfig) -> ClientInstance:
    """The shared client instance, or the one named ``instance_name`` (created on first use)."""
    if instance_name is None:
        return ClientInstance.acquire(namesrv_addr, config)
    key = (namesrv_addr, instance_name, config.credentials)
    with _NAMED_LOCK, ClientInstance._registry_lock:
        inst = _NAMED.get(key)
        if inst is None or inst.state is not ClientState.OPENED:
            inst = ClientInstance(namesrv_addr, config)
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


class SyncEngine(GroupEngine[ClientInstance, PullConsumer]):
    """The threads of one sync consumer's engine: a background thread runs the jobs
    :class:`~client._group_engine.RebalanceClock` says are due, and ``pull_thread_nums`` pull threads serve the
    held queues round robin (see :class:`~client._group_engine.GroupEngine` for the arguments)."""

    _stop: threading.Event
    _wake: threading.Event

    def __init__(self, config: GroupConsumerConfig, namesrv_addr: str, client_config: ClientConfig | None,
                 deliver: Callable[[ProcessQueue, int, list[MessageExt]], None], *,
                 subscribe_retry_topic: bool = False, lock_queues: bool = False,
                 on_locked: Callable[[], None] | None = None) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        super().__init__(config, namesrv_addr, client_config, deliver, subscribe_retry_topic=subscribe_retry_topic,
                         lock_queues=lock_queues, on_locked=on_locked)
        self._sched = _Scheduler()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Acquire the client instance, claim the group on it, start the threads.

        Raises:
            ClientError: already started, closed, or the instance has a consumer of this group.
        """
        with self._lock:
            self._check_startable()
            client = acquire_instance(self.namesrv_addr, self.config.instance_name, self._client_config)
            try:
                claim_group(client, self.group)
            except ClientError:
                client.release()
                raise
            self._opened(client, _BoundPullConsumer(self.group, self.namesrv_addr, client, self.metrics).start())
        self._spawn(self._background, "rebalance")
        for i in range(self.config.pull_thread_nums):
            self._spawn(self._pull_loop, f"pull-{i}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"splitmq-{self.group}-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def close(self, deadline: float) -> None:
        """Stop the threads (waiting until ``deadline``), commit consumed offsets, leave, release the instance."""
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
        client, puller = self._parts()
        client.drive(self.closing_op())
        self._tell_listener()
        puller.close()
        client.release()

    def drive(self, op: Op[T]) -> T:
        """Run ``op`` on the client instance.

        Raises:
            ClientClosedError: the consumer is not started, or is closed.
        """
        client, _ = self.check_open()
        return client.drive(op)

    def rebalance(self) -> None:
        """One rebalance round over every subscribed topic (or the manual assignment), now; then the listener's
        calls it made due."""
        self.drive(self.rebalance_op())
        self._tell_listener()

    def _tell_listener(self) -> None:
        """Make the rebalance listener's calls that are due, in order (unless another thread is making them)."""
        if not self.begin_telling():
            return
        try:
            while changes := self.next_changes():
                for method, queues in changes:
                    self._call_listener(method, queues)
        except BaseException:
            self.end_telling()
            raise

    def _call_listener(self, method: str, queues: set[MessageQueue]) -> None:
        try:
            self.listener_method(method)(queues)
        except Exception:  # the listener's bug must not stop the consumer
            log.exception("%s: rebalance listener %s(%s) failed", self.group, method, sorted(map(str, queues)))

    def auto_commit(self) -> None:
        """Lite pull: commit what ``poll`` acknowledged when ``auto_commit_interval_s`` has passed."""
        self.drive(self.auto_commit_op())

    def commit(self, offsets: Mapping[MessageQueue, int] | None) -> None:
        """See :meth:`client._group_engine.GroupEngine.commit_op`."""
        self.drive(self.commit_op(offsets))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`client._group_engine.GroupEngine.seek_op`."""
        self.drive(self.seek_op(mq, offset))

    # --- threads ---

    def _launch(self, pq: ProcessQueue) -> None:
        self._sched.add(pq)

    def _background(self) -> None:
        client, _ = self._parts()
        while not self._stop.is_set():
            self._wake.clear()
            client.drive(self.round_op())
            self._tell_listener()
            self._wake.wait(self.clock.wait_s())

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
        """One pull of ``pq`` (none while it is paused or over a threshold); the seconds before its next."""
        step = self._pull_start(pq)
        if isinstance(step, float):
            return step
        generation, offset = step
        _, puller = self.check_open()
        cfg = self.config
        began = time.monotonic()
        try:
            r = puller.pull(pq.mq, offset, cfg.pull_batch_size, self.core.filter_of(pq.mq.topic).selector,
                            suspend_timeout_s=cfg.pull_suspend_s or None)
        except ClientError as e:
            log.info("pull of %s at %d failed: %s", pq.mq, offset, e)
            return cfg.pull_delay_on_error_s
        return self._pulled(pq, generation, offset, r, time.monotonic() - began)


class PollSignal:
    """Wakes the threads waiting in ``poll`` when messages arrive, a queue resumes or the consumer closes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, timeout_s: float, ready: Callable[[], bool]) -> None:
        """Wait up to ``timeout_s`` unless ``ready()`` already."""
        with self._cond:
            if not ready():
                self._cond.wait(timeout_s)


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
        self._avail = PollSignal()
        self._engine = SyncEngine(self.config, namesrv_addr, with_credentials(client_config, credentials),
                                  self._on_pulled)

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
        return self

    def __enter__(self) -> GroupConsumer:
        if self.state is ClientState.UNOPENED:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close(acknowledge=exc[0] is None)

    def close(self) -> None:
        """Acknowledge the last poll, commit, leave the group; bounded by ``close_timeout_s``. Idempotent.

        Leaving a ``with`` block by an exception closes without acknowledging the last poll (or the message
        being iterated): what was being processed is not committed, and is delivered again."""
        self._close(acknowledge=True)

    def _close(self, *, acknowledge: bool) -> None:
        if self.state is ClientState.OPENED and acknowledge:
            self._engine.core.ack_polled()
        self._engine.close(time.monotonic() + self.config.close_timeout_s)
        self._avail.wake()

    # --- subscription ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector = "*") -> None:
        """Consume ``topic``: ``*``, ``TagA || TagB``, or a :class:`MessageSelector` (``MessageSelector.sql(...)``:
        the broker filters on message properties); queues come from rebalancing."""
        self._engine.subscribe(topic, sub_expression)

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``; its queues are handed over at the next rebalance (now)."""
        self._engine.unsubscribe(topic)

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Hold exactly ``queues`` (no rebalance, no group sharing)."""
        self._engine.assign(queues)

    def assignment(self) -> set[MessageQueue]:
        """The queues this instance holds now."""
        return self._engine.core.held()

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of ``topic``."""
        return self.pull_consumer.fetch_subscribe_message_queues(topic)

    # --- consuming ---

    def _on_pulled(self, pq: ProcessQueue, generation: int, msgs: list[MessageExt]) -> None:
        self._engine.core.offer(pq, generation, msgs)
        self._avail.wake()

    def poll(self, timeout_s: float = 5.0) -> list[MessageExt]:
        """Messages pulled for this instance, waiting up to ``timeout_s``; ``[]`` when none arrived.

        Calling ``poll`` acknowledges the batch the previous call returned (auto commit sends it later).

        Raises:
            ClientClosedError: the consumer is not started or is closed.
            InvalidParameterError: ``timeout_s`` < 0.
        """
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise InvalidParameterError(f"timeout_s must be >= 0, got {timeout_s!r}")
        engine = self._engine
        engine.check_open()
        engine.core.ack_polled()
        engine.auto_commit()
        deadline = time.monotonic() + timeout_s
        while True:
            msgs = engine.take_polled()
            if msgs:
                return msgs
            left = deadline - time.monotonic()
            if left <= 0 or self.state is not ClientState.OPENED:
                return []
            self._avail.wait(left, engine.core.has_cached)

    def __iter__(self) -> GroupConsumer:
        return self

    def __next__(self) -> MessageExt:
        """The next message, one at a time, waiting as long as it takes (``for msg in consumer:``).

        Asking for the next message acknowledges the one before (as ``poll`` acknowledges the batch before), so
        the automatic commit (every ``auto_commit_interval_s`` with ``auto_commit``, also sent while the loop
        waits) covers only the messages whose loop body finished; :meth:`commit` called in the body covers the
        current message too (call it once the message is handled). The loop ends when the consumer is closed
        (from another thread, or a callback). Nothing is taken from the cache while waiting, so an interrupted
        wait loses nothing; an exception that leaves the ``with`` block leaves the current message uncommitted.

        Raises:
            StopIteration: the consumer is closed (or was never started).
        """
        engine = self._engine
        if self.state is not ClientState.OPENED:
            raise StopIteration
        engine.core.ack_polled()
        while True:
            try:
                engine.auto_commit()
            except ClientClosedError:  # closed by another thread or task meanwhile
                raise StopIteration from None
            msgs = engine.take_polled(1)
            if msgs:
                return msgs[0]
            if self.state is not ClientState.OPENED:
                raise StopIteration
            self._avail.wait(min(ITER_COMMIT_CHECK_S, self.config.auto_commit_interval_s), self._ready)

    def _ready(self) -> bool:
        return self.state is not ClientState.OPENED or self._engine.core.has_cached()

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Commit every message returned by ``poll`` so far (or exactly ``offsets``) to the brokers, now.

        Raises:
            ClientError: a commit failed (the offsets stay pending for the next commit).
        """
        self._engine.commit(offsets)

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq`` on the broker (-1 when none)."""
        return self.pull_consumer.fetch_consume_offset(mq)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Next ``poll`` of ``mq`` starts at ``offset``.

        Raises:
            InvalidParameterError: ``mq`` is not held, or ``offset`` is outside ``[min_offset, max_offset]``.
        """
        self._engine.seek(mq, offset)

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
        self._avail.wake()

    def rebalance_now(self) -> None:
        """Rebalance at once instead of at the next period (synchronously)."""
        self._engine.rebalance()

    def stats(self) -> dict[str, Any]:
        """See :meth:`client._group_engine.GroupEngine.stats` (docs/METRICS.md)."""
        return self._engine.stats()

    def __repr__(self) -> str:
        return f"GroupConsumer({self.group!r}, state={self.state.value}, queues={len(self.assignment())})"
