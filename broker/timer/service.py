"""The timer store (RocketMQ 5's ``TimerMessageStore``), master only: delivers each message parked in
``rmq_sys_wheel_timer`` to its real topic and queue at its ``TIMER_DELIVER_MS``.

The queue is the durable record; :class:`broker.timer.index.TimerIndex` is the in-memory index over it, rebuilt
on start by reading the queue from the persisted ``commitOffset`` (skipping the units persisted as done). One
asyncio task reads new units when the dispatcher reports them (:meth:`notify_dispatched`), rescans the queue when
far units enter the in-memory window, and sleeps until the earliest deliver time otherwise (bounded by
``max_wait_ms``): no polling tick, a message is delivered within milliseconds of its time.

Exactly once across crashes, as the delay-level scheduler (:mod:`broker.redelivery`): before each batch of puts
``config/timerProgress.json`` is written (fsync'd) with the progress *and* the batch's fingerprints and commit-log
offset; on start the batch is settled against the commit log. The progress stays bounded: past ``done_max`` units
delivered out of order, the pending units holding the commit offset back are rolled to the queue's tail
(:meth:`TimerMessageService.compact`), journaled the same way.

Roles: only a master runs it. A slave holds the replicated topic and queue but no progress; promoted (a DLedger
leader change), it starts from its own progress file, which is stale or absent: messages already delivered by the
old leader are delivered again (none is lost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.metadata.json_file import JsonFile
from broker.pass_loop import PassLoop
from broker.redelivery import Delivery, put_copy, settled_prefix
from broker.store.api import AppendResult, GetMessageStatus, MessageStore, PutMessageStatus
from broker.timer.index import Entry, TimerIndex
from broker.timer.rules import TIMER_TOPIC, restore_timer_message
from common.codec import decode_records
from common.errors import ProtocolViolationError
from common.message import MessageExt
from common.properties import TIMER_DELIVER_MS

__all__ = ["TimerMessageService"]

log = logging.getLogger(__name__)

_READER_GROUP = "TIMER_SERVICE"
_READ_MAX_BYTES = 4 << 20


def _deliver_ms(msg: MessageExt) -> int:
    raw = msg.properties.get(TIMER_DELIVER_MS, "")
    return int(raw) if raw.isdigit() and len(raw) <= 15 else msg.store_timestamp


class TimerMessageService:
    """Delivers due timed messages. Start it on a master only.

    Args:
        store: the message store.
        clock_ms: wall clock in ms (the store's clock).
        progress_path: ``config/timerProgress.json`` (progress and delivery journal).
        window_ms: ``timerRollWindowSlot`` in ms: how far ahead messages are held in memory.
        max_entries: ``timerMaxInMemory``: bound on messages held in memory.
        on_put: called after every successful put (metrics).
        batch_size: deliveries per journaled batch; read_batch: units read per store call.
        max_wait_ms / retry_wait_ms: longest sleep; back-off after a failed put or journal write.
        done_max: bound on the units delivered out of order above the commit offset (see :meth:`compact`).
    """

    def __init__(self, store: MessageStore, *, clock_ms: Callable[[], int], progress_path: Path,
                 window_ms: int, max_entries: int, on_put: Callable[[str, AppendResult], None] | None = None,
                 batch_size: int = 32, read_batch: int = 256, max_wait_ms: int = 1000,
                 retry_wait_ms: int = 200, done_max: int = 10_000) -> None:
        self._store = store
        self._clock_ms = clock_ms
        self._file = JsonFile(progress_path)
        self._window_ms = window_ms
        self._max_entries = max_entries
        self._on_put = on_put
        self._batch = batch_size
        self._read_batch = read_batch
        self._max_wait_ms = max_wait_ms
        self._retry_wait_ms = retry_wait_ms
        self._done_max = done_max
        self.index = TimerIndex(window_ms=window_ms, max_entries=max_entries)
        self._dirty = True
        self._retry_at = 0
        self._passes = PassLoop("broker-timer", self.run_once, self.wait_ms, on_error=self._back_off)
        self.delivered = 0

    @property
    def running(self) -> bool:
        return self._passes.running

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild the index from the persisted progress and start the task.

        Raises:
            RuntimeError: already running.
        """
        if self.running:
            raise RuntimeError("TimerMessageService already running")
        self.recover()
        self._dirty = True
        self._passes.start()
        log.info("timer service started at offset %d (%d done above it)", self.index.commit, len(self.index.done))

    async def stop(self) -> None:
        """Stop the task and persist the progress. Idempotent."""
        if await self._passes.stop():
            self._save(None)

    def notify_dispatched(self, queue_id: int, max_offset: int) -> None:
        """New units reached the timer queue (thread-safe)."""
        self._dirty = True
        self._passes.wake()

    def _back_off(self) -> None:
        """After a failed pass: wait ``retry_wait_ms`` before the next."""
        self._retry_at = self._clock_ms() + self._retry_wait_ms

    def wait_ms(self) -> int:
        """How long the task may sleep: until the earliest due time or rescan, at most ``max_wait_ms``."""
        now = self._clock_ms()
        if self._retry_at > now:
            return self._retry_at - now
        if self._dirty:
            return 0
        wait = self._max_wait_ms
        for due in (self.index.next_due_ms(), self.index.rescan_due_ms()):
            if due is not None:
                wait = min(wait, due - now)
        return max(wait, 0)

    # --- one pass -----------------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Read what arrived, rescan when far units entered the window, deliver what is due. Returns the
        number delivered."""
        now = self._clock_ms()
        if self._retry_at > now:
            return 0
        if self._dirty:
            self._dirty = False
            if not self._read_new(now):
                self._dirty = True  # more to read: the next pass goes on
        if self.index.needs_rescan(now):
            self._rescan(now)
        if len(self.index.done) > self._done_max:
            self.compact()
        delivered = 0
        while True:
            due = self.index.pop_due(self._clock_ms(), self._batch)
            if not due:
                return delivered
            n = self._deliver(due)
            delivered += n
            if n < len(due):
                return delivered

    def _units(self, start: int, end: int) -> list[tuple[int, Entry | None]]:
        """The units ``[start, end)`` of the timer queue, read in one store call (fewer when the read stops
        early): ``(queue offset, entry or None when unreadable)``."""
        res = self._store.get_message(_READER_GROUP, TIMER_TOPIC, 0, start, min(self._read_batch, end - start),
                                      _READ_MAX_BYTES)
        if res.status is not GetMessageStatus.FOUND:
            return [(o, None) for o in range(start, min(res.next_begin_offset, end))]
        out: list[tuple[int, Entry | None]] = []
        expected = start
        for qo, rec in zip(res.queue_offsets, res.records, strict=True):
            out.extend((o, None) for o in range(expected, qo))  # holes: units whose records are gone
            expected = qo + 1
            try:
                msg = decode_records(rec)[0]
            except (ProtocolViolationError, IndexError) as e:
                log.error("timer unit %d: unreadable record skipped: %s", qo, e)
                out.append((qo, None))
                continue
            out.append((qo, Entry(_deliver_ms(msg), qo, msg.commit_log_offset, msg.store_size)))
        return out

    def _read_new(self, now: int, max_units: int = 4096) -> bool:
        """Admit units from ``read_offset``; True when caught up with the queue."""
        index = self.index
        lo = self._store.get_min_offset_in_queue(TIMER_TOPIC, 0)
        if index.commit < lo:
            log.warning("timer units [%d, %d) are gone from the queue (expired before delivery)", index.commit, lo)
            index.skip_to(lo)
        hi = self._store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        if index.read_offset > hi and self._store.dispatch_behind_bytes == 0:
            # The log is shorter than the progress says (a DLedger member whose uncommitted tail was cut, a store
            # restored from a backup): start again from what the queue holds.
            log.warning("timer queue ends at %d, below the read offset %d; rebuilding the index from %d", hi,
                        index.read_offset, min(index.commit, hi))
            self.index = index = TimerIndex(window_ms=self._window_ms, max_entries=self._max_entries,
                                            commit=min(index.commit, hi), done=[o for o in index.done if o < hi])
        read = 0
        while index.read_offset < hi and read < max_units:
            units = self._units(index.read_offset, hi)
            if not units:
                return True  # the queue says more, the read found none yet (dispatch behind): look again later
            for qo, entry in units:
                if entry is None:
                    index.skip_unreadable(qo)
                else:
                    index.admit(entry, now)
            read += len(units)
        return index.read_offset >= hi

    def _rescan(self, now: int) -> None:
        start, end = self.index.begin_rescan()
        offset = start
        while offset < end:
            units = self._units(offset, end)
            if not units:
                break
            for _, entry in units:
                if entry is not None:
                    self.index.readmit(entry, now)
            offset = units[-1][0] + 1
        log.info("timer rescan of units [%d, %d): %d in memory, %d far", start, end, self.index.in_memory,
                 self.index.far_count)

    def _deliver(self, due: list[Entry]) -> int:
        plan: list[tuple[Entry, Delivery, MessageExt, bytes, dict[str, str]]] = []
        dropped: list[int] = []
        for e in due:
            rec = self._store.look_message_by_offset(e.physical_offset, e.size)
            try:
                if rec is None:
                    raise ValueError("its record is gone from the commit log")
                msg = decode_records(rec)[0]
                topic, queue_id, props = restore_timer_message(msg.topic, msg.queue_id, msg.properties)
            except (ProtocolViolationError, IndexError, ValueError) as err:
                log.error("timer unit %d dropped: %s", e.queue_offset, err)
                dropped.append(e.queue_offset)
                continue
            plan.append((e, Delivery.of(e.queue_offset, topic, queue_id, msg, props), msg, rec, props))
        self.index.mark_done(dropped)
        if not plan:
            return len(dropped)
        if not self._save([d for _, d, _, _, _ in plan]):
            self._retry_later([e for e, *_ in plan], "the timer progress journal cannot be written")
            return len(dropped)
        delivered: list[int] = []
        for i, (e, d, msg, rec, props) in enumerate(plan):
            # No await in this loop: the batch's copies stay contiguous in the commit log (see recover()).
            result = put_copy(self._store, d, msg, rec, props)
            if result.status is not PutMessageStatus.PUT_OK:
                self.index.mark_done(delivered)
                self._retry_later([p[0] for p in plan[i:]], f"put to {d.topic} queue {d.queue_id} failed: "
                                                            f"{result.status.value} {result.remark}")
                return len(dropped) + len(delivered)
            delivered.append(e.queue_offset)
            self.delivered += 1
            if self._on_put is not None:
                try:
                    self._on_put(d.topic, result)
                except Exception:
                    log.exception("timer on_put callback failed")
        self.index.mark_done(delivered)
        return len(dropped) + len(delivered)

    def compact(self) -> int:
        """Bound the progress: a unit far in the future holds the commit offset back while later units are
        delivered, and each of those is kept in ``done`` until the commit passes it. When ``done`` outgrows
        ``done_max``, the pending units at the commit offset are written again at the queue's tail (RocketMQ 5
        rolls far timers the same way), journaled like deliveries, so the commit offset moves over the done run.
        Returns the units rolled."""
        index = self.index
        start = index.commit
        rolled: list[tuple[Entry, Delivery, MessageExt, bytes, dict[str, str]]] = []
        unreadable: list[int] = []
        for qo, entry in self._units(start, index.read_offset):
            if qo in index.done:
                continue
            rec = None if entry is None else self._store.look_message_by_offset(entry.physical_offset, entry.size)
            if entry is None or rec is None:
                unreadable.append(qo)
                continue
            msg = decode_records(rec)[0]
            rolled.append((entry, Delivery.of(qo, TIMER_TOPIC, 0, msg, msg.properties), msg, rec, msg.properties))
            if len(rolled) >= self._batch:
                break
        index.mark_done(unreadable)
        if not rolled or not self._save([d for _, d, _, _, _ in rolled]):
            return 0
        index.take(e.queue_offset for e, *_ in rolled)
        done: list[int] = []
        for e, d, msg, rec, props in rolled:  # no await: contiguous in the commit log, as deliveries
            result = put_copy(self._store, d, msg, rec, props)
            if result.status is not PutMessageStatus.PUT_OK:
                log.warning("timer: rolling unit %d failed: %s %s", e.queue_offset, result.status.value,
                            result.remark)
                self.index.requeue(r[0] for r in rolled if r[0].queue_offset not in done)
                break
            done.append(e.queue_offset)
        index.mark_done(done)
        self._dirty = True  # the rolled copies are new units to read
        log.info("timer: rolled %d units from offset %d to the queue's tail; commit offset now %d", len(done),
                 start, index.commit)
        return len(done)

    def _retry_later(self, entries: list[Entry], why: str) -> None:
        self.index.requeue(entries)
        self._retry_at = self._clock_ms() + self._retry_wait_ms
        log.warning("timer: %s; retrying in %d ms", why, self._retry_wait_ms)

    # --- progress and journal -----------------------------------------------------------------------------

    def _save(self, batch: list[Delivery] | None) -> bool:
        obj = self.index.progress()
        if batch:
            obj["batch"] = {"commitLogOffset": self._store.max_physical_offset,
                            "deliveries": [d.to_json() for d in batch]}
        try:
            self._file.save(obj)
        except OSError as e:
            log.error("cannot write the timer progress %s: %s", self._file.path, e)
            return False
        return True

    def recover(self) -> None:
        """Load the progress, settle its journaled batch against the commit log, and start the index there."""
        obj = self._file.load()
        try:
            index = TimerIndex.from_progress(obj, window_ms=self._window_ms, max_entries=self._max_entries)
        except ValueError as e:
            log.error("timer progress %s is malformed (%s); starting from the queue's start", self._file.path, e)
            index, obj = TimerIndex(window_ms=self._window_ms, max_entries=self._max_entries), None
        batch = (obj or {}).get("batch")
        if isinstance(batch, dict):
            try:
                deliveries = [Delivery.from_json(row) for row in batch["deliveries"]]
                phy = int(batch["commitLogOffset"])
            except (KeyError, TypeError, ValueError) as e:
                log.error("timer journal batch is malformed (%s); ignored", e)
            else:
                settled = settled_prefix(self._store, phy, deliveries)
                index.mark_done(d.queue_offset for d in deliveries[:settled])
                if settled:
                    log.warning("timer journal: %d of %d deliveries of the last batch were in the log", settled,
                                len(deliveries))
        self.index = index
        self._save(None)

    def status(self) -> dict[str, Any]:
        """For runtime info."""
        index = self.index
        return {"running": self.running, "delivered": self.delivered, "commitOffset": index.commit,
                "readOffset": index.read_offset, "inMemory": index.in_memory, "far": index.far_count,
                "nextDueMs": index.next_due_ms()}
