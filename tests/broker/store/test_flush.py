"""Flush: ASYNC flush thread, SYNC_FLUSH group commit and its timeout, checkpoint updates."""

from __future__ import annotations

import time
from concurrent.futures import wait

from broker.store.io import FaultyIO
from client.protocol.codes import FlushDiskType

from .conftest import BORN_HOST, StoreFactory, batch


def _poll(pred, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


def test_async_flush_future_is_already_done(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    fut = store.flush_future(r.end_offset)
    assert fut.done() and fut.result() is True


def test_async_flush_thread_flushes_and_updates_checkpoint(make_store: StoreFactory) -> None:
    store = make_store(flush_commitlog_least_pages=0)
    r = store.append_batch("T", 0, batch("T", 3), born_host=BORN_HOST)
    assert _poll(lambda: store.flushed_physical_offset == r.end_offset), store.flushed_physical_offset
    cp = store.checkpoint
    assert cp is not None
    assert _poll(lambda: cp.flushed_offset == r.end_offset and cp.physic_ts > 0)


def test_async_flush_waits_for_least_pages(make_store: StoreFactory) -> None:
    io = FaultyIO()
    store = make_store(io=io, flush_commitlog_least_pages=4, flush_commitlog_thorough_interval_ms=60_000)
    store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    time.sleep(0.2)  # several flush intervals (20 ms) pass without 4 dirty pages
    assert store.flushed_physical_offset == 0
    r = store.append_batch("T", 0, batch("T", 40, body=b"p" * 500), born_host=BORN_HOST)
    assert _poll(lambda: store.flushed_physical_offset == r.end_offset)


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
