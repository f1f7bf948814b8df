"""Byte framing of master/slave replication (docs/BEHAVIOUR.md 2.3). Pure: no sockets, no clock.

Slave -> master, an offset report (8 bytes)::

    +--------------------------------+
    | slaveMaxPhyOffset : int64 (BE) |
    +--------------------------------+

Master -> slave, a transfer frame (12-byte header + body; ``bodySize = 0`` is a heartbeat)::

    +------------------------+----------------------+------------------------+
    | phyOffset : int64 (BE) | bodySize : int32 (BE)| body : bodySize bytes  |
    +------------------------+----------------------+------------------------+

The master only uses the *last complete* report it has read (older queued reports are skipped), so
:class:`ReportDecoder` returns at most one value per feed. :class:`FrameDecoder` owns the slave's read buffer:
the socket reads straight into it (``get_buffer`` / ``buffer_updated``) and frames come out as memoryview slices
of it, so a body is copied once, from the socket into the buffer, before the store writes it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "FRAME_HEADER",
    "FRAME_HEADER_SIZE",
    "REPORT",
    "REPORT_SIZE",
    "Frame",
    "FrameDecoder",
    "HAProtocolError",
    "ReportDecoder",
    "encode_frame_header",
    "encode_report",
]

FRAME_HEADER = struct.Struct(">qi")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 12
REPORT = struct.Struct(">q")
REPORT_SIZE = REPORT.size  # 8

_MAX_INT32 = (1 << 31) - 1
_MAX_INT64 = (1 << 63) - 1


class HAProtocolError(ValueError):
    """The peer sent bytes that are not a valid report / frame stream (the message says which field)."""


class Frame(NamedTuple):
    """One transfer frame. ``body`` may be a view into a decoder's buffer: valid until the next read into it."""

    phy_offset: int
    body: memoryview | bytes

    @property
    def is_heartbeat(self) -> bool:
        return len(self.body) == 0


def encode_report(offset: int) -> bytes:
    """The 8-byte report of a slave's max physical offset.

    Raises:
        HAProtocolError: the offset is negative or does not fit an int64.
    """
    if not 0 <= offset <= _MAX_INT64:
        raise HAProtocolError(f"report offset {offset} is outside 0..2^63-1")
    return REPORT.pack(offset)


def encode_frame_header(phy_offset: int, body_size: int) -> bytes:
    """The 12-byte header of a transfer frame.

    Raises:
        HAProtocolError: a negative offset, or a body size outside 0..2^31-1.
    """
    if not 0 <= phy_offset <= _MAX_INT64:
        raise HAProtocolError(f"frame phyOffset {phy_offset} is outside 0..2^63-1")
    if not 0 <= body_size <= _MAX_INT32:
        raise HAProtocolError(f"frame bodySize {body_size} is outside 0..2^31-1")
    return FRAME_HEADER.pack(phy_offset, body_size)


class ReportDecoder:
    """Master side: turns the slave's byte stream into "the latest reported offset"."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""  # < 8 bytes of an incomplete report

    def feed(self, data: bytes | bytearray | memoryview) -> int | None:
        """Consume ``data``; return the last complete report in it (None when no report was completed).

        Raises:
            HAProtocolError: a report is negative (not a valid commit-log offset).
        """
        if self._pending:
            data = self._pending + bytes(data)
        n = len(data)
        complete = n - n % REPORT_SIZE
        self._pending = bytes(data[complete:])
        if complete == 0:
            return None
        (offset,) = REPORT.unpack_from(data, complete - REPORT_SIZE)
        if offset < 0:
            raise HAProtocolError(f"slave reported a negative offset {offset}")
        return int(offset)


class FrameDecoder:
    """Slave side: an incremental decoder over a fixed read buffer that tolerates any split of the stream.

    Use either ``get_buffer()`` + ``buffer_updated(n)`` (read straight into the buffer) or ``feed(data)``, then
    call ``next_frame()`` until it returns None. A returned body views the buffer: consume it before the next
    ``get_buffer``/``feed``.
    """

    __slots__ = ("_buf", "_capacity", "_end", "_start", "_view")

    def __init__(self, capacity: int = 4 * 1024 * 1024) -> None:
        if capacity <= FRAME_HEADER_SIZE:
            raise ValueError(f"read buffer capacity {capacity} must exceed the {FRAME_HEADER_SIZE}-byte header")
        self._capacity = capacity
        self._buf = bytearray(capacity)
        self._view = memoryview(self._buf)
        self._start = 0  # first unconsumed byte
        self._end = 0  # end of received bytes

    @property
    def buffered(self) -> int:
        """Received bytes not yet returned as frames."""
        return self._end - self._start

    def reset(self) -> None:
        """Forget buffered bytes (a new connection)."""
        self._start = self._end = 0

    def get_buffer(self) -> memoryview:
        """The free tail of the buffer to receive into; moves unconsumed bytes to the front when needed."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._capacity - self._end < self._capacity // 4:
            # Only a partial frame is left (callers drain frames before reading), so this copy is small.
            left = self._end - self._start
            self._view[0:left] = self._view[self._start : self._end]  # memoryview copies with memmove
            self._start, self._end = 0, left
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Record that ``nbytes`` were written at the start of the last ``get_buffer()`` view."""
        if not 0 <= nbytes <= self._capacity - self._end:
            raise ValueError(f"buffer_updated({nbytes}) exceeds the free space {self._capacity - self._end}")
        self._end += nbytes

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed.

        Raises:
            HAProtocolError: a negative offset or size, or a body that cannot fit the read buffer.
        """
        avail = self._end - self._start
        if avail < FRAME_HEADER_SIZE:
            return None
        phy, size = FRAME_HEADER.unpack_from(self._buf, self._start)
        if phy < 0:
            raise HAProtocolError(f"frame phyOffset {phy} is negative")
        if size < 0 or size > self._capacity - FRAME_HEADER_SIZE:
            raise HAProtocolError(
                f"frame bodySize {size} at phyOffset {phy} is outside 0..{self._capacity - FRAME_HEADER_SIZE} "
                f"(the slave read buffer, ha_slave_read_buffer_bytes={self._capacity})"
            )
        if avail < FRAME_HEADER_SIZE + size:
            return None
        body_start = self._start + FRAME_HEADER_SIZE
        self._start = body_start + size
        return Frame(phy, self._view[body_start : self._start])

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Copy ``data`` in and return every frame completed, with bodies copied out as ``bytes``.

        Raises:
            HAProtocolError: as :meth:`next_frame`.
        """
        frames: list[Frame] = []
        src = memoryview(data)
        while True:
            while (frame := self.next_frame()) is not None:
                frames.append(Frame(frame.phy_offset, bytes(frame.body)))
            if not src:
                return frames
            room = self.get_buffer()
            k = min(len(room), len(src))
            room[:k] = src[:k]
            self.buffer_updated(k)
            src = src[k:]
