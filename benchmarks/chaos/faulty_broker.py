"""``python -m benchmarks.chaos.faulty_broker -c FILE [...]``: the broker's own entry point, with the store's file
layer replaced by :class:`benchmarks.chaos.faulty_io.FaultyIO`, so the chaos nemesis can fill the disk of a broker
it may not mount a small file system for (it is not root).

* SIGUSR1: the disk is full -- every file allocation and every write of the store fails with ENOSPC (nothing is
  written), from the commit log and consume queues to the files a slave appends replicated bytes to;
* SIGUSR2: the disk has room again.

Everything else is ``python -m broker``: the same arguments, ready line, exit codes and signals. The only
difference is the one the store's constructor allows: ``FileMessageStore(config, io=...)``. The broker's entry
point opens its store through the name ``FileMessageStore`` of its module, which this wrapper binds to the
store class with the faulty layer given (test code only; no broker module knows about it).
"""

from __future__ import annotations

import functools
import signal
import sys
from types import FrameType

import broker.__main__ as broker_main
from benchmarks.chaos.faulty_io import FaultyIO
from broker.store.file_store import FileMessageStore

__all__ = ["DISK_FULL", "DISK_ROOM", "main"]

#: Signal that fills the disk.
DISK_FULL = signal.SIGUSR1
#: Signal that frees it.
DISK_ROOM = signal.SIGUSR2


def main() -> int:
    """Run the broker with a signal-controlled full disk; returns its exit code."""
    io = FaultyIO()

    def set_full(signum: int, _frame: FrameType | None) -> None:
        full = signum == DISK_FULL
        io.enospc_on_allocate = io.enospc_on_write = full

    signal.signal(DISK_FULL, set_full)
    signal.signal(DISK_ROOM, set_full)
    # The entry point builds its store as FileMessageStore(store_config); this name is the one it calls.
    broker_main.FileMessageStore = functools.partial(FileMessageStore, io=io)  # type: ignore[assignment,misc]
    return broker_main.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
