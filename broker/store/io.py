"""The one layer every store file operation goes through: the store is handed one (``io=``), so whoever builds it
decides what its files do.

:class:`FileIO` is the real thing and costs nothing extra: mapped files write straight into their mmap and
only consult the layer's write hooks when ``FileIO.hooked`` is true (a subclass that overrides them says so).
The fault-injecting subclass the tests and the chaos broker use lives with them, in
``benchmarks/chaos/faulty_io.py``; no store module knows of it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from collections.abc import Callable
from typing import ClassVar

__all__ = ["FileIO", "msync", "prefault"]

log = logging.getLogger(__name__)

PAGE_SIZE = mmap.PAGESIZE
#: Linux >= 5.14 ``MADV_POPULATE_WRITE``: fault pages in writeable (no mmap constant for it in 3.11).
_MADV_POPULATE_WRITE = 23
#: One populate step. Each step ends with a GIL round trip against a busy writer (the populater waits for it,
#: the writer is forced to switch), 1024 of them per GiB at 1 MiB. Steps are not larger because madvise holds
#: the process's mmap lock for reading meanwhile, and any mmap/munmap (a new consume-queue file, a large
#: allocation) waits for it: 4 MiB is ~1 ms on reused memory, ~15 ms on memory the VM's host had taken back.
_PREFAULT_CHUNK = 4 << 20
_MS_SYNC = 4  # Linux <sys/mman.h>


def _libc_function(name: str) -> Callable[[int, int, int], int] | None:
    """``int name(void *addr, size_t length, int arg)`` from libc, or None where there is none."""
    if os.name != "posix":
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


# CPython 3.11's ``mmap.flush`` and ``mmap.madvise`` keep the GIL for the whole system call. msync waits for the
# disk: every periodic flush froze the broker's event loop (sends, acks, pulls) for ~100 ms per 50 MB. Populating
# 1 MiB of a file mapping takes about a millisecond, 64 of them per commit-log file. A ctypes call releases the
# GIL; the buffer export it holds keeps the map from being closed under it.
_libc_msync = _libc_function("msync")
_libc_madvise = _libc_function("madvise")


def _call_on_map(fn: Callable[[int, int, int], int], mm: mmap.mmap, offset: int, length: int, arg: int) -> None:
    view = ctypes.c_char.from_buffer(mm)  # ValueError when the map is closed
    try:
        if fn(ctypes.addressof(view) + offset, length, arg) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{getattr(fn, '__name__', 'libc call')} failed: {os.strerror(err)}")
    finally:
        del view


def msync(mm: mmap.mmap, offset: int, length: int) -> None:
    """``msync(MS_SYNC)`` of ``mm[offset:offset + length]`` (``offset`` page-aligned), without the GIL.

    Raises:
        OSError: msync failed (the errno and its text).
        ValueError: the range is outside the map, or the map is closed.
    """
    if _libc_msync is None or offset + length > len(mm):
        mm.flush(offset, length)  # no libc msync; or out of range: mmap's own check raises ValueError
        return
    _call_on_map(_libc_msync, mm, offset, length, _MS_SYNC)


def prefault(
    mm: mmap.mmap,
    start: int,
    end: int,
    *,
    floor: Callable[[], int] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Pre-fault ``mm[start:end]`` in 4 MiB steps, without the GIL during each step.

    Writing into never-touched pages costs a page fault per 4 KiB on the put path (appends ran at a third of
    their speed). ``MAP_POPULATE`` would do this inside ``mmap()`` with the GIL held for seconds and freeze the
    broker's event loop; madvise steps from a background thread never hold it up. Safe while another
    thread writes the same map; stops quietly when the map is closed meanwhile.

    Args:
        mm: the map.
        start: first byte (rounded down to a page).
        end: end of the range (at most the map's length).
        floor: the writer's position in this map, read before every step: pages below it were faulted in by the
            writer itself, so a populater that fell behind jumps to the writer instead of
            walking over them (a fresh file is written from its start while it is being populated).
        stop: set by the owner to end the work between two steps (a file being discarded or the store closing).
    """
    off = start - start % PAGE_SIZE
    end = min(end, len(mm)) if not mm.closed else off
    while off < end:
        if stop is not None and stop.is_set():
            return
        if floor is not None:
            behind = floor()
            if behind > off:
                # At the writer, not ahead of it: where populating is slower than writing (memory the host
                # has taken back, on a busy VM), a writer that meets the populater waits for its faults, and
                # does not fault pages in itself on the put path's CPU share (a 2 MiB lead measured no better).
                off = behind - behind % PAGE_SIZE
                if off >= end:
                    return
        length = min(_PREFAULT_CHUNK, end - off)
        try:
            if _libc_madvise is not None:
                _call_on_map(_libc_madvise, mm, off, length, _MADV_POPULATE_WRITE)
            else:
                mm.madvise(_MADV_POPULATE_WRITE, off, length)
        except (OSError, ValueError):
            return  # old kernel, unsupported file system, or the map was closed: pages fault in when written
        off += length


class FileIO:
    """Real file operations. Subclasses may override any method; ``hooked`` turns on the write hooks."""

    hooked: ClassVar[bool] = False

    def open_mapped(
        self, path: str, size: int, *, create: bool, populate: bool = False, sparse: bool = False
    ) -> tuple[int, mmap.mmap]:
        """Open (or create) ``path``, make sure ``size`` bytes are allocated on disk, and map them.

        Space is reserved with ``posix_fallocate`` before mapping, so a full disk fails here with OSError
        instead of a SIGBUS on a later write through the map. ``populate`` pre-faults every page (slow, done
        off the write path) so later writes do not take a page fault per 4 KiB. ``sparse`` only sets the size:
        the owner reserves space ahead of its writes with :meth:`allocate` (consume queues, most of which stay
        nearly empty).

        Raises:
            OSError: the file cannot be created, allocated (ENOSPC) or mapped.
        """
        existed = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            current = os.fstat(fd).st_size
            if current < size:
                if sparse:
                    os.ftruncate(fd, size)
                else:
                    self.allocate(fd, path, current, size - current)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
            if populate:
                prefault(mm, 0, size)
        except BaseException:
            os.close(fd)
            if create and not existed:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise
        self.opened(path, mm, created=not existed)
        return fd, mm

    def allocate(self, fd: int, path: str, offset: int, length: int) -> None:
        """Reserve ``length`` bytes at ``offset`` (ENOSPC surfaces here)."""
        os.posix_fallocate(fd, offset, length)

    def opened(self, path: str, mm: mmap.mmap, *, created: bool) -> None:
        """Hook: a mapped file was opened."""

    def flush(self, mm: mmap.mmap, path: str, start: int, end: int) -> None:
        """msync bytes ``[start, end)`` of a map (start is rounded down to a page)."""
        if end <= start:
            return
        aligned = start - start % PAGE_SIZE
        msync(mm, aligned, end - aligned)

    def before_write(self, path: str, pos: int, length: int) -> None:
        """Hook (only when ``hooked``): about to write ``length`` bytes at ``pos``."""

    def after_write(self, path: str, mm: mmap.mmap, pos: int, length: int) -> None:
        """Hook (only when ``hooked``): ``length`` bytes were written at ``pos``."""

    def close_mapped(self, fd: int, mm: mmap.mmap) -> None:
        """Unmap and close without flushing (the OS keeps dirty pages)."""
        try:
            mm.close()
        except BufferError:
            # A reader still holds a view; the map closes when that view is released.
            log.warning("mapped file still has exported views; leaving the map to the garbage collector")
        os.close(fd)

    def remove(self, path: str) -> None:
        """Delete a file (missing is fine)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def used_ratio(self, path: str) -> float:
        """Used fraction of the partition holding ``path`` (``os.statvfs``; the nearest existing parent counts),
        counting as free only what an unprivileged writer may use, as RocketMQ's ``getUsableSpace``."""
        while not os.path.exists(path):
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        st = os.statvfs(path)
        total = st.f_blocks * st.f_frsize
        if total <= 0:
            return 0.0
        return max(0.0, min(1.0, (total - st.f_bavail * st.f_frsize) / total))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write_small_file(self, path: str, data: bytes) -> None:
        """Write a small file (abort, lock content) and fsync it."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
