"""The duplicate window of idempotent sends (broker/dedup.py), table by table, with an injected clock.

Each rule must be able to fail: a known key answered with its first copy's place, a batch with some duplicates
answered per message, a key repeated inside one batch, expiry by store time and by the key bound, a key stored
again after it expired, the rebuild from records read back from a log (one FirstWrite per append, the first copy
of a key winning), topics kept apart, a message without a key never a duplicate.
"""

from __future__ import annotations

import pytest

from broker.dedup import Duplicates, DuplicateWindow, FirstWrite, StoredKey

HOST = b"\x7f\x00\x00\x01\x00\x00\x23\x8f"


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def fw(keys: str, queue_id: int = 0, queue_offset: int = 0, base: int = 1000, ts: int = 1_000_000,
       size: int = 100, topic: str = "T") -> FirstWrite:
    """An append of the one-letter ``keys`` to ``queue_id`` from ``queue_offset``, records of ``size`` bytes from
    commit-log offset ``base``."""
    ks = tuple(k.encode() for k in keys)
    return FirstWrite(ks, queue_id, queue_offset, tuple(base + size * i for i in range(len(ks))),
                      base + size * len(ks), ts, HOST, topic)


def window(clock: Clock, window_ms: int = 10_000, max_keys: int = 1000) -> DuplicateWindow:
    return DuplicateWindow(window_ms, max_keys, clock_ms=clock)


def keys(s: str) -> list[bytes]:
    return [k.encode() if k != "_" else b"" for k in s]


def store(w: DuplicateWindow, topic: str, first: FirstWrite) -> FirstWrite:
    first = first._replace(topic=topic)
    w.add(first)
    return first


@pytest.mark.parametrize("batch", ["d", "de", "xyz"])
def test_a_batch_of_new_unique_keys_is_answered_with_none(batch: str) -> None:
    w = window(Clock())
    store(w, "T", fw("abc"))
    assert w.lookup("T", keys(batch)) is None
    assert w.lookup("Other", keys("abc")) is None  # topics are apart
    assert w.duplicates == 0


@pytest.mark.parametrize(("batch", "verdicts", "new"), [
    ("a", [("A", 0)], []),                          # a single send sent again
    ("abc", [("A", 0), ("A", 1), ("A", 2)], []),    # a whole batch sent again
    ("cb", [("A", 2), ("A", 1)], []),               # in another order
    ("adb", [("A", 0), None, ("A", 1)], [1]),       # some keys new: each message on its own
    ("dd", [None, 0], [0]),                         # one key twice in a batch (two sends joined by the SDK)
    ("dad", [None, ("A", 0), 0], [0]),
    ("__", [None, None], [0, 1]),                   # no key: never a duplicate, not even of each other
])
def test_each_message_of_a_batch_gets_its_own_verdict(batch: str, verdicts: list[object], new: list[int]) -> None:
    w = window(Clock())
    first = store(w, "T", fw("abc"))
    found = w.lookup("T", keys(batch))
    assert isinstance(found, Duplicates)
    named = [(("A", v[1]) if v[0] is first else v) if isinstance(v, tuple) else v for v in found.verdicts]
    assert named == verdicts
    assert found.new == new and found.hits == len(batch) - len(new) == w.duplicates


def test_placements_give_the_first_copies_and_the_new_ones() -> None:
    w = window(Clock())
    store(w, "T", fw("abc", queue_id=2, queue_offset=40, base=1000))
    found = w.lookup("T", keys("cxax"))
    assert found is not None and found.new == [1]
    fresh = fw("x", queue_id=3, queue_offset=7, base=5000)
    assert found.placements(fresh) == [(2, 42, 1200), (3, 7, 5000), (2, 40, 1000), (3, 7, 5000)]
    assert found.latest() is not None and found.latest().end == 1300


def test_the_latest_first_write_is_the_one_that_ends_last() -> None:
    w = window(Clock())
    store(w, "T", fw("ab", base=1000))
    second = store(w, "T", fw("cd", base=3000))
    found = w.lookup("T", keys("ca"))
    assert found is not None and found.latest() is second and found.placements(None)[0][2] == 3000


@pytest.mark.parametrize(("age_ms", "known"), [(0, True), (9_999, True), (10_000, False), (60_000, False)])
def test_a_key_is_known_for_the_window_after_its_store_time(age_ms: int, known: bool) -> None:
    clock = Clock()
    w = window(clock)
    store(w, "T", fw("ab", ts=clock.now))
    clock.now += age_ms
    found = w.lookup("T", keys("a"))
    assert (found is not None and found.hits == 1) is known
    if not known:
        assert len(w) == 0  # expired: dropped from the window


def test_a_key_stored_again_after_it_expired_maps_to_its_new_copy() -> None:
    """Expiry runs from the front of the store order; a clock that stepped back leaves an expired FirstWrite
    behind a younger one. Its key, found by a lookup, is new; once stored again, the old FirstWrite's eviction
    must not take the new mapping with it."""
    clock = Clock()
    w = window(clock)
    store(w, "T", fw("z", ts=clock.now + 5_000))   # the younger one in front (stored before the clock stepped back)
    store(w, "T", fw("ab", ts=clock.now))
    clock.now += 12_000                             # "ab" is expired, "z" is not: "ab" stays behind it
    found = w.lookup("T", keys("a"))
    assert found is not None and found.new == [0]
    renewed = store(w, "T", fw("a", base=9000, ts=clock.now))
    clock.now += 4_000                              # "z" and then "ab" leave
    w.lookup("T", keys("q"))
    w.add(fw("q", ts=clock.now))
    assert w.lookup("T", keys("b")) is None         # "ab"'s other key left with it
    found = w.lookup("T", keys("a"))
    assert found is not None and found.verdicts == [(renewed, 0)]


def test_the_key_bound_evicts_the_oldest_appends_first() -> None:
    clock = Clock()
    w = window(clock, max_keys=4)
    store(w, "T", fw("ab"))
    store(w, "T", fw("cd"))
    store(w, "T", fw("e"))                          # 5 keys: "ab" leaves whole
    assert len(w) == 3 and w.evicted_early == 2
    assert w.lookup("T", keys("a")) is None
    found = w.lookup("T", keys("ce"))
    assert found is not None and found.hits == 2


def test_topics_are_apart_and_clear_forgets_everything() -> None:
    w = window(Clock())
    store(w, "T", fw("ab"))
    store(w, "U", fw("ab", queue_id=1))
    found = w.lookup("U", keys("a"))
    assert found is not None and found.placements(None) == [(1, 0, 1000)]
    w.clear()
    assert len(w) == 0 and w.lookup("T", keys("a")) is None


def test_the_window_and_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DuplicateWindow(0, 10)
    with pytest.raises(ValueError):
        DuplicateWindow(10, 0)


# --- rebuild from the log ------------------------------------------------------------------------------------

def rec(key: str, offset: int, queue_offset: int, *, topic: str = "T", queue_id: int = 0, ts: int = 995_000,
        size: int = 100) -> StoredKey:
    return StoredKey(topic, queue_id, queue_offset, offset, size, ts, key.encode(), HOST)


def runs(w: DuplicateWindow, topic: str, ks: str) -> list[tuple[int, int, int]]:
    found = w.lookup(topic, keys(ks))
    assert found is not None and not found.new, ks
    return found.placements(None)


@pytest.mark.parametrize(("records", "appends"), [
    # one batch: adjacent in the log and in the queue, one store time
    ([rec("a", 0, 5), rec("b", 100, 6), rec("c", 200, 7)], 1),
    # two appends in one ms to one queue, back to back: one run is as good (same answers)
    ([rec("a", 0, 5), rec("b", 100, 6), rec("c", 200, 7, ts=995_001)], 2),
    ([rec("a", 0, 5), rec("b", 100, 6, queue_id=1)], 2),      # another queue
    ([rec("a", 0, 5), rec("b", 148, 6)], 2),                  # not adjacent in the log (a DLedger entry head)
    ([rec("a", 0, 5), rec("b", 100, 9)], 2),                  # not adjacent in the queue
    ([rec("a", 0, 5), rec("b", 100, 6, topic="U")], 2),       # another topic
])
def test_a_rebuild_makes_one_first_write_per_append(records: list[StoredKey], appends: int) -> None:
    w = window(Clock())
    assert w.rebuild(records) == len(records) == w.rebuilt
    assert len(w._order) == appends
    for r in records:
        assert runs(w, r.topic, r.key.decode()) == [(r.queue_id, r.queue_offset, r.offset)]


def test_a_rebuild_keeps_the_first_copy_of_a_key_and_skips_what_is_expired() -> None:
    clock = Clock()
    w = window(clock)
    records = [rec("o", 0, 1, ts=clock.now - 10_000),           # as old as the window: left out
               rec("a", 100, 2), rec("b", 200, 3), rec("a", 300, 4), rec("c", 400, 5),
               StoredKey("T", 0, 6, 500, 100, 995_000, b"", HOST)]   # a record without a key
    assert w.rebuild(records) == 3
    assert w.lookup("T", keys("o")) is None
    assert runs(w, "T", "abc") == [(0, 2, 100), (0, 3, 200), (0, 5, 400)]


def test_a_rebuild_replaces_what_the_window_held() -> None:
    w = window(Clock())
    store(w, "T", fw("xy"))
    w.rebuild([rec("a", 0, 0)])
    assert w.lookup("T", keys("x")) is None and len(w) == 1


def test_a_rebuild_holds_the_newest_keys_within_the_bound() -> None:
    w = window(Clock(), max_keys=2)
    w.rebuild([rec("a", 0, 0), rec("b", 100, 1, ts=995_001), rec("c", 200, 2, ts=995_002)])
    assert len(w) == 2 and w.lookup("T", keys("a")) is None
    assert runs(w, "T", "bc") == [(0, 1, 100), (0, 2, 200)]
