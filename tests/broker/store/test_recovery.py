"""Start-up and recovery: abort and lock files, torn tails, mid-log corruption, faults from the I/O layer."""

from __future__ import annotations

import os
import struct

import pytest

from benchmarks.chaos.faulty_io import FaultyIO, SimulatedCrash
from broker.store.api import PutMessageStatus, StoreCorruptError, StoreError
from broker.store.file_store import FileMessageStore
from common.codec import decode_records
from common.message import MessageExt

from .conftest import BORN_HOST, FakeClock, StoreFactory, batch, small_config


def _write(store: FileMessageStore, n_batches: int, per: int = 3, queue_id: int = 0) -> list[int]:
    offsets: list[int] = []
    for i in range(n_batches):
        r = store.append_batch("T", queue_id, batch("T", per, body=os.urandom(300), start=i * per),
                               born_host=BORN_HOST)
        assert r.status is PutMessageStatus.PUT_OK, r
        offsets.extend(r.physical_offsets)
    return offsets


def _all_messages(store: FileMessageStore, queue_id: int = 0) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    while True:
        r = store.get_message("g", "T", queue_id, offset, 32, 1 << 20)
        if not r.records and r.next_begin_offset == offset:
            return out
        out.extend(decode_records(b"".join(r.records), verify_crc=True))
        offset = r.next_begin_offset


def test_abort_file_holds_pid_and_goes_away_on_clean_shutdown(make_store: StoreFactory, tmp_path) -> None:
    store = make_store()
    abort = tmp_path / "store" / "abort"
    assert abort.read_text() == str(os.getpid())
    store.shutdown()
    assert not abort.exists()


def test_second_store_on_same_directory_is_refused(make_store: StoreFactory, tmp_path) -> None:
    make_store()
    other = FileMessageStore(small_config(tmp_path / "store"))
    with pytest.raises(StoreError, match="in use by another store"):
        other.load()


def test_clean_restart_keeps_everything_and_continues_offsets(make_store: StoreFactory, tmp_path) -> None:
    store = make_store()
    offsets = _write(store, 60)
    store.shutdown()
    again = make_store()
    assert again.max_physical_offset == store.max_physical_offset
    assert [m.commit_log_offset for m in _all_messages(again)] == offsets
    assert again.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).queue_offset == 180
    assert len(again.query_message("T", "k7", 4, 0, 1 << 62).records) == 1


def _corrupt(root, offset: int, data: bytes) -> None:
    size = 64 * 1024
    path = root / "commitlog" / f"{offset // size * size:020d}"
    with open(path, "r+b") as f:
        f.seek(offset % size)
        f.write(data)


@pytest.mark.parametrize("abnormal", [False, True])
@pytest.mark.parametrize("tear", ["half", "zeros"])
def test_torn_last_record_is_truncated(make_store: StoreFactory, tmp_path, tear: str, abnormal: bool) -> None:
    store = make_store()
    offsets = _write(store, 10)
    store.dispatch_available()
    end = store.max_physical_offset
    last = offsets[-1]
    store.crash() if abnormal else store.shutdown()
    rec_len = end - last
    if tear == "half":
        _corrupt(tmp_path / "store", last + rec_len // 2, bytes(rec_len - rec_len // 2))
    else:
        _corrupt(tmp_path / "store", last, bytes(rec_len))
    again = make_store()
    assert again.max_physical_offset == last
    assert [m.commit_log_offset for m in _all_messages(again)] == offsets[:-1]
    assert again.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).queue_offset == len(offsets) - 1


@pytest.mark.parametrize(
    ("what", "patch_at", "data"),
    [
        ("bad CRC", 8, b"\x00\x00\x00\x01"),
        ("bad magic", 4, b"\x12\x34\x56\x78"),
        ("impossible size", 0, struct.pack(">i", 5)),
        ("zeroed record", 0, bytes(200)),
    ],
)
def test_mid_log_corruption_is_refused_naming_file_and_offset(
    make_store: StoreFactory, tmp_path, what: str, patch_at: int, data: bytes
) -> None:
    store = make_store()
    offsets = _write(store, 20)
    store.shutdown()
    victim = offsets[len(offsets) // 2]
    _corrupt(tmp_path / "store", victim + patch_at, data)
    fresh = FileMessageStore(small_config(tmp_path / "store"))
    with pytest.raises(StoreCorruptError) as info:
        fresh.load()
    msg = str(info.value)
    assert f"physical offset {victim}" in msg, (what, msg)
    assert os.path.join("commitlog", f"{victim // 65536 * 65536:020d}") in msg
    # The refused store released its lock: an operator can retry with truncate_corrupt.
    cut = make_store(truncate_corrupt=True)
    assert cut.max_physical_offset == victim
    assert [m.commit_log_offset for m in _all_messages(cut)] == [o for o in offsets if o < victim]


def test_abnormal_recovery_rebuilds_lost_consume_queues(make_store: StoreFactory, tmp_path) -> None:
    import shutil

    store = make_store()
    offsets = _write(store, 40)
    store.dispatch_available()
    store.crash()
    shutil.rmtree(tmp_path / "store" / "consumequeue")
    with open(tmp_path / "store" / "checkpoint", "r+b") as f:
        f.write(bytes(40))
    again = make_store()
    assert [m.commit_log_offset for m in _all_messages(again)] == offsets
    assert len(again.query_message("T", "k33", 4, 0, 1 << 62).records) == 1


def test_consume_queue_past_recovered_end_is_truncated(make_store: StoreFactory, tmp_path) -> None:
    store = make_store()
    offsets = _write(store, 10)
    store.shutdown()
    _corrupt(tmp_path / "store", offsets[-3], bytes(64 * 1024 - offsets[-3] % 65536))
    again = make_store()
    assert again.get_max_offset_in_queue("T", 0) == len(offsets) - 3


@pytest.mark.parametrize("preallocate", [False, True])
def test_enospc_on_new_file_writes_nothing(make_store: StoreFactory, preallocate: bool) -> None:
    io = FaultyIO()
    clock = FakeClock()
    store = make_store(io=io, preallocate_commitlog=preallocate, clock_ms=clock)
    _write(store, 1)
    while store.max_physical_offset + 2000 < 64 * 1024:
        _write(store, 1)
    before = store.max_physical_offset
    io.enospc_on_allocate = True
    store.commitlog._discard_prepared()  # a file allocated in the background before the disk filled up
    r = store.append_batch("T", 0, batch("T", 2, body=b"n" * 1000), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert "No space left" in r.remark and "commitlog" in r.remark
    assert store.max_physical_offset == before and len(store.commitlog.files) == 1
    io.enospc_on_allocate = False
    r = store.append_batch("T", 0, batch("T", 2, body=b"n" * 1000), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "the last write failed" in r.remark
    clock.now_ms += 1000  # the next disk check finds room: writes resume by themselves
    r = store.append_batch("T", 0, batch("T", 2, body=b"n" * 1000), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK and r.wrote_offset == 64 * 1024


def test_enospc_on_write_is_service_not_available(make_store: StoreFactory) -> None:
    io = FaultyIO()
    clock = FakeClock()
    store = make_store(io=io, clock_ms=clock)
    _write(store, 2)
    before = store.max_physical_offset
    io.enospc_on_write = True
    r = store.append_batch("T", 0, batch("T", 2), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.remark
    assert store.max_physical_offset == before
    io.enospc_on_write = False
    clock.now_ms += 1000
    assert store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).queue_offset == 6


def test_slave_append_on_full_disk_raises_store_error(make_store: StoreFactory) -> None:
    from common.codes import BrokerRole

    io = FaultyIO()
    store = make_store(io=io, broker_role=BrokerRole.SLAVE)
    io.enospc_on_allocate = True
    with pytest.raises(StoreError, match="No space left"):
        store.append_to_commitlog(0, b"\x00" * 16)


def test_crash_mid_write_loses_only_the_torn_batch(make_store: StoreFactory, tmp_path) -> None:
    io = FaultyIO()
    store = make_store(io=io)
    offsets = _write(store, 15)
    store.dispatch_available()
    io.crash_after_bytes = 500  # lands inside the second record of the next batch
    with pytest.raises(SimulatedCrash):
        _write(store, 1)
    store.crash()
    again = make_store()
    got = [m.commit_log_offset for m in _all_messages(again)]
    # Every acknowledged record survives; of the torn batch, the complete first record does too (its put
    # never returned, so either outcome is allowed), the torn second one is gone.
    assert got[:-1] == offsets and len(got) == len(offsets) + 1
    assert again.max_physical_offset == got[-1] + len(again.look_message_by_offset(got[-1]) or b"")


def test_power_loss_keeps_flushed_records(make_store: StoreFactory, tmp_path) -> None:
    from common.codes import FlushDiskType

    io = FaultyIO(track_unsynced=True)
    store = make_store(io=io, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    durable: list[int] = []
    for i in range(12):
        r = store.append_batch("T", 0, batch("T", 2, start=2 * i), born_host=BORN_HOST)
        if i < 8:
            assert store.flush_future(r.end_offset).result(5.0) is True
            durable.extend(r.physical_offsets)
    store.dispatch_available()
    store.crash()
    io.drop_unsynced()
    again = make_store()
    got = [m.commit_log_offset for m in _all_messages(again)]
    assert got[: len(durable)] == durable
