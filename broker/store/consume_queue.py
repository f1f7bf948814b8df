"""Consume queues: per (topic, queueId), a chain of fixed-size files of 20-byte units (docs/BEHAVIOUR.md 7.2)::

    0  8  commitLogOffset   int64
    8  4  size              int32
   12  8  tagsCode          int64   (for SCHEDULE_TOPIC_XXXX: the deliver timestamp)

Logical offset ``n`` lives at byte ``n * 20`` of the chain; files are named by their starting byte offset.
Appends are idempotent (a unit whose ``commitLogOffset + size`` is not past the last one is ignored), so the
dispatcher may replay the commit log. A queue that starts past 0 is padded with blank units
``(0, Integer.MAX_VALUE, 0)``, which readers skip.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterator

from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile, RetiredFiles, file_name, list_offset_files

__all__ = ["BLANK_SIZE", "CQ_UNIT", "UNIT_SIZE", "ConsumeQueue", "ConsumeQueueTable"]

log = logging.getLogger(__name__)

CQ_UNIT = struct.Struct(">qiq")
UNIT_SIZE = 20
BLANK_SIZE = 0x7FFFFFFF
_BLANK_UNIT = CQ_UNIT.pack(0, BLANK_SIZE, 0)
_NAME_RE = re.compile(r"[%|a-zA-Z0-9_-]{1,127}")
#: Consume-queue files are sparse and get disk blocks this many bytes at a time, ahead of the writes: a queue that
#: holds a few units costs a few KiB, not its 6 MB file (800 new topics used to preallocate 4.5 GB).
RESERVE_CHUNK = 64 * 1024


_UNIT_STRUCTS: dict[int, struct.Struct] = {}
#: Units packed by one write (its struct stays cached).
_UNITS_PER_WRITE = 512


def _units_struct(n: int) -> struct.Struct:
    """A struct of ``n`` consecutive units (cached: batches repeat their sizes; one-off sizes are not kept)."""
    st = _UNIT_STRUCTS.get(n)
    if st is None:
        st = struct.Struct(">" + "qiq" * n)
        if n <= 1024 and len(_UNIT_STRUCTS) < 256:
            _UNIT_STRUCTS[n] = st
    return st


class ConsumeQueue:
    """One logical queue. Written by the dispatcher only; read by anyone."""

    def __init__(self, io: FileIO, directory: str, topic: str, queue_id: int, file_size: int) -> None:
        self.io = io
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.files: list[MappedFile] = []
        #: ``phy + size`` of the last real unit: appends not past it are replays.
        self.max_physic_end = 0
        self.min_offset = 0

    # -- lifecycle --------------------------------------------------------------------------------------
    def load(self) -> None:
        for start, path in list_offset_files(self.directory):
            if self.files and self.files[-1].end != start:
                log.warning("consume queue %s: gap before %s; ignoring later files", self.directory, path)
                break
            # sparse: the unwritten part may have no blocks; the next write reserves them (no SIGBUS on a full disk)
            mf = MappedFile.open(self.io, path, start, self.file_size, create=os.path.getsize(path) < self.file_size,
                                 sparse=True)
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)

    def recover(self) -> None:
        """Find the end: from the third-last file, units are valid while ``offset >= 0 and size > 0``."""
        files = self.files
        if not files:
            return
        for i in range(max(0, len(files) - 3), len(files)):
            mf = files[i]
            pos = 0
            for phy, size, _ in CQ_UNIT.iter_unpack(mf.mm):
                if phy < 0 or size <= 0:
                    break
                pos += UNIT_SIZE
            if pos < mf.size:
                self._cut(i, pos)
                break
        self._refresh_bounds()

    def _refresh_bounds(self) -> None:
        self.max_physic_end = 0
        for off in range(self.max_offset - 1, self.first_offset - 1, -1):
            phy, size, _ = self.unit(off)  # type: ignore[misc]
            if size != BLANK_SIZE:
                self.max_physic_end = phy + size
                break
        self.min_offset = self.first_offset
        if self.files:
            first = self.files[0]
            for i, (_, size, _) in enumerate(CQ_UNIT.iter_unpack(first.mm[: first.wrote])):
                if size != BLANK_SIZE:
                    self.min_offset = (first.start // UNIT_SIZE) + i
                    break
            else:
                self.min_offset = self.max_offset

    def _cut(self, index: int, pos: int) -> None:
        mf = self.files[index]
        mf.zero(pos, mf.size)
        mf.wrote = pos
        mf.flushed = min(mf.flushed, pos)
        mf.flush(mf.size)
        mf.flushed = pos
        drop_from = index if pos == 0 and index > 0 else index + 1
        for later in self.files[drop_from:]:
            later.destroy()
        del self.files[drop_from:]

    def close(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files.clear()
        self.max_physic_end = self.min_offset = 0

    # -- offsets ----------------------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        return self.files[0].start // UNIT_SIZE if self.files else 0

    @property
    def max_offset(self) -> int:
        files = self.files
        if not files:
            return 0
        last = files[-1]
        return (last.start + last.wrote) // UNIT_SIZE

    def locate(self, offset: int) -> tuple[MappedFile, int] | None:
        """``(file, byte position)`` of unit ``offset`` if written."""
        files = self.files
        if not files:
            return None
        byte = offset * UNIT_SIZE
        idx = (byte - files[0].start) // self.file_size
        if idx < 0 or idx >= len(files):
            return None
        mf = files[idx]
        pos = byte - mf.start
        return (mf, pos) if pos < mf.wrote else None

    def unit(self, offset: int) -> tuple[int, int, int] | None:
        """``(phy, size, tags_code)`` of unit ``offset`` or None."""
        loc = self.locate(offset)
        if loc is None:
            return None
        mf, pos = loc
        phy, size, tag = CQ_UNIT.unpack_from(mf.mm, pos)
        return phy, size, tag

    def iter_units(self, offset: int) -> Iterator[tuple[int, int, int, int]]:
        """``(queue offset, phy, size, tags_code)`` from ``offset`` to the end."""
        while True:
            loc = self.locate(offset)
            if loc is None:
                return
            mf, pos = loc
            for phy, size, tag in CQ_UNIT.iter_unpack(mf.mm[pos : mf.wrote]):
                yield offset, phy, size, tag
                offset += 1

    # -- writes -----------------------------------------------------------------------------------------
    def _new_file(self, start: int) -> MappedFile:
        self.io.makedirs(self.directory)
        mf = MappedFile.open(self.io, os.path.join(self.directory, file_name(start)), start, self.file_size,
                             create=True, sparse=True)
        self.files.append(mf)
        return mf

    def _write(self, data: bytes) -> None:
        files = self.files
        mf = files[-1] if files else None
        if mf is None or mf.wrote >= mf.size:
            mf = self._new_file(mf.end if mf is not None else 0)
        if mf.wrote + UNIT_SIZE > mf.reserved:
            mf.reserve(mf.wrote + UNIT_SIZE, RESERVE_CHUNK)
        mf.write(mf.wrote, data)
        mf.wrote += UNIT_SIZE

    def _fill_blanks(self, upto: int) -> None:
        if not self.files:
            start = upto * UNIT_SIZE // self.file_size * self.file_size
            mf = self._new_file(start)
            n = (upto * UNIT_SIZE - start) // UNIT_SIZE
            if n:
                mf.reserve(n * UNIT_SIZE, RESERVE_CHUNK)
                mf.write(0, _BLANK_UNIT * n)
                mf.wrote = n * UNIT_SIZE
            self.min_offset = upto
            return
        log.warning("consume queue %s-%d: gap before offset %d filled with blank units", self.topic,
                    self.queue_id, upto)
        while self.max_offset < upto:
            self._write(_BLANK_UNIT)

    def put(self, phy: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Append a unit at ``queue_offset``; False when it is a replay or conflicts with an existing unit."""
        if phy + size <= self.max_physic_end:
            return False
        max_offset = self.max_offset
        if queue_offset != max_offset:
            if queue_offset < max_offset:
                log.warning("consume queue %s-%d: unit for offset %d (phy %d) already present; max offset %d",
                            self.topic, self.queue_id, queue_offset, phy, max_offset)
                return False
            self._fill_blanks(queue_offset)
            if self.min_offset >= max_offset:  # nothing readable before the gap (a slave restarted its log)
                self.min_offset = queue_offset
        files = self.files
        mf = files[-1] if files else None
        if mf is None or mf.wrote >= mf.size:
            mf = self._new_file(mf.end if mf is not None else 0)
        pos = mf.wrote
        if pos + UNIT_SIZE > mf.reserved:
            mf.reserve(pos + UNIT_SIZE, RESERVE_CHUNK)
        io = self.io
        if io.hooked:
            io.before_write(mf.path, pos, UNIT_SIZE)
        CQ_UNIT.pack_into(mf.mm, pos, phy, size, tags_code)
        if io.hooked:
            io.after_write(mf.path, mf.mm, pos, UNIT_SIZE)
        mf.wrote = pos + UNIT_SIZE
        self.max_physic_end = phy + size
        return True

    def put_run(self, phys: list[int], sizes: list[int], codes: list[int], first_offset: int) -> int:
        """Append the units of consecutive queue offsets from ``first_offset`` (records in log order) as
        :meth:`put` would one by one, but with one write per file touched (and per 512 units); returns the queue's max offset
        after them, 0 when none was added (all replays or conflicts)."""
        n = len(phys)
        if n == 1:  # a single send: the plain put
            return self.max_offset if self.put(phys[0], sizes[0], codes[0], first_offset) else 0
        i = 0
        end = self.max_physic_end
        while i < n and phys[i] + sizes[i] <= end:  # replays: a prefix (phys grow)
            i += 1
        if i == n:
            return 0
        if first_offset + i != self.max_offset:  # a gap, a conflict or a fresh queue: the careful path
            added = False
            for j in range(i, n):
                added = self.put(phys[j], sizes[j], codes[j], first_offset + j) or added
            return self.max_offset if added else 0
        args: list[int] = [0] * (3 * (n - i))
        args[0::3] = phys[i:] if i else phys
        args[1::3] = sizes[i:] if i else sizes
        args[2::3] = codes[i:] if i else codes
        io = self.io
        at = 0
        while at < len(args):
            files = self.files
            mf = files[-1] if files else None
            if mf is None or mf.wrote >= mf.size:
                mf = self._new_file(mf.end if mf is not None else 0)
            pos = mf.wrote
            k = min((len(args) - at) // 3, (mf.size - pos) // UNIT_SIZE, _UNITS_PER_WRITE)
            nbytes = k * UNIT_SIZE
            if pos + nbytes > mf.reserved:
                mf.reserve(pos + nbytes, RESERVE_CHUNK)
            if io.hooked:
                io.before_write(mf.path, pos, nbytes)
            _units_struct(k).pack_into(mf.mm, pos, *args[at : at + 3 * k])
            if io.hooked:
                io.after_write(mf.path, mf.mm, pos, nbytes)
            mf.wrote = pos + nbytes
            at += 3 * k
        self.max_physic_end = phys[-1] + sizes[-1]
        return self.max_offset

    def truncate_dirty(self, phy_end: int) -> None:
        """Drop units pointing at commit-log offsets ``>= phy_end``."""
        lo, hi = self.first_offset, self.max_offset
        # Units are in commit-log order (blank padding, phy 0, only at the start): binary search the cut.
        while lo < hi:
            mid = (lo + hi) // 2
            phy, size, _ = self.unit(mid)  # type: ignore[misc]
            if size != BLANK_SIZE and phy >= phy_end:
                hi = mid
            else:
                lo = mid + 1
        if lo < self.max_offset:
            log.info("consume queue %s-%d: truncated to offset %d (commit log ends at %d)", self.topic,
                     self.queue_id, lo, phy_end)
            byte = lo * UNIT_SIZE
            idx = (byte - self.files[0].start) // self.file_size
            self._cut(idx, byte - self.files[idx].start)
            self._refresh_bounds()

    def flush(self) -> None:
        for mf in list(self.files):
            if mf.flushed < mf.wrote:
                mf.flush()

    # -- retention --------------------------------------------------------------------------------------
    def delete_expired(self, min_phy: int, retired: RetiredFiles, now_ms: int) -> int:
        """Retire the files whose every unit points below ``min_phy`` (never the last file), then correct the
        min offset (RocketMQ's ``deleteExpiredFile`` + ``correctMinOffset``). Returns the files retired."""
        files = self.files
        n = 0
        while n < len(files) - 1:
            mf = files[n]
            if mf.wrote < UNIT_SIZE:
                break
            phy, size, _ = CQ_UNIT.unpack_from(mf.mm, mf.wrote - UNIT_SIZE)
            if size != BLANK_SIZE and phy >= min_phy:  # units are in log order: the last one is the newest
                break
            n += 1
        if n:
            gone = files[:n]
            del files[:n]
            for mf in gone:
                retired.add(mf, now_ms)
        self.correct_min_offset(min_phy)
        return n

    def correct_min_offset(self, min_phy: int) -> None:
        """Min offset := the first unit that still points into the commit log (``>= min_phy``); the max offset
        when none does."""
        lo, hi = max(self.min_offset, self.first_offset), self.max_offset
        while lo < hi:  # blank padding (phy 0) only at the start, then units in log order
            mid = (lo + hi) // 2
            phy, size, _ = self.unit(mid)  # type: ignore[misc]
            if size != BLANK_SIZE and phy >= min_phy:
                hi = mid
            else:
                lo = mid + 1
        self.min_offset = lo


class ConsumeQueueTable:
    """Every consume queue under ``<root>/consumequeue``, keyed by ``(topic, queue_id)``."""

    def __init__(self, io: FileIO, directory: str, file_size: int) -> None:
        self.io = io
        self.directory = directory
        self.file_size = file_size
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> None:
        self.io.makedirs(self.directory)
        for topic in sorted(os.listdir(self.directory)):
            tdir = os.path.join(self.directory, topic)
            if not _NAME_RE.fullmatch(topic) or not os.path.isdir(tdir):
                log.warning("ignoring %s: not a topic directory", tdir)
                continue
            for qid in sorted(os.listdir(tdir)):
                if qid.isdigit():
                    cq = self._make(topic, int(qid))
                    cq.load()
                    self.queues[(topic, int(qid))] = cq

    def _make(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(self.io, os.path.join(self.directory, topic, str(queue_id)), topic, queue_id,
                            self.file_size)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, created (in memory; files on first unit) when new; None for an unsafe topic name."""
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            if not _NAME_RE.fullmatch(topic) or queue_id < 0:
                log.error("not building a consume queue for topic %r queue %d: illegal name", topic, queue_id)
                return None
            cq = self.queues[key] = self._make(topic, queue_id)
        return cq

    def recover(self) -> None:
        for cq in self.queues.values():
            cq.recover()

    def max_physic_end(self) -> int:
        return max((cq.max_physic_end for cq in self.queues.values()), default=0)

    def truncate_dirty(self, phy_end: int) -> None:
        for cq in self.queues.values():
            if cq.max_physic_end > phy_end:
                cq.truncate_dirty(phy_end)

    def delete_expired(self, min_phy: int, retired: RetiredFiles, now_ms: int) -> int:
        """Every queue's :meth:`ConsumeQueue.delete_expired`; returns the files retired."""
        return sum(cq.delete_expired(min_phy, retired, now_ms) for cq in list(self.queues.values()))

    def correct_min_offsets(self, min_phy: int) -> None:
        for cq in self.queues.values():
            cq.correct_min_offset(min_phy)

    def destroy_all(self) -> None:
        for cq in self.queues.values():
            cq.destroy()
        self.queues.clear()

    def flush(self) -> None:
        for cq in list(self.queues.values()):
            cq.flush()

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
