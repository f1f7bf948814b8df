"""A fixed-size, preallocated, memory-mapped file: the unit of the commit log, consume queues and index.

Writes go straight into the map (``mf.mm``); ``wrote`` is the write position, published after the bytes are in
place, and ``flushed`` how far msync has gone. Files are named by their 20-digit start offset.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading

from broker.store.io import FileIO

__all__ = ["MappedFile", "RetiredFiles", "file_name", "list_offset_files"]

log = logging.getLogger(__name__)


def file_name(offset: int) -> str:
    """The 20-digit zero-padded name of a file starting at ``offset``."""
    return f"{offset:020d}"


def list_offset_files(directory: str) -> list[tuple[int, str]]:
    """``(start offset, path)`` of every 20-digit-named file in ``directory``, ascending."""
    if not os.path.isdir(directory):
        return []
    out = []
    for name in os.listdir(directory):
        if len(name) == 20 and name.isdigit():
            out.append((int(name), os.path.join(directory, name)))
        else:
            log.warning("ignoring unexpected file %s in %s", name, directory)
    out.sort()
    return out


class MappedFile:
    """One mapped file. Not thread-safe by itself; owners serialise writers."""

    __slots__ = ("closed", "fd", "flushed", "holds", "io", "mm", "path", "reserved", "size", "start", "wrote")

    def __init__(self, io: FileIO, path: str, start: int, size: int, fd: int, mm: mmap.mmap) -> None:
        self.io = io
        self.path = path
        self.start = start
        self.size = size
        self.fd = fd
        self.mm = mm
        self.wrote = 0
        self.flushed = 0
        self.closed = False
        self.reserved = size
        """Bytes from the file's start known to be allocated on disk (a sparse file reserves as it fills)."""
        self.holds = 0
        """Readers using the map outside the owner's lock (see :meth:`hold`); a retired file waits for them."""

    @classmethod
    def open(cls, io: FileIO, path: str, start: int, size: int, *, create: bool,
             populate: bool = False, sparse: bool = False) -> MappedFile:
        """Open (``create``: or create and preallocate) a file of ``size`` bytes; ``populate`` pre-faults it;
        ``sparse``: allocate nothing now, the writer calls :meth:`reserve` ahead of its writes.

        Raises:
            OSError: cannot create, allocate (ENOSPC) or map it.
        """
        fd, mm = io.open_mapped(path, size, create=create, populate=populate, sparse=sparse)
        mf = cls(io, path, start, size, fd, mm)
        if sparse:
            mf.reserved = 0
        return mf

    def reserve(self, upto: int, chunk: int) -> None:
        """Allocate on disk at least up to ``upto`` (whole chunks of ``chunk`` bytes, within the file), so a write
        through the map below it cannot SIGBUS on a full disk.

        Raises:
            OSError: ENOSPC (nothing is reserved then).
        """
        end = min(self.size, -(-upto // chunk) * chunk)
        if end > self.reserved:
            self.io.allocate(self.fd, self.path, self.reserved, end - self.reserved)
            self.reserved = end

    @property
    def end(self) -> int:
        """Offset just past this file."""
        return self.start + self.size

    @property
    def write_end(self) -> int:
        """Global offset of the write position."""
        return self.start + self.wrote

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` to ``pos`` (does not move ``wrote``)."""
        n = len(data)
        io = self.io
        if io.hooked:
            io.before_write(self.path, pos, n)
        self.mm[pos : pos + n] = data
        if io.hooked:
            io.after_write(self.path, self.mm, pos, n)

    def zero(self, start: int, end: int, chunk: int = 1 << 20) -> None:
        """Zero ``[start, end)``, skipping chunks that already are zero (cheap on fresh preallocated space)."""
        mm = self.mm
        pos = start
        while pos < end:
            stop = min(end, pos + chunk)
            n = stop - pos
            zeros = bytes(n)
            if mm[pos:stop] != zeros:
                self.write(pos, zeros)
            pos = stop

    def flush(self, upto: int | None = None) -> int:
        """msync up to ``upto`` (default: the write position); returns the flushed position."""
        begin = self.flushed
        target = self.wrote if upto is None else upto
        if target > begin and not self.closed:
            try:
                self.io.flush(self.mm, self.path, begin, target)
            except ValueError:
                if self.closed:  # retired and closed by the cleaner meanwhile: nothing left to flush
                    return self.flushed
                raise
            if self.flushed == begin:  # else a truncation reset it while the msync ran (no lock held)
                self.flushed = target
        return self.flushed

    def hold(self) -> bool:
        """Keep the map open for a read that runs outside the owner's lock (the flush thread's msync); False
        when the file is already closed. Pair with :meth:`release`."""
        if self.closed:
            return False
        self.holds += 1
        return True

    def release(self) -> None:
        self.holds -= 1

    def close(self) -> None:
        """Unmap without flushing. Idempotent."""
        if not self.closed:
            self.closed = True
            self.io.close_mapped(self.fd, self.mm)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.io.remove(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, wrote={self.wrote}, flushed={self.flushed})"


class RetiredFiles:
    """Files taken out of use by retention: already unlinked (their name is free, their blocks are freed when the
    map closes), mapped until no reader holds them (:meth:`MappedFile.hold`) or, held or not, until ``forcibly_ms``
    after retirement (RocketMQ's ``destroyMapedFileIntervalForcibly``). A map is never truncated under a reader, so
    a reader never meets a SIGBUS: at worst a closed map (``ValueError``) after the forcible delay."""

    def __init__(self) -> None:
        self._files: list[tuple[MappedFile, int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._files)

    def add(self, mf: MappedFile, now_ms: int) -> None:
        """Unlink ``mf`` now; its map closes in a later :meth:`close_idle`."""
        mf.io.remove(mf.path)
        with self._lock:
            self._files.append((mf, now_ms))

    def close_idle(self, now_ms: int, forcibly_ms: int) -> int:
        """Close the maps no reader holds, and those retired ``forcibly_ms`` ago; returns how many closed."""
        with self._lock:
            keep: list[tuple[MappedFile, int]] = []
            done: list[tuple[MappedFile, int]] = []
            for mf, at in self._files:
                (done if mf.holds <= 0 or now_ms - at >= forcibly_ms else keep).append((mf, at))
            self._files = keep
        for mf, at in done:
            if mf.holds > 0:
                log.warning("closing retired file %s still held by %d reader(s) after %d ms "
                            "(destroyMapedFileIntervalForcibly)", mf.path, mf.holds, now_ms - at)
            mf.close()
        return len(done)

    def close_all(self) -> None:
        with self._lock:
            files, self._files = self._files, []
        for mf, _ in files:
            mf.close()
