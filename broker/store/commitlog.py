"""The commit log: fixed-size mapped files holding records back to back (layout: :mod:`common.codec`).

A record never spans two files. When a write does not fit the rest of a file (it must leave 8 bytes), the file
is closed with the blank marker ``[int32 remaining][int32 BLANK_MAGIC]`` and the whole write goes to the next
file. The next file is created (and its space reserved) *before* the marker is written, so a full disk leaves
the log exactly as it was.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import cast

from broker.store.api import StoreCorruptError, StoreError
from broker.store.io import FileIO, prefault
from broker.store.mapped_file import MappedFile, RetiredFiles, file_name, list_offset_files
from broker.store.records import BAD, BLANK, END, ZERO, check_records, scan_records
from broker.store.retention import FileAge
from common.codec import (
    BLANK_MAGIC,
    MAGIC_V1,
    RECORD_PREFIX,
    BatchItem,
    write_batch_records,
)

__all__ = ["BAD", "BLANK", "END", "ZERO", "CommitLog", "Run", "scan_records"]

log = logging.getLogger(__name__)

_BLANK_MARKER = RECORD_PREFIX
_U16_AT = __import__("struct").Struct(">H").unpack_from
_I64_AT = __import__("struct").Struct(">q").unpack_from
_MAGIC_BYTES = (MAGIC_V1 & 0xFFFFFFFF).to_bytes(4, "big")
#: Bound on waiting for the background allocation of the next file (it pre-faults up to 1 GiB).
_PREPARE_WAIT_S = 30.0

#: ``(topic bytes, queue id, first queue offset, items, bytes)``: records of one queue written back to back.
Run = tuple[bytes, int, int, Sequence[BatchItem], int]


class CommitLog:
    """The files of ``<root>/commitlog``. One writer thread; the flush thread takes ``lock`` for file-list
    changes and msync."""

    def __init__(self, io: FileIO, directory: str, file_size: int, *, preallocate: bool = False) -> None:
        self.io = io
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self.lock = threading.RLock()
        self.flushed_where = 0
        #: Offsets when there are no files (a fresh store starts at 0; a slave at its master's file).
        self._base = 0
        self._preallocate = preallocate
        self._prepared: MappedFile | None = None
        #: The latest preparation thread (each one waits for its predecessor before populating).
        self._prep_thread: threading.Thread | None = None
        #: Set by the latest preparation once the next file exists (or its creation failed).
        self._prep_ready: threading.Event | None = None
        #: Tells every running preparation to stop between two populate steps.
        self._prep_stop = threading.Event()
        #: Files deleted by retention whose maps wait for their readers.
        self.retired = RetiredFiles()

    # -- lifecycle --------------------------------------------------------------------------------------
    def load(self) -> None:
        """Open every file; check sizes and that their start offsets follow each other.

        Raises:
            StoreCorruptError: a file has the wrong size or there is a gap between files.
        """
        self.io.makedirs(self.directory)
        found = list_offset_files(self.directory)
        for i, (start, path) in enumerate(found):
            actual = os.path.getsize(path)
            if actual > self.file_size or (actual < self.file_size and i != len(found) - 1):
                raise StoreCorruptError(
                    f"commit log file {path} is {actual} bytes; mappedFileSizeCommitLog is {self.file_size}"
                )
            if start % self.file_size or (self.files and self.files[-1].end != start):
                raise StoreCorruptError(
                    f"commit log file {path} starts at {start}, expected {self.files[-1].end if self.files else 0} "
                    f"(a multiple of mappedFileSizeCommitLog {self.file_size})"
                )
            # A short last file was being created when the process died: finish its allocation.
            mf = MappedFile.open(self.io, path, start, self.file_size, create=actual < self.file_size)
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)
        if self.files:
            self._base = self.files[0].start
        self.flushed_where = self.max_offset

    def close(self) -> None:
        self._discard_prepared()
        with self.lock:
            for mf in self.files:
                mf.close()
        self.retired.close_all()

    # -- retention --------------------------------------------------------------------------------------
    def file_ages(self, limit: int) -> list[FileAge]:
        """The oldest ``limit`` files (and the last one, which always stays) with their last write time: the
        file's mtime, as RocketMQ's ``lastModified``."""
        files = self.files
        head = files[:limit] + ([files[-1]] if len(files) > limit else [])
        out = []
        for mf in head:
            try:
                ms = int(os.stat(mf.path).st_mtime * 1000)
            except OSError:
                ms = 0
            out.append(FileAge(mf.start, mf.end, ms))
        return out

    def reset_to(self, offset: int, now_ms: int) -> None:
        """Retire every file and start the log again, empty, at ``offset`` (a slave whose master deleted what it
        needed next)."""
        self._discard_prepared()
        with self.lock:
            gone = list(self.files)
            self.files.clear()
            self._base = self.flushed_where = offset
        for mf in gone:
            self.retired.add(mf, now_ms)

    def retire_head(self, count: int, now_ms: int) -> list[MappedFile]:
        """Take the ``count`` oldest files out of the log (never the last): unlinked now, unmapped once no reader
        holds them (:attr:`retired`). Called on the writer's thread; the flush thread sees the list under ``lock``.
        """
        with self.lock:
            count = min(count, len(self.files) - 1)
            if count <= 0:
                return []
            gone = self.files[:count]
            del self.files[:count]
            self._base = self.files[0].start
        for mf in gone:
            self.retired.add(mf, now_ms)
        return gone

    # -- offsets ----------------------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        files = self.files
        if not files:
            return self._base
        last = files[-1]
        return last.start + last.wrote

    @property
    def min_offset(self) -> int:
        files = self.files
        return files[0].start if files else self._base

    def file_for(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        idx = (offset - files[0].start) // self.file_size
        if 0 <= idx < len(files):
            return files[idx]
        return None

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    # -- writes -----------------------------------------------------------------------------------------
    def _create(self, start: int) -> MappedFile:
        """The file starting at ``start``: the one prepared in the background if ready, else a new one. Starts
        preparing the file after it."""
        mf = self._take_prepared(start)
        if mf is None:
            path = os.path.join(self.directory, file_name(start))
            try:
                mf = MappedFile.open(self.io, path, start, self.file_size, create=True)
            except OSError as exc:
                exc.creating_file = True  # type: ignore[attr-defined]
                raise
        if self._preallocate:
            self._start_preparing(mf)
        return mf

    def prepare_ahead(self) -> None:
        """Start preparing a reopened log: the unwritten rest of its last file and the file after it.

        A file found at load is mapped without its pages, so after every restart the writer used to fault in
        the rest of the current file itself, one page fault per 4 KiB (up to 1 GiB), and to create the next
        file on its own thread at the roll. Call on the writer's thread, or before any writer runs.
        """
        if self._preallocate and self.files and self._prep_thread is None:
            self._start_preparing(self.files[-1])

    def _start_preparing(self, current: MappedFile) -> None:
        ready = threading.Event()
        thread = threading.Thread(target=self._prepare, args=(current, self._prep_thread, ready, self._prep_stop),
                                  name="commitlog-allocate", daemon=True)
        self._prep_thread, self._prep_ready = thread, ready
        thread.start()

    def _prepare(self, current: MappedFile, previous: threading.Thread | None, ready: threading.Event,
                 stop: threading.Event) -> None:
        """Background: create the next file, then fault in the pages the writer has not reached yet, of the file
        being written and then of the next one, so appends take no page faults.

        The writer only ever waits for the next file to *exist* (``ready``): creating it reserves its space
        (``posix_fallocate``, milliseconds), populating 1 GiB takes seconds and used to be waited for at every
        roll, which capped appends at the populate speed (about 300 MB/s with the flush thread writing on a
        2-core machine). Populating follows the writer (:func:`prefault` ``floor``): on a fresh store the first
        file is written from its start while it is populated, and pages the writer already faulted in are skipped.
        """
        nxt: MappedFile | None = None
        try:
            if not stop.is_set():
                path = os.path.join(self.directory, file_name(current.end))
                try:
                    nxt = self._prepared = MappedFile.open(self.io, path, current.end, self.file_size, create=True)
                except OSError as exc:
                    log.warning("preallocating commit log file %s failed (will retry on demand): %s", path, exc)
        finally:
            ready.set()
        if previous is not None:
            previous.join()  # it populates ``current`` ahead of the writer: one populater per file at a time
        prefault(current.mm, current.wrote, current.size, floor=lambda: current.wrote, stop=stop)
        if nxt is not None:
            prefault(nxt.mm, nxt.wrote, nxt.size, floor=lambda: nxt.wrote, stop=stop)

    def wait_prepared(self, timeout_s: float) -> bool:
        """Wait for the background preparation (next file created, pages faulted in) to finish; True when it
        did."""
        thread = self._prep_thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _take_prepared(self, start: int) -> MappedFile | None:
        """The prepared file if it starts at ``start`` (else it is deleted); waits only for its creation.

        Raises:
            OSError: the preparation did not create it within ``_PREPARE_WAIT_S`` (the writer must not open the
                same path meanwhile).
        """
        ready = self._prep_ready
        if ready is not None:
            if not ready.wait(_PREPARE_WAIT_S):
                raise OSError(f"preallocating the next commit log file took longer than {_PREPARE_WAIT_S} s")
            self._prep_ready = None
        mf = self._prepared
        if mf is not None and mf.start != start:
            if not self._stop_preparing():  # it may be populating that file
                raise OSError(f"commit log preallocation did not stop within {_PREPARE_WAIT_S} s")
            mf.destroy()
            mf = None
        self._prepared = None
        return mf

    def _stop_preparing(self) -> bool:
        """Stop every preparation thread and wait for them; False when one is stuck."""
        thread = self._prep_thread
        if thread is None:
            return True
        self._prep_stop.set()
        thread.join(_PREPARE_WAIT_S)
        if thread.is_alive():
            return False
        self._prep_thread = None
        self._prep_stop = threading.Event()
        return True

    def _discard_prepared(self) -> None:
        """Stop preparing and delete a prepared file nobody took (before the log is cut, reset or closed)."""
        if not self._stop_preparing():
            log.error("commit log preallocation thread is stuck; leaving its file")
            return
        self._prep_ready = None
        mf, self._prepared = self._prepared, None
        if mf is not None:
            mf.destroy()

    def mark_unflushed(self, offset: int) -> None:
        """Forget that bytes from ``offset`` were flushed (recovery cannot know whether they reached disk)."""
        with self.lock:
            for mf in self.files:
                if mf.end > offset:
                    mf.flushed = max(0, offset - mf.start)
            self.flushed_where = min(self.flushed_where, offset)

    def _file_for_append(self, total: int) -> MappedFile:
        """The file to append ``total`` bytes to; rolls to a new file (blank marker) when it does not fit.

        Raises:
            OSError: the next file cannot be created (nothing has been written).
        """
        files = self.files
        if not files:
            mf = self._create(self._base)
            with self.lock:
                files.append(mf)
            return mf
        mf = files[-1]
        if mf.wrote + total + 8 <= mf.size:
            return mf
        new = self._create(mf.end)
        if mf.wrote < mf.size:
            try:
                mf.write(mf.wrote, _BLANK_MARKER.pack(mf.size - mf.wrote, BLANK_MAGIC))
            except OSError:
                new.destroy()
                raise
            mf.wrote = mf.size
        with self.lock:
            files.append(new)
        return new

    def append(
        self,
        runs: Sequence[Run],
        total: int,
        *,
        store_timestamp: int,
        born_host: bytes,
        store_host: bytes,
        reconsume_times: int,
    ) -> tuple[int, list[int]]:
        """Write ``runs`` (``total`` bytes) contiguously; returns ``(first offset, offset of every record)``.

        Raises:
            OSError: disk full while creating the next file or writing (nothing is published then).
        """
        mf = self._file_for_append(total)
        start = pos = mf.wrote
        io = mf.io
        if io.hooked:
            io.before_write(mf.path, pos, total)
        mm = mf.mm
        offsets: list[int] = []
        for topic, queue_id, first_queue_offset, items, nbytes in runs:
            offs = write_batch_records(
                cast(bytearray, mm), pos, mf.start, topic=topic, queue_id=queue_id, first_queue_offset=first_queue_offset,
                items=items, born_host=born_host, store_timestamp=store_timestamp, store_host=store_host,
                reconsume_times=reconsume_times,
            )
            if offsets:
                offsets.extend(offs)
            else:
                offsets = offs
            pos += nbytes
        if io.hooked:
            io.after_write(mf.path, mm, start, total)
        mf.wrote = pos
        return mf.start + start, offsets

    def append_raw(self, offset: int, data: bytes | memoryview) -> None:
        """Continue the log with replicated bytes (slave side of HA).

        Raises:
            ValueError: ``offset`` does not continue the log (or, for an empty log, is not a file start).
            OSError: disk full.
        """
        if not self.files or (len(self.files) == 1 and self.files[0].wrote == 0):
            if offset % self.file_size:
                raise ValueError(
                    f"an empty commit log can only start at a file boundary (multiple of {self.file_size}); "
                    f"got offset {offset}"
                )
            if offset != self.max_offset:
                self._discard_prepared()
                with self.lock:
                    for mf in self.files:
                        mf.destroy()
                    self.files.clear()
                    self._base = self.flushed_where = offset
        elif offset != self.max_offset:
            raise ValueError(f"replicated data at offset {offset} does not continue the log at {self.max_offset}")
        view = memoryview(data)
        while view:
            files = self.files
            if not files or files[-1].wrote == files[-1].size:
                mf = self._create(self.max_offset)
                with self.lock:
                    files.append(mf)
            mf = files[-1]
            n = min(len(view), mf.size - mf.wrote)
            mf.write(mf.wrote, view[:n])
            mf.wrote += n
            view = view[n:]

    # -- reads ------------------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` if they were written, else None."""
        mf = self.file_for(offset)
        if mf is None:
            return None
        pos = offset - mf.start
        if pos < 0 or pos + size > mf.wrote:
            return None
        return mf.mm[pos : pos + size]

    def record_size_at(self, offset: int) -> int | None:
        """TOTALSIZE of the record at ``offset``, None if no record starts there."""
        mf = self.file_for(offset)
        if mf is None:
            return None
        pos = offset - mf.start
        if pos < 0 or pos + 8 > mf.wrote:
            return None
        size, magic = RECORD_PREFIX.unpack_from(mf.mm, pos)
        if magic != MAGIC_V1 or size < 91 or pos + size > mf.wrote:
            return None
        return int(size)

    def get_data(self, offset: int, max_bytes: int) -> memoryview | None:
        """Written bytes from ``offset`` to the end of its file (at most ``max_bytes``), copied."""
        mf = self.file_for(offset)
        if mf is None:
            return None
        pos = offset - mf.start
        end = min(mf.wrote, pos + max_bytes)
        if pos < 0 or end <= pos:
            return None
        return memoryview(mf.mm[pos:end])

    # -- flush ------------------------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> int:
        """msync written bytes; with ``least_pages`` skip the last file when fewer dirty pages. Returns the
        flushed offset.

        The msync runs without ``lock``: it waits for the disk, and the writer takes the lock to add a file at
        a roll, so holding it would stall the put path for the whole disk write. The ranges are taken under the
        lock; a range is only marked flushed when nothing truncated the file meanwhile.
        """
        with self.lock:
            files = self.files
            if not files:
                self.flushed_where = self._base
                return self._base
            last = files[-1]
            todo: list[tuple[MappedFile, int, int]] = []
            for mf in files:
                if mf.flushed >= mf.wrote:
                    continue
                if least_pages and mf is last and (mf.wrote >> 12) - (mf.flushed >> 12) < least_pages:
                    break
                if mf.hold():  # retention may retire it meanwhile: its map stays until we release it
                    todo.append((mf, mf.flushed, mf.wrote))
        try:
            for mf, begin, end in todo:
                try:
                    mf.io.flush(mf.mm, mf.path, begin, end)
                except ValueError:  # closed meanwhile (truncated away, or retired past the forcible delay)
                    continue
        finally:
            for mf, _, _ in todo:
                mf.release()
        with self.lock:
            for mf, begin, end in todo:
                if not mf.closed and mf.flushed == begin:
                    mf.flushed = min(end, mf.wrote)
            where = self.max_offset
            for mf in self.files:
                if mf.flushed < mf.wrote:
                    where = mf.start + mf.flushed
                    break
            self.flushed_where = where
            return where

    # -- recovery and truncation ------------------------------------------------------------------------
    def first_store_timestamp(self, mf: MappedFile) -> int | None:
        """Store time of the first record of a file (None when it does not start with a record)."""
        size, magic = RECORD_PREFIX.unpack_from(mf.mm, 0)
        if magic != MAGIC_V1 or size < 91:
            return None
        sys_flag = int.from_bytes(mf.mm[36:40], "big")
        pos = 48 + (20 if sys_flag & 0x10 else 8)
        return int(_I64_AT(mf.mm, pos)[0])

    def recover(self, start_index: int, *, check_crc: bool, truncate_corrupt: bool, durable_offset: int) -> int:
        """Validate records from ``files[start_index]`` on; cut the log after the last valid record.

        A bad record is a torn tail (truncated, with a warning) when it lies past ``durable_offset`` or when
        no valid record follows it; otherwise the log is corrupt in the middle.

        Raises:
            StoreCorruptError: a corrupt record mid-log and not ``truncate_corrupt``.
        """
        files = self.files
        for i in range(start_index, len(files)):
            mf = files[i]
            with memoryview(mf.mm) as view:
                pos, outcome = scan_records(view, mf.start, 0, mf.size, check_crc)
            if outcome == BLANK:
                mf.wrote = mf.size
                continue
            end = mf.start + pos
            # Past the durable offset anything may be torn (lost pages); before it, bad bytes followed by
            # good records are corruption, not a crash artefact.
            if end < durable_offset and self._followed_by_valid(i, pos, check_crc):
                where = f"commit log file {mf.path} at physical offset {end} (file position {pos})"
                if not truncate_corrupt:
                    raise StoreCorruptError(
                        f"corrupt record in the middle of the log: {where}; valid records follow. Restore the "
                        f"file, or start with truncate_corrupt=True to drop everything from that offset"
                    )
                log.warning("truncate_corrupt: dropping the commit log from %s (valid records followed)", where)
            elif outcome == BAD:
                log.warning("torn tail in %s at physical offset %d: truncated", mf.path, end)
            self._cut(i, pos)
            return end
        return self.max_offset

    def _followed_by_valid(self, index: int, pos: int, check_crc: bool) -> bool:
        """Whether a valid record or blank marker starts anywhere after ``pos`` in file ``index`` or later."""
        for mf in self.files[index:]:
            mm = mf.mm
            at = mm.find(_MAGIC_BYTES, pos + 4 if mf is self.files[index] else 0)
            while at >= 4:
                start = at - 4
                size = int.from_bytes(mm[start : start + 4], "big", signed=True)
                if 91 <= size <= mf.size - start:
                    with memoryview(mm) as view:
                        # Only this record's bytes count (data_end), in its file (the marker-room rule).
                        if check_records(view, mf.start, start, start + size, mf.size, check_crc, mf.size)[0] > start:
                            return True
                at = mm.find(_MAGIC_BYTES, at + 1)
        return False

    def _cut(self, index: int, pos: int) -> None:
        """Keep files up to ``index`` with ``pos`` bytes in the last; zero the rest, delete later files."""
        self._discard_prepared()
        with self.lock:
            mf = self.files[index]
            mf.zero(pos, mf.size)
            mf.wrote = pos
            mf.flushed = 0
            mf.flush(pos if pos else None)
            mf.flushed = pos
            for later in self.files[index + 1 :]:
                log.warning("deleting commit log file %s past the end of the log", later.path)
                later.destroy()
            del self.files[index + 1 :]
            self.flushed_where = min(self.flushed_where, self.max_offset)

    def truncate(self, offset: int) -> None:
        """Drop everything from ``offset`` on (zeroed and flushed, later files deleted).

        Raises:
            ValueError: ``offset`` is below the log's minimum offset.
            StoreError: the zeroing could not be written.
        """
        if offset >= self.max_offset:
            return
        if offset < self.min_offset:
            raise ValueError(f"cannot truncate at {offset}: below the commit log's min offset {self.min_offset}")
        self._discard_prepared()
        with self.lock:
            idx = (offset - self.files[0].start) // self.file_size
            if idx >= len(self.files):
                return
            try:
                if offset == self.files[idx].start and idx > 0:
                    for mf in self.files[idx:]:
                        mf.destroy()
                    del self.files[idx:]
                else:
                    self._cut(idx, offset - self.files[idx].start)
            except OSError as exc:
                raise StoreError(f"truncating the commit log at {offset} failed: {exc}") from exc
            self.flushed_where = min(self.flushed_where, offset)
