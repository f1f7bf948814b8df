"""The dispatcher (RocketMQ's ReputMessageService, docs/BEHAVIOUR.md 7.7): tails the commit log from the reput
offset and builds consume-queue units and index entries.

Two sources, one builder. On a master the store hands over each appended batch with what its send path already
read (queue, offsets, tags, keys, unique key of every message: :meth:`Dispatcher.handover`), so nothing is parsed
again; anything else (a slave fed with replicated bytes, recovery, a DLedger follower's committed entries, a batch
whose hand-over was dropped) is parsed from the record bytes, once per record. Either way records are grouped in
*runs* (consecutive records of one queue) and each run becomes one bulk write of its units
(:meth:`ConsumeQueue.put_run`) and one batch of index entries (:meth:`IndexService.build_batch`): per-record
Python work is what capped dispatch below the append rate.

It stops at an incomplete record (a slave may hold half of one) and at an invalid one (logged), and jumps to
the next file at a blank marker. ``dispatch_available`` is non-blocking and bounded; the broker's
:class:`broker.dispatch_driver.DispatchDriver` calls it on its event loop, woken by the store's append event.
"""

from __future__ import annotations

import logging
import mmap
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter, sub

from broker.store.commitlog import CommitLog
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from broker.store.index import IndexService
from common.codec import (
    BLANK_MAGIC,
    DISPATCH_HEAD_V4,
    MAGIC_V1,
    RECORD_PREFIX,
    BatchItem,
    record_layout,
    tags_hash,
)
from common.errors import ProtocolViolationError
from common.properties import scan_properties

__all__ = ["HANDOVER_MAX_MESSAGES", "SCHEDULE_TOPIC", "Dispatcher"]

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_SCHEDULE_B = SCHEDULE_TOPIC.encode()
_I64 = struct.Struct(">q").unpack_from
#: Messages of appended batches held for hand-over; past it (or past :data:`HANDOVER_MAX_BYTES`) the oldest
#: batches are dropped and parsed from the log when their turn comes.
HANDOVER_MAX_MESSAGES = 65536
#: Stored bytes of the batches held for hand-over. A hand-over holds the send's items (reading their tags, keys
#: and unique keys at append time cost the append path about 0.1 µs a message, and the lists built for them as
#: much again in garbage-collector work while they wait), and the items' bodies are views into the requests:
#: this bounds the request memory a dispatch backlog keeps alive. The driver dispatches after each append, so
#: normally one batch is held.
HANDOVER_MAX_BYTES = 16 << 20
_TAGS = itemgetter(6)
_KEYS = itemgetter(7)
_UNIQ = itemgetter(8)

DispatchListener = Callable[[str, int, int], None]
#: ``(topic bytes, queue id, first queue offset, items, bytes)``: one run of an append (:data:`commitlog.Run`).
_Run = tuple[bytes, int, int, Sequence[BatchItem], int]
#: An appended batch: ``(first offset, end offset, store time, runs, offset of every record)``.
_Handover = tuple[int, int, int, Sequence[_Run], Sequence[int]]


class Dispatcher:
    """Builds consume queues and the index from the commit log."""

    def __init__(
        self,
        commitlog: CommitLog,
        cqs: ConsumeQueueTable,
        index: IndexService | None,
        delay_levels_ms: tuple[int, ...],
        listeners: list[DispatchListener],
    ) -> None:
        self.commitlog = commitlog
        self.cqs = cqs
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.listeners = listeners
        self.reput = 0
        #: Store time of the last dispatched record (checkpoint logicsMsgTimestamp).
        self.last_store_ts = 0
        self.lock = threading.Lock()
        self._cq_cache: dict[tuple[bytes, int], ConsumeQueue | None] = {}
        self._tags_cache: dict[bytes, int] = {}
        self._stuck_at = -1
        #: Appended batches not dispatched yet, in log order, and how many messages they hold.
        self._handovers: deque[_Handover] = deque()
        self._handover_msgs = 0
        self._handover_bytes = 0
        self._handover_lock = threading.Lock()

    # -- hand-over ----------------------------------------------------------------------------------------
    def handover(self, start: int, end: int, store_ts: int, runs: Sequence[_Run], offsets: Sequence[int]) -> None:
        """An append wrote ``runs`` (as planned by the writer) at ``[start, end)`` with store time ``store_ts``:
        keep them, so dispatch builds their units and index entries from what the send path read instead of
        parsing the bytes back. Bounded by :data:`HANDOVER_MAX_MESSAGES` and :data:`HANDOVER_MAX_BYTES` (the
        oldest are dropped: dispatch parses those)."""
        with self._handover_lock:
            pending = self._handovers
            pending.append((start, end, store_ts, runs, offsets))
            self._handover_msgs += len(offsets)
            self._handover_bytes += end - start
            while (self._handover_msgs > HANDOVER_MAX_MESSAGES or self._handover_bytes > HANDOVER_MAX_BYTES) \
                    and pending:
                self._forget(pending.popleft())

    def _forget(self, entry: _Handover) -> None:
        self._handover_msgs -= len(entry[4])
        self._handover_bytes -= entry[1] - entry[0]

    def drop_handovers(self) -> None:
        """Forget every hand-over (the log was cut or restarted: its bytes may no longer be these records)."""
        with self._handover_lock:
            self._handovers.clear()
            self._handover_msgs = self._handover_bytes = 0

    def _drop_parsed(self, reput: int) -> None:
        """Forget the hand-overs of batches below ``reput`` (parsed from the bytes): their requests go now."""
        with self._handover_lock:
            self._forget_below(reput)

    def _forget_below(self, reput: int) -> None:
        pending = self._handovers
        while pending and pending[0][0] < reput:
            self._forget(pending.popleft())

    @property
    def handover_bytes(self) -> int:
        """Bytes of the batches handed over and not dispatched yet."""
        return self._handover_bytes

    def _next_handover_start(self) -> int | None:
        """Where the oldest kept hand-over starts (None: none kept)."""
        if not self._handovers:  # a slave's every step: no lock for nothing
            return None
        with self._handover_lock:
            return self._handovers[0][0] if self._handovers else None

    def _take_handover(self, reput: int) -> _Handover | None:
        """The hand-over of the batch that starts at ``reput``, if any; drops older ones (already parsed)."""
        pending = self._handovers
        if not pending:
            return None
        with self._handover_lock:
            self._forget_below(reput)
            if not pending or pending[0][0] != reput:
                return None
            entry = pending.popleft()
            self._forget(entry)
        return entry

    # -- dispatch ---------------------------------------------------------------------------------------
    def reset_caches(self) -> None:
        self._cq_cache.clear()
        self.drop_handovers()

    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        """Dispatch up to about ``max_bytes`` of complete records; returns the bytes consumed (0: caught up)."""
        with self.lock:
            notify: dict[ConsumeQueue, int] = {}
            consumed = self._dispatch(max_bytes, notify)
        for cq, max_offset in notify.items():
            for listener in self.listeners:
                try:
                    listener(cq.topic, cq.queue_id, max_offset)
                except Exception:
                    log.exception("dispatch listener failed for %s-%d", cq.topic, cq.queue_id)
        return consumed

    def _dispatch(self, max_bytes: int, notify: dict[ConsumeQueue, int]) -> int:
        cl = self.commitlog
        consumed = 0
        while consumed < max_bytes:
            reput = self.reput
            if reput >= cl.max_offset:
                break
            mf = cl.file_for(reput)
            if mf is None:
                if reput < cl.min_offset:
                    log.warning("reput offset %d below the commit log's min %d; skipping ahead", reput,
                                cl.min_offset)
                    self.reput = cl.min_offset
                    continue
                break
            pos = reput - mf.start
            entry = self._take_handover(reput)
            if entry is not None and entry[1] - mf.start <= mf.wrote and self._matches(mf.mm, pos, entry):
                self._dispatch_handover(entry, notify)
                consumed += entry[1] - reput
                self.reput = entry[1]
                continue
            budget_end = pos + max_bytes - consumed
            ahead = self._next_handover_start()
            if ahead is not None and ahead - mf.start > pos:
                # Parse only up to the next hand-over (a batch's first record). Stopping inside a batch would
                # drop its hand-over and the next one's, and each pass after would parse again while dispatch is
                # more than a chunk behind: under a steady load, for good.
                budget_end = min(budget_end, ahead - mf.start)
            new_pos, blank = self._dispatch_file(mf.mm, mf.start, mf.size, pos, mf.wrote, budget_end, notify)
            if blank:
                new_pos = mf.size
            consumed += new_pos - pos
            self.reput = mf.start + new_pos
            if self._handovers and self._handovers[0][0] < self.reput:
                self._drop_parsed(self.reput)
            if new_pos == pos:
                break
        return consumed

    def _matches(self, mm: mmap.mmap, pos: int, entry: _Handover) -> bool:
        """Whether the log holds the hand-over's first record at ``pos`` (a cheap guard: magic and offset)."""
        if pos + 36 > len(mm):
            return False
        _, magic = RECORD_PREFIX.unpack_from(mm, pos)
        if magic == MAGIC_V1 and _I64(mm, pos + 28)[0] == entry[0]:
            return True
        log.warning("appended batch at %d does not match the log: dispatching from the bytes", entry[0])
        self.drop_handovers()
        return False

    def _queue(self, topic: bytes, queue_id: int) -> ConsumeQueue | None:
        key = (topic, queue_id)
        try:
            return self._cq_cache[key]
        except KeyError:
            cq = self._cq_cache[key] = self.cqs.get_or_create(topic.decode("utf-8", "replace"), queue_id)
            return cq

    def _tags_code(self, tags: bytes) -> int:
        code = self._tags_cache.get(tags)
        if code is None:
            code = tags_hash(tags.decode("utf-8", "replace"))
            if len(self._tags_cache) < 65536:
                self._tags_cache[tags] = code
        return code

    def _codes(self, topic: bytes, queue_id: int, tags: list[bytes], times: list[int] | int) -> list[int]:
        """Tag codes of a run: the tags' hashes, or for SCHEDULE_TOPIC_XXXX the deliver time."""
        n = len(tags)
        if topic == _SCHEDULE_B:
            levels = self.delay_levels_ms
            delay = levels[queue_id] if 0 <= queue_id < len(levels) else 1000
            return [times + delay] * n if isinstance(times, int) else [t + delay for t in times]
        first = tags[0]
        if tags.count(first) == n:  # one tag for the whole run (the usual batch)
            return [self._tags_code(first) if first else 0] * n
        code = self._tags_code
        return [code(t) if t else 0 for t in tags]

    def _emit(self, topic: bytes, queue_id: int, first_offset: int, tx: int, phys: list[int], sizes: list[int],
              tags: list[bytes], times: list[int] | int, uniqs: list[bytes], keys: list[bytes],
              notify: dict[ConsumeQueue, int]) -> None:
        """Units and index entries of one run: consecutive records of one queue, one transaction type."""
        if tx == 0 or tx == 8:
            cq = self._cq_cache.get((topic, queue_id)) or self._queue(topic, queue_id)
            if cq is not None:
                top = cq.put_run(phys, sizes, self._codes(topic, queue_id, tags, times), first_offset)
                if top:
                    notify[cq] = top
        index = self.index
        if index is not None and tx != 0xC:
            index.build_batch(topic, phys, times, uniqs, keys)

    def _dispatch_handover(self, entry: _Handover, notify: dict[ConsumeQueue, int]) -> None:
        _, _, store_ts, runs, offsets = entry
        k = 0
        for topic, queue_id, first_offset, items, nbytes in runs:
            n = len(items)
            tx = items[0].sys_flag & 0xC
            if n == 1:  # a single send: no column set-up
                item = items[0]
                tags, uniqs, keys = [item[6]], [item[8]], [item[7]]
                phys = [offsets[k]]
                sizes = [nbytes]
            else:
                tags, uniqs, keys = list(map(_TAGS, items)), list(map(_UNIQ, items)), list(map(_KEYS, items))
                phys = list(offsets[k : k + n])
                sizes = list(map(sub, phys[1:], phys[:-1]))
                sizes.append(phys[0] + nbytes - phys[-1])
            k += n
            self._emit(topic, queue_id, first_offset, tx, phys, sizes, tags, store_ts, uniqs, keys, notify)
        self.last_store_ts = store_ts

    def _invalid(self, file_start: int, pos: int, why: str) -> tuple[int, bool]:
        if self._stuck_at != file_start + pos:
            self._stuck_at = file_start + pos
            log.error("dispatch stopped at physical offset %d: %s", file_start + pos, why)
        return pos, False

    def _dispatch_file(
        self, mm: mmap.mmap, file_start: int, file_size: int, pos: int, limit: int, budget_end: int,
        notify: dict[ConsumeQueue, int],
    ) -> tuple[int, bool]:
        """Dispatch records in one file from ``pos`` to ``limit``; ``(new position, hit blank marker)``.

        The records are parsed first (each once), grouped in runs, then built run by run; what was parsed
        before an invalid record or a blank marker is built too."""
        head = DISPATCH_HEAD_V4.unpack_from
        scan = scan_properties
        # One run: [topic, queue id, first queue offset, tx type, phys, sizes, tags, times, uniqs, keys].
        runs: list[list] = []
        run: list | None = None
        next_offset = -1
        last_ts = self.last_store_ts
        result: tuple[int, bool] | None = None
        # Below the index's end, a record of a queue that already holds it is a replay (abnormal recovery
        # re-dispatches whole files): skipped before its properties are read.
        index = self.index
        indexed_below = index.end_phy if index is not None else 1 << 62
        queues = self._cq_cache
        while pos < budget_end and pos + 8 <= limit:
            if pos + 88 > file_size:
                size, magic = RECORD_PREFIX.unpack_from(mm, pos)
                if magic == BLANK_MAGIC:
                    result = pos, True
                else:
                    result = self._invalid(file_start, pos, f"bad magic {magic & 0xFFFFFFFF:#x}")
                break
            size, magic, queue_id, queue_offset, phy, sys_flag, store_ts, body_len = head(mm, pos)
            if magic != MAGIC_V1:
                if magic == BLANK_MAGIC:
                    result = pos, True
                else:
                    result = self._invalid(file_start, pos, f"bad magic {magic & 0xFFFFFFFF:#x}")
                break
            if pos + size > limit:
                break  # incomplete record: wait for the rest
            if size < 91:
                result = self._invalid(file_start, pos, f"impossible size {size}")
                break
            if sys_flag & 0x30:
                try:
                    _, ts_pos, _, tp, pp = record_layout(memoryview(mm), pos, size)
                except ProtocolViolationError as exc:
                    result = self._invalid(file_start, pos, str(exc))
                    break
                store_ts = _I64(mm, ts_pos)[0]
            else:
                tp = pos + 88 + body_len
                pp = tp + 1 + mm[tp]
            topic = mm[tp + 1 : pp]
            tx = sys_flag & 0xC
            if tx == 0xC or (phy < indexed_below and (tx == 4 or (
                    (cq := queues.get((topic, queue_id)) or self._queue(topic, queue_id)) is not None
                    and phy + size <= cq.max_physic_end))):
                # A rollback record builds nothing; a prepared one only its index entries.
                last_ts = store_ts
                pos += size
                continue
            # The record's properties read once, from its stored bytes (the same on a slave).
            tags, keys, uniq, _, _ = scan(mm[pp + 2 : pos + size])
            if (run is None or queue_offset != next_offset or run[1] != queue_id or run[3] != tx
                    or run[0] != topic):
                run = [topic, queue_id, queue_offset, tx, [], [], [], [], [], []]
                runs.append(run)
                add_phy, add_size, add_tags, add_ts, add_uniq, add_keys = (
                    run[4].append, run[5].append, run[6].append, run[7].append, run[8].append, run[9].append)
            next_offset = queue_offset + 1
            add_phy(phy)
            add_size(size)
            add_tags(tags)
            add_ts(store_ts)
            add_uniq(uniq)
            add_keys(keys)
            last_ts = store_ts
            pos += size
        emit = self._emit
        for topic, queue_id, first_offset, tx, phys, sizes, tags, times, uniqs, keys in runs:
            emit(topic, queue_id, first_offset, tx, phys, sizes, tags, times, uniqs, keys, notify)
        self.last_store_ts = last_ts
        return result if result is not None else (pos, False)
