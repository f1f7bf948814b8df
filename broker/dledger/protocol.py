"""The DLedger peer protocol: binary, length-prefixed frames over TCP (no HTTP, no JSON; entries travel in
batches). Pure: no sockets, no clock. The one module that owns these bytes.

Every frame, big-endian::

     0  4  LENGTH      int32   bytes after this field (12 + body), at most ``max_frame_bytes``
     4  2  MAGIC       uint16  0x444C ("DL")
     6  1  VERSION     uint8   1
     7  1  TYPE        uint8   a :class:`MsgType`
     8  8  REQUEST_ID  int64   echoed by the answer
    16     BODY

Bodies (strings are ``uint16 length + UTF-8``)::

    HELLO        group str, from_id str, to_id str        first frame of a connection, both ways
    VOTE         term i64, ledger_end_term i64, ledger_end_index i64, pre_vote u8
    VOTE_REPLY   result u8 (VoteResult), term i64
    HEARTBEAT    term i64 [, broker_addr str]           the leader's broker (HTTP) address: its followers' master
    HB_REPLY     code u8 (HeartbeatCode), term i64
    PUSH         kind u8 (PushKind), term i64, committed_index i64, first_index i64, count i32, entries
                 (``count`` entries of :mod:`broker.dledger.entry` back to back: one for COMPARE and TRUNCATE,
                 none for COMMIT)
    PUSH_REPLY   code u8 (PushCode), term i64, index i64, begin_index i64, end_index i64
    TAKE_LEADERSHIP        term i64 (the leader hands over: the receiver campaigns at once, without pre-vote)
    TAKE_LEADERSHIP_REPLY  as HB_REPLY

:class:`FrameDecoder` checks every length before it allocates or waits, so garbage, truncated frames or absurd
sizes end in a :class:`PeerProtocolError` naming the field, and the connection is closed by its owner.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple, TypeVar

from broker.dledger.dispatcher import PushKind
from broker.dledger.election import HeartbeatCode, VoteResult

__all__ = [
    "HEADER",
    "MAGIC",
    "Frame",
    "FrameDecoder",
    "Hello",
    "MsgType",
    "PeerProtocolError",
    "Push",
    "PushCode",
    "PushReply",
    "Vote",
    "decode_heartbeat",
    "decode_heartbeat_reply",
    "decode_hello",
    "decode_push",
    "decode_push_reply",
    "decode_term",
    "decode_vote",
    "decode_vote_reply",
    "encode_frame",
    "encode_frame_parts",
    "encode_heartbeat",
    "encode_heartbeat_reply",
    "encode_hello",
    "encode_push_head",
    "encode_push_reply",
    "encode_term",
    "encode_vote",
    "encode_vote_reply",
]

MAGIC = 0x444C
VERSION = 1
HEADER = struct.Struct(">iHBBq")  # 16 bytes
_AFTER_LENGTH = HEADER.size - 4
_VOTE = struct.Struct(">qqqB")
_REPLY = struct.Struct(">Bq")
_TERM = struct.Struct(">q")
_PUSH = struct.Struct(">Bqqqi")
_PUSH_REPLY = struct.Struct(">Bqqqq")
_U16 = struct.Struct(">H")


class PeerProtocolError(ValueError):
    """Bytes from a peer that are not a valid frame (the message names the field)."""


class MsgType(enum.IntEnum):
    HELLO = 1
    VOTE = 2
    VOTE_REPLY = 3
    HEARTBEAT = 4
    HB_REPLY = 5
    PUSH = 6
    PUSH_REPLY = 7
    TAKE_LEADERSHIP = 8
    TAKE_LEADERSHIP_REPLY = 9


class PushCode(enum.IntEnum):
    SUCCESS = 0
    INCONSISTENT_STATE = 1
    REPEATED_PUSH = 2
    PUSH_REQUEST_IS_FULL = 3
    NOT_FOLLOWER = 4
    EXPIRED_TERM = 5
    INCONSISTENT_LEADER = 6
    DISK_ERROR = 7


E = TypeVar("E", bound=enum.Enum)

#: Codes by value: a dict lookup per frame and per ack, not an enum call.
_MSG_TYPES = {t.value: t for t in MsgType}
_PUSH_CODES = {c.value: c for c in PushCode}
#: Entries a PUSH of each kind carries (APPEND: 1 .. 2^20).
_PUSH_COUNTS = {PushKind.COMMIT: (0, 0), PushKind.COMPARE: (1, 1), PushKind.TRUNCATE: (1, 1)}

_VOTE_RESULTS = list(VoteResult)
_HB_CODES = list(HeartbeatCode)
_PUSH_KINDS = list(PushKind)


class Frame(NamedTuple):
    type: MsgType
    request_id: int
    body: memoryview


def encode_frame(msg_type: MsgType, request_id: int, body: bytes = b"", tail: bytes = b"") -> bytes:
    """One frame whose body is ``body + tail``, joined in one copy (a PUSH's head and its entries)."""
    head = HEADER.pack(_AFTER_LENGTH + len(body) + len(tail), MAGIC, VERSION, msg_type, request_id)
    return b"".join((head, body, tail)) if tail else head + body


def encode_frame_parts(msg_type: MsgType, request_id: int, body: bytes,
                       tail: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """The frame of :func:`encode_frame` as ``(header + body, tail)``, not joined: a PUSH's entries (``tail``,
    often tens of KB) go to the socket as they are, in one ``writelines``, and one buffer of entries serves
    every follower pushed the same range (only the small first part differs: the request id)."""
    head = HEADER.pack(_AFTER_LENGTH + len(body) + len(tail), MAGIC, VERSION, msg_type, request_id)
    return head + body, tail


class FrameDecoder:
    """An incremental decoder over a fixed buffer of ``max_frame_bytes + 16`` (any split of the stream).

    Read into :meth:`get_buffer`, record with :meth:`buffer_updated`, then take :meth:`next_frame` until None. A
    frame's body views the buffer: use it before the next read.
    """

    def __init__(self, max_frame_bytes: int = 32 << 20) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._cap = max_frame_bytes + HEADER.size
        self._buf = bytearray(self._cap)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def get_buffer(self) -> memoryview:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._cap - self._end < self._cap // 4:
            left = self._end - self._start
            self._view[:left] = self._view[self._start : self._end]
            self._start, self._end = 0, left
        return self._view[self._end :]

    def buffer_updated(self, n: int) -> None:
        if not 0 <= n <= self._cap - self._end:
            raise ValueError(f"buffer_updated({n}) exceeds the free space {self._cap - self._end}")
        self._end += n

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame ``data`` completes; no body views the decoder's buffer.

        Frames that lie whole in ``data`` with nothing buffered before them are not copied: their bodies view
        ``data`` (bytes: nothing can change them; a follower parks a pushed batch as it was read). A frame that
        straddles reads goes through the buffer and its body is copied out once. Only a trailing partial frame
        is copied in.
        """
        out: list[Frame] = []
        if not isinstance(data, bytes):
            data = bytes(data)
        src = memoryview(data)
        if self._start == self._end:
            at, n = 0, len(src)
            while (h := self._header(src, at, n - at)) is not None and n - at >= 4 + h[0]:
                length, kind, request_id = h
                out.append(Frame(kind, request_id, src[at + HEADER.size : at + 4 + length]))
                at += 4 + length
            src = src[at:]
        while True:
            while (f := self.next_frame()) is not None:
                out.append(Frame(f.type, f.request_id, memoryview(bytes(f.body))))
            if not src:
                return out
            room = self.get_buffer()
            k = min(len(room), len(src))
            room[:k] = src[:k]
            self.buffer_updated(k)
            src = src[k:]

    def _header(self, buf: memoryview | bytearray, at: int, avail: int) -> tuple[int, MsgType, int] | None:
        """``(length, type, request id)`` of the frame at ``buf[at:]`` (``avail`` bytes there), checked; None
        when its header is not all there yet.

        Raises:
            PeerProtocolError: a bad magic, version or type, or a length outside ``12..max_frame_bytes``.
        """
        if avail < HEADER.size:
            return None
        length, magic, version, msg_type, request_id = HEADER.unpack_from(buf, at)
        if magic != MAGIC:
            raise PeerProtocolError(f"frame magic {magic:#06x} is not {MAGIC:#06x}: not a DLedger peer")
        if version != VERSION:
            raise PeerProtocolError(f"frame version {version} is not {VERSION}")
        if not _AFTER_LENGTH <= length <= self.max_frame_bytes:
            raise PeerProtocolError(f"frame length {length} is outside {_AFTER_LENGTH}..{self.max_frame_bytes}")
        kind = _MSG_TYPES.get(msg_type)
        if kind is None:
            raise PeerProtocolError(f"frame type {msg_type} is unknown")
        return length, kind, request_id

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed.

        Raises:
            PeerProtocolError: a bad magic, version or type, or a length outside ``12..max_frame_bytes``.
        """
        h = self._header(self._buf, self._start, self._end - self._start)
        if h is None or self._end - self._start < 4 + h[0]:
            return None
        length, kind, request_id = h
        body_start = self._start + HEADER.size
        self._start += 4 + length
        return Frame(kind, request_id, self._view[body_start : self._start])


def _str(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 255:
        raise ValueError(f"{s[:40]!r}... is longer than 255 bytes")
    return _U16.pack(len(raw)) + raw


class Hello(NamedTuple):
    group: str
    from_id: str
    to_id: str


def encode_hello(h: Hello) -> bytes:
    return _str(h.group) + _str(h.from_id) + _str(h.to_id)


def decode_hello(body: memoryview | bytes) -> Hello:
    parts: list[str] = []
    at = 0
    for name in ("group", "from_id", "to_id"):
        if at + 2 > len(body):
            raise PeerProtocolError(f"HELLO ends before its {name}")
        (n,) = _U16.unpack_from(body, at)
        if n > 255 or at + 2 + n > len(body):
            raise PeerProtocolError(f"HELLO {name} of {n} bytes does not fit the frame")
        try:
            parts.append(bytes(body[at + 2 : at + 2 + n]).decode())
        except UnicodeDecodeError:
            raise PeerProtocolError(f"HELLO {name} is not UTF-8") from None
        at += 2 + n
    if at != len(body):
        raise PeerProtocolError(f"HELLO has {len(body) - at} bytes past its fields")
    return Hello(*parts)


def _exact(body: memoryview | bytes, st: struct.Struct, what: str) -> tuple[int, ...]:
    if len(body) != st.size:
        raise PeerProtocolError(f"{what} body is {len(body)} bytes, not {st.size}")
    return st.unpack_from(body, 0)


class Vote(NamedTuple):
    term: int
    ledger_end_term: int
    ledger_end_index: int
    pre_vote: bool


def encode_vote(v: Vote) -> bytes:
    return _VOTE.pack(v.term, v.ledger_end_term, v.ledger_end_index, int(v.pre_vote))


def decode_vote(body: memoryview | bytes) -> Vote:
    term, lt, li, pre = _exact(body, _VOTE, "VOTE")
    if term < 0 or lt < -1 or li < -1 or pre > 1:
        raise PeerProtocolError(f"VOTE fields out of range: term {term}, ledger end {lt}/{li}, pre_vote {pre}")
    return Vote(term, lt, li, bool(pre))


def _encode_reply(codes: Sequence[E], code: E, term: int) -> bytes:
    return _REPLY.pack(codes.index(code), term)


def _decode_reply(codes: Sequence[E], body: memoryview | bytes, what: str, field: str) -> tuple[E, int]:
    code, term = _exact(body, _REPLY, what)
    if code >= len(codes):
        raise PeerProtocolError(f"{what} {field} {code} is unknown")
    return codes[code], term


def encode_vote_reply(result: VoteResult, term: int) -> bytes:
    return _encode_reply(_VOTE_RESULTS, result, term)


def decode_vote_reply(body: memoryview | bytes) -> tuple[VoteResult, int]:
    return _decode_reply(_VOTE_RESULTS, body, "VOTE_REPLY", "result")


def encode_heartbeat_reply(code: HeartbeatCode, term: int) -> bytes:
    return _encode_reply(_HB_CODES, code, term)


def decode_heartbeat_reply(body: memoryview | bytes) -> tuple[HeartbeatCode, int]:
    return _decode_reply(_HB_CODES, body, "HB_REPLY", "code")


def encode_term(term: int) -> bytes:
    return _TERM.pack(term)


def decode_term(body: memoryview | bytes, what: str = "TAKE_LEADERSHIP") -> int:
    (term,) = _exact(body, _TERM, what)
    if term < 0:
        raise PeerProtocolError(f"{what} term {term} is negative")
    return int(term)


def encode_heartbeat(term: int, broker_addr: str = "") -> bytes:
    """A HEARTBEAT: the term, and the leader's broker address when it has one (its followers' master)."""
    return _TERM.pack(term) + (_str(broker_addr) if broker_addr else b"")


def decode_heartbeat(body: memoryview | bytes) -> tuple[int, str]:
    """``(term, broker address)`` of a HEARTBEAT (``""`` when the leader sent none: a bare 8-byte term)."""
    if len(body) == _TERM.size:
        return decode_term(body, "HEARTBEAT"), ""
    if len(body) < _TERM.size + 2:
        raise PeerProtocolError(f"HEARTBEAT body is {len(body)} bytes, not 8 or 10 and more")
    term = decode_term(body[: _TERM.size], "HEARTBEAT")
    (n,) = _U16.unpack_from(body, _TERM.size)
    if n > 255 or _TERM.size + 2 + n != len(body):
        raise PeerProtocolError(f"HEARTBEAT broker_addr of {n} bytes does not fit the {len(body)}-byte body")
    try:
        addr = bytes(body[_TERM.size + 2 :]).decode()
    except UnicodeDecodeError:
        raise PeerProtocolError("HEARTBEAT broker_addr is not UTF-8") from None
    return term, addr


class Push(NamedTuple):
    kind: PushKind
    term: int
    committed_index: int
    first_index: int
    n_entries: int
    entries: memoryview | bytes
    """``n_entries`` entries back to back (not checked here: the follower checks each with ``check_entry``)."""


def encode_push_head(kind: PushKind, term: int, committed_index: int, first_index: int, count: int) -> bytes:
    """The fixed part of a PUSH body; the entries follow it in the same frame."""
    return _PUSH.pack(_PUSH_KINDS.index(kind), term, committed_index, first_index, count)


def decode_push(body: memoryview | bytes) -> Push:
    if len(body) < _PUSH.size:
        raise PeerProtocolError(f"PUSH body is {len(body)} bytes, shorter than its {_PUSH.size}-byte head")
    kind, term, committed, first, count = _PUSH.unpack_from(body, 0)
    if kind >= len(_PUSH_KINDS):
        raise PeerProtocolError(f"PUSH kind {kind} is unknown")
    k = _PUSH_KINDS[kind]
    want = _PUSH_COUNTS.get(k, (1, 1 << 20))
    if term < 0 or committed < -1 or first < -1 or not want[0] <= count <= want[1]:
        raise PeerProtocolError(f"PUSH {k.value} fields out of range: term {term}, committed {committed}, "
                                f"first index {first}, count {count}")
    entries = body[_PUSH.size :]
    if (count == 0) != (len(entries) == 0):
        raise PeerProtocolError(f"PUSH {k.value} carries {len(entries)} entry bytes for {count} entries")
    return Push(k, term, committed, first, count, entries)


class PushReply(NamedTuple):
    code: PushCode
    term: int
    acked_index: int
    begin_index: int
    end_index: int


def encode_push_reply(r: PushReply) -> bytes:
    return _PUSH_REPLY.pack(r.code, r.term, r.acked_index, r.begin_index, r.end_index)


def decode_push_reply(body: memoryview | bytes) -> PushReply:
    code, term, index, begin, end = _exact(body, _PUSH_REPLY, "PUSH_REPLY")
    c = _PUSH_CODES.get(code)
    if c is None:
        raise PeerProtocolError(f"PUSH_REPLY code {code} is unknown")
    return PushReply(c, term, index, begin, end)
