"""The checkpoint file (``<root>/checkpoint``, 4096 bytes, big-endian int64 fields, docs/BEHAVIOUR.md 7.5)::

    @0   physicMsgTimestamp   store time of the last flushed commit-log record
    @8   logicsMsgTimestamp   store time of the last record in flushed consume queues
    @16  indexMsgTimestamp    end time of the last flushed index
    @24  masterFlushedOffset  commit-log offset known to be on disk (recovery: bad bytes before it are
                              corruption, after it a torn tail)
    @32  confirmPhyOffset     unused (0)
"""

from __future__ import annotations

import struct
import threading

from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile

__all__ = ["Checkpoint"]

_FIELDS = struct.Struct(">qqqqq")
SIZE = 4096


class Checkpoint:
    """In-memory values; :meth:`flush` writes and msyncs them (callable from several threads: the flush
    thread, and a truncation on the loop thread)."""

    def __init__(self, io: FileIO, path: str) -> None:
        self.mf = MappedFile.open(io, path, 0, SIZE, create=True)
        self._lock = threading.Lock()
        (self.physic_ts, self.logics_ts, self.index_ts, self.flushed_offset,
         self.confirm_offset) = _FIELDS.unpack_from(self.mf.mm, 0)

    def min_timestamp(self) -> int:
        """``max(0, min(physic, logics) - 3000)``: records stored before this are in flushed consume queues."""
        return max(0, min(self.physic_ts, self.logics_ts) - 3000)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_ts)

    def flush(self) -> None:
        mf = self.mf
        with self._lock:  # the values are read inside: the last flush to finish writes the latest ones
            if mf.closed:
                return
            mf.write(0, _FIELDS.pack(self.physic_ts, self.logics_ts, self.index_ts, self.flushed_offset,
                                     self.confirm_offset))
            mf.io.flush(mf.mm, mf.path, 0, SIZE)

    def close(self) -> None:
        self.mf.close()
