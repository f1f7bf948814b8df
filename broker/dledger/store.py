"""The DLedger log on disk (docs/BEHAVIOUR.md 9.6-9.7): entry data files and index files on the store's mapped-file
and fault-injecting I/O layer, the ``checkpoint`` and ``currterm`` files, recovery after a crash, and truncation
of a divergent tail.

* ``data/<20-digit start position>``: entries back to back, preallocated files of ``data_file_size`` bytes; an
  entry never spans two files: one that does not fit (leaving 8 bytes) goes to the next file and the rest of the
  current one is closed with the blank marker ``[int32 remaining][int32 BLANK_MAGIC]``, the commit log's rule.
  Every peer places an entry at the same position (same file size, same rule), so commit-log offsets
  (position + 48) agree across the group.
* ``index/<20-digit start byte>``: one 32-byte unit per entry, entry ``i``'s at byte ``i * 32``.
* ``checkpoint``: ``endIndex`` and ``committedIndex`` (Java properties); ``currterm``: ``currTerm``, ``voteLeader``.

Recovery walks the entries of the last three data files with :func:`broker.dledger.entry.check_entry` and cuts
the log after the last good one (a torn tail after SIGKILL), rewriting the index units it walked; the committed
index comes back from the checkpoint, capped at the recovered end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import cast

from broker.dledger.entry import (
    BLANK_MAGIC,
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    check_entry,
    read_entry_header,
    read_index_unit,
    seal_entry,
    write_index_unit,
)
from broker.store.commitlog import CommitLog
from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile, list_offset_files

__all__ = ["DLedgerStore", "EntryRefused", "copying", "read_properties"]

log = logging.getLogger(__name__)

_BLANK = BLANK_MAGIC.to_bytes(4, "big", signed=True)


class EntryRefused(ValueError):
    """An entry a follower cannot append (wrong index or position, a bad entry): the leader must COMPARE."""


def read_properties(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def copying(body: bytes | memoryview) -> Callable[[bytearray, int, int], None]:
    """A body builder for :meth:`DLedgerStore.append_built` that copies ``body`` as it is."""
    def copy(buf: bytearray, at: int, _phys: int) -> None:
        buf[at : at + len(body)] = body
    return copy


class _Chain(CommitLog):
    """Fixed-size mapped files named by their start offset, contiguous. It is a :class:`CommitLog` so the store's
    readers, its flush thread (incremental msync of ``[flushed, wrote)``) and its disk guard work on it unchanged;
    the DLedger store moves each file's ``wrote`` as it writes, and truncation moves it back."""

    def __init__(self, io: FileIO, directory: str, file_size: int, *, preallocate: bool = False) -> None:
        super().__init__(io, directory, file_size, preallocate=preallocate)
        self.on_retired: Callable[[int], None] | None = None
        """Called with the time after :meth:`retire_head` took files out (the DLedger store moves its begin)."""

    def load(self) -> None:
        """Open every file; all count as written and flushed until recovery sets the end (:meth:`set_end`)."""
        self.io.makedirs(self.directory)
        for start, path in list_offset_files(self.directory):
            if self.files and self.files[-1].end != start:
                log.warning("%s: gap before %s; ignoring it and later files", self.directory, path)
                break
            mf = MappedFile.open(self.io, path, start, self.file_size, create=os.path.getsize(path) < self.file_size)
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)

    def ensure(self, offset: int) -> MappedFile:
        """The file holding ``offset``, created (with every file before it) when missing. With ``preallocate``
        a file is created ahead and its pages faulted in by a background thread, as the commit log's are
        (:meth:`CommitLog._create`): a write into never-touched pages of the map costs a page fault per 4 KiB,
        on the leader's append and on every follower.

        Raises:
            OSError: a full disk (nothing is half-created).
        """
        mf = self.file_for(offset)
        if mf is not None:
            return mf
        start = offset - offset % self.file_size
        if self.files and start < self.files[0].start:
            raise ValueError(f"{offset} is before the first file of {self.directory}")
        nxt = self.files[-1].end if self.files else start
        while True:
            mf = self._create(nxt)
            with self.lock:
                self.files.append(mf)
            if mf.end > offset:
                return mf
            mf.wrote = mf.size  # skipped over: nothing will be written there
            nxt = mf.end

    def wrote_to(self, mf: MappedFile, end: int) -> None:
        """Bytes up to global offset ``end`` of ``mf`` are written (the flush thread msyncs them)."""
        mf.wrote = max(mf.wrote, end - mf.start)

    def set_end(self, offset: int) -> None:
        """Everything before ``offset`` is written, nothing after it (recovery, truncation)."""
        with self.lock:
            for mf in self.files:
                mf.wrote = min(mf.size, max(0, offset - mf.start))
                mf.flushed = min(mf.flushed, mf.wrote)
            self.flushed_where = min(self.flushed_where, offset)

    def drop_from(self, offset: int) -> None:
        """Zero everything from ``offset`` and delete the files after its file."""
        self._discard_prepared()  # its populater may hold a map that goes, and the next file starts elsewhere
        with self.lock:
            for mf in list(self.files):
                if mf.start >= offset and mf is not self.files[0]:
                    mf.destroy()
                    self.files.remove(mf)
                elif mf.end > offset:
                    mf.zero(max(0, offset - mf.start), mf.size)
        self.set_end(offset)

    def clear(self) -> None:
        self._discard_prepared()
        with self.lock:
            for mf in self.files:
                mf.destroy()
            self.files.clear()
            self.flushed_where = 0

    def retire_head(self, count: int, now_ms: int) -> list[MappedFile]:
        """Retention took the oldest files out (see :meth:`CommitLog.retire_head`); the store hears of it."""
        gone = super().retire_head(count, now_ms)
        if gone and self.on_retired is not None:
            self.on_retired(now_ms)
        return gone


class DLedgerStore:
    """One peer's log.

    Args:
        io: the file layer (the store's; a subclass may inject faults, see :mod:`broker.store.io`).
        directory: ``<storePathRootDir>/dledger-<selfId>``.
        data_file_size: ``mappedFileSizeForEntryData`` (RocketMQ: ``mappedFileSizeCommitLog``).
        index_file_size: ``mappedFileSizeForEntryIndex`` (a multiple of 32).
        preallocate: create each data file ahead and fault its pages in from a background thread (the store's
            ``preallocate_commitlog``, as for the classic commit log).
    """

    def __init__(self, io: FileIO, directory: str, *, data_file_size: int, index_file_size: int,
                 preallocate: bool = False) -> None:
        if index_file_size % INDEX_UNIT_SIZE:
            raise ValueError(f"index file size {index_file_size} is not a multiple of {INDEX_UNIT_SIZE}")
        if data_file_size < 2 * BODY_OFFSET:
            raise ValueError(f"data file size {data_file_size} is too small")
        self.io = io
        self.directory = directory
        self.data = _Chain(io, os.path.join(directory, "data"), data_file_size, preallocate=preallocate)
        self.index = _Chain(io, os.path.join(directory, "index"), index_file_size)
        self.index.retired = self.data.retired  # one list of deleted maps, closed by the store's cleaner
        self.data.on_retired = self._head_retired
        self.begin_index = -1
        self.end_index = -1
        self.end_term = -1
        self.end_pos = 0
        """Position after the last entry (where the next one goes, before a roll)."""
        self.committed_index = -1
        self.committed_pos = -1
        """End position of the committed entry (-1 when nothing is committed)."""

    # -- lifecycle --------------------------------------------------------------------------------------
    def load(self) -> None:
        """Open the files, recover the end of the log, read the checkpoint."""
        self.io.makedirs(self.directory)
        self.data.load()
        self.index.load()
        self._recover()
        self._begin_at_first_file()
        cp = self._read(os.path.join(self.directory, "checkpoint"))
        committed = int(cp.get("committedIndex", "-1"))
        self.committed_index = min(committed, self.end_index)
        self.committed_pos = self.end_of(self.committed_index)

    def _read(self, path: str) -> dict[str, str]:
        try:
            with open(path, encoding="utf-8") as f:
                return read_properties(f.read())
        except FileNotFoundError:
            return {}

    def _recover(self) -> None:
        files = self.data.files
        if not files:
            return
        start_file = max(0, len(files) - 3)
        first = None
        for mf in files[start_file:]:  # the first entry at the start of one of the last files
            if check_entry(mf.mm, 0, end=mf.size, pos=mf.start) is None:
                first = mf
                break
        if first is None:
            log.warning("%s: no entry at the start of the last data files; the log is empty", self.directory)
            self.data.clear()
            self.index.clear()
            return
        h = read_entry_header(first.mm, 0)
        if self.begin_index < 0:
            self.begin_index = self._first_index(h.entry_index)
        pos, idx, term = first.start, h.entry_index - 1, -1
        while True:
            cur = self.data.file_for(pos)
            if cur is None:
                break
            mf = cur
            at = pos - mf.start
            if at + 8 <= mf.size and mf.mm[at + 4 : at + 8] == _BLANK:
                pos = mf.end
                continue
            if check_entry(mf.mm, at, end=mf.size, pos=pos, index=idx + 1) is not None:
                break
            hdr = read_entry_header(mf.mm, at)
            iu = self.index.ensure((idx + 1) * INDEX_UNIT_SIZE)
            write_index_unit(iu.mm, (idx + 1) * INDEX_UNIT_SIZE - iu.start, pos=pos, size=hdr.size, index=idx + 1,
                             term=hdr.term)
            idx, term, pos = idx + 1, hdr.term, pos + hdr.size
        self.end_index, self.end_term, self.end_pos = idx, term, pos
        self.data.drop_from(pos)
        self.index.drop_from((idx + 1) * INDEX_UNIT_SIZE)
        log.info("%s: recovered entries %d..%d (end position %d)", self.directory, self.begin_index, idx, pos)

    def _begin_at_first_file(self) -> None:
        """The log begins with the first entry of the first data file (retention deleted the files before it;
        index files may still hold units for them)."""
        if self.data.files and self.end_index >= 0:
            first = self.data.files[0]
            if check_entry(first.mm, 0, end=first.size, pos=first.start) is None:
                self.begin_index = max(self.begin_index, read_entry_header(first.mm, 0).entry_index)

    def _head_retired(self, now_ms: int) -> None:
        """Retention deleted the oldest data files: the log now begins at the first entry left, and the index
        files holding only units before it go too."""
        self._begin_at_first_file()
        below = 0
        for iu in self.index.files[:-1]:
            if iu.end > self.begin_index * INDEX_UNIT_SIZE:
                break
            below += 1
        if below:
            self.index.retire_head(below, now_ms)
        log.info("%s: retention: the log now begins at entry %d (position %d)", self.directory, self.begin_index,
                 self.data.min_offset)

    def _first_index(self, walked_from: int) -> int:
        """The first index the index files hold a unit for (the log's begin), else where the walk started."""
        files = self.index.files
        if files:
            first = files[0]
            for at in range(0, first.size, INDEX_UNIT_SIZE):
                if read_index_unit(first.mm, at).magic != 0:
                    return (first.start + at) // INDEX_UNIT_SIZE
        return walked_from

    def write_checkpoint(self) -> None:
        text = f"endIndex={self.end_index}\ncommittedIndex={self.committed_index}\n"
        self.io.write_small_file(os.path.join(self.directory, "checkpoint"), text.encode())

    def persist_term(self, term: int, vote_for: str | None) -> None:
        """The ``currterm`` file, written (and fsynced) before a vote or a new term is acted on."""
        text = f"currTerm={term}\nvoteLeader={vote_for or ''}\n"
        path = os.path.join(self.directory, "currterm")
        self.io.write_small_file(path + ".tmp", text.encode())
        os.replace(path + ".tmp", path)

    def load_term(self) -> tuple[int, str | None]:
        props = self._read(os.path.join(self.directory, "currterm"))
        return int(props.get("currTerm", "0")), props.get("voteLeader") or None

    def flush(self) -> int:
        """msync what was written since the last flush (data, then index); returns the flushed data position."""
        flushed = self.data.flush()
        self.index.flush()
        return flushed

    def close(self) -> None:
        self.data.close()
        self.index.close()

    # -- appends ----------------------------------------------------------------------------------------
    def _place(self, size: int) -> int:
        """Where an entry of ``size`` bytes goes: the end, or the next file when it does not fit (blank marker)."""
        fs = self.data.file_size
        if size + 8 > fs:
            raise ValueError(f"an entry of {size} bytes does not fit a data file of {fs} bytes")
        pos = self.end_pos
        room = fs - pos % fs
        if size + 8 > room:
            mf = self.data.ensure(pos)
            mf.write(pos - mf.start, room.to_bytes(4, "big") + _BLANK)
            self.data.wrote_to(mf, mf.end)
            pos += room
        return pos

    def _write(self, index: int, term: int, pos: int, entry: bytes | bytearray | memoryview) -> None:
        mf = self.data.ensure(pos)
        iu = self.index.ensure(index * INDEX_UNIT_SIZE)
        mf.write(pos - mf.start, entry)
        self._index_and_end(mf, iu, index, term, pos, len(entry))

    def _index_and_end(self, mf: MappedFile, iu: MappedFile, index: int, term: int, pos: int, size: int) -> None:
        """The entry at ``pos`` is in ``mf``: write its index unit and move the log's end past it."""
        write_index_unit(iu.mm, index * INDEX_UNIT_SIZE - iu.start, pos=pos, size=size, index=index, term=term)
        self.data.wrote_to(mf, pos + size)
        self.index.wrote_to(iu, (index + 1) * INDEX_UNIT_SIZE)
        if self.begin_index < 0:
            self.begin_index = index
        self.end_index, self.end_term, self.end_pos = index, term, pos + size

    def append_as_leader(self, term: int, body: bytes | memoryview) -> tuple[int, int]:
        """Append ``body`` as the next entry in ``term``; returns ``(index, position)``.

        Raises:
            OSError: the disk is full (nothing is written).
        """
        return self.append_built(term, len(body), copying(body))

    def append_built(self, term: int, body_length: int,
                     build: Callable[[bytearray, int, int], None]) -> tuple[int, int]:
        """Append the next entry in ``term`` with a body of ``body_length`` bytes that ``build(buf, at, phys)``
        writes into ``buf[at:]``; ``phys`` is the body's position in the log (entry position + 48), which the
        broker's records carry as their PHYSICALOFFSET. Returns ``(index, position)``.

        Raises:
            OSError: the disk is full (nothing is written).
        """
        size = BODY_OFFSET + body_length
        pos = self._place(size)
        index = self.end_index + 1
        mf = self.data.ensure(pos)
        iu = self.index.ensure(index * INDEX_UNIT_SIZE)
        at = pos - mf.start
        io = mf.io
        if io.hooked:
            io.before_write(mf.path, at, size)
        # Straight into the map: the bytes past the log's end mean nothing until the end moves over them.
        if body_length:
            build(cast(bytearray, mf.mm), at + BODY_OFFSET, pos + BODY_OFFSET)
        seal_entry(mf.mm, at, index=index, term=term, pos=pos, body_length=body_length)
        if io.hooked:
            io.after_write(mf.path, mf.mm, at, size)
        self._index_and_end(mf, iu, index, term, pos, size)
        return index, pos

    def append_as_follower(self, entry: bytes | memoryview) -> int:
        """Append an entry the leader pushed; it must be the next index, at the position this log puts it.

        Raises:
            EntryRefused: a bad entry, or not the entry that continues this log.
        """
        bad = check_entry(entry, 0, end=len(entry), index=self.end_index + 1 if self.end_index >= 0 else None)
        if bad is not None:
            raise EntryRefused(f"entry refused: {bad}")
        h = read_entry_header(entry, 0)
        if h.size != len(entry):
            raise EntryRefused(f"entry of {h.size} bytes arrived as {len(entry)} bytes")
        if self.end_index >= 0:
            pos = self._place(h.size)
            if h.pos != pos:
                raise EntryRefused(f"entry {h.entry_index} says position {h.pos}, this log puts it at {pos}")
        else:
            pos = h.pos  # an empty log starts where the leader's entry sits
            self.end_pos = pos
        self._write(h.entry_index, h.term, pos, entry)
        return int(h.entry_index)

    # -- reads ------------------------------------------------------------------------------------------
    def unit(self, index: int) -> tuple[int, int, int] | None:
        """``(position, size, term)`` of entry ``index``, None when absent."""
        if not self.begin_index <= index <= self.end_index or index < 0:
            return None
        iu = self.index.file_for(index * INDEX_UNIT_SIZE)
        if iu is None:
            return None
        u = read_index_unit(iu.mm, index * INDEX_UNIT_SIZE - iu.start)
        return u.pos, u.size, u.term

    def get_range(self, first: int, last: int, max_bytes: int) -> tuple[bytes, int]:
        """Entries ``first..last`` back to back (at most ``max_bytes``, at least one entry), copied once when they
        sit in one file; returns ``(bytes, index of the last entry included)`` (``first - 1`` when absent)."""
        u = self.unit(first)
        mf = self.data.file_for(u[0]) if u is not None else None
        if u is None or mf is None:
            return b"", first - 1
        start = u[0]
        end, upto = start + u[1], first
        for i in range(first + 1, last + 1):
            v = self.unit(i)
            if v is None or v[0] != end or v[0] + v[1] > mf.end or v[0] + v[1] - start > max_bytes:
                break
            end, upto = v[0] + v[1], i
        return bytes(mf.mm[start - mf.start : end - mf.start]), upto

    def get(self, index: int) -> bytes | None:
        """Entry ``index`` (header and body), copied; None when absent."""
        u = self.unit(index)
        if u is None:
            return None
        pos, size, _ = u
        mf = self.data.file_for(pos)
        if mf is None:
            return None
        return bytes(mf.mm[pos - mf.start : pos - mf.start + size])

    def end_of(self, index: int) -> int:
        """The position after entry ``index`` (-1 when absent)."""
        u = self.unit(index)
        return -1 if u is None else u[0] + u[1]

    # -- commit and truncation --------------------------------------------------------------------------
    def update_committed(self, term: int, index: int, current_term: int) -> bool:
        """docs/BEHAVIOUR.md 9.5 ``updateCommittedIndex``: ignored for -1, an empty log, an old term or no change;
        refused (False, with a warning) below the committed index or the log's begin; capped at the end."""
        if index == -1 or self.end_index < 0 or term < current_term or index == self.committed_index:
            return False
        if index < self.committed_index or index < self.begin_index:
            log.warning("%s: committed index %d refused (committed %d, begin %d)", self.directory, index,
                        self.committed_index, self.begin_index)
            return False
        index = min(index, self.end_index)
        self.committed_index = index
        self.committed_pos = self.end_of(index)
        return True

    def truncate(self, entry: bytes | memoryview) -> int:
        """Make this log end with ``entry`` (the leader's entry at its index): the follower's divergent tail goes.
        When this log does not reach that index, or starts after it, it is reset to start there.

        Raises:
            EntryRefused: a bad entry.
            ValueError: truncating below the committed index (a committed entry is never removed).
        """
        bad = check_entry(entry, 0, end=len(entry))
        if bad is not None:
            raise EntryRefused(f"truncate entry refused: {bad}")
        h = read_entry_header(entry, 0)
        if h.entry_index < self.committed_index:
            raise ValueError(f"truncating to {h.entry_index} would remove committed entries (committed "
                             f"{self.committed_index})")
        u = self.unit(h.entry_index)
        if u is None or self.begin_index < 0 or h.entry_index < self.begin_index:
            log.warning("%s: resetting the log to start at entry %d (position %d)", self.directory, h.entry_index,
                        h.pos)
            self.data.clear()
            self.index.clear()
            self.begin_index = self.end_index = -1
            self.end_pos = h.pos
            self._write(h.entry_index, h.term, h.pos, entry)
            return int(h.entry_index)
        if u[0] != h.pos:
            raise EntryRefused(f"entry {h.entry_index} sits at {u[0]} here, the leader's at {h.pos}")
        self._write(h.entry_index, h.term, h.pos, entry)
        self.data.drop_from(h.pos + len(entry))
        self.index.drop_from((h.entry_index + 1) * INDEX_UNIT_SIZE)
        return int(h.entry_index)
