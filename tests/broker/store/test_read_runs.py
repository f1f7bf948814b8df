"""``get_message`` copies each run of records contiguous in one commit-log file out of its map in one piece: which
records share a run, and that the bytes, counts, offsets and statuses are those of reading each record on its own."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import pytest

from broker.store import reader
from broker.store.api import GetMessageResult
from broker.store.api import GetMessageStatus as S
from broker.store.file_store import FileMessageStore
from common.codec import decode_records, record_size, tags_hash

from .conftest import BORN_HOST, StoreFactory, batch

#: Room for every read below: the in-memory caps are set per row where a row is about them.
WIDE = dict(max_transfer_count_on_message_in_memory=1000, max_transfer_bytes_on_message_in_memory=1 << 30,
            mapped_file_size_consume_queue=2000 * 20)


def _append(store: FileMessageStore, appends: list[tuple[int, int, str]]) -> None:
    """Each ``(queue_id, count, tags)`` is one batch of topic T (its records back to back in the log)."""
    done = [0, 0]
    for queue_id, n, tags in appends:
        store.append_batch("T", queue_id, batch("T", n, tags=tags, start=done[queue_id]), born_host=BORN_HOST)
        done[queue_id] += n
    store.dispatch_available(1 << 30)


@pytest.fixture
def runs_of_last_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[int]]]:
    """The queue offsets of the records in each run the last read copied out."""
    seen: list[list[int]] = []
    copy_out = reader._copy_out

    def spy(runs: list[tuple[mmap.mmap, int, int]]) -> bytes:
        seen[:] = [[m.queue_offset for m in decode_records(mm[start:end])] for mm, start, end in runs]
        return copy_out(runs)

    monkeypatch.setattr(reader, "_copy_out", spy)
    yield seen


def _check_exact(store: FileMessageStore, r: GetMessageResult, queue_id: int = 0) -> None:
    """Bytes, records, count and size are those of the records read one by one at their units."""
    cq = store.cqs.get("T", queue_id)
    assert cq is not None
    units = [cq.unit(q) for q in r.queue_offsets]
    one_by_one = [store.look_message_by_offset(u[0], u[1]) for u in units if u is not None]
    assert r.records == one_by_one
    assert r.data == b"".join(one_by_one)  # type: ignore[arg-type]
    assert (r.msg_count, r.total_size) == (len(one_by_one), sum(u[1] for u in units if u is not None))


A = tags_hash("A")
_ITEM = batch("T", 1, tags="A")[0]
#: Bytes of each of the first ten records of a queue in these tests (keys k0 to k9; k10 on is a byte longer).
SIZE = record_size(len(_ITEM.body), 1, len(_ITEM.properties))


@pytest.mark.parametrize(
    ("appends", "offset", "max_nums", "max_records_bytes", "only_a", "config", "runs", "next_offset"),
    [
        pytest.param([(0, 10, "A")], 0, 32, None, False, {}, [list(range(10))], 10, id="one batch, one buffer"),
        pytest.param([(0, 4, "A"), (0, 4, "A")], 0, 32, None, False, {}, [list(range(8))], 8,
                     id="batches of one queue back to back"),
        pytest.param([(0, 3, "A"), (1, 2, "A"), (0, 3, "A"), (1, 1, "A"), (0, 2, "A")], 0, 32, None, False, {},
                     [[0, 1, 2], [3, 4, 5], [6, 7]], 8, id="another queue's records end a run"),
        pytest.param([(0, 10, "A")], 4, 32, None, False, {}, [list(range(4, 10))], 10, id="a read from mid-run"),
        pytest.param([(0, 2, "A"), (0, 1, "B"), (0, 3, "A"), (0, 1, "B")], 0, 32, None, True, {},
                     [[0, 1], [3, 4, 5]], 7, id="a tag filter drops a record in mid-run"),
        pytest.param([(0, 10, "A")], 0, 4, None, False, {}, [[0, 1, 2, 3]], 4, id="maxMsgNums lands mid-run"),
        pytest.param([(0, 10, "A")], 0, 32, 3, False, {}, [[0, 1, 2]], 3, id="max bytes land mid-run"),
        pytest.param([(0, 40, "A")], 0, 64, None, False, {"max_transfer_count_on_message_in_memory": 32},
                     [list(range(32))], 32, id="maxTransferCountOnMessageInMemory lands mid-run"),
        pytest.param([(0, 40, "A")], 0, 64, None, False, {"total_physical_memory_bytes": 1000},
                     [list(range(8))], 8, id="maxTransferCountOnMessageInDisk lands mid-run"),
        pytest.param([(0, 10, "A")], 0, 32, None, False, {"max_transfer_bytes_on_message_in_memory": 4 * SIZE},
                     [[0, 1, 2, 3]], 4, id="maxTransferBytesOnMessageInMemory lands mid-run, exactly full"),
        pytest.param([(0, 10, "A")], 0, 32, None, False,
                     {"total_physical_memory_bytes": 1000, "max_transfer_bytes_on_message_in_disk": 3 * SIZE - 1},
                     [[0, 1]], 2, id="maxTransferBytesOnMessageInDisk lands mid-run"),
        # memory = 40% of 23750 = 9500 of the about 9900 bytes: the first records are on disk, the rest in memory.
        pytest.param([(0, 40, "A")], 0, 64, None, False, {"total_physical_memory_bytes": 23750},
                     [list(range(40))], 40, id="a run from disk into memory"),
    ],
)
def test_runs(make_store: StoreFactory, runs_of_last_read: list[list[int]], appends, offset, max_nums, max_records_bytes, only_a, config, runs,
              next_offset) -> None:
    store = make_store(**{**WIDE, **config})
    _append(store, appends)
    assert store.cqs.get("T", 0).unit(0)[1] == SIZE
    max_bytes = SIZE * max_records_bytes if max_records_bytes else 1 << 30
    r = store.get_message("g", "T", 0, offset, max_nums, max_bytes, (lambda code: code == A) if only_a else None)
    assert (r.status, runs_of_last_read, r.next_begin_offset) == (S.FOUND, runs, next_offset)
    assert r.queue_offsets == [q for run in runs for q in run]
    _check_exact(store, r)


def test_a_record_filter_ends_a_run_where_it_refuses_a_record(make_store: StoreFactory,
                                                              runs_of_last_read: list[list[int]]) -> None:
    store = make_store(**WIDE)
    _append(store, [(0, 6, "A")])
    seen: list[int] = []

    def record_filter(rec: bytes) -> bool:
        (msg,) = decode_records(rec)
        seen.append(msg.queue_offset)
        return msg.queue_offset != 2

    r = store.get_message("g", "T", 0, 0, 32, 1 << 30, None, record_filter)
    assert (r.status, runs_of_last_read, r.next_begin_offset) == (S.FOUND, [[0, 1], [3, 4, 5]], 6)
    assert seen == [0, 1, 2, 3, 4, 5]  # each record once, in queue order
    _check_exact(store, r)


def _first_in_second_file(store: FileMessageStore, last: int) -> int:
    cq = store.cqs.get("T", 0)
    assert cq is not None
    return next(q for q in range(last) if cq.unit(q)[0] >= store.commitlog.file_size)  # type: ignore[index]


def test_a_run_ends_at_a_commit_log_file(make_store: StoreFactory, runs_of_last_read: list[list[int]]) -> None:
    store = make_store(**WIDE)
    for i in range(6):  # 96 records of 1050 bytes: two 64 KiB files
        store.append_batch("T", 0, batch("T", 16, body=b"x" * 900, start=16 * i), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    second = _first_in_second_file(store, 96)
    assert 0 < second < 96
    r = store.get_message("g", "T", 0, 0, 200, 1 << 30)
    assert (r.status, runs_of_last_read, r.next_begin_offset) == (S.FOUND, [list(range(second)),
                                                                            list(range(second, 96))], 96)
    _check_exact(store, r)


def test_records_of_a_removed_file_are_skipped_to_the_next_file(make_store: StoreFactory,
                                                                runs_of_last_read: list[list[int]]) -> None:
    # 50-unit consume-queue files bound each read's window; 62 records of 1050 bytes fill a 64 KiB log file.
    store = make_store(**{**WIDE, "mapped_file_size_consume_queue": 50 * 20})
    for i in range(128):  # one by one: a batch never straddles two files
        store.append_batch("T", 0, batch("T", 1, body=b"x" * 900, start=i), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    second = _first_in_second_file(store, 128)
    assert 50 < second < 100
    assert store.commitlog.retire_head(1, 0)
    r = store.get_message("g", "T", 0, 0, 200, 1 << 30)
    assert (r.status, r.data, r.queue_offsets, r.next_begin_offset) == (S.MESSAGE_WAS_REMOVING, b"", [], 50)
    r = store.get_message("g", "T", 0, 50, 200, 1 << 30)
    assert (r.status, runs_of_last_read, r.next_begin_offset) == (S.FOUND, [list(range(second, 100))], 100)
    _check_exact(store, r)


def test_a_read_of_many_runs_leaves_no_view_open_on_the_map(make_store: StoreFactory,
                                                            runs_of_last_read: list[list[int]],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(**WIDE)
    _append(store, [(0, 1, "A"), (1, 1, "A")] * 3)
    for i in range(5):  # queue 1 goes on into a second file, so that the first one can be retired
        store.append_batch("T", 1, batch("T", 16, body=b"x" * 900, start=3 + 16 * i), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    assert len(store.commitlog.files) == 2
    r = store.get_message("g", "T", 0, 0, 32, 1 << 30)
    assert (r.status, runs_of_last_read) == (S.FOUND, [[0], [1], [2]])
    _check_exact(store, r)
    first = store.commitlog.files[0]
    assert store.commitlog.retire_head(1, 0) == [first]
    store.cleaner.close_retired()
    assert first.closed and first.mm.closed  # a view left open would have kept the map (and logged a warning)
    assert "exported views" not in caplog.text
