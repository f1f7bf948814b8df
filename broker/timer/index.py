"""The timer's in-memory index: which parked units are due when, as plain data (no I/O, no clock).

The durable record is ``rmq_sys_wheel_timer`` queue 0: one unit per timed message, in arrival order, each with
its deliver time. Deliveries happen in deliver-time order, so the index tracks progress as

* ``commit``: every unit below it is done (delivered, or skipped as unreadable);
* ``done``: the done units at or above ``commit`` (delivered out of queue order);
* ``read_offset``: the next unit not looked at yet.

Every unit in ``[commit, read_offset)`` that is not done is *pending*: either in the heap (its deliver time is
within ``window_ms`` of now, and the heap has room), or *far* -- counted, its earliest deliver time kept, but not
held in memory. Memory is bounded by ``max_entries`` heap entries whatever the backlog; when the window reaches
the earliest far time, :meth:`begin_rescan` asks the caller to read ``[commit, read_offset)`` again and
:meth:`readmit` what now fits (RocketMQ 5 keeps a window of ``timerRollWindowSlot`` slots in its wheel and rolls
what is beyond; here the log is read again instead). ``done`` is bounded the other way: when a far unit holds the
commit back while many later ones are delivered, the service writes the pending units at the commit again at
the queue's tail (:meth:`take`, then :meth:`mark_done`) and the commit moves over the done run.

``commit`` and ``done`` are what a restart needs (:meth:`progress` / :meth:`from_progress`): the index is rebuilt
by reading the queue from ``commit`` and skipping the done units.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = ["Entry", "TimerIndex"]


class Entry(NamedTuple):
    """One pending unit held in memory, ordered by deliver time then queue offset."""

    deliver_ms: int
    queue_offset: int
    physical_offset: int
    """Where the parked record is in the commit log (read back at delivery)."""
    size: int


class TimerIndex:
    """Pending timed messages of one queue (see the module docstring).

    Args:
        window_ms: how far ahead of now a unit is held in memory.
        max_entries: bound on the heap; units past it stay far until the heap drains.
        commit / done: progress to start from (a restart's persisted progress).
    """

    def __init__(self, *, window_ms: int, max_entries: int, commit: int = 0, done: Iterable[int] = ()) -> None:
        if window_ms <= 0 or max_entries <= 0:
            raise ValueError("window_ms and max_entries must be > 0")
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.commit = commit
        self.done: set[int] = {o for o in done if o >= commit}
        self.read_offset = commit
        self._heap: list[Entry] = []
        self._in_heap: set[int] = set()
        self.far_count = 0
        """Pending units not in memory."""
        self.far_min_ms: int | None = None
        """The earliest deliver time among them (None when there are none)."""
        self._advance_commit()

    # --- progress ----------------------------------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        """What a restart needs (JSON-ready)."""
        return {"commitOffset": self.commit, "done": sorted(self.done)}

    @classmethod
    def from_progress(cls, obj: Mapping[str, Any] | None, *, window_ms: int, max_entries: int) -> TimerIndex:
        """Raises ValueError on a malformed object."""
        if not obj:
            return cls(window_ms=window_ms, max_entries=max_entries)
        try:
            commit = int(obj.get("commitOffset", 0))
            done = [int(o) for o in obj.get("done", [])]
        except (TypeError, ValueError):
            raise ValueError("timer progress holds a non-integer offset") from None
        if commit < 0:
            raise ValueError(f"timer progress commitOffset {commit} is negative")
        return cls(window_ms=window_ms, max_entries=max_entries, commit=commit, done=done)

    def skip_to(self, offset: int) -> None:
        """The queue no longer holds units below ``offset`` (expired): count them as done."""
        if offset > self.commit:
            self.commit = offset
            self.done = {o for o in self.done if o >= offset}
            self.read_offset = max(self.read_offset, offset)
            self._advance_commit()

    def take(self, offsets: Iterable[int]) -> None:
        """Pending units leave the index without being delivered (written again at the queue's tail, see
        :meth:`broker.timer.service.TimerMessageService.compact`); the caller marks them done after the write."""
        taken = set(offsets)
        in_heap = taken & self._in_heap
        if in_heap:
            self._in_heap -= in_heap
            self._heap = [e for e in self._heap if e.queue_offset not in in_heap]
            heapq.heapify(self._heap)
        # far_min_ms may now be early: the next rescan recomputes it.
        self.far_count = max(0, self.far_count - len(taken - in_heap))

    def _advance_commit(self) -> None:
        while self.commit in self.done:
            self.done.discard(self.commit)
            self.commit += 1

    # --- reading the queue -------------------------------------------------------------------------------

    def admit(self, entry: Entry, now_ms: int) -> None:
        """The unit at ``read_offset`` was read (units must come in queue order)."""
        if entry.queue_offset != self.read_offset:
            raise ValueError(f"timer unit {entry.queue_offset} read out of order (expected {self.read_offset})")
        self.read_offset += 1
        if entry.queue_offset in self.done or entry.queue_offset < self.commit:
            return
        self._place(entry, now_ms)

    def skip_unreadable(self, queue_offset: int) -> None:
        """The unit at ``read_offset`` has no readable message: done, never to be delivered."""
        if queue_offset == self.read_offset:
            self.read_offset += 1
        self.mark_done([queue_offset])

    def _place(self, entry: Entry, now_ms: int) -> None:
        if entry.deliver_ms <= now_ms + self.window_ms and len(self._heap) < self.max_entries:
            heapq.heappush(self._heap, entry)
            self._in_heap.add(entry.queue_offset)
        else:
            self.far_count += 1
            if self.far_min_ms is None or entry.deliver_ms < self.far_min_ms:
                self.far_min_ms = entry.deliver_ms

    def rescan_due_ms(self) -> int | None:
        """When the far units should be looked at again (None: there are none)."""
        if not self.far_count or self.far_min_ms is None:
            return None
        return self.far_min_ms - self.window_ms

    def needs_rescan(self, now_ms: int) -> bool:
        """Far units have entered the window and the heap has room for them."""
        due = self.rescan_due_ms()
        return due is not None and due <= now_ms and len(self._heap) < self.max_entries

    def begin_rescan(self) -> tuple[int, int]:
        """Forget the far units' summary; the caller reads ``[start, end)`` again and :meth:`readmit`\\s each
        unit. Returns ``(start, end)``."""
        self.far_count = 0
        self.far_min_ms = None
        return self.commit, self.read_offset

    def readmit(self, entry: Entry, now_ms: int) -> None:
        """A unit read again during a rescan: placed unless done, in the heap already, or not read yet."""
        qo = entry.queue_offset
        if qo < self.commit or qo >= self.read_offset or qo in self.done or qo in self._in_heap:
            return
        self._place(entry, now_ms)

    # --- delivering --------------------------------------------------------------------------------------

    @property
    def in_memory(self) -> int:
        return len(self._heap)

    def next_due_ms(self) -> int | None:
        return self._heap[0].deliver_ms if self._heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries due at ``now_ms``, earliest first (taken out: :meth:`mark_done` or
        :meth:`requeue` each)."""
        out: list[Entry] = []
        heap = self._heap
        while heap and heap[0].deliver_ms <= now_ms and len(out) < limit:
            e = heapq.heappop(heap)
            self._in_heap.discard(e.queue_offset)
            out.append(e)
        return out

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Entries taken by :meth:`pop_due` that were not delivered (a failed put): back in the heap."""
        for e in entries:
            if e.queue_offset not in self._in_heap and e.queue_offset not in self.done:
                heapq.heappush(self._heap, e)
                self._in_heap.add(e.queue_offset)

    def mark_done(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            if o >= self.commit:
                self.done.add(o)
        self._advance_commit()

    def pending(self) -> int:
        """Units read and not done (in memory or far)."""
        return len(self._heap) + self.far_count
