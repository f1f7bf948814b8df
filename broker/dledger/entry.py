"""The DLedger entry and index formats (docs/BEHAVIOUR.md 9.6): the one module that owns these bytes.

Data entry, big-endian, body at ``BODY_OFFSET`` (48)::

     0  4  MAGIC        int32   1 (a blank tail marker has BLANK_MAGIC instead, as in the commit log)
     4  4  SIZE         int32   48 + body length: the whole entry
     8  8  INDEX        int64   the entry's index in the log, from 0
    16  8  TERM         int64   the leader's term when it was appended
    24  8  POS          int64   the entry's position in the data files
    32  4  CHANNEL      int32   0
    36  4  CHAIN_CRC    int32   0 (unused)
    40  4  BODY_CRC     int32   zlib.crc32 of the body
    44  4  BODY_LENGTH  int32
    48     BODY                 the RocketMQ record of docs/BEHAVIOUR.md 7.1 (its PHYSICALOFFSET is POS + 48)

Index unit, 32 bytes, entry ``i``'s at byte ``i * 32`` of the index files::

     0  4  MAGIC  int32
     4  8  POS    int64
    12  4  SIZE   int32
    16  8  INDEX  int64
    24  8  TERM   int64

A batch of bodies of ``128 * (i + 1)`` bytes appended from position 0 puts entry ``i`` at
``48 * i + 128 * i * (i + 1) / 2``.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple, TypeAlias

from common.codec import crc32

__all__ = [
    "BLANK_MAGIC",
    "BODY_OFFSET",
    "ENTRY_HEADER",
    "ENTRY_MAGIC",
    "INDEX_UNIT",
    "INDEX_UNIT_SIZE",
    "EntryHeader",
    "IndexUnit",
    "ReadBuffer",
    "WriteBuffer",
    "check_entry",
    "entry_size",
    "read_entry_header",
    "read_index_unit",
    "seal_entry",
    "write_entry",
    "write_index_unit",
]

#: What entries are read from and written into (files are read through their maps).
ReadBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WriteBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

ENTRY_MAGIC = 1
BLANK_MAGIC = -1
ENTRY_HEADER = struct.Struct(">iiqqqiiii")
BODY_OFFSET = ENTRY_HEADER.size  # 48
INDEX_UNIT = struct.Struct(">iqiqq")
INDEX_UNIT_SIZE = INDEX_UNIT.size  # 32


class EntryHeader(NamedTuple):
    magic: int
    size: int
    entry_index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_length: int


class IndexUnit(NamedTuple):
    magic: int
    pos: int
    size: int
    entry_index: int
    term: int


def entry_size(body_length: int) -> int:
    return BODY_OFFSET + body_length


def write_entry(buf: WriteBuffer, at: int, *, index: int, term: int, pos: int,
                body: bytes | bytearray | memoryview) -> int:
    """Write one entry at ``buf[at:]``; returns its size."""
    n = len(body)
    buf[at + BODY_OFFSET : at + BODY_OFFSET + n] = body
    return seal_entry(buf, at, index=index, term=term, pos=pos, body_length=n)


def seal_entry(buf: WriteBuffer, at: int, *, index: int, term: int, pos: int, body_length: int) -> int:
    """Write the header of an entry whose body is already at ``buf[at + 48:]`` (its CRC is computed here);
    returns the entry's size."""
    body = memoryview(buf)[at + BODY_OFFSET : at + BODY_OFFSET + body_length]
    ENTRY_HEADER.pack_into(buf, at, ENTRY_MAGIC, BODY_OFFSET + body_length, index, term, pos, 0, 0,
                           crc32(body) & 0x7FFFFFFF, body_length)
    body.release()
    return BODY_OFFSET + body_length


def read_entry_header(buf: ReadBuffer, at: int) -> EntryHeader:
    return EntryHeader._make(ENTRY_HEADER.unpack_from(buf, at))


def check_entry(buf: ReadBuffer, at: int, *, end: int, pos: int | None = None,
                index: int | None = None, max_size: int = 1 << 31) -> str | None:
    """Why the entry at ``buf[at:]`` is not a good entry (None when it is): a whole entry before ``end``, the
    right magic, sizes that agree, the body's CRC, and (when given) the expected position and index. Bytes from a
    peer or a disk go through this before they are trusted."""
    if at + BODY_OFFSET > end:
        return f"{end - at} bytes left, fewer than an entry header ({BODY_OFFSET})"
    h = read_entry_header(buf, at)
    if h.magic != ENTRY_MAGIC:
        return f"magic {h.magic} is not {ENTRY_MAGIC}"
    if h.body_length < 0 or h.size != BODY_OFFSET + h.body_length or h.size > max_size:
        return f"size {h.size} does not match body length {h.body_length} (+{BODY_OFFSET}, at most {max_size})"
    if at + h.size > end:
        return f"entry of {h.size} bytes runs past the {end - at} bytes present"
    if pos is not None and h.pos != pos:
        return f"entry says position {h.pos}, it sits at {pos}"
    if index is not None and h.entry_index != index:
        return f"entry has index {h.entry_index}, expected {index}"
    body = memoryview(buf)[at + BODY_OFFSET : at + h.size]
    if crc32(body) & 0x7FFFFFFF != h.body_crc:
        return "body CRC does not match"
    return None


def write_index_unit(buf: WriteBuffer, at: int, *, pos: int, size: int, index: int, term: int) -> None:
    INDEX_UNIT.pack_into(buf, at, ENTRY_MAGIC, pos, size, index, term)


def read_index_unit(buf: ReadBuffer, at: int) -> IndexUnit:
    return IndexUnit._make(INDEX_UNIT.unpack_from(buf, at))
