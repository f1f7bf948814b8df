"""Checking commit-log records (layout: :mod:`common.codec`; rules: docs/BEHAVIOUR.md 7.1). Pure: no files.

One checker serves both places that take records they did not write:

* recovery (:meth:`broker.store.commitlog.CommitLog.recover`) walks whole files with :func:`scan_records`;
* a slave (:class:`ReplicaChecker`) checks the master's bytes before they reach its log, as they arrive in
  frames that split records anywhere.

A record is good when its TOTALSIZE lies in ``91..max_size`` and leaves the 8 bytes of a blank marker before
the end of its file (the writer's rule, so a file can always be closed), its magic is V1, its field lengths add
up to TOTALSIZE, its PHYSICALOFFSET is its own offset and its BODYCRC matches the body. A blank marker
``[int32 remaining][int32 BLANK_MAGIC]`` must say exactly how many bytes are left in its file.
"""

from __future__ import annotations

import struct

from common.codec import BLANK_MAGIC, CHECK_HEAD_V4, MAGIC_V1, RECORD_PREFIX, crc32, record_layout
from common.errors import ProtocolViolationError

__all__ = [
    "BAD",
    "BLANK",
    "END",
    "MORE",
    "ZERO",
    "RecordViolation",
    "ReplicaChecker",
    "check_records",
    "scan_records",
]

#: Outcomes. Anything else :func:`check_records` returns is the reason a record is bad.
BLANK, ZERO, END, MORE = "blank", "zero", "end", "more"
#: The single "bad" outcome of :func:`scan_records` (recovery needs no reason).
BAD = "bad"

_MIN_SIZE = 91
_MARKER = RECORD_PREFIX.size  # 8: size + magic, also the blank marker
_U16_AT = struct.Struct(">H").unpack_from
_I64_AT = struct.Struct(">q").unpack_from


def _check_generic(buf: memoryview, pos: int, size: int, phy: int, check_crc: bool) -> str | None:
    """The IPv6-host layouts, through the codec's general parser (rare: not worth a fast path)."""
    try:
        _, _, body_len_pos, topic_len_pos, _ = record_layout(buf, pos, size)
    except ProtocolViolationError:
        return "field lengths do not add up to TOTALSIZE"
    if _I64_AT(buf, pos + 28)[0] != phy:
        return f"PHYSICALOFFSET {_I64_AT(buf, pos + 28)[0]} is not the record's offset"
    crc = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
    if check_crc and crc32(buf[body_len_pos + 4 : topic_len_pos]) & 0x7FFFFFFF != crc:
        return "BODYCRC does not match the body"
    return None


def check_records(
    buf: memoryview, base: int, pos: int, data_end: int, file_end: int, check_crc: bool, max_size: int
) -> tuple[int, str]:
    """Walk the records of one commit-log file in ``buf[pos:data_end]``.

    Args:
        buf: the bytes; ``buf[i]`` sits at physical offset ``base + i``. ``pos`` must be a record start.
        base: physical offset of ``buf[0]``.
        pos: where to start.
        data_end: end of the bytes present (a slave may hold only part of a file).
        file_end: where the commit-log file ends, in ``buf`` positions (``>= data_end``).
        check_crc: check each BODYCRC.
        max_size: largest TOTALSIZE accepted.

    Returns:
        ``(position, outcome)``, ``position`` the end of the good records: ``BLANK`` (a correct blank marker
        starts there: the file is done), ``ZERO`` (zeros: end of data), ``END`` (fewer than 8 bytes left in the
        file), ``MORE`` (the record there is not complete in ``buf``; it may be the end of the data), or else
        the reason the record there is bad.
    """
    prefix = RECORD_PREFIX.unpack_from
    head = CHECK_HEAD_V4.unpack_from
    u16 = _U16_AT
    crc_of = crc32
    limit = file_end - _MARKER  # a record must leave room for a blank marker
    fast_end = min(data_end, limit)
    while True:
        # Fast path: a whole good IPv4 record, all rules in one test (the replication hot path). Anything
        # else -- a bad, incomplete, IPv6 or blank record -- goes through the rules one by one below.
        if pos + 88 <= data_end:
            size, magic, crc, phy, sys_flag, body_len = head(buf, pos)
            end = pos + size
            tp = pos + 88 + body_len
            if (magic == MAGIC_V1 and _MIN_SIZE <= size <= max_size and end <= fast_end and not sys_flag & 0x30
                    and phy == base + pos and body_len >= 0 and tp + 3 <= end):
                pp = tp + 1 + buf[tp]
                if pp + 2 <= end and pp + 2 + u16(buf, pp)[0] == end and (
                        not check_crc or crc_of(buf[pos + 88 : tp]) & 0x7FFFFFFF == crc):
                    pos = end
                    continue
        if pos + _MARKER > data_end:
            return (pos, END) if pos > limit else (pos, MORE)
        size, magic = prefix(buf, pos)
        if magic == MAGIC_V1:
            end = pos + size
            if size < _MIN_SIZE or size > max_size or end > limit:
                return pos, f"TOTALSIZE {size} is outside {_MIN_SIZE}..{min(max_size, limit - pos)}"
            if end > data_end:
                return pos, MORE
            _, _, crc, phy, sys_flag, body_len = head(buf, pos)
            if sys_flag & 0x30:
                bad = _check_generic(buf, pos, size, base + pos, check_crc)
                if bad is not None:
                    return pos, bad
                pos = end
                continue
            tp = pos + 88 + body_len
            if body_len < 0 or tp + 3 > end:
                return pos, f"BODYLENGTH {body_len} does not fit TOTALSIZE {size}"
            pp = tp + 1 + buf[tp]
            if pp + 2 > end or pp + 2 + u16(buf, pp)[0] != end:
                return pos, "field lengths do not add up to TOTALSIZE"
            if phy != base + pos:
                return pos, f"PHYSICALOFFSET {phy} is not the record's offset"
            if check_crc and crc_of(buf[pos + 88 : tp]) & 0x7FFFFFFF != crc:
                return pos, "BODYCRC does not match the body"
            pos = end
        elif magic == BLANK_MAGIC:
            if size == file_end - pos:
                return pos, BLANK
            return pos, f"blank marker says {size} bytes are left in the file, not {file_end - pos}"
        elif magic == 0 and size == 0:
            return pos, ZERO
        else:
            return pos, f"MAGICCODE {magic & 0xFFFFFFFF:#010x} is neither a record's nor a blank marker's"


def scan_records(buf: memoryview, file_start: int, pos: int, limit: int, check_crc: bool) -> tuple[int, str]:
    """Recovery's walk of one whole file ``buf[:limit]`` (``limit`` its size) from ``pos``.

    Returns ``(position, outcome)``: ``BLANK`` (blank marker at position: the file is done), ``ZERO`` (zeros at
    position: end of data), ``BAD`` (an invalid record at position) or ``END`` (no room for another record).
    """
    pos, outcome = check_records(buf, file_start, pos, limit, limit, check_crc, limit)
    if outcome in (BLANK, ZERO, END):
        return pos, outcome
    return pos, BAD  # MORE cannot happen with the whole file present: the record runs past the file


class RecordViolation(ValueError):
    """Replicated bytes that are not good records (the message names the offset and the rule)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"replicated bytes at physical offset {offset} are not a good record: {reason}")
        self.offset = offset
        self.reason = reason


class ReplicaChecker:
    """A slave's check of the master's byte stream, fed frame body by frame body (any split).

    Returns only bytes of whole good records (and the unused tail of a file after its blank marker), so the
    log never holds a record it has not checked. The start of a record split across frames is held, at most
    ``max_size`` bytes, until the rest arrives.

    Args:
        file_size: the commit-log file size (``mapped_file_size_commitlog``), the same on master and slave.
        max_size: largest record accepted (``maxMessageSize``: the master stores nothing larger).
        check_crc: check each record's BODYCRC.
    """

    __slots__ = ("_carry", "_check_crc", "_file_size", "_max_size", "_next", "_skip")

    def __init__(self, file_size: int, max_size: int, *, check_crc: bool = True) -> None:
        if file_size <= 2 * _MARKER:
            raise ValueError(f"file_size {file_size} is too small for a record and a blank marker")
        self._file_size = file_size
        self._max_size = max(_MIN_SIZE, max_size)
        self._check_crc = check_crc
        self._carry = bytearray()  # the start of a record that is not complete yet
        self._next = 0  # physical offset of the first byte not returned yet (the held record's start)
        self._skip = 0  # bytes left of a file's tail after its blank marker

    @property
    def held(self) -> int:
        """Bytes received but not returned yet (the start of an incomplete record)."""
        return len(self._carry)

    @property
    def next_offset(self) -> int:
        """Physical offset the next body must start at."""
        return self._next + len(self._carry)

    def reset(self, offset: int) -> None:
        """Start over at ``offset`` (a record start: the end of the slave's log), forgetting held bytes."""
        self._carry = bytearray()
        self._next = offset
        self._skip = 0

    def feed(self, body: memoryview | bytes, out: list[memoryview | bytes]) -> None:
        """Check ``body`` (the bytes at :attr:`next_offset`); add the bytes that may be appended to ``out``.

        The pieces added continue each other and what was added before. A returned view is a slice of
        ``body``.

        Raises:
            RecordViolation: a bad record; the pieces of the good records before it are in ``out``.
        """
        view = memoryview(body)
        while view:
            if self._skip:
                n = min(self._skip, len(view))
                out.append(view[:n])
                self._skip -= n
                self._next += n
                view = view[n:]
            elif self._carry:
                view = self._complete(view, out)
            else:
                view = self._whole(view, out)

    def _file_end(self, offset: int) -> int:
        return offset - offset % self._file_size + self._file_size

    def _whole(self, view: memoryview, out: list[memoryview | bytes]) -> memoryview:
        """Check records straight from ``view`` (no copy); hold an incomplete last one."""
        at = self._next
        file_end = self._file_end(at) - at
        data_end = min(len(view), file_end)
        pos, outcome = check_records(view, at, 0, data_end, file_end, self._check_crc, self._max_size)
        if pos:
            out.append(view[:pos])
            self._next += pos
        if outcome == MORE:
            if data_end < len(view):  # the body goes on past the end of the file: no blank marker closed it
                raise RecordViolation(at + pos, "the file ends without a blank marker")
            self._carry = bytearray(view[pos:data_end])
            return view[data_end:data_end]
        if outcome == BLANK:
            self._skip = file_end - pos
            return view[pos:]
        raise RecordViolation(at + pos, _reason(outcome))

    def _complete(self, view: memoryview, out: list[memoryview | bytes]) -> memoryview:
        """Add bytes of ``view`` to the held record; once it is whole, check it and return the rest of ``view``."""
        carry, at = self._carry, self._next
        for _ in range(2):  # the second round reads TOTALSIZE once the first brought the 8-byte prefix
            want = _MARKER
            if len(carry) >= _MARKER:
                size, magic = RECORD_PREFIX.unpack_from(carry, 0)
                if magic == MAGIC_V1 and _MIN_SIZE <= size <= self._max_size:
                    want = size  # never more than max_size held; the file bound is checked below
            take = max(0, min(want - len(carry), len(view)))
            if take:
                carry += view[:take]
                view = view[take:]
            if len(carry) < want:
                return view  # empty: the next body brings more
        file_end = self._file_end(at) - at
        held = memoryview(carry)
        pos, outcome = check_records(held, at, 0, len(carry), file_end, self._check_crc, self._max_size)
        if outcome == BLANK:  # the held bytes are the 8-byte marker
            self._skip = file_end - len(carry)
        elif pos != len(carry):
            raise RecordViolation(at + pos, _reason(outcome))
        self._carry = bytearray()  # ``held`` keeps the old one alive, unchanged, for the caller's append
        out.append(held)
        self._next += len(carry)
        return view


def _reason(outcome: str) -> str:
    if outcome == ZERO:
        return "zeros where a record should start"
    if outcome == END:
        return "a record leaves less than a blank marker's 8 bytes before the end of the file"
    return outcome
