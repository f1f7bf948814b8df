"""Which pages of a file are in the page cache: ``mincore(2)`` on a read-only shared mapping, through ctypes.

For the isolation benchmark: the ground truth the broker's "cold read" rule is checked against, and the cost a
rule that asked the kernel on every pull would pay. Mapping a file touches none of its pages, and ``mincore``
faults nothing in, so looking changes nothing it looks at; the page cache is the file's, not the mapping's, so
another process's cached pages (a broker's) are seen too.
"""

from __future__ import annotations

import ctypes
import mmap
import os

__all__ = ["FileResidency", "resident_map"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


class FileResidency:
    """A read-only mapping of one file, asked which of its pages are cached. Close it (or use ``with``)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(fd).st_size
            addr = _libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) if self.size else None
        finally:
            os.close(fd)  # the mapping keeps the file
        if addr == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        self._addr: int | None = addr
        self._vec = (ctypes.c_ubyte * max(1, (self.size + PAGE - 1) // PAGE))()

    def pages(self, offset: int = 0, length: int | None = None) -> bytes:
        """One byte per page of ``[offset, offset + length)`` (page-aligned outwards): bit 0 set when cached."""
        if self._addr is None:
            return b""
        end = self.size if length is None else min(self.size, offset + length)
        first = offset // PAGE * PAGE
        n = (end - first + PAGE - 1) // PAGE
        if n <= 0:
            return b""
        if _libc.mincore(self._addr + first, end - first, self._vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return bytes(self._vec[:n])

    def all_resident(self, offset: int, length: int) -> bool:
        """Whether every page of the range is cached (what a per-pull residency rule would ask)."""
        if self._addr is None or length <= 0:
            return True
        first = offset // PAGE * PAGE
        end = min(self.size, offset + length)
        n = (end - first + PAGE - 1) // PAGE
        if _libc.mincore(self._addr + first, end - first, self._vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return b"\0" not in ctypes.string_at(self._vec, n)  # a cached page's byte is 1 (its other bits are 0)

    def close(self) -> None:
        if self._addr is not None:
            _libc.munmap(self._addr, self.size)
            self._addr = None

    def __enter__(self) -> FileResidency:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resident_map(files: list[tuple[int, str]], start: int, end: int) -> list[bool]:
    """Per page of the log range ``[start, end)`` (``files``: ``(start offset, path)`` of equal-sized, contiguous
    files), whether it is cached; pages of a missing file count as not cached."""
    out = [False] * ((end - start + PAGE - 1) // PAGE)
    for file_start, path in files:
        try:
            res = FileResidency(path)
        except OSError:
            continue
        with res:
            lo, hi = max(start, file_start), min(end, file_start + res.size)
            if lo >= hi:
                continue
            vec = res.pages(lo - file_start, hi - lo)
            base = (lo - start) // PAGE
            for i, b in enumerate(vec[: len(out) - base]):
                out[base + i] = bool(b & 1)
    return out
