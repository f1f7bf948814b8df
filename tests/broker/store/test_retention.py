"""Retention on a real store with small files and a fake clock: which files go and when, what follows them
(consume queues, index, min offsets, reads), readers holding deleted files, and the disk-full guard."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from broker.retention_driver import CleanReport, RetentionDriver
from broker.store.api import GetMessageStatus as S
from broker.store.api import PutMessageStatus
from broker.store.file_store import FileMessageStore
from broker.store.retention import RetentionConfig
from common.codes import BrokerRole

from .conftest import BORN_HOST, FakeClock, StoreFactory, batch

H = 3_600_000
FILE = 4096
#: 04:30 local time on some day: deleteWhen "04" holds then.
AT_4 = int(time.mktime((2026, 11, 20, 4, 30, 0, 0, 0, -1)) * 1000)


class Disk:
    """An injected partition usage (fraction), the same for every part of the store."""

    def __init__(self) -> None:
        self.used = 0.10

    def __call__(self, path: str) -> float:
        return self.used


def wait_until(cond, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def fill(store: FileMessageStore, n: int, topic: str = "T", queue_id: int = 0) -> None:
    for i in range(n):
        r = store.append_batch(topic, queue_id, batch(topic, 1, body=b"b" * 300, start=i, keys=f"key{i}"),
                               born_host=BORN_HOST)
        assert r.status is PutMessageStatus.PUT_OK, r
    store.dispatch_available(1 << 30)
    wait_until(lambda: store.flushed_physical_offset >= store.max_physical_offset, "the flush thread")


def commitlog_files(store: FileMessageStore) -> list[str]:
    """The log's files (not the next one, prepared in the background), each checked to be on disk."""
    names = [os.path.basename(mf.path) for mf in store.commitlog.files]
    assert set(names) <= set(os.listdir(Path(store.root) / "commitlog"))
    return names


def age_files(store: FileMessageStore, last_write_ms: int) -> None:
    for mf in store.commitlog.files:
        os.utime(mf.path, ns=(last_write_ms * 1_000_000, last_write_ms * 1_000_000))


def run_pass(store: FileMessageStore, committed: dict[str, dict[int, int]] | None = None, *,
             manual: bool = False) -> CleanReport:
    async def no_pause(_: float) -> None:
        return None

    driver = RetentionDriver(store.cleaner, lambda: committed or {}, interval_s=10.0, delete_interval_s=0.1,
                             batch_max=store.config.retention.delete_file_batch_max, sleep=no_pause)
    return asyncio.run(driver.pass_once(manual=manual))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(AT_4)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def store(make_store: StoreFactory, clock: FakeClock, disk: Disk) -> FileMessageStore:
    s = make_store(mapped_file_size_commitlog=FILE, mapped_file_size_consume_queue=10 * 20, clock_ms=clock,
                   flush_commitlog_least_pages=0,
                   disk_used_ratio=disk, max_hash_slot_num=8, max_index_num=16)
    fill(s, 50)
    assert len(s.commitlog.files) >= 5
    return s


def test_expired_files_go_at_delete_when_oldest_first_never_the_current(store: FileMessageStore,
                                                                       clock: FakeClock) -> None:
    names = commitlog_files(store)
    age_files(store, AT_4 - 71 * H)
    assert run_pass(store).deleted_files == 0  # the hour is right, the files are not old enough
    clock.now_ms = AT_4 + 24 * H - 2 * H  # 02:30 the next day: old enough, not the hour
    age_files(store, clock.now_ms - 100 * H)
    report = run_pass(store)
    assert (report.deleted_files, report.reason) == (0, "nothing to do at this hour")
    clock.now_ms = AT_4 + 24 * H  # 04:30
    report = run_pass(store)
    assert report.deleted_files == len(names) - 1
    assert report.reason == "the hour is one of deleteWhen"
    assert commitlog_files(store) == names[-1:]  # oldest first; the file being written stays
    assert not set(names[:-1]) & set(os.listdir(Path(store.root) / "commitlog"))
    assert store.min_physical_offset == int(names[-1]) == report.min_offset
    assert report.bytes_reclaimed == (len(names) - 1) * FILE


def test_queues_index_and_reads_follow_the_commit_log(store: FileMessageStore, clock: FakeClock) -> None:
    cq = store.cqs.get("T", 0)
    assert cq is not None and len(cq.files) == 5  # 10 units per file
    index_before = len(store.index.files) if store.index else 0
    assert index_before > 2
    age_files(store, AT_4 - 100 * H)
    report = run_pass(store, {"T@g1": {0: 0}, "T@g2": {0: 45}, "T@other": {0: 0}, "U@g1": {0: 0}})
    new_min = store.min_physical_offset
    first_kept = next(o for o in range(cq.first_offset, 50) if cq.unit(o)[0] >= new_min)  # type: ignore[index]
    assert store.get_min_offset_in_queue("T", 0) == first_kept > 0
    assert report.lost == {"g1": first_kept, "other": first_kept}  # g2 had consumed past the deleted part
    # consume-queue files whose every unit pointed into deleted files are gone, the rest stay
    assert cq.files[0].start // 20 <= first_kept < cq.files[0].start // 20 + 10
    assert sorted(os.listdir(Path(cq.directory))) == [os.path.basename(mf.path) for mf in cq.files]
    # index files covering only deleted bytes are gone too; the last one always stays
    assert store.index is not None and 1 <= len(store.index.files) < index_before
    assert all(f.end_phy >= new_min for f in store.index.files)
    # a read below the new min is told where the data starts now (PULL_OFFSET_MOVED at the broker)
    r = store.get_message("g1", "T", 0, 0, 32, 1 << 20)
    assert (r.status, r.next_begin_offset, r.min_offset) == (S.OFFSET_TOO_SMALL, first_kept, first_kept)
    r = store.get_message("g1", "T", 0, first_kept, 32, 1 << 20)
    assert r.status is S.FOUND and r.queue_offsets[0] == first_kept
    # a query by key of a deleted message finds nothing (no error); a kept one is found
    assert store.query_message("T", "key0", 10, 0, 1 << 62).records == []
    assert len(store.query_message("T", "key49", 10, 0, 1 << 62).records) == 1
    assert store.look_message_by_offset(0) is None


def test_min_offsets_survive_a_restart(make_store: StoreFactory, store: FileMessageStore, clock: FakeClock,
                                       disk: Disk) -> None:
    age_files(store, AT_4 - 100 * H)
    run_pass(store)
    min_q, min_phy = store.get_min_offset_in_queue("T", 0), store.min_physical_offset
    root = store.root
    store.shutdown()
    again = make_store(root=root, mapped_file_size_commitlog=FILE, mapped_file_size_consume_queue=10 * 20,
                       flush_commitlog_least_pages=0,
                       clock_ms=clock, disk_used_ratio=disk, max_hash_slot_num=8, max_index_num=16)
    assert (again.get_min_offset_in_queue("T", 0), again.min_physical_offset) == (min_q, min_phy)
    assert again.get_message("g", "T", 0, min_q, 32, 1 << 20).status is S.FOUND
    fill(again, 3)  # and the log goes on
    assert again.get_max_offset_in_queue("T", 0) == 53


def test_files_are_kept_until_dispatched(store: FileMessageStore, clock: FakeClock) -> None:
    store.dispatcher.reput = store.commitlog.files[1].start + 10  # pretend dispatch is behind, in file 1
    age_files(store, AT_4 - 100 * H)
    assert run_pass(store).deleted_files == 1  # file 0 only: file 1 still has undispatched bytes
    store.dispatch_available(1 << 30)


def test_manual_clean_deletes_expired_files_whatever_the_hour(store: FileMessageStore, clock: FakeClock) -> None:
    clock.now_ms = AT_4 + 6 * H  # 10:30
    age_files(store, AT_4 - 100 * H)
    assert run_pass(store).deleted_files == 0
    n = len(store.commitlog.files)
    report = run_pass(store, manual=True)
    assert report.deleted_files == n - 1
    assert report.reason == "an operator asked for a pass now (splitmq broker clean, Admin.clean_expired_files)"


def test_disk_pressure_deletes_expired_then_unexpired_files(store: FileMessageStore, clock: FakeClock,
                                                            disk: Disk) -> None:
    clock.now_ms = AT_4 + 6 * H  # not the hour
    age_files(store, clock.now_ms - 1 * H)  # young files
    files = commitlog_files(store)
    disk.used = 0.80  # above 75 %: only expired files may go, and none is
    assert run_pass(store).deleted_files == 0
    disk.used = 0.86  # above 85 %: the oldest go anyway
    report = run_pass(store, {"T@g": {0: 0}})
    assert report.forced and report.deleted_files == len(files) - 1
    assert report.lost["g"] > 0


def test_batch_max_bounds_a_pass(make_store: StoreFactory, clock: FakeClock, disk: Disk) -> None:
    s = make_store(mapped_file_size_commitlog=FILE, clock_ms=clock, disk_used_ratio=disk, flush_commitlog_least_pages=0,
                   retention=RetentionConfig(delete_file_batch_max=2))
    fill(s, 50)
    age_files(s, AT_4 - 100 * H)
    n = len(s.commitlog.files)
    assert run_pass(s).deleted_files == 2
    assert len(s.commitlog.files) == n - 2


def test_a_pass_asks_again_after_each_pause_a_slave_restarting_its_log_meanwhile(store: FileMessageStore) -> None:
    """A slave may drop its log and restart it at its master's oldest file between two deletions of one pass
    (the HA client does it on the event loop while the pass pauses): the fresh files are not the expired ones
    the pass started on, and none of them goes."""
    age_files(store, AT_4 - 100 * H)
    assert len(store.commitlog.files) >= 3
    restart_at = (store.max_physical_offset // FILE + 2) * FILE
    pauses = 0

    async def restart_during_the_pause(_: float) -> None:
        nonlocal pauses
        pauses += 1
        if pauses == 1:
            store.set_broker_role(BrokerRole.SLAVE)
            store.restart_log_at(restart_at)
            store.set_broker_role(BrokerRole.ASYNC_MASTER)  # to write new files here as replication would
            fill(store, 30)
            assert len(store.commitlog.files) >= 2

    driver = RetentionDriver(store.cleaner, dict, interval_s=10.0, delete_interval_s=0.1,
                             batch_max=store.config.retention.delete_file_batch_max, sleep=restart_during_the_pause)
    fresh: list[str] = []

    async def one_pass() -> CleanReport:
        report = await driver.pass_once(manual=True)
        fresh.extend(commitlog_files(store))
        return report

    report = asyncio.run(one_pass())
    assert report.deleted_files == 1 and pauses == 1
    assert store.commitlog.min_offset == restart_at and len(fresh) >= 2


def test_a_reader_holding_a_deleted_file_reads_its_bytes_until_it_lets_go(store: FileMessageStore,
                                                                        clock: FakeClock) -> None:
    first = store.commitlog.files[0]
    expected = bytes(first.mm[:FILE])
    assert first.hold()
    age_files(store, AT_4 - 100 * H)
    run_pass(store)
    assert not os.path.exists(first.path)  # unlinked: the name is free
    assert not first.closed and bytes(first.mm[:FILE]) == expected  # still mapped, still the same bytes
    store.cleaner.close_retired()
    assert not first.closed
    first.release()
    store.cleaner.close_retired()
    assert first.closed


def test_a_held_file_is_unmapped_after_the_forcible_delay(store: FileMessageStore, clock: FakeClock) -> None:
    first = store.commitlog.files[0]
    assert first.hold()
    age_files(store, AT_4 - 100 * H)
    run_pass(store)
    clock.now_ms += 119_999
    store.cleaner.close_retired()
    assert not first.closed
    clock.now_ms += 1
    store.cleaner.close_retired()
    assert first.closed  # a late reader gets ValueError from the closed map, never a SIGBUS
    with pytest.raises(ValueError):
        first.mm[0]


def test_disk_full_refuses_writes_keeps_reads_and_recovers(store: FileMessageStore, clock: FakeClock,
                                                           disk: Disk) -> None:
    disk.used = 0.93
    store.cleaner.check_disk()
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert "disk full: commit log 93.0%, consume queue 93.0%, index 93.0%" in r.remark
    assert "diskSpaceWarningLevelRatio 90%" in r.remark
    assert store.get_message("g", "T", 0, 0, 32, 1 << 20).status is S.FOUND  # reads keep working
    disk.used = 0.50
    clock.now_ms += 999
    assert store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    clock.now_ms += 1  # a refused write measures again once a second: space is back
    assert store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).status is PutMessageStatus.PUT_OK


def test_a_write_error_refuses_writes_until_a_disk_check(store: FileMessageStore, clock: FakeClock,
                                                         disk: Disk) -> None:
    store.cleaner.write_failed("disk full: [Errno 28] No space left on device")
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "the last write failed" in r.remark
    disk.used = 0.95  # still full at the next check: still refused, now as "disk full"
    clock.now_ms += 1000
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.remark
    disk.used = 0.40
    clock.now_ms += 1000
    assert store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).status is PutMessageStatus.PUT_OK


def test_slave_restarts_its_log_at_the_masters_oldest_file(make_store: StoreFactory, clock: FakeClock,
                                                           tmp_path: Path) -> None:
    master = make_store(root=tmp_path / "m", mapped_file_size_commitlog=FILE, clock_ms=clock,
                        flush_commitlog_least_pages=0)
    fill(master, 30)
    slave = make_store(root=tmp_path / "s", mapped_file_size_commitlog=FILE, clock_ms=clock,
                       broker_role=BrokerRole.SLAVE)
    first_file = bytes(master.commitlog.files[0].mm[: master.commitlog.files[0].wrote])
    slave.append_to_commitlog(0, first_file)
    slave.dispatch_available(1 << 30)
    held = slave.get_max_offset_in_queue("T", 0)
    assert held > 0
    age_files(master, AT_4 - 100 * H)
    run_pass(master)
    start = master.min_physical_offset
    assert start > slave.max_physical_offset
    with pytest.raises(Exception, match="must be a file start"):
        slave.restart_log_at(start + 1)
    slave.restart_log_at(start)
    assert (slave.min_physical_offset, slave.max_physical_offset) == (start, start)
    assert slave.get_min_offset_in_queue("T", 0) == held  # nothing below is readable any more
    data = master.get_commitlog_data(start, 1 << 20)
    assert data is not None
    slave.append_to_commitlog(start, data)
    slave.dispatch_available(1 << 30)
    r = slave.get_message("g", "T", 0, slave.get_min_offset_in_queue("T", 0), 32, 1 << 20)
    assert r.status is S.FOUND
    assert r.queue_offsets[0] == master.get_min_offset_in_queue("T", 0)
