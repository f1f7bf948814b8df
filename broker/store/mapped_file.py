"""A fixed-size, preallocated, memory-mapped file: the unit of the commit log, consume queues and index.

Writes go straight into the map (``mf.mm``); ``wrote`` is the write position, published after the bytes are in
place, and ``flushed`` how far msync has gone. Files are named by their 20-digit start offset.
"""

from __future__ import annotations

import logging
import mmap
import os

from broker.store.io import FileIO

__all__ = ["MappedFile", "file_name", "list_offset_files"]

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

    __slots__ = ("closed", "fd", "flushed", "io", "mm", "path", "reserved", "size", "start", "wrote")

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
            self.io.flush(self.mm, self.path, begin, target)
            if self.flushed == begin:  # else a truncation reset it while the msync ran (no lock held)
                self.flushed = target
        return self.flushed

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
