"""The byte layouts of messages: commit-log records, send batches, msgIds. The only module that owns them.

Commit-log record, version 1 (``MAGIC_V1``), all integers big-endian, IPv4 hosts::

    pos  size  field
      0     4  TOTALSIZE           whole record, this field included (91 + body + topic + properties)
      4     4  MAGICCODE           0xDAA320A7
      8     4  BODYCRC             zlib.crc32(body) & 0x7FFFFFFF (RocketMQ's UtilAll.crc32)
     12     4  QUEUEID
     16     4  FLAG                user flag
     20     8  QUEUEOFFSET         logical offset in the consume queue
     28     8  PHYSICALOFFSET      this record's commit-log offset
     36     4  SYSFLAG             SysFlag bits; 0x10 / 0x20 make BORNHOST / STOREHOST 20 bytes (IPv6)
     40     8  BORNTIMESTAMP       ms
     48     8  BORNHOST            4-byte IPv4 + int32 port
     56     8  STORETIMESTAMP      ms
     64     8  STOREHOSTADDRESS    4-byte IPv4 + int32 port
     72     4  RECONSUMETIMES
     76     8  PREPARED TX OFFSET
     84     4  BODYLENGTH          followed by the body
      .     1  TOPICLENGTH         followed by the UTF-8 topic (at most 127 bytes)
      .     2  PROPERTIESLENGTH    followed by ``k\\x01v\\x02...`` UTF-8 (at most 32767 bytes)

End of a commit-log file: an 8-byte blank marker ``[int32 remaining][int32 BLANK_MAGIC]``; the rest of the
file is unused and readers move to the next file.

Send batch (the body of ``POST /send``; one topic and queue per request, given in the query string), items back
to back::

      0     4  ITEMSIZE            whole item, this field included (34 + body + properties)
      4     4  MAGICCODE           BATCH_MAGIC 0x53504C54 ("SPLT")
      8     4  BODYCRC             as in the record
     12     4  FLAG
     16     4  SYSFLAG
     20     8  BORNTIMESTAMP
     28     4  BODYLENGTH          followed by the body
      .     2  PROPERTIESLENGTH    followed by the properties

Offset msgId (``offsetMsgId``): upper-case hex of ``storeHostIP (4|16) | storePort int32 | commitLogOffset int64``.
The client unique id (``UNIQ_KEY`` property, the ``msg_id`` users see): upper-case hex of
``ip (4) | pid (2) | random (4) | ms since the start of the month (4) | counter (2)`` = 32 characters.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import itertools
import os
import random as _random
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from operator import mul
from typing import NamedTuple, TypeVar

from common.codes import SysFlag
from common.errors import MessageIllegalError, ProtocolViolationError
from common.lazy import LazyFields, read_fields_with
from common.message import Message, MessageExt
from common.properties import (
    DELAY,
    KEYS,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_LENGTH,
    TAGS,
    UNIQ_KEY,
    UNIQ_PAIR,
    decode_properties,
    encode_properties,
    scan_properties,
)

__all__ = [
    "BATCH_ITEM_HEAD",
    "BLANK_MAGIC",
    "CHECK_HEAD_V4",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DISPATCH_HEAD_V4",
    "MAGIC_V1",
    "RECORD_HEAD",
    "BatchItem",
    "DispatchInfo",
    "UniqKeyGenerator",
    "batch_item",
    "body_crc",
    "crc32",
    "create_offset_msg_id",
    "decode_batch",
    "decode_offset_msg_id",
    "decode_records",
    "encode_batch",
    "encode_item",
    "java_hash",
    "pack_host",
    "packed_born_host",
    "parse_dispatch_info",
    "record_size",
    "tags_hash",
    "unpack_host",
    "write_batch_records",
    "write_record",
]

MAGIC_V1 = -626843481  # 0xDAA320A7 as a signed int32
BLANK_MAGIC = -875286124  # 0xCBD43194
BATCH_MAGIC = 0x53504C54
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

#: Fixed part of a record up to and including BODYLENGTH, IPv4 hosts (88 bytes).
RECORD_HEAD = struct.Struct(">iiiiiqqiq4siq4siiqi")
#: TOTALSIZE + MAGICCODE: enough to step over a record or recognise a blank marker.
RECORD_PREFIX = struct.Struct(">ii")
BLANK_MARKER = struct.Struct(">ii")
#: The fields the dispatcher needs from an IPv4 record, in one unpack: TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET,
#: PHYSICALOFFSET, SYSFLAG, STORETIMESTAMP, BODYLENGTH (valid only when SYSFLAG has neither IPv6 bit).
DISPATCH_HEAD_V4 = struct.Struct(">ii4xi4xqqi16xq20xi")
#: What recovery checks in an IPv4 record: TOTALSIZE, MAGICCODE, BODYCRC, PHYSICALOFFSET, SYSFLAG, BODYLENGTH.
CHECK_HEAD_V4 = struct.Struct(">iii16xqi44xi")
#: Batch item header up to and including BODYLENGTH (32 bytes).
BATCH_ITEM_HEAD = struct.Struct(">iiiiiqi")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_Q_OFFSET = struct.Struct(">q")
_MSGID_TAIL = struct.Struct(">iq")
RECORD_FIXED_SIZE = RECORD_HEAD.size + 1 + 2  # 91
BATCH_FIXED_SIZE = BATCH_ITEM_HEAD.size + 2  # 34
#: Records smaller than this are impossible; used to reject garbage sizes early.
MIN_RECORD_SIZE = RECORD_FIXED_SIZE


try:
    # ISA-L's CRC-32 is zlib's to the bit, about 5x faster on 1 KiB bodies (carry-less multiply): every body is
    # checked by the SDK, by the master on a send and by each slave before it appends, so on a small box where
    # client, master and slave share the cores, this checksum is a tenth of a replicated send_batch's CPU.
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel keeps the stdlib's
    _fast_crc32 = zlib.crc32

#: ``zlib.crc32`` (IEEE 802.3, same signature and results), the fastest implementation available.
crc32 = _fast_crc32


def body_crc(body: bytes | memoryview) -> int:
    """CRC32 of a body as RocketMQ stores it (masked to a non-negative int32)."""
    return crc32(body) & 0x7FFFFFFF


# --- Java String.hashCode -------------------------------------------------------------------------------

_POW31: dict[int, tuple[int, ...]] = {}
_MASK32 = 0xFFFFFFFF


def _powers(n: int) -> tuple[int, ...]:
    p = _POW31.get(n)
    if p is None:
        p = tuple(pow(31, n - 1 - i, 1 << 32) for i in range(n))
        if n <= 512:
            _POW31[n] = p
    return p


def java_hash(s: str) -> int:
    """Java's ``String.hashCode()``: signed 32-bit ``h = 31*h + c`` over UTF-16 code units.

    ``java_hash("TagA") == 2598919``; ``java_hash("FooBar#KEY1") == -2081429752``.
    """
    if s.isascii():
        units: bytes | tuple[int, ...] = s.encode("ascii")
    else:
        raw = s.encode("utf-16-be")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    h = sum(map(mul, units, _powers(len(units)))) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


_K = TypeVar("_K")
_V = TypeVar("_V")


def _bounded_memo(compute: Callable[[_K], _V], limit: int) -> Callable[[_K], _V]:
    """``compute`` remembered for the first ``limit`` keys (tags, topics and hosts repeat; a stream of distinct
    ones must not grow memory)."""
    memo: dict[_K, _V] = {}

    def lookup(key: _K) -> _V:
        value = memo.get(key)
        if value is None:
            value = compute(key)
            if len(memo) < limit:
                memo[key] = value
        return value

    return lookup


_tags_code = _bounded_memo(java_hash, 65536)


def tags_hash(tags: str | None) -> int:
    """Consume-queue tag code: ``java_hash(tags)``, 0 without tags (cached: tags repeat)."""
    return _tags_code(tags) if tags else 0


# --- hosts and msgIds ---------------------------------------------------------------------------------


def pack_host(host: str, port: int) -> bytes:
    """``ip`` (4 or 16 bytes) + int32 port, as stored in BORNHOST / STOREHOST."""
    return ipaddress.ip_address(host).packed + _I32.pack(port)


def unpack_host(data: bytes | memoryview) -> str:
    """Inverse of :func:`pack_host`: ``"ip:port"`` (IPv6 in brackets)."""
    ip = ipaddress.ip_address(bytes(data[:-4]))
    port = _I32.unpack_from(data, len(data) - 4)[0]
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


def create_offset_msg_id(store_host: bytes, offset: int) -> str:
    """Broker msgId from a packed store host (:func:`pack_host`) and a commit-log offset.

    ``create_offset_msg_id(pack_host("127.0.0.1", 9103), 123456) == "7F0000010000238F000000000001E240"``.
    """
    return (store_host + _Q_OFFSET.pack(offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """``(store "ip:port", commit-log offset)`` from an offset msgId.

    Raises:
        MessageIllegalError: not 32 (IPv4) or 56 (IPv6) hex characters.
    """
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageIllegalError(f"msgId {msg_id!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise MessageIllegalError(f"msgId {msg_id!r} has {len(msg_id)} characters; expected 32 or 56")
    return unpack_host(raw[:-8]), _Q_OFFSET.unpack_from(raw, len(raw) - 8)[0]


class UniqKeyGenerator:
    """Client unique message ids (``UNIQ_KEY``), sortable within a process and month.

    Args:
        ip: 4 bytes identifying the host (defaults to 127.0.0.1).
        clock_ms: returns the current time in ms (injected in tests).
        rng: random source for the per-process part (injected in tests).
    """

    def __init__(
        self,
        ip: bytes = b"\x7f\x00\x00\x01",
        *,
        clock_ms: Callable[[], int] | None = None,
        rng: _random.Random | None = None,
    ) -> None:
        rng = rng or _random.Random()
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._prefix = (ip[-4:] + struct.pack(">HI", os.getpid() & 0xFFFF, rng.getrandbits(32))).hex().upper()
        self._counter = itertools.count(rng.getrandbits(16))
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._lock = threading.Lock()

    def _roll_month(self, now_ms: int) -> None:
        now = _dt.datetime.fromtimestamp(now_ms / 1000, tz=_dt.UTC)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start + _dt.timedelta(days=32)).replace(day=1)
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next(self) -> str:
        """A new 32-character id."""
        now = self._clock_ms()
        with self._lock:
            if now >= self._next_month_ms or now < self._month_start_ms:
                self._roll_month(now)
            n = next(self._counter) & 0xFFFF
        return f"{self._prefix}{(now - self._month_start_ms) & 0xFFFFFFFF:08X}{n:04X}"

    def next_many(self, count: int) -> list[str]:
        """``count`` new ids, as ``count`` calls of :meth:`next` in one instant (one clock read, one lock)."""
        now = self._clock_ms()
        with self._lock:
            if now >= self._next_month_ms or now < self._month_start_ms:
                self._roll_month(now)
            counts = [next(self._counter) & 0xFFFF for _ in range(count)]
        head = f"{self._prefix}{(now - self._month_start_ms) & 0xFFFFFFFF:08X}"
        return [f"{head}{n:04X}" for n in counts]


# --- send batches (client -> broker) --------------------------------------------------------------------


def _message_properties(msg: Message, uniq_key: str | None, born_ms: int) -> bytes:
    if uniq_key and not msg.properties and not msg.tags and not msg.keys and not msg.delay_level \
            and msg.deliver_at_ms is None and msg.delay_s is None:
        # The common message: only the SDK's UNIQ_KEY (32 hex characters, nothing to check or escape).
        if uniq_key.isascii() and uniq_key.isalnum():
            return UNIQ_PAIR + uniq_key.encode("ascii") + b"\x02"
        return encode_properties({UNIQ_KEY: uniq_key})
    props = dict(msg.properties)
    if msg.tags:
        props[TAGS] = msg.tags
    if msg.keys:
        props[KEYS] = " ".join(msg.keys)
    if msg.delay_level:
        props[DELAY] = str(msg.delay_level)
    elif msg.deliver_at_ms is not None or msg.delay_s is not None:
        timer = msg.timer_property(born_ms)
        if timer is not None:
            props[timer[0]] = timer[1]
    if uniq_key:
        props[UNIQ_KEY] = uniq_key
    return encode_properties(props)


def encode_batch(
    messages: Sequence[Message],
    *,
    born_timestamp_ms: int,
    uniq_keys: Sequence[str | None] | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    sys_flag: int = 0,
) -> bytes:
    """Encode messages as one send body (see the module docstring).

    Args:
        messages: the messages (their topic is carried by the request, not the item).
        born_timestamp_ms: producer clock for every item.
        uniq_keys: a ``UNIQ_KEY`` per message (None entries add none).
        max_message_size: limit on each message's stored record size.
        sys_flag: SYSFLAG of every item (``SysFlag.TRANSACTION_PREPARED`` for a transaction's half message,
            ``SysFlag.IDEMPOTENT`` from an idempotent producer).

    Raises:
        MessageIllegalError: a message would exceed ``max_message_size`` or its properties 32767 bytes.
    """
    parts: list[bytes] = []
    head = BATCH_ITEM_HEAD.pack
    for i, msg in enumerate(messages):
        body = msg.body if type(msg.body) is bytes else bytes(msg.body)
        props = _message_properties(msg, uniq_keys[i] if uniq_keys else None, born_timestamp_ms)
        size = record_size(len(body), len(msg.topic), len(props))
        if size > max_message_size:
            raise MessageIllegalError(
                f"message {i} to topic {msg.topic} is {size} bytes stored, more than maxMessageSize "
                f"{max_message_size}"
            )
        item_size = BATCH_FIXED_SIZE + len(body) + len(props)
        parts.append(head(item_size, BATCH_MAGIC, body_crc(body), msg.flag, sys_flag, born_timestamp_ms, len(body)))
        parts.append(body)
        parts.append(_U16.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def encode_item(msg: Message, *, born_timestamp_ms: int, uniq_key: str | None,
                max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, sys_flag: int = 0) -> bytes:
    """One message as a send-batch item: ``encode_batch([msg], ...)`` without the batch's lists (a producer's
    single send encodes one; items concatenate into a batch body). ``sys_flag`` as in :func:`encode_batch`.

    Raises:
        MessageIllegalError: as :func:`encode_batch`.
    """
    body = msg.body if type(msg.body) is bytes else bytes(msg.body)
    props = _message_properties(msg, uniq_key, born_timestamp_ms)
    size = record_size(len(body), len(msg.topic), len(props))
    if size > max_message_size:
        raise MessageIllegalError(
            f"message 0 to topic {msg.topic} is {size} bytes stored, more than maxMessageSize {max_message_size}"
        )
    return b"".join((
        BATCH_ITEM_HEAD.pack(BATCH_FIXED_SIZE + len(body) + len(props), BATCH_MAGIC, body_crc(body), msg.flag,
                             sys_flag, born_timestamp_ms, len(body)),
        body, _U16.pack(len(props)), props,
    ))


class BatchItem(NamedTuple):
    """One message of a send batch: the body as a view into the request, the raw properties, and the
    well-known properties read once (:func:`common.properties.scan_properties`), so that nothing on
    the send path parses them again. Build one with :func:`decode_batch` or :func:`batch_item`.

    Attributes:
        properties: the raw property string, as stored.
        tags: ``TAGS``, raw UTF-8, ``b""`` when absent (as ``keys`` and ``uniq_key``).
        keys: ``KEYS``, space-separated.
        uniq_key: the SDK's unique message id.
        delay_level: ``DELAY`` as a level (0: not delayed); the store reads it to reroute the message.
        wait: False only when the message says ``WAIT=false``.
    """

    flag: int
    sys_flag: int
    born_timestamp: int
    body_crc: int
    body: memoryview
    properties: bytes | memoryview
    tags: bytes
    keys: bytes
    uniq_key: bytes
    delay_level: int
    wait: bool


_new_tuple = tuple.__new__


def batch_item(body: bytes, properties: bytes, *, flag: int = 0, sys_flag: int = 0,
               born_timestamp: int) -> BatchItem:
    """A batch item built in the broker (a delayed delivery, a send-back copy): its CRC and properties read."""
    return BatchItem(flag, sys_flag, born_timestamp, body_crc(body), memoryview(body), properties,
                     *scan_properties(properties))


def decode_batch(data: bytes | memoryview, *, verify_crc: bool = True) -> list[BatchItem]:
    """Split a send body into items, checking every length, magic and (optionally) body CRC, and reading each
    item's well-known properties in the same pass (the only time the send path reads them).

    Raises:
        MessageIllegalError: empty, truncated or corrupt body; the message names the item and byte position.
    """
    raw = data if type(data) is bytes else bytes(data)
    view = memoryview(raw)
    n = len(view)
    if n == 0:
        raise MessageIllegalError("send body is empty: expected at least one encoded message")
    items: list[BatchItem] = []
    pos = 0
    unpack = BATCH_ITEM_HEAD.unpack_from
    new, scan = _new_tuple, scan_properties
    uniq_pair = UNIQ_PAIR
    uniq_at = len(uniq_pair)
    while pos < n:
        if n - pos < BATCH_FIXED_SIZE:
            raise MessageIllegalError(f"batch item {len(items)} at byte {pos} is truncated ({n - pos} bytes left)")
        size, magic, crc, flag, sys_flag, born, body_len = unpack(view, pos)
        if magic != BATCH_MAGIC:
            raise MessageIllegalError(f"batch item {len(items)} at byte {pos} has bad magic {magic & 0xFFFFFFFF:#x}")
        if size < BATCH_FIXED_SIZE or pos + size > n or body_len < 0 or body_len > size - BATCH_FIXED_SIZE:
            raise MessageIllegalError(
                f"batch item {len(items)} at byte {pos}: size {size} / body length {body_len} do not fit the "
                f"{n}-byte body (truncated?)"
            )
        body_start = pos + BATCH_ITEM_HEAD.size
        props_at = body_start + body_len
        props_len = _U16.unpack_from(view, props_at)[0]
        if BATCH_FIXED_SIZE + body_len + props_len != size:
            raise MessageIllegalError(
                f"batch item {len(items)} at byte {pos}: lengths add up to "
                f"{BATCH_FIXED_SIZE + body_len + props_len}, item size says {size}"
            )
        if props_len > MAX_PROPERTIES_BYTES:
            raise MessageIllegalError(
                f"batch item {len(items)}: properties are {props_len} bytes, more than {MAX_PROPERTIES_BYTES}"
            )
        body = view[body_start:props_at]
        if verify_crc and body_crc(body) != crc:
            raise MessageIllegalError(f"batch item {len(items)} at byte {pos}: body CRC mismatch")
        props = raw[props_at + 2 : pos + size]
        if props.startswith(uniq_pair) and props.find(b"\x02") == props_len - 1:
            # The SDK's plain message, its unique key alone: what scan_properties reads first, without the call.
            items.append(new(BatchItem, (flag, sys_flag, born, crc, body, props, b"", b"", props[uniq_at:-1], 0,
                                         True)))
        else:
            items.append(new(BatchItem, (flag, sys_flag, born, crc, body, props, *scan(props))))
        pos += size
    return items


# --- commit-log records (broker) ------------------------------------------------------------------------


def record_size(body_len: int, topic_len: int, props_len: int) -> int:
    """Stored size of a V1 record with IPv4 hosts."""
    return RECORD_FIXED_SIZE + body_len + topic_len + props_len


def write_record(
    buf: bytearray | memoryview,
    pos: int,
    *,
    topic: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_tx_offset: int,
    body: bytes | memoryview,
    body_crc: int,
    properties: bytes | memoryview,
) -> int:
    """Write one V1 record at ``buf[pos:]`` and return its size. Hosts are :func:`pack_host` values (8 bytes).

    The caller has checked that the record fits (see :func:`record_size`) and that the topic is at most 127
    bytes and the properties at most 32767 bytes.
    """
    body_len = len(body)
    topic_len = len(topic)
    props_len = len(properties)
    size = RECORD_FIXED_SIZE + body_len + topic_len + props_len
    if len(born_host) == 8 and len(store_host) == 8:
        RECORD_HEAD.pack_into(
            buf, pos, size, MAGIC_V1, body_crc, queue_id, flag, queue_offset, physical_offset,
            sys_flag & ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6), born_timestamp, born_host[:4],
            _I32.unpack_from(born_host, 4)[0], store_timestamp, store_host[:4], _I32.unpack_from(store_host, 4)[0],
            reconsume_times, prepared_tx_offset, body_len,
        )
        p = pos + RECORD_HEAD.size
    else:
        return _write_record_v6(
            buf, pos, topic, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
            store_timestamp, store_host, reconsume_times, prepared_tx_offset, body, body_crc, properties,
        )
    buf[p : p + body_len] = body
    p += body_len
    buf[p] = topic_len
    buf[p + 1 : p + 1 + topic_len] = topic
    p += 1 + topic_len
    _U16.pack_into(buf, p, props_len)
    buf[p + 2 : p + 2 + props_len] = properties
    return size


def write_batch_records(
    buf: bytearray | memoryview,
    pos: int,
    file_start_offset: int,
    *,
    topic: bytes,
    queue_id: int,
    first_queue_offset: int,
    items: Sequence[BatchItem],
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int = 0,
) -> list[int]:
    """Write the records of a send batch back to back at ``buf[pos:]`` (the hot path of a put).

    ``file_start_offset + pos`` is the physical offset of the first record. Both hosts must be IPv4 (8 bytes);
    the caller checked that everything fits. Returns the physical offset of each record.
    """
    pack_head = RECORD_HEAD.pack_into
    pack_u16 = _U16.pack_into
    born_ip, born_port = born_host[:4], _I32.unpack_from(born_host, 4)[0]
    store_ip, store_port = store_host[:4], _I32.unpack_from(store_host, 4)[0]
    topic_len = len(topic)
    topic_field = bytes([topic_len]) + topic
    offsets: list[int] = []
    append = offsets.append
    queue_offset = first_queue_offset
    for flag, sys_flag, born_ts, crc, body, props, _tags, _keys, _uniq, _delay, _wait in items:
        body_len = len(body)
        props_len = len(props)
        size = RECORD_FIXED_SIZE + body_len + topic_len + props_len
        phy = file_start_offset + pos
        pack_head(buf, pos, size, MAGIC_V1, crc, queue_id, flag, queue_offset, phy, sys_flag & ~0x30, born_ts,
                  born_ip, born_port, store_timestamp, store_ip, store_port, reconsume_times, 0, body_len)
        p = pos + 88
        buf[p : p + body_len] = body
        p += body_len
        buf[p : p + 1 + topic_len] = topic_field
        p += 1 + topic_len
        pack_u16(buf, p, props_len)
        buf[p + 2 : p + 2 + props_len] = props
        append(phy)
        pos += size
        queue_offset += 1
    return offsets


def _write_record_v6(
    buf: bytearray | memoryview, pos: int, topic: bytes, queue_id: int, flag: int, queue_offset: int,
    physical_offset: int, sys_flag: int, born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
    reconsume_times: int, prepared_tx_offset: int, body: bytes | memoryview, crc: int,
    properties: bytes | memoryview,
) -> int:
    sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    if len(born_host) == 20:
        sys_flag |= SysFlag.BORNHOST_V6
    if len(store_host) == 20:
        sys_flag |= SysFlag.STOREHOST_V6
    parts = [
        struct.pack(">ii", 0, MAGIC_V1),
        struct.pack(">iiiqqiq", crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts),
        born_host,
        struct.pack(">q", store_ts),
        store_host,
        struct.pack(">iqi", reconsume_times, prepared_tx_offset, len(body)),
        bytes(body),
        bytes([len(topic)]),
        topic,
        _U16.pack(len(properties)),
        bytes(properties),
    ]
    rec = b"".join(parts)
    size = len(rec)
    buf[pos : pos + size] = rec
    _I32.pack_into(buf, pos, size)
    return size


class DispatchInfo(NamedTuple):
    """What the dispatcher needs from one record to build consume queues and the index."""

    size: int
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    tags_code: int
    keys: str
    uniq_key: str
    delay_level: int


def _decode_topic(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


_topic_str = _bounded_memo(_decode_topic, 100_000)


def _host_sizes(sys_flag: int) -> tuple[int, int]:
    return (20 if sys_flag & _BORNHOST_V6 else 8), (20 if sys_flag & _STOREHOST_V6 else 8)


# Plain ints: ``int & SysFlag.X`` runs IntFlag's Python-level __rand__ (about 0.5 µs; once per record here).
_BORNHOST_V6 = int(SysFlag.BORNHOST_V6)
_STOREHOST_V6 = int(SysFlag.STOREHOST_V6)


def packed_born_host(record: bytes, sys_flag: int) -> bytes:
    """The BORNHOST field of a stored record (``sys_flag`` its SYSFLAG), packed as :func:`pack_host` packs it."""
    return record[48 : 48 + (20 if sys_flag & _BORNHOST_V6 else 8)]


def _record_layout(buf: bytes | memoryview, pos: int, size: int) -> tuple[int, int, int, int, int]:
    """``(sys_flag, store_ts_pos, body_len_pos, topic_len_pos, props_len_pos)`` of a record; validates lengths."""
    sys_flag = _I32.unpack_from(buf, pos + 36)[0]
    born_len, store_len = _host_sizes(sys_flag)
    store_ts_pos = pos + 48 + born_len
    body_len_pos = store_ts_pos + 8 + store_len + 4 + 8
    body_len = _I32.unpack_from(buf, body_len_pos)[0]
    topic_len_pos = body_len_pos + 4 + body_len
    if body_len < 0 or topic_len_pos + 3 > pos + size:
        raise ProtocolViolationError(f"record at {pos}: body length {body_len} does not fit size {size}")
    topic_len = buf[topic_len_pos]
    props_len_pos = topic_len_pos + 1 + topic_len
    props_len = _U16.unpack_from(buf, props_len_pos)[0]
    if props_len_pos + 2 + props_len != pos + size:
        raise ProtocolViolationError(f"record at {pos}: field lengths do not add up to TOTALSIZE {size}")
    return sys_flag, store_ts_pos, body_len_pos, topic_len_pos, props_len_pos


def record_layout(buf: bytes | memoryview, pos: int, size: int) -> tuple[int, int, int, int, int]:
    """``(sys_flag, store_ts_pos, body_len_pos, topic_len_pos, props_len_pos)`` of any record (IPv4 or IPv6).

    Raises:
        ProtocolViolationError: the record's internal lengths do not add up to ``size``.
    """
    return _record_layout(buf, pos, size)


def parse_dispatch_info(buf: bytes | memoryview, pos: int, size: int) -> DispatchInfo:
    """Read the fields the dispatcher needs from the record at ``buf[pos:pos+size]``.

    Raises:
        ProtocolViolationError: the record's internal lengths are inconsistent.
    """
    sys_flag, store_ts_pos, _body_len_pos, topic_len_pos, props_len_pos = _record_layout(buf, pos, size)
    queue_id = _I32.unpack_from(buf, pos + 12)[0]
    queue_offset, physical_offset = struct.unpack_from(">qq", buf, pos + 20)
    store_ts = _Q_OFFSET.unpack_from(buf, store_ts_pos)[0]
    topic = _topic_str(bytes(buf[topic_len_pos + 1 : props_len_pos]))
    tags, keys, uniq, delay, _ = scan_properties(bytes(buf[props_len_pos + 2 : pos + size]))
    return DispatchInfo(
        size, topic, queue_id, queue_offset, physical_offset, sys_flag, store_ts,
        tags_hash(tags.decode("utf-8", "replace")), keys.decode("utf-8", "replace"),
        uniq.decode("utf-8", "replace"), delay,
    )


def read_record_prefix(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(TOTALSIZE, MAGICCODE)`` at ``pos``."""
    return RECORD_PREFIX.unpack_from(buf, pos)


def decode_records(
    data: bytes | memoryview,
    *,
    broker_name: str = "",
    verify_crc: bool = False,
    offset: int = 0,
) -> list[MessageExt]:
    """Decode back-to-back stored records (a pull response body) into messages.

    Each record's lengths and magic are checked here and its body copied out; its other fields are read from it
    when first used (see :class:`_StoredMessage`), so a consumer that reads only bodies pays for little more.
    Each message holds copies of its own record's bytes; nothing holds a reference to ``data``. ``offset`` is
    where the first record starts (a pull response passes its whole body and the head size, saving a copy).

    Raises:
        ProtocolViolationError: a record is truncated, has a bad magic, or (with ``verify_crc``) a bad body CRC.
    """
    out: list[MessageExt] = []
    if isinstance(data, bytes):
        _decode_run(data, offset, 0, len(data), broker_name, verify_crc, out)
        return out
    # A view (a large answer read where it was received) is copied to bytes a chunk of whole records at a time:
    # slicing bytes costs less than slicing a view and copying each slice (0.80 against 1.06 µs a 1 KiB record).
    view = memoryview(data)
    n = len(view)
    pos = offset
    while pos < n:
        end = min(n, pos + _DECODE_CHUNK)
        if end < n and n - pos >= 4:
            end = min(n, max(end, pos + _I32.unpack_from(view, pos)[0]))  # the first record whole, if it is there
        pos += _decode_run(bytes(view[pos:end]), 0, pos, n, broker_name, verify_crc, out)
    return out


#: Bytes of a view copied to bytes at once by :func:`decode_records` (more when one record is larger).
_DECODE_CHUNK = 64 * 1024


def _decode_run(buf: bytes, pos: int, base: int, total: int, broker_name: str, verify_crc: bool,
                out: list[MessageExt]) -> int:
    """Decode the records of ``buf`` from ``pos`` into ``out``; returns the bytes consumed. ``buf`` is the answer's
    bytes from ``base`` on, of ``total`` in all: unless it holds them all, a record that runs past its end is left
    for the next run instead of refused (errors name positions in the whole answer)."""
    # The hot loop of every consumer: one unpack of the five fields the checks need, three slices.
    start = pos
    n = len(buf)
    final = base + n == total
    append = out.append
    check = _RECORD_CHECK.unpack_from
    u16 = _U16.unpack_from
    new = object.__new__
    stored = _StoredMessage
    set_state = _set_stored_state
    while pos < n:
        if n - pos < RECORD_FIXED_SIZE:
            if not final:
                break
            raise ProtocolViolationError(f"record at byte {base + pos} is truncated ({total - base - pos} bytes left)")
        size, magic, crc, sys_flag, body_len = check(buf, pos)
        if magic != MAGIC_V1:
            raise ProtocolViolationError(f"record at byte {base + pos} has bad magic {magic & 0xFFFFFFFF:#x}")
        if size < RECORD_FIXED_SIZE or pos + size > n:
            if not final and size >= RECORD_FIXED_SIZE and pos > start:
                break
            raise ProtocolViolationError(f"record at byte {base + pos} claims {size} bytes; {total - base - pos} left")
        if sys_flag & _HOST_V6_BITS:
            append(_decode_record_generic(memoryview(buf), pos, size, broker_name))
            pos += size
            continue
        end = pos + size
        topic_at = pos + _BODY_AT + body_len
        if body_len < 0 or topic_at + 3 > end:
            raise ProtocolViolationError(f"record at byte {base + pos}: body length {body_len} exceeds size {size}")
        props_at = topic_at + 1 + buf[topic_at]
        if props_at + 2 > end or props_at + 2 + u16(buf, props_at)[0] != end:
            raise ProtocolViolationError(f"record at byte {base + pos}: field lengths do not add up to {size}")
        head, body, tail = buf[pos : pos + _BODY_AT], buf[pos + _BODY_AT : topic_at], buf[topic_at:end]
        if verify_crc and body_crc(body) != crc:
            phy = _Q_OFFSET.unpack_from(head, 28)[0]
            raise ProtocolViolationError(f"record at byte {base + pos} (offset {phy}): body CRC mismatch")
        m = new(stored)
        set_state(m, (head, body, tail, broker_name))
        append(m)
        pos = end
    return pos - start


#: TOTALSIZE, MAGICCODE, BODYCRC, SYSFLAG and BODYLENGTH of an IPv4 record: what :func:`decode_records` checks.
_RECORD_CHECK = struct.Struct(">iii24xi44xi")
_BODY_AT = 88  # an IPv4 record's body starts here (BODYLENGTH is at 84)


class _StoredMessage(LazyFields, MessageExt):
    """A :class:`MessageExt` that reads its fields from its stored (IPv4) record when they are first used.

    Building all twenty fields of every message (a properties dict, hosts, two ids) cost more than the rest of a
    large pull, and a consumer often reads a few of them. :func:`decode_records` checked the record's lengths, so no
    field read can fail. The body is copied out at once (as before); the record's fixed head and its topic and
    properties are kept beside it, so no byte is held twice, and the properties dict is built once, on first use.
    To every caller it is a MessageExt (:class:`~common.lazy.LazyFields`).
    """

    __slots__ = ("_props", "_state")
    _state: tuple[bytes, bytes, bytes, str]
    """``(head: the 88 fixed bytes, body, tail: topic and properties, broker name)``: a tuple of bytes and a
    str, which the garbage collector stops tracking (a list in it, for the properties, kept every message
    tracked: about a tenth of a large pull's decoding)."""
    _props: dict[str, str]
    """The properties, once built (unset before)."""


_set_stored_state = _StoredMessage._state.__set__  # type: ignore[attr-defined]  # the slot, past the frozen setattr
_set_stored_props = _StoredMessage._props.__set__  # type: ignore[attr-defined]


def _stored_properties(m: _StoredMessage) -> dict[str, str]:
    try:
        return m._props
    except AttributeError:
        tail = m._state[2]
        props_at = 1 + tail[0]
        props = decode_properties(tail[props_at + 2 :]) if props_at + 2 < len(tail) else {}
        _set_stored_props(m, props)
        return props


def _stored_topic(m: _StoredMessage) -> str:
    tail = m._state[2]
    return _topic_str(tail[1 : 1 + tail[0]])


def _stored_keys(m: _StoredMessage) -> tuple[str, ...]:
    keys = _stored_properties(m).get(KEYS)
    return tuple(keys.split()) if keys else ()


def _stored_offset_msg_id(m: _StoredMessage) -> str:
    head = m._state[0]
    return create_offset_msg_id(head[64:72], _Q_OFFSET.unpack_from(head, 28)[0])


def _stored_msg_id(m: _StoredMessage) -> str:
    return _stored_properties(m).get(UNIQ_KEY) or _stored_offset_msg_id(m)


def _int_at(fmt: struct.Struct, at: int) -> Callable[[_StoredMessage], int]:
    read = fmt.unpack_from

    def field(m: _StoredMessage) -> int:
        return int(read(m._state[0], at)[0])

    return field


def _host_at(at: int) -> Callable[[_StoredMessage], str]:
    def field(m: _StoredMessage) -> str:
        return _host_str(m._state[0][at : at + 8])

    return field


_host_str = _bounded_memo(unpack_host, 10_000)


# Each field of MessageExt, read from the record: the attrs slots of the base class stay empty (properties set
# here, where mypy does not see them override the fields).
read_fields_with(_StoredMessage, MessageExt, {
    "topic": _stored_topic,
    "body": lambda m: m._state[1],
    "tags": lambda m: _stored_properties(m).get(TAGS),
    "keys": _stored_keys,
    "properties": _stored_properties,
    "broker_name": lambda m: m._state[3],
    "queue_id": _int_at(_I32, 12),
    "queue_offset": _int_at(_Q_OFFSET, 20),
    "commit_log_offset": _int_at(_Q_OFFSET, 28),
    "msg_id": _stored_msg_id,
    "offset_msg_id": _stored_offset_msg_id,
    "born_timestamp": _int_at(_Q_OFFSET, 40),
    "store_timestamp": _int_at(_Q_OFFSET, 56),
    "born_host": _host_at(48),
    "store_host": _host_at(64),
    "reconsume_times": _int_at(_I32, 72),
    "store_size": _int_at(_I32, 0),
    "flag": _int_at(_I32, 16),
    "sys_flag": _int_at(_I32, 36),
    "body_crc": _int_at(_I32, 8),
}, "the stored record")


_HOST_V6_BITS = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)


def _decode_record_generic(view: memoryview, pos: int, size: int, broker_name: str) -> MessageExt:
    try:
        sys_flag, store_ts_pos, body_len_pos, topic_len_pos, props_len_pos = _record_layout(view, pos, size)
    except ProtocolViolationError:
        raise
    crc, queue_id, flag, queue_offset, phy = struct.unpack_from(">iiiqq", view, pos + 8)
    born_ts = _Q_OFFSET.unpack_from(view, pos + 40)[0]
    born_host = bytes(view[pos + 48 : store_ts_pos])
    store_ts = _Q_OFFSET.unpack_from(view, store_ts_pos)[0]
    store_host = bytes(view[store_ts_pos + 8 : body_len_pos - 12])
    reconsume = _I32.unpack_from(view, body_len_pos - 12)[0]
    body = bytes(view[body_len_pos + 4 : topic_len_pos])
    topic = _topic_str(bytes(view[topic_len_pos + 1 : props_len_pos]))
    props = decode_properties(view[props_len_pos + 2 : pos + size])
    offset_msg_id = create_offset_msg_id(store_host, phy)
    keys = props.get(KEYS)
    return MessageExt(
        topic, body, props.get(TAGS), tuple(keys.split()) if keys else (), props, broker_name, queue_id,
        queue_offset, phy, props.get(UNIQ_KEY) or offset_msg_id, offset_msg_id, born_ts, store_ts,
        unpack_host(born_host), unpack_host(store_host), reconsume, size, flag, sys_flag, crc,
    )


def iter_record_spans(data: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """``(pos, size)`` of each record in back-to-back stored records; stops at a blank marker or garbage."""
    view = memoryview(data)
    pos, n = 0, len(view)
    while n - pos >= 8:
        size, magic = RECORD_PREFIX.unpack_from(view, pos)
        if magic != MAGIC_V1 or size < RECORD_FIXED_SIZE or pos + size > n:
            return
        yield pos, size
        pos += size


def check_topic_bytes(topic: str) -> bytes:
    """UTF-8 topic for a V1 record; raises MessageIllegalError beyond 127 bytes."""
    raw = topic.encode()
    if len(raw) > MAX_TOPIC_LENGTH:
        raise MessageIllegalError(f"topic {topic[:40]!r}... is {len(raw)} bytes, longer than {MAX_TOPIC_LENGTH}")
    return raw
