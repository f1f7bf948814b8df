"""Delayed messages: RocketMQ's ``ScheduleMessageService`` (docs/BEHAVIOUR.md 8.1-8.2), master only.

A message put with a ``DELAY`` level is rewritten by the store to ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``
(``REAL_TOPIC`` / ``REAL_QID`` keep where it was going). This service reads each level's queue from
``offsetTable[level]`` (:class:`broker.metadata.delay_offsets.DelayOffsetManager`), and once a unit's deliver
time (``storeTimestamp + delay(level)``, what the dispatcher writes as the unit's tag code) has come, puts the
message back under its real topic and queue and advances the offset.

Timing: one asyncio task for all levels. Each level remembers when its head unit is due; the task sleeps until
the earliest of those (bounded by ``max_wait_ms``) and wakes early when :meth:`notify_dispatched` reports new
units. No polling tick: a message is redelivered within a few milliseconds of its deliver time.

Exactly once across crashes. RocketMQ persists the offsets every 10 s, so a crash re-delivers up to 10 s of
messages. Here, before each batch of puts, a small journal (``delayDelivery.json``) records for the level the
offset the batch starts at, the commit-log offset the first put will land at, and a fingerprint of every
message about to be put; the offsets are persisted right after the batch. The puts of one batch run without
yielding to the event loop, so they are contiguous in the commit log. On start, :meth:`recover` compares the
journal with the commit log: copies found at the recorded position count as delivered, the rest are delivered
again. What remains: a copy lost together with the journal's fsync (an OS crash between the journal write and
the page-cache flush of the commit log) is delivered again -- never lost -- and a different message identical
in topic, queue, body CRC, born time and unique key written at exactly the recorded position would be taken
for the copy (it cannot be, since only this service writes there during the batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.metadata.delay_offsets import DelayOffsetManager
from broker.metadata.json_file import JsonFile
from broker.metadata.topics import SCHEDULE_TOPIC
from broker.pass_loop import PassLoop
from broker.redelivery import Delivery, put_copy, settled_prefix
from broker.store.api import AppendResult, GetMessageStatus, MessageStore, PutMessageStatus
from common.codec import decode_records
from common.errors import ProtocolViolationError
from common.message import MessageExt
from common.properties import DELAY, REAL_QID, REAL_TOPIC, WAIT

__all__ = [
    "DEFAULT_UNKNOWN_LEVEL_DELAY_MS",
    "TRANS_HALF_TOPIC",
    "Delivery",
    "ScheduleMessageService",
    "clamp_offset",
    "compute_deliver_timestamp",
    "delay_level_to_queue_id",
    "effective_deliver_timestamp",
    "queue_id_to_delay_level",
    "restore_message",
]

log = logging.getLogger(__name__)

#: Delay of a level the configuration does not know (``computeDeliverTimestamp``'s fallback).
DEFAULT_UNKNOWN_LEVEL_DELAY_MS = 1000
#: A half (prepared) transactional message must never be delivered by the scheduler (RocketMQ's bug guard).
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: The ``group`` argument of the store reads (only a label: the store keeps no state per group).
_READER_GROUP = "SCHEDULE_SERVICE"
#: Bytes read per batch at most (the store's own transfer limits apply first).
_READ_MAX_BYTES = 4 << 20


# --- pure rules -----------------------------------------------------------------------------------------------

def delay_level_to_queue_id(level: int) -> int:
    """``delayLevel2QueueId``: level 1 lives in queue 0."""
    return level - 1


def queue_id_to_delay_level(queue_id: int) -> int:
    """``queueId2DelayLevel``: queue 0 holds level 1."""
    return queue_id + 1


def compute_deliver_timestamp(store_timestamp_ms: int, level: int, delay_levels_ms: Sequence[int]) -> int:
    """When a message stored at ``store_timestamp_ms`` with ``level`` is due (unknown level: +1000 ms)."""
    if 1 <= level <= len(delay_levels_ms):
        return store_timestamp_ms + delay_levels_ms[level - 1]
    return store_timestamp_ms + DEFAULT_UNKNOWN_LEVEL_DELAY_MS


def effective_deliver_timestamp(deliver_ms: int, now_ms: int, delay_ms: int) -> int:
    """The clock-skew guard: a deliver time further ahead than the level's whole delay means the clock went
    back (or the record's store time is bogus), so the message is due now rather than stuck for hours."""
    return now_ms if deliver_ms > now_ms + delay_ms else deliver_ms


def clamp_offset(offset: int, min_offset: int, max_offset: int) -> int:
    """``correctDelayOffset``: an offset outside a queue's ``[min, max]`` is moved to the nearer end."""
    return min(max(offset, min_offset), max_offset)


def restore_message(topic: str, queue_id: int, properties: Mapping[str, str]) -> tuple[str, int, dict[str, str]]:
    """The topic, queue and properties a scheduled message is delivered with.

    ``REAL_TOPIC`` / ``REAL_QID`` become the topic and queue and are removed with ``DELAY``; ``WAIT`` is set to
    false (nobody waits for a redelivery's flush); every other property is kept.

    Raises:
        ValueError: ``REAL_TOPIC`` is missing or ``REAL_QID`` is not a non-negative integer (the message says
            which, and where the record was).
    """
    real_topic = properties.get(REAL_TOPIC)
    if not real_topic:
        raise ValueError(f"scheduled message in {topic} queue {queue_id} has no {REAL_TOPIC} property")
    raw_qid = properties.get(REAL_QID, "")
    if not raw_qid.isdigit():
        raise ValueError(f"scheduled message in {topic} queue {queue_id} has {REAL_QID}={raw_qid!r}, "
                         "not a queue id")
    props = {k: v for k, v in properties.items() if k not in (DELAY, REAL_TOPIC, REAL_QID)}
    props[WAIT] = "false"
    return real_topic, int(raw_qid), props


# --- the service ------------------------------------------------------------------------------------------------

class ScheduleMessageService:
    """Redelivers due ``SCHEDULE_TOPIC_XXXX`` messages. Start it on a master only.

    Args:
        store: the message store.
        offsets: the delay offsets (``offsetTable``), loaded by the caller.
        delay_levels_ms: delay of each level, level 1 first (``StoreConfig.delay_levels_ms``).
        clock_ms: wall clock in ms, the same clock the store stamps records with.
        journal_path: the delivery journal (``config/delayDelivery.json``); None disables it (then a crash
            between a put and the offset persist delivers that batch twice).
        on_put: called after every successful put with the topic and the result (metrics, HA wake-up).
        batch_size: units read per level and pass.
        max_wait_ms: longest sleep when nothing is due (a safety net for a lost notification).
        retry_wait_ms / max_retry_wait_ms: first and largest back-off after a failed put or read (doubling).
    """

    def __init__(
        self,
        store: MessageStore,
        offsets: DelayOffsetManager,
        *,
        delay_levels_ms: Sequence[int],
        clock_ms: Callable[[], int],
        journal_path: Path | None = None,
        on_put: Callable[[str, AppendResult], None] | None = None,
        batch_size: int = 32,
        max_wait_ms: int = 1000,
        retry_wait_ms: int = 100,
        max_retry_wait_ms: int = 10_000,
    ) -> None:
        if not delay_levels_ms:
            raise ValueError("delay_levels_ms is empty")
        if batch_size <= 0 or max_wait_ms <= 0 or retry_wait_ms <= 0 or max_retry_wait_ms < retry_wait_ms:
            raise ValueError("batch_size, max_wait_ms, retry_wait_ms must be > 0 and max_retry_wait_ms >= "
                             "retry_wait_ms")
        self._store = store
        self._offsets = offsets
        self._levels = tuple(delay_levels_ms)
        self._clock_ms = clock_ms
        self._journal = JsonFile(journal_path) if journal_path is not None else None
        self._journal_table: dict[str, Any] = {}
        self._on_put = on_put
        self._batch = batch_size
        self._max_wait_ms = max_wait_ms
        self._retry_wait_ms = retry_wait_ms
        self._max_retry_wait_ms = max_retry_wait_ms
        self._next_due: dict[int, int | None] = dict.fromkeys(self.levels, None)
        """Per level: when its head unit is due; None = caught up, wait for a notification."""
        self._backoff_ms: dict[int, int] = dict.fromkeys(self.levels, 0)
        self._dirty: set[int] = set(self.levels)
        self._passes = PassLoop("broker-schedule", self.deliver_due, self.wait_ms, on_error=self._back_off,
                                on_timeout=self._rescan_caught_up)
        self.delivered = 0
        """Messages put back since creation."""

    @property
    def levels(self) -> range:
        return range(1, len(self._levels) + 1)

    @property
    def running(self) -> bool:
        return self._passes.running

    def delay_ms(self, level: int) -> int:
        return self._levels[level - 1] if 1 <= level <= len(self._levels) else DEFAULT_UNKNOWN_LEVEL_DELAY_MS

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the journal, correct the offsets, and start the delivery task.

        Raises:
            RuntimeError: already running.
        """
        if self.running:
            raise RuntimeError("ScheduleMessageService already running")
        self.recover()
        self.correct_delay_offsets()
        self._dirty.update(self.levels)
        self._passes.start()
        log.info("schedule service started: %d delay levels, offsets %s", len(self._levels),
                 self._offsets.table())

    async def stop(self) -> None:
        """Stop the task and persist the offsets. Idempotent; safe when never started."""
        await self._passes.stop()
        self._persist_offsets()

    def notify_dispatched(self, queue_id: int, max_offset: int) -> None:
        """New units reached ``SCHEDULE_TOPIC_XXXX`` queue ``queue_id`` (thread-safe; the store's dispatch
        listener calls this, possibly from the dispatch thread)."""
        level = queue_id_to_delay_level(queue_id)
        if level not in self._next_due:
            return
        self._dirty.add(level)
        self._passes.wake()

    def _back_off(self) -> None:
        """After a failed pass: every level waits ``max_retry_wait_ms``."""
        for level in self.levels:
            self._next_due[level] = self._clock_ms() + self._max_retry_wait_ms

    def _rescan_caught_up(self) -> None:
        """The safety net of a sleep that ran out: look at caught-up levels too, in case a dispatch notification
        was lost."""
        self._dirty.update(level for level, due in self._next_due.items() if due is None)

    def wait_ms(self) -> int:
        """How long the task may sleep: until the earliest due head, at most ``max_wait_ms``; 0 when a level
        was notified or is due."""
        if self._dirty:
            return 0
        now = self._clock_ms()
        wait = self._max_wait_ms
        for due in self._next_due.values():
            if due is not None:
                wait = min(wait, due - now)
        return max(wait, 0)

    # --- offsets ------------------------------------------------------------------------------------------

    def correct_delay_offsets(self) -> dict[int, tuple[int, int]]:
        """Clamp each level's offset into its queue's ``[min, max]`` (``correctDelayOffset``).

        An offset above the max is only lowered when dispatch has caught up: otherwise the queue is just not
        rebuilt yet, and lowering it would deliver those messages again.

        Returns:
            ``{level: (old, new)}`` for the offsets that changed (persisted).
        """
        changed: dict[int, tuple[int, int]] = {}
        caught_up = self._store.dispatch_behind_bytes == 0
        for level in self.levels:
            qid = delay_level_to_queue_id(level)
            lo = self._store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid)
            hi = self._store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
            old = self._offsets.get(level)
            new = clamp_offset(old, lo, hi) if caught_up else max(old, lo)
            if new != old:
                log.warning("delay level %d offset %d is outside its queue [%d, %d]; corrected to %d",
                            level, old, lo, hi, new)
                self._offsets.update(level, new)
                changed[level] = (old, new)
        if changed:
            self._persist_offsets()
        return changed

    def _persist_offsets(self) -> None:
        try:
            self._offsets.persist()
        except OSError as e:  # the journal still bounds what a crash re-delivers; the next batch retries
            log.error("cannot persist delay offsets to %s: %s", self._offsets.path, e)

    # --- delivery -----------------------------------------------------------------------------------------

    def deliver_due(self) -> int:
        """One pass: for every level that was notified or whose head is due, deliver up to ``batch_size`` due
        messages. Synchronous (the store is); returns how many messages were put back."""
        total = 0
        for level in self.levels:
            due = self._next_due[level]
            if level in self._dirty or (due is not None and due <= self._clock_ms()):
                self._dirty.discard(level)
                total += self._deliver_level(level)
        return total

    def _deliver_level(self, level: int) -> int:
        store = self._store
        qid = delay_level_to_queue_id(level)
        offset = self._offsets.get(level)
        lo = store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid)
        hi = store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
        if offset < lo:
            log.warning("delay level %d offset %d is below the queue's min %d (expired); moving to %d",
                        level, offset, lo, lo)
            offset = lo
            self._offsets.update(level, lo)
        if offset >= hi:
            if offset > hi and store.dispatch_behind_bytes == 0:
                log.warning("delay level %d offset %d is above the queue's max %d; moving to %d", level, offset,
                            hi, hi)
                self._offsets.update(level, hi)
            self._next_due[level] = None
            return 0
        res = store.get_message(_READER_GROUP, SCHEDULE_TOPIC, qid, offset, self._batch, _READ_MAX_BYTES)
        if res.status is not GetMessageStatus.FOUND:
            if res.next_begin_offset > offset:  # units whose records are gone: skip them, as RocketMQ does
                log.warning("delay level %d: units [%d, %d) have no message (%s); skipped", level, offset,
                            res.next_begin_offset, res.status.value)
                self._offsets.update(level, res.next_begin_offset)
                self._next_due[level] = self._clock_ms()
            else:
                self._retry_later(level, f"read at offset {offset} returned {res.status.value}")
            return 0
        return self._deliver_batch(level, offset, res.queue_offsets, res.records)

    def _plan(self, level: int, records: Sequence[bytes], queue_offsets: Sequence[int]
              ) -> tuple[list[tuple[Delivery, MessageExt, bytes, dict[str, str]]], int, int | None]:
        """The due prefix of a read: ``(deliveries, offset after the prefix, due time of the first not-due)``."""
        now = self._clock_ms()
        delay = self.delay_ms(level)
        plan: list[tuple[Delivery, MessageExt, bytes, dict[str, str]]] = []
        next_offset = queue_offsets[0]
        for qo, rec in zip(queue_offsets, records, strict=True):
            try:
                msg = decode_records(rec)[0]
            except (ProtocolViolationError, IndexError) as e:
                log.error("delay level %d offset %d: unreadable record skipped: %s", level, qo, e)
                next_offset = qo + 1
                continue
            due = effective_deliver_timestamp(compute_deliver_timestamp(msg.store_timestamp, level, self._levels),
                                              now, delay)
            if due > now:
                return plan, next_offset, due
            next_offset = qo + 1
            try:
                topic, queue_id, props = restore_message(msg.topic, msg.queue_id, msg.properties)
            except ValueError as e:
                log.error("delay level %d offset %d skipped: %s", level, qo, e)
                continue
            if topic == TRANS_HALF_TOPIC:
                log.error("delay level %d offset %d: a half transactional message was scheduled; dropped", level, qo)
                continue
            d = Delivery.of(qo, topic, queue_id, msg, props)
            plan.append((d, msg, rec, props))
        return plan, next_offset, None

    def _deliver_batch(self, level: int, offset: int, queue_offsets: Sequence[int], records: Sequence[bytes]) -> int:
        plan, next_offset, next_due = self._plan(level, records, queue_offsets)
        if plan and not self._write_journal(level, offset, [d for d, _, _, _ in plan]):
            self._retry_later(level, "the delivery journal cannot be written")
            return 0
        delivered = 0
        for d, msg, rec, props in plan:
            # No await in this loop: the batch's records stay contiguous in the commit log (see recover()).
            result = put_copy(self._store, d, msg, rec, props)
            if result.status is not PutMessageStatus.PUT_OK:
                next_offset = d.queue_offset
                self._offsets.update(level, next_offset)
                self._persist_offsets()
                self._retry_later(level, f"put to {d.topic} queue {d.queue_id} failed: {result.status.value} "
                                         f"{result.remark}")
                return delivered
            delivered += 1
            self.delivered += 1
            if self._on_put is not None:
                try:
                    self._on_put(d.topic, result)
                except Exception:
                    log.exception("schedule on_put callback failed")
        self._backoff_ms[level] = 0
        if next_offset != offset:
            self._offsets.update(level, next_offset)
            self._persist_offsets()
        # A full due batch may have more behind it: look again at once.
        self._next_due[level] = next_due if next_due is not None else self._clock_ms()
        return delivered

    def _retry_later(self, level: int, why: str) -> None:
        backoff = min(max(self._backoff_ms[level] * 2, self._retry_wait_ms), self._max_retry_wait_ms)
        self._backoff_ms[level] = backoff
        self._next_due[level] = self._clock_ms() + backoff
        log.warning("delay level %d: %s; retrying in %d ms (bound maxRetryWaitMs=%d)", level, why, backoff,
                    self._max_retry_wait_ms)

    # --- the delivery journal -----------------------------------------------------------------------------

    def _write_journal(self, level: int, offset: int, deliveries: Sequence[Delivery]) -> bool:
        if self._journal is None:
            return True
        self._journal_table[str(level)] = {
            "queueOffset": offset,
            "commitLogOffset": self._store.max_physical_offset,
            "deliveries": [d.to_json() for d in deliveries],
        }
        try:
            self._journal.save({"levels": self._journal_table})
        except OSError as e:
            log.error("cannot write the delay delivery journal %s: %s", self._journal.path, e)
            return False
        return True

    def recover(self) -> dict[int, int]:
        """Settle the last journaled batch of each level against the commit log (see the module docstring).

        Returns:
            ``{level: offset}`` for the levels whose offset the journal moved (persisted).
        """
        if self._journal is None:
            return {}
        obj = self._journal.load() or {}
        levels = obj.get("levels")
        self._journal_table = dict(levels) if isinstance(levels, dict) else {}
        moved: dict[int, int] = {}
        for key, entry in self._journal_table.items():
            try:
                level = int(key)
                start = int(entry["queueOffset"])
                phy = int(entry["commitLogOffset"])
                deliveries = [Delivery.from_json(row) for row in entry["deliveries"]]
            except (KeyError, TypeError, ValueError) as e:
                log.error("delay delivery journal entry for level %s is malformed (%s); ignored", key, e)
                continue
            if not deliveries or self._offsets.get(level) > deliveries[-1].queue_offset:
                continue  # the batch's offsets were persisted
            offset = max(start, self._settle(phy, deliveries, start))
            if offset != self._offsets.get(level):
                log.warning("delay level %d: journal moves the offset from %d to %d", level,
                            self._offsets.get(level), offset)
                self._offsets.update(level, offset)
                moved[level] = offset
        if moved:
            self._persist_offsets()
        return moved

    def _settle(self, phy: int, deliveries: Sequence[Delivery], start: int) -> int:
        """The offset after the last journaled delivery whose copy is in the commit log at ``phy`` onwards."""
        done = settled_prefix(self._store, phy, deliveries)
        return deliveries[done - 1].queue_offset + 1 if done else start

    def status(self) -> dict[str, Any]:
        """For runtime info: offsets, due times and counters."""
        return {
            "running": self.running,
            "delivered": self.delivered,
            "offsetTable": {str(k): v for k, v in sorted(self._offsets.table().items())},
            "nextDueMs": {str(k): v for k, v in self._next_due.items() if v is not None},
        }
