"""The DLedger entry and index formats (docs/BEHAVIOUR.md 9.6): layout, the batch example, and every check."""

from __future__ import annotations

import struct

import pytest

from broker.dledger.entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    check_entry,
    entry_size,
    read_entry_header,
    read_index_unit,
    write_entry,
    write_index_unit,
)


def test_layout() -> None:
    assert (BODY_OFFSET, INDEX_UNIT_SIZE) == (48, 32)
    buf = bytearray(100)
    n = write_entry(buf, 0, index=7, term=3, pos=4096, body=b"hello")
    assert n == entry_size(5) == 53
    magic, size, index, term, pos, channel, chain, crc, blen = struct.unpack_from(">iiqqqiiii", buf)
    assert (magic, size, index, term, pos, channel, chain, blen) == (1, 53, 7, 3, 4096, 0, 0, 5)
    assert bytes(buf[48:53]) == b"hello"
    assert read_entry_header(buf, 0).body_crc == crc
    assert check_entry(buf, 0, end=n, pos=4096, index=7) is None


def test_batch_positions_follow_the_spec_example() -> None:
    buf = bytearray(8192)
    at = 0
    starts = []
    for i in range(6):
        starts.append(at)
        at += write_entry(buf, at, index=i, term=1, pos=at, body=bytes(128 * (i + 1)))
    assert starts == [48 * i + 128 * i * (i + 1) // 2 for i in range(6)]


def test_index_unit() -> None:
    buf = bytearray(64)
    write_index_unit(buf, 32, pos=999, size=53, index=1, term=2)
    assert read_index_unit(buf, 32) == (1, 999, 53, 1, 2)


def good() -> bytearray:
    buf = bytearray(80)
    write_entry(buf, 0, index=2, term=1, pos=100, body=b"x" * 20)
    return buf


@pytest.mark.parametrize(
    ("mutate", "kw", "reason"),
    [
        (lambda b: b, {"end": 40}, "fewer than an entry header"),
        (lambda b: b.__setitem__(slice(0, 4), struct.pack(">i", 7)), {}, "magic 7 is not 1"),
        (lambda b: b.__setitem__(slice(4, 8), struct.pack(">i", 69)), {}, "does not match body length 20"),
        (lambda b: b.__setitem__(slice(44, 48), struct.pack(">i", -5)), {}, "does not match body length -5"),
        (lambda b: b, {"end": 60}, "runs past the 60 bytes present"),
        (lambda b: b, {"pos": 101}, "entry says position 100, it sits at 101"),
        (lambda b: b, {"index": 3}, "entry has index 2, expected 3"),
        (lambda b: b.__setitem__(50, 0x79), {}, "body CRC does not match"),
        (lambda b: b, {"max_size": 60}, "at most 60"),
    ],
)
def test_bad_entries_are_named(mutate, kw, reason: str) -> None:  # type: ignore[no-untyped-def]
    buf = good()
    mutate(buf)
    args = {"end": 80, **kw}
    got = check_entry(buf, 0, **args)
    assert got is not None and reason in got, got
