"""``python -m benchmarks isolation``: its pure parts (phase plan, percentiles, the /proc and Prometheus parsing)
and the mincore helper. The run itself needs cgroups, two CPUs and minutes: it is run by hand (docs/BENCHMARKS.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import ENTRIES
from benchmarks._mincore import FileResidency, resident_map
from benchmarks.isolation_bench import (
    FULL,
    QUICK,
    Phase,
    latencies_between,
    latencies_within,
    parse_proc_io,
    parse_proc_stat,
    percentile,
    plan_phases,
    prometheus_sum,
    quiet_windows,
    summarize,
)


def test_registered() -> None:
    assert ENTRIES["isolation"] == "benchmarks.isolation_bench:run"


def test_plan_interleaves_and_flips_the_order() -> None:
    plan = plan_phases(["group", "spark"])
    assert [(p.reader, p.pinned) for p in plan] == [
        ("none", False), ("busy", False),
        ("group", True), ("group", False), ("none", False),
        ("spark", False), ("spark", True), ("none", False),
    ]
    assert [p.label for p in plan[:4]] == ["no reader", "no reader, the other CPU busy",
                                          "consumer group, pinned to the master",
                                          "consumer group, following suggestions"]
    assert [p.is_replay for p in plan[:3]] == [False, False, True]
    assert plan_phases([], control=False) == [Phase("none")]


def test_every_reader_runs_once_each_way_between_no_reader_phases() -> None:
    plan = plan_phases(["a", "b", "c"], control=False)
    for reader in "abc":
        assert sorted(p.pinned for p in plan if p.reader == reader) == [False, True]
    assert all(plan[i].reader == "none" for i in range(0, len(plan), 3))


@pytest.mark.parametrize(
    ("values", "q", "expect"),
    [
        ([], 0.99, 0.0),
        ([5.0], 0.5, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),  # nearest rank: ceil(0.5 * 4) = 2nd
        ([1.0, 2.0, 3.0, 4.0], 0.51, 3.0),
        (list(map(float, range(1, 101))), 0.99, 99.0),
        (list(map(float, range(1, 1001))), 0.999, 999.0),
        (list(map(float, range(1, 101))), 0.999, 100.0),  # fewer than 1000 samples: p99.9 is the maximum
        ([1.0, 2.0], 0.0, 1.0),
        ([1.0, 2.0], 1.0, 2.0),
    ],
)
def test_percentile(values: list[float], q: float, expect: float) -> None:
    assert percentile(values, q) == expect


def test_summarize_in_ms() -> None:
    s = summarize([0.001 * i for i in range(1000, 0, -1)])  # 1..1000 ms, unsorted
    assert (s.count, s.p50, s.p99, s.p999) == (1000, pytest.approx(500), pytest.approx(990), pytest.approx(999))


def test_latencies_between_takes_sends_started_in_the_window() -> None:
    times = [0.0, 1.0, 2.0, 3.0]
    lats = [0.1, 0.2, 0.3, 0.4]
    assert latencies_between(times, lats, 1.0, 3.0) == [0.2, 0.3]


def test_quiet_windows_are_the_spans_the_masters_count_stood_still() -> None:
    samples = [(0.0, 10.0), (1.0, 10.0), (2.0, 15.0), (3.0, 15.0), (4.0, 15.0), (5.0, 20.0)]
    assert quiet_windows(samples, 0.5, 4.5) == [(0.5, 1.0), (2.0, 3.0), (3.0, 4.0)]
    assert quiet_windows(samples[:1], 0.0, 9.0) == []


def test_latencies_within_spans() -> None:
    times = [0.1, 0.6, 1.5, 2.2, 3.9, 4.0]
    lats = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert latencies_within(times, lats, [(0.5, 1.0), (2.0, 3.0), (3.0, 4.0)]) == [2.0, 4.0, 5.0]
    assert latencies_within(times, lats, []) == []


def test_parse_proc_files() -> None:
    io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n"
    assert parse_proc_io(io)["read_bytes"] == 4096
    # A command name with a space and a parenthesis, then state ppid pgrp session tty tpgid flags minflt cminflt
    # majflt cmajflt utime stime ...
    stat = "1234 (py (thon) x) S 1 1234 1234 0 -1 4194304 500 0 7 0 120 30 0 0 20 0 5 0"
    assert parse_proc_stat(stat) == (7, 150)


def test_parse_own_proc_files() -> None:
    with open("/proc/self/stat", encoding="utf-8") as f:
        majflt, ticks = parse_proc_stat(f.read())
    assert majflt >= 0 and ticks >= 0


def test_prometheus_sum() -> None:
    text = ('# HELP splitmq_pull_served_total Messages\n# TYPE splitmq_pull_served_total counter\n'
            'splitmq_pull_served_total{role="ASYNC_MASTER"} 10.0\nsplitmq_pull_served_total{role="SLAVE"} 5.0\n'
            'splitmq_pull_served_created{role="SLAVE"} 1.7e9\nsplitmq_pull_served_total_other 99\n')
    assert prometheus_sum(text, "splitmq_pull_served_total") == 15.0
    assert prometheus_sum(text, "absent") == 0.0


def test_profiles_replay_at_least_twice_the_masters_memory() -> None:
    assert FULL.history_factor >= 2 and QUICK.history_factor >= 2
    assert FULL.cgroup_bytes >= QUICK.cgroup_bytes


def test_mincore_sees_pages_a_read_brought_in(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (1 << 20))
    with open(path, "rb") as f:
        f.read()  # cached now (written a moment ago anyway)
    with FileResidency(str(path)) as res:
        assert len(res.pages()) == (1 << 20) // os.sysconf("SC_PAGE_SIZE")
        assert res.all_resident(0, 1 << 20)
        assert res.all_resident(4000, 10)
    assert all(resident_map([(0, str(path))], 0, 1 << 20))
    assert resident_map([(0, str(tmp_path / "missing"))], 0, 8192) == [False, False]
