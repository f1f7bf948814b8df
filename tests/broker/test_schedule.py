"""ScheduleMessageService: the pure rules, delivery against a real file store with a settable clock, back-off,
offset correction, exactly-once across a restart and a crash mid-batch, and one real-time 1 s delivery."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from broker.dispatch_driver import DispatchDriver
from broker.schedule import (
    ScheduleMessageService,
    clamp_offset,
    compute_deliver_timestamp,
    delay_level_to_queue_id,
    effective_deliver_timestamp,
    queue_id_to_delay_level,
    restore_message,
)
from broker.store.api import AppendResult, PutMessageStatus
from broker.store.file_store import FileMessageStore
from common.codec import record_size
from common.properties import DELAY, REAL_QID, REAL_TOPIC, UNIQ_KEY, WAIT
from tests.broker.delay_support import (
    T0,
    FakeClock,
    delivered_keys,
    drain,
    make_service,
    make_store,
    put,
    put_delayed,
    read_all,
)
from tests.waiting import wait_until

LEVELS_MS = (1000, 2000, 3000)


# --- pure rules ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("store_ts", "level", "expected"), [
    (100, 1, 1100), (100, 3, 3100), (100, 4, 1100), (100, 0, 1100), (0, 2, 2000),
])
def test_compute_deliver_timestamp(store_ts: int, level: int, expected: int) -> None:
    assert compute_deliver_timestamp(store_ts, level, LEVELS_MS) == expected


@pytest.mark.parametrize(("deliver", "now", "delay", "expected"), [
    (5000, 4000, 1000, 5000),    # due in exactly the level's delay: kept
    (5001, 4000, 1000, 4000),    # further ahead than the whole delay: the clock went back, due now
    (3000, 4000, 1000, 3000),    # overdue: kept (delivered at once)
    (4000, 4000, 1000, 4000),
])
def test_clock_skew_guard(deliver: int, now: int, delay: int, expected: int) -> None:
    assert effective_deliver_timestamp(deliver, now, delay) == expected


@pytest.mark.parametrize(("offset", "lo", "hi", "expected"), [(5, 0, 10, 5), (-1, 0, 10, 0), (12, 0, 10, 10),
                                                              (3, 4, 10, 4), (0, 0, 0, 0)])
def test_clamp_offset(offset: int, lo: int, hi: int, expected: int) -> None:
    assert clamp_offset(offset, lo, hi) == expected


def test_level_queue_mapping() -> None:
    assert [delay_level_to_queue_id(level) for level in (1, 2, 18)] == [0, 1, 17]
    assert [queue_id_to_delay_level(q) for q in (0, 1, 17)] == [1, 2, 18]


def test_restore_message_moves_real_topic_and_keeps_the_rest() -> None:
    props = {REAL_TOPIC: "Orders", REAL_QID: "3", DELAY: "2", WAIT: "true", "KEYS": "k1 k2", "user": "x"}
    assert restore_message("SCHEDULE_TOPIC_XXXX", 1, props) == (
        "Orders", 3, {WAIT: "false", "KEYS": "k1 k2", "user": "x"})


@pytest.mark.parametrize(("props", "needle"), [
    ({REAL_QID: "1"}, REAL_TOPIC), ({REAL_TOPIC: "T"}, REAL_QID), ({REAL_TOPIC: "T", REAL_QID: "-1"}, REAL_QID),
    ({REAL_TOPIC: "T", REAL_QID: "x"}, REAL_QID),
])
def test_restore_message_rejects_broken_records(props: dict[str, str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        restore_message("SCHEDULE_TOPIC_XXXX", 0, props)


def test_constructor_rejects_bad_bounds(tmp_path: Path) -> None:
    from broker.metadata.delay_offsets import DelayOffsetManager

    offsets = DelayOffsetManager(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        ScheduleMessageService(None, offsets, delay_levels_ms=(), clock_ms=FakeClock())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        ScheduleMessageService(None, offsets, delay_levels_ms=(1,), clock_ms=FakeClock(),  # type: ignore[arg-type]
                               batch_size=0)


# --- delivery with a settable clock ---------------------------------------------------------------------------

@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def store(tmp_path: Path, clock: FakeClock) -> Any:
    s = make_store(tmp_path, clock)
    yield s
    s.shutdown()


def test_delivers_no_earlier_than_the_delay_and_restores_everything(tmp_path: Path, clock: FakeClock,
                                                                    store: FileMessageStore) -> None:
    svc, offsets = make_service(store, tmp_path, clock)
    put(store, "Orders", b"body-1", level=2, queue_id=1, reconsume_times=2, flag=7,
        props={UNIQ_KEY: "u1", "TAGS": "TagA", "user": "v"})
    drain(store)
    assert svc.deliver_due() == 0  # stored at T0, due at T0 + 2000
    clock.advance(1999)
    assert svc.deliver_due() == 0
    assert read_all(store, "Orders", 1) == []
    clock.advance(1)
    assert svc.deliver_due() == 1
    [m] = read_all(store, "Orders", 1)
    assert (m.topic, m.queue_id, m.body, m.flag, m.reconsume_times, m.born_timestamp) == (
        "Orders", 1, b"body-1", 7, 2, T0 - 5)
    assert m.born_host == "10.1.2.3:40123"
    assert m.properties == {UNIQ_KEY: "u1", "TAGS": "TagA", "user": "v", WAIT: "false"}
    assert m.tags == "TagA"
    assert offsets.get(2) == 1
    persisted = json.loads((tmp_path / "config" / "delayOffset.json").read_text())
    assert persisted["offsetTable"]["2"] == 1
    assert svc.deliver_due() == 0  # nothing twice


def test_wait_is_exactly_until_the_next_due_head(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    svc, _ = make_service(store, tmp_path, clock, max_wait_ms=60_000)
    assert svc.deliver_due() == 0
    assert svc.wait_ms() == 60_000  # nothing anywhere: the bound
    put_delayed(store, 1, level=3)
    assert svc.wait_ms() == 0  # the dispatch notification asks for a pass
    clock.advance(500)
    svc.deliver_due()
    assert svc.wait_ms() == 2500
    put_delayed(store, 1, level=1, prefix="x")  # stored at T0+500, due at T0+1500
    svc.deliver_due()
    assert svc.wait_ms() == 1000


def test_levels_are_independent_and_fifo(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    svc, _ = make_service(store, tmp_path, clock, batch_size=4)
    slow = put_delayed(store, 5, level=3, prefix="s")
    fast = put_delayed(store, 10, level=1, prefix="f")
    clock.advance(1000)
    total = 0
    while (n := svc.deliver_due()) > 0:  # batches of 4: keeps going while due
        total += n
    assert total == 10
    assert delivered_keys(store) == sorted(fast)
    clock.advance(2000)
    while svc.deliver_due():
        pass
    assert delivered_keys(store) == sorted(fast + slow)
    q0 = [m.properties[UNIQ_KEY] for m in read_all(store, "T", 0)]
    assert q0 == [k for k in fast if int(k[1:]) % 2 == 0] + [k for k in slow if int(k[1:]) % 2 == 0]


def test_clock_went_back_delivers_now(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    put_delayed(store, 2, level=1)
    clock.advance(-3_600_000)  # an hour back: the records look due in an hour and a second
    svc, _ = make_service(store, tmp_path, clock)
    assert svc.deliver_due() == 2


class FlakyPuts:
    """Store proxy whose first ``failures`` put_message calls fail."""

    def __init__(self, store: FileMessageStore, failures: int) -> None:
        self._store = store
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_message(self, *args: Any, **kwargs: Any) -> AppendResult:
        if self.failures > 0:
            self.failures -= 1
            return AppendResult(PutMessageStatus.OS_PAGE_CACHE_BUSY, "injected")
        return self._store.put_message(*args, **kwargs)


def test_failed_put_retries_with_bounded_backoff(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    keys = put_delayed(store, 3, level=1)
    flaky = FlakyPuts(store, failures=3)
    svc, offsets = make_service(flaky, tmp_path, clock, retry_wait_ms=100,  # type: ignore[arg-type]
                                max_retry_wait_ms=250)
    clock.advance(1000)
    waits = []
    for _ in range(3):
        assert svc.deliver_due() == 0
        assert offsets.get(1) == 0
        waits.append(svc.wait_ms())
        clock.advance(svc.wait_ms())
    assert waits == [100, 200, 250]  # doubling, capped
    assert svc.deliver_due() == 3
    assert delivered_keys(store) == sorted(keys)


def test_correct_delay_offsets_clamps_into_the_queue(tmp_path: Path, clock: FakeClock,
                                                     store: FileMessageStore) -> None:
    put_delayed(store, 3, level=2)
    svc, offsets = make_service(store, tmp_path, clock)
    offsets.update(2, 10)
    offsets.update(3, 4)
    assert svc.correct_delay_offsets() == {2: (10, 3), 3: (4, 0)}
    assert json.loads((tmp_path / "config" / "delayOffset.json").read_text())["offsetTable"] == {"2": 3, "3": 0}


def test_offsets_above_max_are_kept_while_dispatch_is_behind(tmp_path: Path, clock: FakeClock,
                                                             store: FileMessageStore) -> None:
    put_delayed(store, 3, level=2)
    put(store, "T", b"undispatched", level=2)  # the queue will grow to 4
    svc, offsets = make_service(store, tmp_path, clock)
    offsets.update(2, 4)
    assert svc.correct_delay_offsets() == {}
    assert offsets.get(2) == 4


def test_restart_delivers_the_rest_once(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    early = put_delayed(store, 4, level=1, prefix="e")
    late = put_delayed(store, 4, level=3, prefix="l")
    svc, _ = make_service(store, tmp_path, clock)
    clock.advance(1000)
    assert svc.deliver_due() == 4
    svc2, offsets2 = make_service(store, tmp_path, clock)  # a restart: offsets from disk
    assert offsets2.get(1) == 4
    assert svc2.recover() == {}
    clock.advance(2000)
    assert svc2.deliver_due() == 4
    assert svc2.deliver_due() == 0
    assert delivered_keys(store) == sorted(early + late)


class Crash(BaseException):
    """The process dies (nothing catches it)."""


class CrashAfterPuts:
    """Store proxy that dies right after its ``n``-th successful put_message, before anything else runs."""

    def __init__(self, store: FileMessageStore, n: int) -> None:
        self._store = store
        self.n = n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_message(self, *args: Any, **kwargs: Any) -> AppendResult:
        r = self._store.put_message(*args, **kwargs)
        self.n -= 1
        if self.n == 0:
            raise Crash
        return r


def _fill_to_file_end(store: FileMessageStore, leave: int) -> None:
    """Put a filler so that only ``leave`` bytes remain in the current commit-log file."""
    file_size = store.mapped_file_size_commitlog
    remaining = file_size - store.max_physical_offset % file_size
    body_len = remaining - leave - record_size(0, len("Filler"), 0)
    assert body_len > 0
    put(store, "Filler", b"f" * body_len)


@pytest.mark.parametrize(("crash_after", "roll_file"), [(1, False), (3, False), (5, False), (2, True)])
def test_crash_mid_batch_loses_and_duplicates_nothing(tmp_path: Path, crash_after: int, roll_file: bool) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock, file_size=64 * 1024)
    keys = put_delayed(store, 5, level=1)
    if roll_file:  # the first redelivered record will not fit: the journal's position is a blank marker
        _fill_to_file_end(store, leave=60)
    svc, _ = make_service(CrashAfterPuts(store, crash_after), tmp_path, clock)  # type: ignore[arg-type]
    clock.advance(1000)
    with pytest.raises(Crash):
        svc.deliver_due()
    store.crash()  # killed: no flush, no dispatch, abort file left
    store = make_store(tmp_path, clock, file_size=64 * 1024)
    try:
        drain(store)
        svc2, offsets2 = make_service(store, tmp_path, clock)
        assert offsets2.get(1) == 0  # the batch's offset never reached the disk
        assert svc2.recover() == {1: crash_after}
        svc2.correct_delay_offsets()
        while svc2.deliver_due():
            pass
        assert delivered_keys(store) == sorted(keys), f"crash after put {crash_after}"
        # and a second restart changes nothing
        svc3, offsets3 = make_service(store, tmp_path, clock)
        assert svc3.recover() == {}
        assert offsets3.get(1) == 5
        assert svc3.deliver_due() == 0
    finally:
        store.shutdown()


def test_without_the_journal_a_crash_mid_batch_duplicates(tmp_path: Path) -> None:
    """What the journal buys: RocketMQ's behaviour (re-delivery of the unpersisted batch)."""
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    put_delayed(store, 3, level=1)
    svc, _ = make_service(CrashAfterPuts(store, 2), tmp_path, clock, journal=False)  # type: ignore[arg-type]
    clock.advance(1000)
    with pytest.raises(Crash):
        svc.deliver_due()
    svc2, _ = make_service(store, tmp_path, clock, journal=False)
    while svc2.deliver_due():
        pass
    assert delivered_keys(store) == ["m0", "m0", "m1", "m1", "m2"]
    store.shutdown()


def test_journal_mismatch_redelivers(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    """A journal whose recorded copies are not in the commit log (lost with an OS crash) moves nothing."""
    put_delayed(store, 2, level=1)
    svc, offsets = make_service(store, tmp_path, clock)
    path = tmp_path / "config" / "delayDelivery.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"levels": {"1": {"queueOffset": 0, "commitLogOffset": store.max_physical_offset,
                                                 "deliveries": [[0, "T", 0, 1, 2, "m0"]]}}}))
    assert svc.recover() == {}
    assert offsets.get(1) == 0
    path.write_text('{"levels": {"1": {"queueOffset": "x"}}}')
    assert svc.recover() == {}  # malformed: logged and ignored


# --- the asyncio task, real time --------------------------------------------------------------------------------

def test_real_time_delivery_within_a_second_of_the_delay(tmp_path: Path) -> None:
    async def main() -> tuple[list[int], list[int]]:
        store = make_store(tmp_path)
        driver = DispatchDriver(store)  # dispatch as in the broker: woken by the append event, on this loop
        store.add_append_listener(driver.wake)
        dispatching = asyncio.get_running_loop().create_task(driver.run())
        delivered = asyncio.Event()
        seen: list[int] = []
        stored: list[int] = []

        def on_put(topic: str, result: AppendResult) -> None:
            seen.append(time.time_ns() // 1_000_000)
            if len(seen) == 3:
                delivered.set()

        svc, _ = make_service(store, tmp_path, store.config.clock_ms, on_put=on_put, max_wait_ms=5000)  # type: ignore[arg-type]
        await svc.start()
        try:
            for i in range(3):
                r = put(store, "T", b"x", level=1, props={UNIQ_KEY: f"rt{i}"})
                stored.append(r.store_timestamp)
                await asyncio.sleep(0.05)  # spread the deliver times apart
            await asyncio.wait_for(delivered.wait(), 5.0)
        finally:
            dispatching.cancel()
            await svc.stop()
            store.shutdown()
        return stored, seen

    stored, seen = asyncio.run(main())
    lateness = [d - (s + 1000) for s, d in zip(stored, seen, strict=True)]
    assert all(0 <= late < 1000 for late in lateness), f"delivered {lateness} ms after the 1 s delay"
    assert max(lateness) < 300, f"wake-up is not precise: {lateness} ms late"  # precise wake-up, not a tick


def test_start_twice_and_stop_twice(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    async def main() -> None:
        svc, _ = make_service(store, tmp_path, clock)
        await svc.start()
        assert svc.running
        with pytest.raises(RuntimeError, match="already running"):
            await svc.start()
        await svc.stop()
        await svc.stop()
        assert not svc.running
        assert svc.status()["running"] is False

    asyncio.run(main())


def test_notify_from_another_thread_wakes_the_task(tmp_path: Path, clock: FakeClock, store: FileMessageStore) -> None:
    """The task asleep for its 60 s bound is woken by a dispatch notification from another thread."""
    async def main() -> None:
        delivered = asyncio.Event()
        svc, _ = make_service(store, tmp_path, clock, max_wait_ms=60_000, on_put=lambda *_: delivered.set())
        await svc.start()
        try:
            await wait_until(lambda: svc.wait_ms() == 60_000, 5, "the first pass, then a sleep for the 60 s bound")
            put(store, "T", b"x", level=1, props={UNIQ_KEY: "n1"})
            clock.advance(1000)
            await asyncio.to_thread(drain, store)  # the listener fires in a worker thread
            await asyncio.wait_for(delivered.wait(), 5)  # long before the 60 s bound: the notification woke it
            assert svc.delivered == 1
        finally:
            await svc.stop()

    asyncio.run(main())


def test_bounded_wait_finds_units_without_a_notification(tmp_path: Path, clock: FakeClock,
                                                         store: FileMessageStore) -> None:
    """A lost dispatch notification costs at most ``max_wait_ms``, not the message."""
    async def main() -> None:
        delivered = asyncio.Event()
        offsets_only = make_service(store, tmp_path, clock, max_wait_ms=50)[0]
        svc = ScheduleMessageService(store, offsets_only._offsets, delay_levels_ms=LEVELS_MS, clock_ms=clock,
                                     max_wait_ms=50, on_put=lambda *_: delivered.set())  # no dispatch listener
        await svc.start()
        try:
            # The first pass looks at every level; the unit must come after it, found only by the bounded wait.
            await wait_until(lambda: svc.wait_ms() > 0, 5, "the first pass over every level")
            put(store, "T", b"x", level=1, props={UNIQ_KEY: "lost"})
            drain(store)
            clock.advance(1000)
            await asyncio.wait_for(delivered.wait(), 5)
            assert svc.delivered == 1
        finally:
            await svc.stop()

    asyncio.run(main())
