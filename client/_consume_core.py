"""State and decisions shared by the group consumers (lite pull, sync and async) and the push consumer.

No I/O here: the shells fetch client ids, offsets and messages and hand them to :class:`GroupCore`, which owns
the subscriptions, the queues this instance holds (one :class:`ProcessQueue` each), the offset table and the
cache of pulled batches waiting for ``poll``. One lock guards it all; every method takes it briefly.

Offsets (lite pull): a batch returned by ``poll`` stays "in flight" in its queue until the next ``poll``,
``commit`` or ``close`` acknowledges it, so a periodic or hand-over commit never covers a batch the user may
still be processing; a crash re-delivers it instead (at least once, as RocketMQ's lite pull consumer).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import attrs

from client._offset_store import OffsetTable
from client._rebalance import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueStrategy,
    ConsumeFromWhere,
    MessageModel,
    ProcessQueue,
    TagFilter,
    restore_retry_topic,
)
from client._requests import PullResult
from client._routing import pull_refused
from common.codes import PullStatus
from common.message import MessageExt, MessageQueue
from common.properties import validate_group, validate_topic
from common.selector import MessageSelector

__all__ = ["ITER_COMMIT_CHECK_S", "GroupConsumerConfig", "GroupCore", "PulledBatch", "RebalanceListener", "consume_timestamp_ms",
           "next_pull_delay_s"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: The least wait before pulling a queue again after an answer without messages that the broker did not hold
#: (long polling off, or a slave's refusal): pulling it at once would spin on the same answer.
NO_NEW_MIN_DELAY_S = 0.05
#: A consumer's iterator waiting for messages wakes at least this often to send a due automatic commit.
ITER_COMMIT_CHECK_S = 1.0


def _positive(_: Any, attribute: Any, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _non_negative(_: Any, attribute: Any, value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _check_strategy(_: Any, attribute: Any, value: object) -> None:
    if not callable(getattr(value, "allocate", None)):
        raise ValueError(f"allocate_strategy must have an allocate() method, got {type(value).__name__}")


class RebalanceListener:
    """Told when a rebalance changes the queues a group consumer holds (Kafka's ``ConsumerRebalanceListener``,
    named for RocketMQ's queues). Subclass it and override either method; pass an instance as
    ``rebalance_listener=`` to :class:`client.GroupConsumer` or :class:`client.AsyncGroupConsumer`.

    The order, for each rebalance round: the queues leaving this instance are committed (their consumed offset),
    then :meth:`on_queues_revoked` gets them, then the new queues are held (``assignment()`` includes them; their
    pulls have started) and :meth:`on_queues_assigned` gets them. ``close`` commits every held queue, then calls
    :meth:`on_queues_revoked` with them. Empty sets are not told. Calls come one at a time, in that order, from
    the consumer's background thread (task), or from the caller of ``rebalance_now`` or ``close``. An exception
    in a callback is logged and swallowed: the consumer goes on. On :class:`client.AsyncGroupConsumer` a
    callback may be a coroutine function (it is awaited); on the others it must not block for long (it delays
    the next rebalance and commit).
    """

    def on_queues_revoked(self, queues: set[MessageQueue]) -> Awaitable[None] | None:
        """``queues`` are no longer held here; their consumed offsets are committed (best effort: a failed commit
        is logged, and the next owner may re-read what was consumed since the last good one)."""
        return None

    def on_queues_assigned(self, queues: set[MessageQueue]) -> Awaitable[None] | None:
        """``queues`` are held here from now on, each from its committed offset (or ``consume_from_where``)."""
        return None


def _check_listener(_: Any, attribute: Any, value: object) -> None:
    if value is not None and not all(callable(getattr(value, name, None))
                                     for name in ("on_queues_revoked", "on_queues_assigned")):
        raise ValueError(f"rebalance_listener must have on_queues_revoked() and on_queues_assigned() methods "
                         f"(subclass client.RebalanceListener), got {type(value).__name__}")


@attrs.frozen
class GroupConsumerConfig:
    """Settings of a group consumer (lite pull) or push consumer; RocketMQ's defaults."""

    group: str = attrs.field(validator=lambda _, __, v: validate_group(v))
    """Consumer group."""
    message_model: MessageModel = attrs.field(default=MessageModel.CLUSTERING, converter=MessageModel)
    """CLUSTERING (queues divided among the group's instances) or BROADCASTING (every instance gets all)."""
    consume_from_where: ConsumeFromWhere = attrs.field(default=ConsumeFromWhere.LAST_OFFSET,
                                                       converter=ConsumeFromWhere)
    """Start of a queue the group never committed: LAST_OFFSET, FIRST_OFFSET or TIMESTAMP."""
    consume_timestamp_ms: int | None = None
    """For TIMESTAMP: ms since the epoch (None: 30 minutes before start, as RocketMQ)."""
    allocate_strategy: AllocateMessageQueueStrategy = attrs.field(factory=AllocateMessageQueueAveragely,
                                                                  validator=_check_strategy)
    """How the instances divide the queues."""
    heartbeat_interval_s: float = attrs.field(default=30.0, validator=_positive)
    """Heartbeat period of the client instance this consumer creates (a shared one keeps its own)."""
    rebalance_interval_s: float = attrs.field(default=20.0, validator=_positive)
    """Period of the rebalance (a joining or leaving instance is seen within it)."""
    auto_commit: bool = True
    """Commit consumed offsets every ``auto_commit_interval_s`` (lite pull: from ``poll``)."""
    auto_commit_interval_s: float = attrs.field(default=5.0, validator=_positive)
    """``persistConsumerOffsetInterval``."""
    pull_batch_size: int = attrs.field(default=32, validator=_positive)
    """Messages per pull at most."""
    max_poll_messages: int = attrs.field(default=64, validator=_positive)
    """Messages one ``poll`` returns at most."""
    pull_threshold_for_queue: int = attrs.field(default=1000, validator=_positive)
    """Cached messages of one queue above which its pulls pause (flow control)."""
    pull_threshold_size_for_queue_mib: int = attrs.field(default=100, validator=_positive)
    """Cached body MiB of one queue above which its pulls pause."""
    pull_suspend_s: float = attrs.field(default=5.0, validator=_non_negative)
    """Long polling: how long the broker may hold a pull that finds nothing (0 = no long polling)."""
    pull_thread_nums: int = attrs.field(default=8, validator=_positive)
    """Pull threads of a sync consumer (queues are pulled round robin by them)."""
    pull_delay_on_error_s: float = attrs.field(default=1.0, validator=_non_negative)
    """``pullTimeDelayMillsWhenException``."""
    rebalance_lock_interval_s: float = attrs.field(default=20.0, validator=_positive)
    """Orderly push consumers: how often held queues are locked again on their masters (``rebalanceLockInterval``;
    keep it well under the broker's 60 s lock expiry and the 30 s a lock is trusted locally)."""
    offset_store_dir: str = "~/.splitmq_offsets"
    """BROADCASTING: where the local offsets file lives."""
    instance_name: str | None = None
    """None: use the process-wide client instance. A name: a client instance of its own (its own client id),
    shared by the consumers given the same name -- RocketMQ's ``instanceName``."""
    close_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """Bound on close: in-flight work, the final commit."""
    rebalance_listener: RebalanceListener | None = attrs.field(default=None, validator=_check_listener)
    """Told of the queues each rebalance takes away and gives (:class:`RebalanceListener`)."""

    @property
    def threshold_bytes(self) -> int:
        return self.pull_threshold_size_for_queue_mib * MIB


@attrs.frozen
class PulledBatch:
    """Messages of one pull waiting in the poll cache."""

    pq: ProcessQueue
    generation: int
    msgs: list[MessageExt]


class GroupCore:
    """Subscriptions, held queues, offsets and the poll cache of one consumer (thread-safe, no I/O)."""

    def __init__(self, config: GroupConsumerConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.subscriptions: dict[str, TagFilter] = {}
        self.assigned_mode = False
        self.manual_queues: set[MessageQueue] = set()
        self.pqs: dict[MessageQueue, ProcessQueue] = {}
        self.offsets = OffsetTable()
        self.cache: collections.deque[PulledBatch] = collections.deque()
        self.stash: dict[MessageQueue, list[PulledBatch]] = {}
        self.unacked: list[tuple[ProcessQueue, int, list[MessageExt]]] = []

    # --- subscriptions ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector | None) -> TagFilter:
        """Add or replace a topic subscription.

        Raises:
            MessageIllegalError: bad topic name.
            ValueError: bad expression, or ``assign`` was used.
        """
        validate_topic(topic)
        flt = TagFilter.parse(sub_expression)
        with self.lock:
            if self.assigned_mode:
                raise ValueError("subscribe() and assign() are exclusive: this consumer uses assign()")
            self.subscriptions[topic] = flt
        return flt

    def unsubscribe(self, topic: str) -> None:
        with self.lock:
            self.subscriptions.pop(topic, None)

    def assign(self, queues: Iterable[MessageQueue]) -> set[MessageQueue]:
        """Manual assignment (no rebalance): the queues to hold from now on.

        Raises:
            ValueError: a queue is not a MessageQueue, or ``subscribe`` was used.
        """
        qs = set(queues)
        for mq in qs:
            if not isinstance(mq, MessageQueue):
                raise ValueError(f"assign() takes MessageQueue objects, got {type(mq).__name__}")
            validate_topic(mq.topic)
        with self.lock:
            if self.subscriptions and not self.assigned_mode:
                raise ValueError("subscribe() and assign() are exclusive: this consumer uses subscribe()")
            self.assigned_mode = True
            self.manual_queues = qs
            for mq in qs:
                self.subscriptions.setdefault(mq.topic, TagFilter("*", None))
        return qs

    def filter_of(self, topic: str) -> TagFilter:
        return self.subscriptions.get(topic) or TagFilter("*", None)

    # --- queues ---

    def held(self, topic: str | None = None) -> set[MessageQueue]:
        with self.lock:
            return {mq for mq in self.pqs if topic is None or mq.topic == topic}

    def add_queue(self, mq: MessageQueue, start_offset: int) -> ProcessQueue | None:
        """Hold ``mq`` from ``start_offset``; None when already held."""
        with self.lock:
            if mq in self.pqs:
                return None
            pq = ProcessQueue(mq, start_offset)
            self.pqs[mq] = pq
            self.offsets.update(mq, start_offset, increase_only=False)
            return pq

    def drop_queue(self, mq: MessageQueue) -> int:
        """Stop holding ``mq``; returns its consumed offset (-1 when it was not held)."""
        with self.lock:
            pq = self.pqs.pop(mq, None)
            if pq is None:
                return -1
            pq.dropped = True
            self.stash.pop(mq, None)
            self.offsets.remove(mq)
            return pq.consume_offset

    def live(self, pq: ProcessQueue, generation: int | None = None) -> bool:
        """True while ``pq`` is still held (and, with ``generation``, not reset since)."""
        return not pq.dropped and self.pqs.get(pq.mq) is pq and (generation is None or pq.generation == generation)

    # --- pull results ---

    def on_pulled(self, pq: ProcessQueue, generation: int, msgs: Sequence[MessageExt], next_begin: int,
                  group: str) -> list[MessageExt]:
        """Record a pull's answer; returns the messages to deliver (tag re-check, retry topic restored)."""
        flt = self.filter_of(pq.mq.topic)
        kept = [restore_retry_topic(m, group) for m in msgs if flt.matches(m)]
        with self.lock:
            if not self.live(pq, generation):
                return []
            before = pq.consume_offset
            added = pq.put(kept, next_begin)
            if pq.consume_offset != before:
                self.offsets.update(pq.mq, pq.consume_offset)
            return added

    def reset_queue(self, pq: ProcessQueue, offset: int) -> None:
        """Restart ``pq`` at ``offset`` (seek, OFFSET_ILLEGAL); cached batches of it become stale."""
        with self.lock:
            pq.reset(offset)
            self.stash.pop(pq.mq, None)
            self.offsets.update(pq.mq, offset, increase_only=False)

    def after_pull(self, pq: ProcessQueue, generation: int, offset: int, result: PullResult, held_s: float,
                   group: str) -> tuple[list[MessageExt], float]:
        """Record the answer to a pull of ``pq`` at ``offset`` that took ``held_s`` (both engines, sync and async).

        Returns:
            The messages to deliver (tags re-checked, retry topic restored), and how long the queue waits before
            its next pull (:func:`next_pull_delay_s`).
        """
        status = result.pull_status
        if status is PullStatus.FOUND:
            return self.on_pulled(pq, generation, result.msg_found_list, result.next_begin_offset, group), 0.0
        if status is PullStatus.OFFSET_ILLEGAL:
            skipped = result.next_begin_offset - offset
            log.warning("%s: offset %d of %s is illegal (min %d max %d); moving to %d%s", group, offset, pq.mq,
                        result.min_offset, result.max_offset, result.next_begin_offset,
                        f", skipping {skipped} messages the broker no longer has (deleted by retention)"
                        if skipped > 0 else "")
            with self.lock:
                if self.live(pq, generation):
                    self.reset_queue(pq, result.next_begin_offset)
            return [], 0.0
        self.on_pulled(pq, generation, [], result.next_begin_offset, group)
        return [], next_pull_delay_s(result, offset, held_s, self.config)

    def consumed(self, pq: ProcessQueue, msgs: Sequence[MessageExt], generation: int | None = None) -> None:
        """``msgs`` of ``pq`` are consumed: advance its offset to the smallest still in flight."""
        with self.lock:
            if not self.live(pq, generation):
                return
            self.offsets.update(pq.mq, pq.remove(msgs))

    # --- poll cache (lite pull) ---

    def offer(self, pq: ProcessQueue, generation: int, msgs: list[MessageExt]) -> None:
        with self.lock:
            if msgs and self.live(pq, generation):
                self.cache.append(PulledBatch(pq, generation, msgs))

    def ack_polled(self) -> None:
        """The batches returned by earlier polls are consumed."""
        with self.lock:
            unacked, self.unacked = self.unacked, []
            for pq, gen, msgs in unacked:
                self.consumed(pq, msgs, gen)

    def take_polled(self, max_messages: int) -> list[MessageExt]:
        """Cached messages (paused queues' batches are set aside until resume), at most ``max_messages``."""
        out: list[MessageExt] = []
        with self.lock:
            while self.cache and len(out) < max_messages:
                b = self.cache.popleft()
                if not self.live(b.pq, b.generation):
                    continue
                if b.pq.paused:
                    self.stash.setdefault(b.pq.mq, []).append(b)
                    continue
                room = max_messages - len(out)
                if len(b.msgs) > room:
                    self.cache.appendleft(PulledBatch(b.pq, b.generation, b.msgs[room:]))
                    b = PulledBatch(b.pq, b.generation, b.msgs[:room])
                out.extend(b.msgs)
                self.unacked.append((b.pq, b.generation, b.msgs))
        return out

    def set_paused(self, queues: Iterable[MessageQueue], paused: bool) -> list[ProcessQueue]:
        """Pause or resume held queues; returns the resumed ones (their set-aside batches go back)."""
        resumed = []
        with self.lock:
            for mq in queues:
                pq = self.pqs.get(mq)
                if pq is None:
                    continue
                pq.paused = paused
                if not paused:
                    resumed.append(pq)
                    self.cache.extend(self.stash.pop(mq, []))
        return resumed

    def has_cached(self) -> bool:
        with self.lock:
            return any(self.live(b.pq, b.generation) and not b.pq.paused for b in self.cache)

    # --- bookkeeping for shells ---

    def snapshot_offsets(self) -> dict[MessageQueue, int]:
        """Consumed offsets of every held queue."""
        with self.lock:
            return {mq: pq.consume_offset for mq, pq in self.pqs.items()}

    def topics(self) -> list[str]:
        with self.lock:
            return sorted(self.subscriptions)


def next_pull_delay_s(result: PullResult, requested_offset: int, held_s: float, config: GroupConsumerConfig
                      ) -> float:
    """How long a queue waits before its next pull, after ``result`` of a pull at ``requested_offset`` that took
    ``held_s`` (both engines, sync and async, pace their pulls with this).

    * messages found, or the offset moved: at once;
    * refused by every member asked (:func:`client._routing.pull_refused`: a slave with ``slaveReadEnable=false``
      whose master link is up, and the master could not be reached or is not in the route):
      ``pull_delay_on_error_s``, as a pull that failed (RocketMQ's ``pullTimeDelayMillsWhenException``) -- the
      next pull would get the same answer at once;
    * NO_NEW_MSG the broker did not hold (long polling off, or answered early): :data:`NO_NEW_MIN_DELAY_S`;
    * anything else (NO_MATCHED_MSG that skipped messages, a held NO_NEW_MSG): at once.
    """
    status = result.pull_status
    if status is PullStatus.FOUND or status is PullStatus.OFFSET_ILLEGAL:
        return 0.0
    if pull_refused(result, requested_offset):
        return max(config.pull_delay_on_error_s, NO_NEW_MIN_DELAY_S)
    if status is PullStatus.NO_NEW_MSG and held_s < config.pull_suspend_s / 2:
        return NO_NEW_MIN_DELAY_S
    return 0.0


def consume_timestamp_ms(config: GroupConsumerConfig, now_ms: int) -> int:
    """Where a group that never committed starts under TIMESTAMP: ``consume_timestamp_ms``, else 30 minutes
    before now (RocketMQ's ``consumeTimestamp`` default)."""
    ts = config.consume_timestamp_ms
    return now_ms - 30 * 60 * 1000 if ts is None else ts


def run_quietly(fn: Callable[[], Any], what: str, log: Any) -> bool:
    """Run ``fn``; log and swallow any exception (background loops must survive anything)."""
    try:
        fn()
        return True
    except Exception as e:
        log.warning("%s failed: %s", what, e)
        return False
