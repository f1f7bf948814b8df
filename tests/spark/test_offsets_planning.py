"""Offset JSON, the per-trigger rate limit, and partition planning (no Spark)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_connector.offsets import (
    QueueKey,
    offsets_from_json,
    offsets_to_json,
    parse_offsets_json,
    rate_limit,
)
from spark_connector.planning import MinOffsetsGate, QueueRange, plan_ranges, split_ranges

A0, A1, A10, B2 = (QueueKey("T", "broker-a", 0), QueueKey("T", "broker-a", 1), QueueKey("T", "broker-a", 10),
                   QueueKey("T", "broker-b", 2))


def test_canonical_json_is_sorted_whatever_the_input_order() -> None:
    one = offsets_to_json({B2: 5, A10: 1, A1: 3, A0: 2})
    two = offsets_to_json({A0: 2, A1: 3, A10: 1, B2: 5})
    assert json.dumps(one) == json.dumps(two) == json.dumps(one, sort_keys=True)
    assert one == {"T": {"broker-a": {"0": 2, "1": 3, "10": 1}, "broker-b": {"2": 5}}}


@given(st.dictionaries(
    st.builds(QueueKey, st.sampled_from(["T", "U"]), st.sampled_from(["a", "b", "c"]), st.integers(0, 40)),
    st.integers(0, 2**62), max_size=20,
))
def test_json_round_trip(offsets: dict[QueueKey, int]) -> None:
    doc = json.loads(json.dumps(offsets_to_json(offsets)))
    assert offsets_from_json(doc) == offsets


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ([1, 2], "JSON object"),
        ({"T": 3}, "broker names"),
        ({"T": {"a": []}}, "queue ids"),
        ({"T": {"a": {"x": 1}}}, "not an integer"),
        ({"T": {"a": {"-1": 1}}}, "non-negative"),
        ({"T": {"a": {"0": "5"}}}, "not an integer"),
        ({"T": {"a": {"0": True}}}, "not an integer"),
        ({"T": {"a": {"0": -3}}}, "negative"),
    ],
)
def test_bad_offset_json(doc: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_offsets_json(doc)


def test_markers_allowed_only_where_asked() -> None:
    assert parse_offsets_json({"T": {"a": {"0": -2, "1": -1}}}) == {
        QueueKey("T", "a", 0): -2, QueueKey("T", "a", 1): -1}
    with pytest.raises(ValueError, match="-1"):
        offsets_from_json({"T": {"a": {"0": -1}}})


def test_rate_limit_is_proportional_to_backlog() -> None:
    # maxOffsetsPerTrigger is shared in proportion to each queue's backlog:
    # backlogs 25/10/5 with a limit of 16 -> 10/4/2
    start = {A0: 0, A1: 0, B2: 0}
    latest = {A0: 25, A1: 10, B2: 5}
    assert rate_limit(start, latest, 16) == {A0: 10, A1: 4, B2: 2}
    assert rate_limit(start, latest, 100) == latest


def test_rate_limit_does_not_starve_small_queues_and_never_passes_latest() -> None:
    end = rate_limit({A0: 0, A1: 0}, {A0: 1000, A1: 1}, 10)
    assert end[A1] == 1  # a share below one is rounded up
    assert end[A0] == 9
    assert rate_limit({A0: 7}, {A0: 7}, 3) == {A0: 7}


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8),
       st.integers(1, 500))
def test_rate_limit_bounds(pairs: list[tuple[int, int]], limit: int) -> None:
    keys = [QueueKey("T", "a", i) for i in range(len(pairs))]
    start = {k: s for k, (s, _) in zip(keys, pairs, strict=True)}
    latest = {k: s + n for k, (s, n) in zip(keys, pairs, strict=True)}
    end = rate_limit(start, latest, limit)
    assert all(start[k] <= end[k] <= latest[k] for k in keys)
    read = sum(end[k] - start[k] for k in keys)
    assert read <= limit + len(keys)
    assert read == min(sum(n for _, n in pairs), read)


def test_plan_drops_empty_ranges_and_is_sorted() -> None:
    ranges = plan_ranges({A0: 5, A1: 3, B2: 0}, {B2: 4, A1: 3, A0: 9}, routes={"broker-a": {0: "h:1", 1: "h:2"}})
    assert [(r.key, r.start, r.end) for r in ranges] == [(A0, 5, 9), (B2, 0, 4)]
    assert ranges[0].broker_addrs == ((0, "h:1"), (1, "h:2"))
    assert ranges[1].broker_addrs == ()


def test_split_by_max_records() -> None:
    r = QueueRange("T", "a", 0, 0, 10)
    assert [(p.start, p.end) for p in split_ranges([r], max_records_per_partition=4)] == [(0, 3), (3, 6), (6, 10)]


def test_split_by_min_partitions_is_proportional() -> None:
    big, small = QueueRange("T", "a", 0, 0, 90), QueueRange("T", "a", 1, 0, 10)
    out = split_ranges([big, small], min_partitions=10)
    assert sum(1 for p in out if p.queue_id == 0) == 9
    assert sum(1 for p in out if p.queue_id == 1) == 1
    assert sum(p.size for p in out) == 100
    assert split_ranges([big, small], min_partitions=2) == [big, small]


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=6), st.integers(1, 30), st.integers(1, 5000))
def test_splitting_covers_every_offset_once(sizes: list[int], min_parts: int, max_records: int) -> None:
    ranges = [QueueRange("T", "a", i, 100, 100 + n) for i, n in enumerate(sizes)]
    out = split_ranges(ranges, min_partitions=min_parts, max_records_per_partition=max_records)
    for i, n in enumerate(sizes):
        pieces = sorted((p.start, p.end) for p in out if p.queue_id == i)
        assert pieces[0][0] == 100 and pieces[-1][1] == 100 + n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert all(e - s <= max_records for s, e in pieces)


@pytest.mark.parametrize(("steps", "expected"), [
    # (ms since start, new offsets) per trigger; min 10, maxTriggerDelay 6000 ms
    ([(0, 3)], [True]),                                          # the first trigger always runs
    ([(0, 3), (500, 4), (5_999, 4)], [True, False, False]),      # too few, delay not reached
    ([(0, 3), (500, 4), (6_000, 4)], [True, False, True]),       # maxTriggerDelay since the last let through
    ([(0, 3), (500, 11)], [True, True]),                         # enough new offsets
    ([(0, 3), (500, 11), (6_000, 2), (6_500, 2)], [True, True, False, True]),  # the delay restarts at 500
    ([(0, 0), (12_800, 4)], [True, True]),                       # a slow first batch: the delay counts from its plan
])
def test_min_offsets_gate_waits_for_enough_or_for_max_trigger_delay(steps: list[tuple[int, int]],
                                                                    expected: list[bool]) -> None:
    now = [0]
    gate = MinOffsetsGate(10, 6_000, lambda: now[0])
    got = []
    for at, new in steps:
        now[0] = 1_000_000 + at
        got.append(gate.admit(new))
    assert got == expected
