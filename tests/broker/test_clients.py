"""Client table: announced heartbeat timeouts, clamping, and unregister."""

from __future__ import annotations

from broker.clients import MIN_CLIENT_TIMEOUT_MS, ClientTable


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def group(c: str) -> list[dict[str, object]]:
    return [{"group": c, "subscriptions": [{"topic": "T", "expression": "*"}]}]


def test_announced_timeout_expires_a_silent_client_sooner_than_the_default() -> None:
    clock = Clock()
    table = ClientTable(clock_ms=clock, expire_ms=120_000)
    table.heartbeat("fast", [], group("g"), timeout_ms=2000)
    table.heartbeat("slow", [], group("g"))
    clock.now += 2000
    assert table.consumer_ids("g") == ["fast", "slow"]  # exactly at the limit: still live
    clock.now += 1
    assert table.consumer_ids("g") == ["slow"]
    assert table.expire() == 1
    clock.now += 120_000
    assert table.consumer_ids("g") == []


def test_announced_timeout_is_clamped() -> None:
    clock = Clock()
    table = ClientTable(clock_ms=clock, expire_ms=10_000)
    table.heartbeat("tiny", [], group("g"), timeout_ms=1)
    table.heartbeat("huge", [], group("g"), timeout_ms=10**9)
    assert table.consumers["g"]["tiny"].timeout_ms == MIN_CLIENT_TIMEOUT_MS
    assert table.consumers["g"]["huge"].timeout_ms == 10_000


def test_unregister_removes_only_the_named_groups() -> None:
    table = ClientTable(clock_ms=Clock())
    table.heartbeat("c1", ["p"], group("g1") + group("g2"))
    assert table.unregister("c1", [], ["g1"]) == 1
    assert table.consumer_ids("g1") == [] and "g1" not in table.consumers
    assert table.consumer_ids("g2") == ["c1"]
    assert table.unregister("c1", [], ["g1"]) == 0
    assert table.unregister("c1", ["p"], []) == 1
