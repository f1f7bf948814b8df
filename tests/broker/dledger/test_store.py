"""The DLedger log on disk: leader and follower place every entry at the same position (byte-identical files),
blank tails, reads, the committed-index rules, truncation of a divergent tail and reset, recovery of a torn tail
after a crash, the persisted term and vote, and a full disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.chaos.faulty_io import FaultyIO
from broker.dledger.entry import BODY_OFFSET, read_entry_header
from broker.dledger.store import DLedgerStore, EntryRefused
from broker.store.io import FileIO

DATA = 1024
INDEX = 32 * 16


def store(root: Path, name: str = "n0", io: FileIO | None = None, *, preallocate: bool = False) -> DLedgerStore:
    s = DLedgerStore(io or FileIO(), str(root / f"dledger-{name}"), data_file_size=DATA, index_file_size=INDEX,
                     preallocate=preallocate)
    s.load()
    return s


def body(i: int, n: int = 100) -> bytes:
    return bytes([i % 251]) * n


def data_files(s: DLedgerStore) -> dict[str, bytes]:
    d = Path(s.directory) / "data"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_leader_appends_roll_files_with_a_blank_tail_and_reads_back(tmp_path: Path) -> None:
    s = store(tmp_path)
    places = [s.append_as_leader(1, body(i)) for i in range(30)]  # 148 bytes each: 6 per 1 KiB file
    assert [i for i, _ in places] == list(range(30))
    assert places[6][1] == DATA  # the 7th entry does not fit the first file's rest: next file
    assert len(s.data.files) == 5
    first = s.data.files[0].mm
    assert int.from_bytes(first[6 * 148 : 6 * 148 + 4], "big") == DATA - 6 * 148  # blank marker: bytes left
    for i, (index, pos) in enumerate(places):
        e = s.get(index)
        assert e is not None and e[BODY_OFFSET:] == body(i)
        assert read_entry_header(e, 0).pos == pos
    assert (s.begin_index, s.end_index, s.end_term) == (0, 29, 1)
    assert s.get(30) is None and s.get(-1) is None


def test_a_built_body_sees_its_position_before_the_crc(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.append_as_leader(1, body(0))

    def build(buf: bytearray, at: int, phys: int) -> None:
        buf[at : at + len(body(1))] = body(1)
        buf[at : at + 8] = phys.to_bytes(8, "big")

    index, pos = s.append_built(1, len(body(1)), build)
    e = s.get(index)
    assert e is not None and int.from_bytes(e[BODY_OFFSET : BODY_OFFSET + 8], "big") == pos + BODY_OFFSET
    f = store(tmp_path, "n1")  # the stamped entry passes a follower's check
    f.append_as_follower(s.get(0))  # type: ignore[arg-type]
    f.append_as_follower(e)


def test_the_flush_covers_what_was_written_and_nothing_past_the_end(tmp_path: Path) -> None:
    s = store(tmp_path)
    for i in range(12):
        s.append_as_leader(1, body(i))
    assert s.data.max_offset == s.end_pos  # the chain's written end is the log's
    assert s.flush() == s.end_pos
    s.truncate(s.get(5))  # type: ignore[arg-type]
    assert s.data.max_offset == s.end_pos == s.end_of(5)
    assert s.data.flushed_where <= s.end_pos


def test_a_follower_places_every_entry_where_the_leader_did(tmp_path: Path) -> None:
    leader, follower = store(tmp_path, "n0"), store(tmp_path, "n1")
    for i in range(40):
        leader.append_as_leader(2, body(i, 50 + 7 * i % 90))
    for i in range(40):
        assert follower.append_as_follower(leader.get(i)) == i  # type: ignore[arg-type]
    leader.flush()
    follower.flush()
    assert data_files(leader) == data_files(follower)


@pytest.mark.parametrize("which", ["skip", "repeat"])
def test_a_follower_refuses_an_entry_that_does_not_continue_its_log(tmp_path: Path, which: str) -> None:
    leader, follower = store(tmp_path, "n0"), store(tmp_path, "n1")
    for i in range(3):
        leader.append_as_leader(1, body(i))
    follower.append_as_follower(leader.get(0))  # type: ignore[arg-type]
    with pytest.raises(EntryRefused, match="expected 1"):
        follower.append_as_follower(leader.get(2 if which == "skip" else 0))  # type: ignore[arg-type]


def test_preallocated_data_files_hold_the_same_log_through_truncation_reset_and_recovery(tmp_path: Path) -> None:
    """With ``preallocate`` (the broker's default) the next data file is made and faulted in ahead by a thread;
    truncation, reset and recovery must not trip over it."""
    leader = store(tmp_path, "n0", preallocate=True)
    follower = store(tmp_path, "n1", preallocate=True)
    for i in range(20):
        leader.append_as_leader(1, body(i))
        follower.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    assert leader.data.wait_prepared(10) and leader.data._prepared is not None  # the file after the last one
    for i in range(20, 40):  # the follower, once a leader, appended entries nobody acknowledged: 3 more files
        follower.append_as_leader(2, body(100 + i))
    for i in range(20, 26):
        leader.append_as_leader(3, body(i))
    assert follower.truncate(leader.get(9)) == 9  # type: ignore[arg-type]
    for i in range(10, 26):
        follower.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    reset = store(tmp_path, "n2", preallocate=True)
    for i in range(12):
        reset.append_as_leader(4, body(200 + i))
    assert reset.truncate(leader.get(20)) == 20  # type: ignore[arg-type]
    for i in range(21, 26):
        reset.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    entries = [leader.get(i) for i in range(26)]
    for s in (leader, follower, reset):
        s.flush()
        s.close()
    for name in ("n0", "n1", "n2"):
        again = store(tmp_path, name, preallocate=True)
        assert again.end_index == 25 and all(again.get(i) == entries[i] for i in range(again.begin_index, 26))
        assert again.append_as_leader(5, body(99))[0] == 26
        again.close()


def test_a_follower_refuses_a_corrupt_entry(tmp_path: Path) -> None:
    leader, follower = store(tmp_path, "n0"), store(tmp_path, "n1")
    leader.append_as_leader(1, body(0))
    e = bytearray(leader.get(0))  # type: ignore[arg-type]
    e[-1] ^= 0xFF
    with pytest.raises(EntryRefused, match="CRC"):
        follower.append_as_follower(e)
    assert follower.end_index == -1


def test_committed_index_rules(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert not s.update_committed(1, 3, 1)  # an empty log
    for i in range(5):
        s.append_as_leader(1, body(i))
    assert not s.update_committed(1, -1, 1)
    assert not s.update_committed(0, 3, 1)  # an old term
    assert s.update_committed(1, 3, 1) and s.committed_index == 3
    assert s.committed_pos == s.unit(3)[0] + s.unit(3)[1]  # type: ignore[index]
    assert not s.update_committed(1, 2, 1)  # never backwards
    assert s.update_committed(1, 99, 1) and s.committed_index == 4  # capped at the end


def test_truncate_cuts_the_divergent_tail(tmp_path: Path) -> None:
    leader, follower = store(tmp_path, "n0"), store(tmp_path, "n1")
    for i in range(10):
        leader.append_as_leader(1, body(i))
        follower.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    for i in range(10, 14):  # the follower, once a leader, appended entries nobody acknowledged
        follower.append_as_leader(2, body(100 + i))
    for i in range(10, 16):
        leader.append_as_leader(3, body(i))
    assert follower.truncate(leader.get(9)) == 9  # type: ignore[arg-type]
    assert (follower.end_index, follower.get(10)) == (9, None)
    for i in range(10, 16):
        follower.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    leader.flush()
    follower.flush()
    assert data_files(leader) == data_files(follower)


def test_truncate_never_removes_committed_entries(tmp_path: Path) -> None:
    s = store(tmp_path)
    for i in range(5):
        s.append_as_leader(1, body(i))
    s.update_committed(1, 4, 1)
    with pytest.raises(ValueError, match="committed"):
        s.truncate(s.get(2))  # type: ignore[arg-type]


def test_truncate_resets_a_follower_that_does_not_reach_the_entry(tmp_path: Path) -> None:
    leader, follower = store(tmp_path, "n0"), store(tmp_path, "n1")
    for i in range(20):
        leader.append_as_leader(1, body(i))
    assert follower.truncate(leader.get(12)) == 12  # type: ignore[arg-type]
    assert (follower.begin_index, follower.end_index) == (12, 12)
    for i in range(13, 20):
        follower.append_as_follower(leader.get(i))  # type: ignore[arg-type]
    for i in range(12, 20):
        assert follower.get(i) == leader.get(i)


def test_recovery_cuts_a_torn_tail_and_keeps_the_committed_index(tmp_path: Path) -> None:
    s = store(tmp_path)
    for i in range(20):
        s.append_as_leader(4, body(i))
    s.update_committed(4, 15, 4)
    s.write_checkpoint()
    s.flush()
    last = s.unit(19)
    assert last is not None
    mf = s.data.file_for(last[0])
    assert mf is not None
    mf.mm[last[0] - mf.start + BODY_OFFSET + 10] ^= 0xFF  # entry 19 torn: its CRC fails
    s.close()
    again = store(tmp_path)
    assert (again.begin_index, again.end_index, again.end_term, again.committed_index) == (0, 18, 4, 15)
    assert again.get(19) is None
    assert again.append_as_leader(5, body(99)) == (19, last[0])  # the next entry takes the torn one's place


def test_recovery_of_an_empty_or_missing_log(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert (s.begin_index, s.end_index, s.committed_index) == (-1, -1, -1)
    s.close()
    assert store(tmp_path).end_index == -1


def test_term_and_vote_survive_a_restart(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.load_term() == (0, None)
    s.persist_term(7, "n2")
    assert store(tmp_path).load_term() == (7, "n2")
    s.persist_term(8, None)
    assert store(tmp_path).load_term() == (8, None)


def test_a_full_disk_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    io = FaultyIO()
    s = store(tmp_path, io=io)
    for i in range(6):
        s.append_as_leader(1, body(i))
    files = sorted(os.listdir(os.path.join(s.directory, "data")))
    io.enospc_on_allocate = True
    with pytest.raises(OSError):
        s.append_as_leader(1, body(6))  # needs the next data file
    assert s.end_index == 5
    assert sorted(os.listdir(os.path.join(s.directory, "data"))) == files  # no half-created file left behind
    io.enospc_on_allocate = False
    assert s.append_as_leader(1, body(6))[0] == 6
    assert (s.get(6) or b"")[BODY_OFFSET:] == body(6)
