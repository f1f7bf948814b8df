"""``memory`` of ``suggestPullingFromSlave``: the pure rule (RAM, cgroup limit, ratio) and the limit's refresh."""

from __future__ import annotations

import pytest

from broker.store.read_memory import MemoryLimitCache, memory_bytes_for_reads

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    ("ram", "limit", "ratio", "expect"),
    [
        pytest.param(24 * GIB, None, 40, int(24 * GIB * 0.4), id="no-limit: RAM"),
        pytest.param(24 * GIB, 256 * MIB, 40, int(256 * MIB * 0.4), id="limit below RAM"),
        pytest.param(4 * GIB, 64 * GIB, 40, int(4 * GIB * 0.4), id="limit above RAM: RAM"),
        pytest.param(24 * GIB, 256 * MIB, 0, 0, id="ratio 0: everything cold"),
        pytest.param(24 * GIB, 256 * MIB, 100, 256 * MIB, id="ratio 100"),
        pytest.param(1000, 999, 40, 399, id="truncated like Java's long cast"),
    ],
)
def test_memory_bytes_for_reads(ram: int, limit: int | None, ratio: int, expect: int) -> None:
    assert memory_bytes_for_reads(ram, limit, ratio) == expect


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize(
    ("steps", "expect_reads"),
    [
        pytest.param([0, 0, 0], [1, 1, 1], id="read once, then cached"),
        pytest.param([0, 9_999, 1], [1, 1, 2], id="read again at the interval"),
        pytest.param([0, 25_000, 25_000], [1, 2, 3], id="every call past the interval reads"),
        pytest.param([0, -1, 0], [1, 2, 2], id="a clock stepping back reads again"),
    ],
)
def test_refresh(steps: list[int], expect_reads: list[int]) -> None:
    clock = Clock()
    values = iter(range(100))
    cache = MemoryLimitCache(lambda: next(values), clock, 10_000)
    got = []
    for step in steps:
        clock.now += step
        cache.limit_bytes()
        got.append(cache.reads)
    assert got == expect_reads


def test_the_cached_value_is_the_last_reading() -> None:
    clock = Clock()
    readings = iter([None, 512 * MIB])
    cache = MemoryLimitCache(lambda: next(readings), clock, 10_000)
    assert cache.limit_bytes() is None
    clock.now += 10_000
    assert cache.limit_bytes() == 512 * MIB
    assert cache.limit_bytes() == 512 * MIB


def test_refresh_must_be_positive() -> None:
    with pytest.raises(ValueError, match="refresh_ms"):
        MemoryLimitCache(lambda: None, Clock(), 0)
