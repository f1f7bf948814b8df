"""The dispatch driver over a scripted store: woken by the append event, chunked, yielding, bounded catch-up,
retry after a failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

import pytest

from broker.dispatch_driver import DispatchDriver
from tests import waiting


class ScriptedStore:
    """``behind`` bytes pending; each ``dispatch_available`` call takes at most ``max_bytes`` of them."""

    def __init__(self, behind: int = 0, *, fail_times: int = 0) -> None:
        self.behind = behind
        self.handed = 0
        """Of ``behind``, the bytes handed over by the send path (dispatched first, as the store does)."""
        self.calls: list[int] = []
        self.fail_times = fail_times

    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        if self.fail_times:
            self.fail_times -= 1
            raise OSError("injected dispatch failure")
        step = min(self.behind, max_bytes)
        self.behind -= step
        self.handed = max(0, self.handed - step)
        self.calls.append(step)
        return step

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.behind

    @property
    def dispatch_handover_bytes(self) -> int:
        return self.handed


def test_catch_up_is_bounded_and_says_whether_anything_is_left() -> None:
    store = ScriptedStore(250)
    driver = DispatchDriver(store, chunk_bytes=100, catch_up_max_bytes=200)
    assert driver.catch_up() is False  # 200 of 250 done, the bound stops it
    assert store.calls == [100, 100] and store.behind == 50
    assert driver.catch_up() is True
    assert store.calls == [100, 100, 50, 0]
    calls = len(store.calls)
    assert driver.catch_up() is True and len(store.calls) == calls  # nothing pending: the store is not asked


def test_the_task_catches_up_at_start_and_on_each_append_event_yielding_between_chunks() -> None:
    async def main() -> None:
        store = ScriptedStore(350)  # what recovery left
        driver = DispatchDriver(store, chunk_bytes=100)
        task = asyncio.get_running_loop().create_task(driver.run())
        turns: list[int] = []

        async def other_requests() -> None:
            while True:
                turns.append(len(store.calls))
                await asyncio.sleep(0)

        other = asyncio.get_running_loop().create_task(other_requests())
        try:
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "the start-up catch-up")
            # Other work ran between the chunks: it saw 1, 2 and 3 chunks done, not only 0 and 4.
            assert {1, 2, 3} <= set(turns)
            store.behind = 120
            driver.wake(10_000)
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "dispatch after the append event")
            assert store.calls[-3:] == [100, 20, 0]
        finally:
            task.cancel()
            other.cancel()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _idle_driver(store: ScriptedStore) -> AsyncIterator[DispatchDriver]:
    """A running driver over ``store`` (nothing pending), once its first pass found nothing to do."""
    driver = DispatchDriver(store, chunk_bytes=100)
    task = asyncio.get_running_loop().create_task(driver.run())
    try:
        await waiting.wait_until(lambda: store.calls == [0], 5.0, "the first pass")
        yield driver
    finally:
        task.cancel()


def test_wakes_while_a_step_is_scheduled_add_no_second_chain() -> None:
    async def main() -> None:
        store = ScriptedStore()
        async with _idle_driver(store) as driver:
            store.behind = 50
            for _ in range(10):  # ten appends in one loop turn
                driver.wake()
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "dispatch after the append events")
            for _ in range(5):
                await asyncio.sleep(0)  # turns in which a second chain would still ask the store
            assert store.calls == [0, 50, 0]

    asyncio.run(main())


def test_a_wake_from_another_thread_is_handed_to_the_loop() -> None:
    async def main() -> None:
        store = ScriptedStore()
        async with _idle_driver(store) as driver:
            store.behind = 30
            thread = threading.Thread(target=driver.wake)
            thread.start()
            thread.join()
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "dispatch after a foreign-thread wake")

    asyncio.run(main())


def test_a_failed_dispatch_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        store = ScriptedStore(50, fail_times=2)
        driver = DispatchDriver(store, chunk_bytes=100, retry_pause_s=0.0)
        task = asyncio.get_running_loop().create_task(driver.run())
        try:
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "dispatch after two failures")
        finally:
            task.cancel()

    with caplog.at_level(logging.ERROR, logger="broker.dispatch_driver"):
        asyncio.run(main())
    assert sum("dispatch failed" in r.getMessage() for r in caplog.records) == 2


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        DispatchDriver(ScriptedStore(), chunk_bytes=0)


def _load(store: ScriptedStore, driver: DispatchDriver, turns: int, per_turn: int, *, handed: bool) -> list[int]:
    """``turns`` loop turns that each append ``per_turn`` bytes (handed over, as a master's sends, or not, as a
    slave's replicated bytes) and wake the driver; the backlog after each turn."""

    async def main() -> list[int]:
        task = asyncio.get_running_loop().create_task(driver.run())
        backlog: list[int] = []
        try:
            for _ in range(turns):
                await asyncio.sleep(0)
                store.behind += per_turn
                if handed:
                    store.handed += per_turn
                driver.wake()
                backlog.append(store.behind)
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "the last appends dispatched")
        finally:
            task.cancel()
        return backlog

    return asyncio.run(main())


def test_steps_keep_pace_with_what_the_send_path_hands_over() -> None:
    """Senders append 500 bytes a loop turn, five chunks' worth, all handed over: each step takes what is handed
    over plus a chunk, so the backlog stays bounded instead of growing by 400 bytes a turn."""
    store = ScriptedStore(300)
    backlog = _load(store, DispatchDriver(store, chunk_bytes=100, step_max_bytes=10_000), 40, 500, handed=True)
    assert max(backlog[10:]) <= 1_000, backlog


def test_replicated_bytes_are_dispatched_a_chunk_a_step() -> None:
    """A slave's appends carry no hand-over: its steps stay a chunk each, so a slave catching up spends its turns
    replicating first (the backlog is dispatched once replication pauses)."""
    store = ScriptedStore()
    backlog = _load(store, DispatchDriver(store, chunk_bytes=100, step_max_bytes=10_000), 20, 500, handed=False)
    assert backlog[-1] >= 20 * 400 - 500, backlog  # 100 a turn dispatched, 500 appended
    assert max(store.calls) == 100


def test_a_step_takes_at_most_step_max_bytes() -> None:
    async def main() -> None:
        store = ScriptedStore(5_000)
        store.handed = 5_000  # one append event of 5,000 handed-over bytes
        driver = DispatchDriver(store, chunk_bytes=100, step_max_bytes=1_000)
        task = asyncio.get_running_loop().create_task(driver.run())
        try:
            await waiting.wait_until(lambda: store.behind == 0, 5.0, "the backlog dispatched")
            assert store.calls[0] == 1_000 and max(store.calls) == 1_000
        finally:
            task.cancel()

    asyncio.run(main())


def test_the_step_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="step_max_bytes >= chunk_bytes"):
        DispatchDriver(ScriptedStore(), chunk_bytes=100, step_max_bytes=99)
