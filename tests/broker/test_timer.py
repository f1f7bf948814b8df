"""Timed delivery without processes: the index as tables with an injected clock, the send rules, and the service
over a real file store with a settable clock (delivery at the time, bounded memory, exactly once after a crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.store.file_store import FileMessageStore
from broker.timer import TIMER_TOPIC, Entry, TimerIndex, TimerMessageService, deliver_ms_of, route_timer_send
from broker.timer.rules import has_timer, restore_timer_message
from client.errors import MessageIllegalError
from common.codec import BatchItem, batch_item
from common.properties import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    decode_properties,
    encode_properties,
)
from tests.broker.delay_support import BORN_HOST, T0, FakeClock, drain, make_store, read_all

# --- the index ------------------------------------------------------------------------------------------------


def _e(offset: int, deliver: int) -> Entry:
    return Entry(deliver, offset, 1000 + offset, 100)


@pytest.mark.parametrize(
    ("delivers", "now", "window", "max_entries", "in_memory", "far", "far_min"),
    [
        ([100, 200, 300], 0, 1000, 10, 3, 0, None),  # all within the window
        ([100, 5000, 300], 0, 1000, 10, 2, 1, 5000),  # one beyond it
        ([100, 200, 300], 0, 1000, 2, 2, 1, 300),  # the heap is full: the third waits in the log
        ([5000, 4000], 0, 1000, 10, 0, 2, 4000),
        ([1000, 1001], 0, 1000, 10, 1, 1, 1001),  # the window's end is inclusive
    ],
)
def test_admit_places_units_in_the_window_or_far(delivers: list[int], now: int, window: int, max_entries: int,
                                                 in_memory: int, far: int, far_min: int | None) -> None:
    index = TimerIndex(window_ms=window, max_entries=max_entries)
    for i, d in enumerate(delivers):
        index.admit(_e(i, d), now)
    assert (index.in_memory, index.far_count, index.far_min_ms) == (in_memory, far, far_min)
    assert index.read_offset == len(delivers)


def test_pop_due_is_earliest_first_and_bounded() -> None:
    index = TimerIndex(window_ms=10_000, max_entries=100)
    for i, d in enumerate([300, 100, 200, 900]):
        index.admit(_e(i, d), 0)
    assert index.pop_due(250, 10) == [_e(1, 100), _e(2, 200)]
    assert index.next_due_ms() == 300
    assert index.pop_due(1000, 1) == [_e(0, 300)]
    assert index.pop_due(1000, 10) == [_e(3, 900)]
    assert index.pop_due(10**9, 10) == []


@pytest.mark.parametrize(
    ("done", "commit", "left"),
    [
        ([0, 1, 2], 3, []),
        ([1, 2], 0, [1, 2]),  # out of order: 0 holds the commit back
        ([2, 0], 1, [2]),
        ([0, 3, 1], 2, [3]),
    ],
)
def test_mark_done_moves_the_commit_over_the_done_prefix(done: list[int], commit: int, left: list[int]) -> None:
    index = TimerIndex(window_ms=1000, max_entries=10)
    for i in range(4):
        index.admit(_e(i, 0), 0)
    index.mark_done(done)
    assert index.commit == commit
    assert sorted(index.done) == left
    assert TimerIndex.from_progress(index.progress(), window_ms=1000, max_entries=10).progress() == index.progress()


def test_rebuild_from_progress_skips_done_units() -> None:
    index = TimerIndex.from_progress({"commitOffset": 2, "done": [1, 3, 5]}, window_ms=1000, max_entries=10)
    assert (index.commit, sorted(index.done), index.read_offset) == (2, [3, 5], 2)
    for i in range(2, 7):
        index.admit(_e(i, 10), 0)
    assert [e.queue_offset for e in index.pop_due(10, 10)] == [2, 4, 6]


@pytest.mark.parametrize("bad", [{"commitOffset": "x"}, {"commitOffset": -1}, {"done": [None]}])
def test_malformed_progress_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="timer progress"):
        TimerIndex.from_progress(bad, window_ms=1000, max_entries=10)


def test_far_units_come_back_when_the_window_reaches_them() -> None:
    index = TimerIndex(window_ms=1000, max_entries=10)
    units = [_e(0, 500), _e(1, 5000), _e(2, 3000), _e(3, 9000)]
    for u in units:
        index.admit(u, 0)
    assert (index.in_memory, index.far_count, index.rescan_due_ms()) == (1, 3, 2000)
    assert not index.needs_rescan(1999)
    assert index.needs_rescan(2000)
    start, end = index.begin_rescan()
    assert (start, end) == (0, 4)
    for u in units:  # the caller reads [start, end) again
        index.readmit(u, 2000)
    assert (index.in_memory, index.far_count, index.far_min_ms) == (2, 2, 5000)  # unit 0 not twice
    assert [e.queue_offset for e in index.pop_due(3000, 10)] == [0, 2]


def test_requeue_puts_undelivered_entries_back() -> None:
    index = TimerIndex(window_ms=1000, max_entries=10)
    index.admit(_e(0, 10), 0)
    taken = index.pop_due(10, 10)
    index.requeue(taken)
    index.requeue(taken)  # twice: still once
    assert index.pop_due(10, 10) == taken


def test_units_must_be_read_in_order() -> None:
    index = TimerIndex(window_ms=1000, max_entries=10)
    with pytest.raises(ValueError, match="out of order"):
        index.admit(_e(1, 0), 0)


# --- the send rules ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, None),
        ({TIMER_DELIVER_MS: "5000"}, 5000),
        ({TIMER_DELAY_SEC: "3"}, T0 + 3000),
        ({TIMER_DELAY_MS: "1500"}, T0 + 1500),
        ({TIMER_DELAY_SEC: "1", TIMER_DELIVER_MS: "5"}, T0 + 1000),  # a delay wins
        ({TIMER_DELAY_MS: "7", TIMER_DELIVER_MS: "5"}, T0 + 7),
    ],
)
def test_deliver_ms_of(props: dict[str, str], expected: int | None) -> None:
    assert deliver_ms_of(props, T0) == expected


@pytest.mark.parametrize("raw", ["-1", "1.5", "", "x", "9" * 40, "\u0663"])
def test_deliver_ms_of_refuses_malformed_values(raw: str) -> None:
    with pytest.raises(MessageIllegalError, match="TIMER_DELAY_SEC"):
        deliver_ms_of({TIMER_DELAY_SEC: raw}, T0)


def _item(props: dict[str, str]) -> BatchItem:
    return batch_item(b"body", encode_properties(props), born_timestamp=T0)


def test_route_timer_send_parks_a_timed_message() -> None:
    routed = route_timer_send("T", 3, [_item({UNIQ_KEY: "u", TIMER_DELAY_SEC: "10"})], T0, 60)
    assert routed is not None
    topic, qid, (item,) = routed
    assert (topic, qid) == (TIMER_TOPIC, 0)
    props = decode_properties(item.properties)
    assert props[TIMER_DELIVER_MS] == str(T0 + 10_000)
    assert (props[REAL_TOPIC], props[REAL_QID], props[UNIQ_KEY]) == ("T", "3", "u")
    real_topic, real_qid, restored = restore_timer_message(topic, qid, props)
    assert (real_topic, real_qid) == ("T", 3)
    assert TIMER_DELAY_SEC not in restored and REAL_TOPIC not in restored
    assert restored[TIMER_DELIVER_MS] == str(T0 + 10_000)


@pytest.mark.parametrize(
    ("props", "n"),
    [({}, 1), ({TIMER_DELIVER_MS: str(T0)}, 1), ({TIMER_DELIVER_MS: str(T0 - 5)}, 1), ({TIMER_DELAY_SEC: "0"}, 2)],
)
def test_nothing_to_wait_for_is_not_parked(props: dict[str, str], n: int) -> None:
    assert route_timer_send("T", 0, [_item(props)] * n, T0, 60) is None


@pytest.mark.parametrize(
    ("items", "match"),
    [
        ([{TIMER_DELAY_SEC: "5"}, {}], "cannot be sent in a batch"),
        ([{TIMER_DELAY_SEC: "61"}], "beyond timerMaxDelaySec"),
        ([{TIMER_DELAY_SEC: "5", "DELAY": "2"}], "both a delay level and a timer"),
        ([{TIMER_DELIVER_MS: "soon"}], "not a non-negative integer"),
    ],
)
def test_route_timer_send_refuses(items: list[dict[str, str]], match: str) -> None:
    with pytest.raises(MessageIllegalError, match=match):
        route_timer_send("T", 0, [_item(p) for p in items], T0, 60)


def test_has_timer_is_a_byte_search() -> None:
    assert not has_timer([_item({UNIQ_KEY: "u", "k": "v"})])
    assert has_timer([_item({}), _item({TIMER_DELAY_SEC: "1"})])


# --- the service over a real store ------------------------------------------------------------------------------


def _park(store: FileMessageStore, key: str, deliver_ms: int, *, topic: str = "T", queue_id: int = 0) -> None:
    routed = route_timer_send(topic, queue_id, [_item({UNIQ_KEY: key, TIMER_DELIVER_MS: str(deliver_ms)})], T0,
                              7 * 24 * 3600)
    assert routed is not None
    r = store.append_batch(*routed, born_host=BORN_HOST)
    assert r.status.value == "PUT_OK", r


def _service(store: FileMessageStore, root: Path, clock: FakeClock, *, window_ms: int = 60_000,
             max_entries: int = 1000, batch_size: int = 32, done_max: int = 10_000) -> TimerMessageService:
    svc = TimerMessageService(store, clock_ms=clock, progress_path=root / "config" / "timerProgress.json",
                              window_ms=window_ms, max_entries=max_entries, batch_size=batch_size, done_max=done_max)
    svc.recover()
    return svc


def _delivered(store: FileMessageStore) -> list[str]:
    return [m.properties[UNIQ_KEY] for m in read_all(store, "T", 0)]


def test_messages_are_delivered_at_their_time_in_time_order(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    for key, at in [("c", 3000), ("a", 1000), ("b", 2000)]:
        _park(store, key, T0 + at)
    drain(store)
    svc = _service(store, tmp_path, clock)
    assert svc.run_once() == 0
    assert svc.wait_ms() == 1000  # sleeps until the first is due: no tick
    clock.advance(1999)
    assert svc.run_once() == 1
    assert _delivered(store) == ["a"]
    clock.advance(5000)
    assert svc.run_once() == 2
    assert _delivered(store) == ["a", "b", "c"]
    copy = read_all(store, "T", 0)[0]
    assert REAL_TOPIC not in copy.properties and copy.properties[TIMER_DELIVER_MS] == str(T0 + 1000)
    store.shutdown()


def test_far_messages_wait_in_the_log_and_memory_stays_bounded(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    hour = 3_600_000
    for i in range(50):
        _park(store, f"m{i:02d}", T0 + (i + 1) * hour)  # one an hour, for two days
    drain(store)
    svc = _service(store, tmp_path, clock, window_ms=2 * hour, max_entries=5)
    svc.run_once()
    assert (svc.index.in_memory, svc.index.far_count) == (2, 48)
    delivered = 0
    for _ in range(60):
        clock.advance(hour)
        delivered += svc.run_once()
        assert svc.index.in_memory <= 5
    assert delivered == 50
    assert _delivered(store) == [f"m{i:02d}" for i in range(50)]
    store.shutdown()


def test_a_crash_after_a_delivery_repeats_none(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    for i in range(10):
        _park(store, f"m{i}", T0 + 1000 * (i % 3 + 1))  # three times, units out of time order
    drain(store)
    svc = _service(store, tmp_path, clock, batch_size=2)
    clock.advance(2000)
    first = svc.run_once()
    assert 0 < first < 10
    # A crash: no stop(), so the progress on disk is the journal written before the last batch.
    svc2 = _service(store, tmp_path, clock)
    assert svc2.run_once() == 0  # nothing due yet was left undelivered
    clock.advance(5000)
    assert svc2.run_once() == 10 - first
    keys = _delivered(store)
    assert sorted(keys) == sorted(f"m{i}" for i in range(10))
    store.shutdown()


def test_a_crash_between_the_journal_and_the_puts_delivers_the_batch_again(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    for i in range(4):
        _park(store, f"m{i}", T0 + 1000)
    drain(store)
    svc = _service(store, tmp_path, clock)
    clock.advance(1000)
    svc.run_once()
    assert len(_delivered(store)) == 4
    # The journal of a batch whose puts never happened: its messages are not done.
    journal = svc._file.load()
    assert journal is not None and len(journal["batch"]["deliveries"]) == 4
    journal["batch"]["commitLogOffset"] = store.max_physical_offset  # nothing there
    journal["done"], journal["commitOffset"] = [], 0
    svc._file.save(journal)
    svc2 = _service(store, tmp_path, clock)
    assert svc2.run_once() == 4  # at least once: delivered again, not lost
    store.shutdown()


def test_a_far_unit_holding_the_commit_back_is_rolled_so_progress_stays_bounded(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    hour = 3_600_000
    _park(store, "far", T0 + hour)
    near = [f"n{i:02d}" for i in range(40)]
    for i, key in enumerate(near):
        _park(store, key, T0 + 1000 + i)
    drain(store)
    svc = _service(store, tmp_path, clock, window_ms=10_000, done_max=10, batch_size=4)
    clock.advance(2000)
    for _ in range(5):
        svc.run_once()
        drain(store)  # the rolled copy reaches the queue
    assert sorted(_delivered(store)) == near
    assert svc.index.commit == 41 and not svc.index.done  # the far unit was written again at offset 41
    assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 42
    # A crash after the roll: the journal says the copy is in the log, so it is not rolled twice.
    svc2 = _service(store, tmp_path, clock, window_ms=10_000)
    svc2.run_once()
    assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 42
    clock.advance(hour)
    assert svc2.run_once() == 1
    assert sorted(_delivered(store)) == sorted([*near, "far"])
    store.shutdown()


def test_progress_beyond_the_queue_is_rebuilt_from_what_the_queue_holds(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    for i in range(3):
        _park(store, f"old{i}", T0 + 1000)
    drain(store)
    # Progress of a longer log (a DLedger member whose uncommitted tail was cut): units 0-2 are done by its
    # account, but it must not hide the units written from now on at offsets 3, 4, ...
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "timerProgress.json").write_text('{"commitOffset": 100, "done": [101]}')
    svc = _service(store, tmp_path, clock)
    svc.run_once()
    for i in range(2):
        _park(store, f"new{i}", T0 + 1000)
    drain(store)
    svc.notify_dispatched(0, 5)
    clock.advance(1000)
    assert svc.run_once() == 2
    assert _delivered(store) == ["new0", "new1"]
    store.shutdown()
