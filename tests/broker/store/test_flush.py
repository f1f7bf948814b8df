"""Flush: ASYNC flush thread, SYNC_FLUSH group commit and its timeout, checkpoint updates."""

from __future__ import annotations

import time
from concurrent.futures import wait

from benchmarks.chaos.faulty_io import FaultyIO
from common.codes import FlushDiskType
from tests.waiting import poll_until

from .conftest import BORN_HOST, StoreFactory, batch


def test_async_flush_future_is_already_done(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    fut = store.flush_future(r.end_offset)
    assert fut.done() and fut.result() is True


def test_async_flush_thread_flushes_and_updates_checkpoint(make_store: StoreFactory) -> None:
    store = make_store(flush_commitlog_least_pages=0)
    r = store.append_batch("T", 0, batch("T", 3), born_host=BORN_HOST)
    poll_until(lambda: store.flushed_physical_offset == r.end_offset, 5, "the flush thread flushing the append")
    cp = store.checkpoint
    assert cp is not None
    poll_until(lambda: cp.flushed_offset == r.end_offset and cp.physic_ts > 0, 5, "the checkpoint update")


def test_async_flush_waits_for_least_pages(make_store: StoreFactory) -> None:
    """Fewer dirty pages than ``flushCommitLogLeastPages``: the flush thread takes its turns and flushes nothing;
    enough pages: the next turn flushes them."""
    store = make_store(io=FaultyIO(), flush_commitlog_least_pages=4, flush_commitlog_thorough_interval_ms=60_000)
    turns: list[tuple[int, int]] = []  # (least_pages asked, flushed offset after the turn)
    real_flush = store.commitlog.flush

    def counted(least_pages: int = 0) -> int:
        flushed = real_flush(least_pages)
        turns.append((least_pages, flushed))
        return flushed

    store.commitlog.flush = counted  # type: ignore[method-assign]  # the flush thread looks it up per turn
    store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    seen = len(turns)
    poll_until(lambda: len(turns) >= seen + 3, 5, "three turns of the flush thread after the append")
    assert all(least == 4 for least, _ in turns), turns
    assert store.flushed_physical_offset == 0 and all(flushed == 0 for _, flushed in turns[seen:]), turns
    r = store.append_batch("T", 0, batch("T", 40, body=b"p" * 500), born_host=BORN_HOST)
    poll_until(lambda: store.flushed_physical_offset == r.end_offset, 5, "the flush of 4+ dirty pages")


def test_sync_flush_group_commit_shares_flushes(make_store: StoreFactory) -> None:
    io = FaultyIO(fsync_delay_s=0.05)
    store = make_store(io=io, flush_disk_type=FlushDiskType.SYNC_FLUSH, flush_interval_consume_queue_ms=60_000)
    base = io.flush_count
    futures = []
    for i in range(20):
        r = store.append_batch("T", 0, batch("T", 1, start=i), born_host=BORN_HOST)
        futures.append(store.flush_future(r.end_offset))
    _done, not_done = wait(futures, timeout=10)
    assert not not_done and all(f.result() is True for f in futures)
    assert io.flush_count - base < 20, "every request flushed on its own: no group commit"
    assert store.flushed_physical_offset == store.max_physical_offset


def test_sync_flush_times_out_with_false(make_store: StoreFactory) -> None:
    io = FaultyIO(fsync_delay_s=1.5)
    store = make_store(io=io, flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=100,
                       flush_interval_consume_queue_ms=60_000)
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    t0 = time.monotonic()
    fut = store.flush_future(r.end_offset)
    assert fut.result(timeout=5) is False
    assert time.monotonic() - t0 < 1.2, "the watcher must not wait for the slow fsync"
    io.fsync_delay_s = 0.0


def test_flush_calls_libc_msync_which_runs_without_the_gil(tmp_path, monkeypatch) -> None:
    """CPython 3.11's ``mmap.flush`` holds the GIL for the whole disk write (the broker's loop froze ~100 ms per
    periodic flush); a ctypes call to libc releases it. The flush must go through libc, over the right range."""
    import mmap
    import os

    from broker.store import io as store_io

    assert store_io._libc_msync is not None, "libc msync not found on this POSIX system"
    calls: list[tuple[int, int]] = []
    real = store_io._libc_msync

    def spy(addr: int, length: int, flags: int) -> int:
        calls.append((addr, length))
        return real(addr, length, flags)

    monkeypatch.setattr(store_io, "_libc_msync", spy)
    path = tmp_path / "f"
    size = 4 * mmap.PAGESIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    try:
        mm[mmap.PAGESIZE + 10:mmap.PAGESIZE + 15] = b"hello"
        store_io.FileIO().flush(mm, str(path), mmap.PAGESIZE + 10, mmap.PAGESIZE + 15)
        assert [length for _, length in calls] == [15]  # from the page start to the end
        assert os.pread(fd, 5, mmap.PAGESIZE + 10) == b"hello"
        mm.close()  # the buffer export of the call is gone: the map closes
    finally:
        os.close(fd)


def test_prefault_calls_libc_madvise_step_by_step_and_stops_at_a_closed_map(tmp_path, monkeypatch) -> None:
    """Populating pages goes through libc (the GIL is free meanwhile), ``_PREFAULT_CHUNK`` at a time, and ends
    quietly once the map is closed."""
    import mmap
    import os

    from broker.store import io as store_io

    assert store_io._libc_madvise is not None, "libc madvise not found on this POSIX system"
    real = store_io._libc_madvise
    lengths: list[int] = []
    path = tmp_path / "f"
    step = store_io._PREFAULT_CHUNK
    size = 3 * step + mmap.PAGESIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)

    def spy(addr: int, length: int, advice: int) -> int:
        lengths.append(length)
        return real(addr, length, advice)

    monkeypatch.setattr(store_io, "_libc_madvise", spy)
    try:
        store_io.prefault(mm, 10, size)
        # Kernels before 5.14 refuse MADV_POPULATE_WRITE: one refused call, then it stops.
        assert lengths in ([step] * 3 + [mmap.PAGESIZE], [step]), lengths
        mm.close()
        lengths.clear()
        store_io.prefault(mm, 0, size)  # closed: nothing, no error
        assert lengths == []
    finally:
        os.close(fd)
