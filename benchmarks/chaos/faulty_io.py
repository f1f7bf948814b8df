"""The store's file layer with faults injected on demand: the chaos broker (:mod:`benchmarks.chaos.faulty_broker`)
fills its disk with it, and the store tests crash, slow and fill theirs. A subclass of the real
:class:`~broker.store.io.FileIO`, handed to the store (``io=``); the broker never builds one.

:class:`FaultyIO` injects:

* ``fsync_delay_s``: every flush sleeps first (slow disk; drives SYNC_FLUSH timeouts);
* ``enospc_on_allocate`` / ``enospc_on_write``: the next allocation / write fails with ENOSPC, nothing written;
* ``crash_after_bytes``: writes land until the budget is spent, the write that crosses it lands only partly and
  :class:`SimulatedCrash` is raised (a process killed mid-``memcpy``);
* :meth:`FaultyIO.drop_unsynced`: after the store is abandoned, every file goes back to its last flushed
  content (the page cache lost at power failure).
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from typing import ClassVar

from broker.store.io import PAGE_SIZE, FileIO

__all__ = ["FaultyIO", "SimulatedCrash"]


class SimulatedCrash(BaseException):
    """Raised by :class:`FaultyIO` to stop the store as if the process died (not an Exception on purpose:
    no store code path may catch it and carry on)."""


class FaultyIO(FileIO):
    """:class:`FileIO` with injectable faults (see the module docstring)."""

    hooked: ClassVar[bool] = True

    def __init__(
        self,
        *,
        fsync_delay_s: float = 0.0,
        crash_after_bytes: int | None = None,
        track_unsynced: bool = False,
    ) -> None:
        self.fsync_delay_s = fsync_delay_s
        self.crash_after_bytes = crash_after_bytes
        self.enospc_on_allocate = False
        self.enospc_on_write = False
        self.track_unsynced = track_unsynced
        self.bytes_written = 0
        self.flush_count = 0
        #: path -> content as of the last flush (what survives a power failure).
        self._durable: dict[str, bytearray] = {}

    def allocate(self, fd: int, path: str, offset: int, length: int) -> None:
        if self.enospc_on_allocate:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        super().allocate(fd, path, offset, length)

    def opened(self, path: str, mm: mmap.mmap, *, created: bool) -> None:
        if self.track_unsynced and path not in self._durable:
            # A file found on open is durable as it is; a new one is durable as zeros.
            self._durable[path] = bytearray(len(mm)) if created else bytearray(mm[:])

    def flush(self, mm: mmap.mmap, path: str, start: int, end: int) -> None:
        if self.fsync_delay_s:
            time.sleep(self.fsync_delay_s)
        super().flush(mm, path, start, end)
        self.flush_count += 1
        if self.track_unsynced and end > start:
            snap = self._durable.setdefault(path, bytearray(len(mm)))
            aligned = start - start % PAGE_SIZE
            snap[aligned:end] = mm[aligned:end]

    def before_write(self, path: str, pos: int, length: int) -> None:
        if self.enospc_on_write:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    def after_write(self, path: str, mm: mmap.mmap, pos: int, length: int) -> None:
        self.bytes_written += length
        if self.crash_after_bytes is None:
            return
        self.crash_after_bytes -= length
        if self.crash_after_bytes < 0:
            lost = min(length, -self.crash_after_bytes)
            mm[pos + length - lost : pos + length] = bytes(lost)
            self.crash_after_bytes = None
            raise SimulatedCrash(f"simulated crash: last {lost} bytes of a {length}-byte write to {path} lost")

    def remove(self, path: str) -> None:
        self._durable.pop(path, None)
        super().remove(path)

    def drop_unsynced(self) -> int:
        """Put every tracked file back to its last flushed content; returns the files touched.

        Call only after the store was abandoned (its maps closed).
        """
        touched = 0
        for path, snap in self._durable.items():
            if not os.path.exists(path):
                continue
            with open(path, "r+b") as f:
                if f.read() != snap:
                    f.seek(0)
                    f.write(snap)
                    touched += 1
        return touched
