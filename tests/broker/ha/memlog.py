"""An in-memory commit log with just the store methods HA uses, laid out like RocketMQ's: fixed-size files, a
record never crosses a file, a file that cannot take the next record gets a blank marker and its tail counts as
written. For the HA tests (beside the real file store); not a message store."""

from __future__ import annotations

from collections.abc import Callable

from common.codec import BLANK_MAGIC, RECORD_PREFIX, body_crc, pack_host, record_size, write_record

__all__ = ["MemoryCommitLog"]

_PREFIX = RECORD_PREFIX
_TOPIC = b"HaTopic"
_HOST = pack_host("127.0.0.1", 10911)


class MemoryCommitLog:
    """``get_commitlog_data``, ``append_to_commitlog``, ``max_physical_offset``, ``mapped_file_size_commitlog``,
    ``add_append_listener`` (the append event, as the store publishes it), ``min_physical_offset``, over
    bytearrays."""

    def __init__(self, file_size: int = 64 * 1024) -> None:
        if file_size <= 16:
            raise ValueError(f"file_size {file_size} is too small for a record and a blank marker")
        self.mapped_file_size_commitlog = file_size
        self._files: dict[int, bytearray] = {}
        self._wrote: dict[int, int] = {}
        self._last = -1  # start of the last file
        self._base = 0
        self._listeners: list[Callable[[int], None]] = []
        self._records = 0

    @property
    def max_physical_offset(self) -> int:
        return self._base if self._last < 0 else self._last + self._wrote[self._last]

    @property
    def min_physical_offset(self) -> int:
        return min(self._files) if self._files else self._base

    def get_commitlog_data(self, physical_offset: int, max_bytes: int) -> memoryview | None:
        """Written bytes from ``physical_offset`` to the end of its file (at most ``max_bytes``), or None."""
        start = physical_offset - physical_offset % self.mapped_file_size_commitlog
        buf = self._files.get(start)
        if buf is None:
            return None
        pos, end = physical_offset - start, min(self._wrote[start], physical_offset - start + max_bytes)
        if end <= pos:
            return None
        return memoryview(buf)[pos:end]

    def append_to_commitlog(self, physical_offset: int, data: bytes | memoryview) -> None:
        """Continue the log with replicated bytes (an empty log may start at any file boundary).

        Raises:
            ValueError: ``physical_offset`` does not continue the log.
        """
        if self._last < 0:
            if physical_offset % self.mapped_file_size_commitlog:
                raise ValueError(f"an empty log must start at a file boundary, got {physical_offset}")
            self._base = physical_offset
        elif physical_offset != self.max_physical_offset:
            raise ValueError(f"offset {physical_offset} does not continue the log at {self.max_physical_offset}")
        self._write(data)

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)

    def append_record(self, payload: bytes | memoryview) -> int:
        """Master side: append one good record with ``payload`` as its body (a slave checks what it gets),
        rolling to a new file with a blank marker when it does not fit; return the end offset.

        Raises:
            ValueError: the record cannot fit in one file.
        """
        size = self.mapped_file_size_commitlog
        total = record_size(len(payload), len(_TOPIC), 0)
        if total + _PREFIX.size > size:
            raise ValueError(f"record of {total} bytes does not fit a {size}-byte file")
        if self._last >= 0:
            wrote = self._wrote[self._last]
            if wrote + total + _PREFIX.size > size:
                _PREFIX.pack_into(self._files[self._last], wrote, size - wrote, BLANK_MAGIC)
                self._wrote[self._last] = size
        record = bytearray(total)
        write_record(
            record, 0, topic=_TOPIC, queue_id=0, flag=0, queue_offset=self._records, physical_offset=self.max_physical_offset,
            sys_flag=0, born_timestamp=1, born_host=_HOST, store_timestamp=2,
            store_host=_HOST, reconsume_times=0, prepared_tx_offset=0, body=payload, body_crc=body_crc(payload),
            properties=b"",
        )
        self._records += 1
        self._write(record)
        return self.max_physical_offset

    def read_range(self, begin: int, end: int) -> bytes:
        """The bytes ``begin..end`` (which must be written)."""
        out = bytearray()
        while begin < end:
            data = self.get_commitlog_data(begin, end - begin)
            if data is None:
                raise ValueError(f"no data at offset {begin}")
            out += data
            begin += len(data)
        return bytes(out)

    def _write(self, data: bytes | memoryview) -> None:
        size = self.mapped_file_size_commitlog
        view = memoryview(data)
        while view:
            off = self.max_physical_offset
            start = off - off % size
            if start not in self._files:
                self._files[start] = bytearray(size)
                self._wrote[start] = 0
                self._last = start
            pos = off - start
            n = min(len(view), size - pos)
            self._files[start][pos : pos + n] = view[:n]
            self._wrote[start] += n
            view = view[n:]
        for callback in self._listeners:
            callback(self.max_physical_offset)
