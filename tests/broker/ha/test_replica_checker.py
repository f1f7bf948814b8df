"""The slave's check of replicated bytes (:mod:`broker.store.records`, docs/BEHAVIOUR.md 7.1), as tables: good
streams split every way, and each kind of bad record, with what may be appended before it."""

from __future__ import annotations

import random
import struct

import pytest

from broker.store.records import (
    BAD,
    BLANK,
    END,
    MORE,
    ZERO,
    RecordViolation,
    ReplicaChecker,
    check_records,
    scan_records,
)
from common.codec import BLANK_MAGIC, body_crc, pack_host, record_size, write_record

FILE = 2048
HOST = pack_host("127.0.0.1", 10911)
MAX = 1024


def record(offset: int, body: bytes, *, topic: bytes = b"T", props: bytes = b"", crc: int | None = None) -> bytes:
    """One good V1 record that sits at physical ``offset`` (``crc`` overrides BODYCRC)."""
    buf = bytearray(record_size(len(body), len(topic), len(props)))
    write_record(buf, 0, topic=topic, queue_id=1, flag=0, queue_offset=7, physical_offset=offset, sys_flag=0,
                 born_timestamp=1, born_host=HOST, store_timestamp=2, store_host=HOST, reconsume_times=0,
                 prepared_tx_offset=0, body=body, body_crc=body_crc(body) if crc is None else crc,
                 properties=props)
    return bytes(buf)


def stream(start: int, sizes: list[int]) -> bytes:
    """Records of the given body sizes from ``start`` on, each file closed with a blank marker and zeros,
    as a master writes them."""
    out = bytearray()
    at = start
    for i, n in enumerate(sizes):
        rec = record(at, bytes([i & 0xFF]) * n)
        room = FILE - at % FILE
        if len(rec) + 8 > room:
            out += struct.pack(">ii", room, BLANK_MAGIC) + bytes(room - 8)
            at += room
            rec = record(at, bytes([i & 0xFF]) * n)
        out += rec
        at += len(rec)
    return bytes(out)


def feed_all(checker: ReplicaChecker, pieces: list[bytes]) -> bytes:
    out: list[memoryview | bytes] = []
    for piece in pieces:
        checker.feed(piece, out)
        assert checker.held <= MAX, checker.held  # never more than one record held
    return b"".join(out)


def record_ends(data: bytes) -> list[int]:
    """Every offset where a record (or a file) ends in ``data``, relative to ``data``."""
    ends, pos = [0], 0
    while pos < len(data):
        pos += struct.unpack_from(">i", data, pos)[0]
        ends.append(pos)
    return ends


# -- good streams -----------------------------------------------------------------------------------------------
SIZES = [10, 300, 0, 700, 50, 900, 5, 400, 400, 400, 120]


@pytest.mark.parametrize("start", [0, FILE, 3 * FILE])
def test_a_good_stream_in_one_piece_passes_whole(start: int) -> None:
    data = stream(start, SIZES)
    assert len(data) > 2 * FILE  # crosses files: blank markers and their zero tails pass too
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(start)
    assert feed_all(checker, [data]) == data
    assert checker.held == 0 and checker.next_offset == start + len(data)


def test_every_split_in_two_passes_whole_records_and_holds_the_rest() -> None:
    data = stream(FILE, SIZES[:6])  # the last record goes to the next file, after a blank marker
    ends = record_ends(data)
    for cut in range(len(data) + 1):
        checker = ReplicaChecker(FILE, MAX)
        checker.reset(FILE)
        out: list[memoryview | bytes] = []
        checker.feed(data[:cut], out)
        first = b"".join(out)
        # Whole records pass (and a file's zero tail after its marker, byte by byte); the start of a split
        # record is held, not passed.
        assert max(e for e in ends if e <= cut) <= len(first) <= cut, cut
        assert first == data[: len(first)] and checker.held == cut - len(first), cut
        assert checker.next_offset == FILE + cut
        checker.feed(data[cut:], out)
        assert b"".join(out) == data, cut
        assert checker.held == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_pass_the_stream_unchanged(seed: int) -> None:
    rnd = random.Random(seed)
    data = stream(0, [rnd.randrange(0, 900) for _ in range(30)])
    cuts = sorted(rnd.sample(range(1, len(data)), 25))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(0)
    assert feed_all(checker, pieces) == data, f"seed {seed}"


# -- bad records ------------------------------------------------------------------------------------------------
def corrupt(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


GOOD = record(FILE, b"a" * 100)
SECOND = FILE + len(GOOD)

BAD_CASES = [
    ("garbage", GOOD + random.Random(1).randbytes(1000), SECOND, "TOTALSIZE|MAGICCODE"),
    ("zeros", GOOD + bytes(200), SECOND, "zeros"),
    ("wrong magic", GOOD + corrupt(record(SECOND, b"b" * 50), 4, b"\x12\x34\x56\x78"), SECOND, "MAGICCODE 0x12345678"),
    ("size below the minimum", GOOD + corrupt(record(SECOND, b"b"), 0, struct.pack(">i", 90)), SECOND, "TOTALSIZE 90"),
    ("size past max_size", GOOD + record(SECOND, b"b" * (MAX + 10)), SECOND, f"TOTALSIZE {MAX + 10 + 92}"),
    ("size past the file", GOOD + corrupt(record(SECOND, b"b"), 0, struct.pack(">i", FILE)), SECOND, "TOTALSIZE"),
    ("lengths do not add up", GOOD + corrupt(record(SECOND, b"b" * 50), 0, struct.pack(">i", 141)), SECOND,
     "add up"),
    ("body length too big", GOOD + corrupt(record(SECOND, b"b" * 50), 84, struct.pack(">i", 500)), SECOND,
     "BODYLENGTH 500"),
    ("bad crc", GOOD + record(SECOND, b"b" * 50, crc=12345), SECOND, "BODYCRC"),
    ("body changed", GOOD + corrupt(record(SECOND, b"b" * 50), 90, b"X"), SECOND, "BODYCRC"),
    ("right bytes, wrong offset", GOOD + record(SECOND + 8, b"b" * 50), SECOND, f"PHYSICALOFFSET {SECOND + 8}"),
    ("blank marker not at the end", GOOD + struct.pack(">ii", 100, BLANK_MAGIC) + bytes(92), SECOND,
     "blank marker says 100"),
]


@pytest.mark.parametrize(("data", "bad_at", "reason"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_a_bad_record_is_refused_and_only_the_good_ones_before_it_pass(
    data: bytes, bad_at: int, reason: str, split: str
) -> None:
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(FILE)
    out: list[memoryview | bytes] = []
    pieces = [data] if split == "whole" else [data[i : i + 1] for i in range(len(data))]
    with pytest.raises(RecordViolation, match=reason) as info:
        for piece in pieces:
            checker.feed(piece, out)
    assert info.value.offset == bad_at
    assert f"physical offset {bad_at}" in str(info.value)
    assert b"".join(out) == data[: bad_at - FILE]  # the good record, nothing of the bad one


def test_a_blank_marker_at_the_end_of_the_file_closes_it_and_the_next_file_follows() -> None:
    room = FILE - len(GOOD)
    data = GOOD + struct.pack(">ii", room, BLANK_MAGIC) + bytes(room - 8) + record(2 * FILE, b"next")
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(FILE)
    assert feed_all(checker, [data[:50], data[50 : len(GOOD) + 4], data[len(GOOD) + 4 : 1500], data[1500:]]) == data


def test_a_file_that_ends_without_a_blank_marker_is_refused() -> None:
    """Records that leave fewer than 8 bytes at the end of a file: recovery would stop there and drop later files."""
    rec = record(FILE, b"z" * (FILE - 92 - 4))  # ends 4 bytes before the file end
    checker = ReplicaChecker(FILE, 4 * FILE)
    checker.reset(FILE)
    with pytest.raises(RecordViolation, match="TOTALSIZE"):
        checker.feed(rec + bytes(4) + record(2 * FILE, b"n"), [])


def test_a_huge_totalsize_is_refused_on_its_first_8_bytes_without_holding_the_rest() -> None:
    checker = ReplicaChecker(1 << 30, MAX)
    checker.reset(0)
    out: list[memoryview | bytes] = []
    checker.feed(struct.pack(">i", 1 << 29)[:3], out)  # a split prefix is held ...
    assert checker.held == 3
    with pytest.raises(RecordViolation, match=f"TOTALSIZE {1 << 29}"):
        checker.feed(struct.pack(">i", 1 << 29)[3:] + GOOD[4:] + bytes(10_000), out)  # ... the size is refused
    assert out == []


def test_an_empty_body_and_reset_forget_held_bytes() -> None:
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(FILE)
    out: list[memoryview | bytes] = []
    checker.feed(GOOD[:40], out)
    checker.feed(b"", out)
    assert checker.held == 40 and checker.next_offset == FILE + 40 and out == []
    checker.reset(FILE)
    assert checker.held == 0 and checker.next_offset == FILE
    checker.feed(GOOD, out)
    assert b"".join(out) == GOOD


def test_constructor_refuses_a_file_too_small() -> None:
    with pytest.raises(ValueError, match="too small"):
        ReplicaChecker(16, MAX)


# -- the same walk for recovery ---------------------------------------------------------------------------------
def whole_file(content: bytes) -> memoryview:
    return memoryview(content + bytes(FILE - len(content)))


@pytest.mark.parametrize(
    ("content", "outcome", "at"),
    [
        (GOOD, ZERO, len(GOOD)),
        (GOOD + struct.pack(">ii", FILE - len(GOOD), BLANK_MAGIC), BLANK, len(GOOD)),
        (GOOD + struct.pack(">ii", 8, BLANK_MAGIC), BAD, len(GOOD)),
        (GOOD + record(SECOND, b"b", crc=1), BAD, len(GOOD)),
        (GOOD + b"\x01" * 20, BAD, len(GOOD)),
    ],
    ids=["zeros end the data", "blank at the end", "blank too short", "bad crc", "garbage"],
)
def test_recovery_scan_outcomes(content: bytes, outcome: str, at: int) -> None:
    assert scan_records(whole_file(content), FILE, 0, FILE, True) == (at, outcome)


def test_recovery_scan_without_crc_takes_a_bad_crc() -> None:
    content = GOOD + record(SECOND, b"b", crc=1)
    assert scan_records(whole_file(content), FILE, 0, FILE, False) == (len(content), ZERO)


def test_check_records_says_more_for_a_record_not_yet_complete_and_end_at_the_end_of_the_file() -> None:
    data = memoryview(GOOD + GOOD[:30])
    assert check_records(data, FILE, 0, len(data), FILE, True, MAX) == (len(GOOD), MORE)
    tail = memoryview(bytes(4))
    assert check_records(tail, FILE - 4, 0, 4, 4, True, MAX) == (0, END)


def test_ipv6_host_records_pass_and_are_checked_too() -> None:
    host6 = pack_host("::1", 10911)
    assert len(host6) == 20

    def rec6(offset: int, body: bytes, crc: int | None = None) -> bytes:
        buf = bytearray(record_size(len(body), 1, 0) + 24)
        size = write_record(buf, 0, topic=b"T", queue_id=1, flag=0, queue_offset=0, physical_offset=offset,
                            sys_flag=0, born_timestamp=1, born_host=host6, store_timestamp=2, store_host=host6,
                            reconsume_times=0, prepared_tx_offset=0, body=body,
                            body_crc=body_crc(body) if crc is None else crc, properties=b"")
        return bytes(buf[:size])

    first = rec6(FILE, b"six")
    data = first + GOOD.replace(struct.pack(">q", FILE), struct.pack(">q", FILE + len(first)), 1)
    checker = ReplicaChecker(FILE, MAX)
    checker.reset(FILE)
    assert feed_all(checker, [data[:7], data[7:]]) == data
    checker.reset(FILE)
    with pytest.raises(RecordViolation, match="BODYCRC"):
        checker.feed(rec6(FILE, b"six", crc=5), [])
