"""Pure replication state: start offset, isSlaveOK, in-sync count, ack waiters, reconnect back-off."""

from __future__ import annotations

import itertools

import pytest

from broker.ha.config import HAConfig
from broker.ha.progress import (
    AckWaiters,
    Backoff,
    ReplicationState,
    SlaveProgress,
    TooManyWaitersError,
    is_slave_ok,
    slave_in_sync,
    transfer_start_offset,
)

GiB = 1 << 30


@pytest.mark.parametrize(
    ("request_offset", "master_max", "file_size", "expected"),
    [
        (0, 0, GiB, 0),  # both empty
        (0, 2_500_000_000, GiB, 2_147_483_648),  # SEMANTICS 2.4 example: the master's last file
        (0, 2 * GiB, GiB, 2 * GiB),  # exactly at a boundary: the (empty) next file
        (0, 100, 64, 64),
        (5000, 9000, 64, 5000),  # a non-empty slave resumes from its own offset
        (9999, 9000, 64, 9999),  # even beyond the master (it then only gets heartbeats)
    ],
)
def test_transfer_start_offset(request_offset: int, master_max: int, file_size: int, expected: int) -> None:
    assert transfer_start_offset(request_offset, master_max, file_size) == expected


def test_transfer_start_offset_needs_a_report() -> None:
    with pytest.raises(ValueError, match="not reported"):
        transfer_start_offset(-1, 100, 64)


@pytest.mark.parametrize(
    ("connections", "put_where", "push2", "gap", "ok"),
    [
        (0, 100, 100, 1000, False),  # no slave
        (1, 100, 100, 1000, True),
        (1, 1100, 100, 1000, False),  # exactly the gap: strict <
        (1, 1099, 100, 1000, True),
        (2, 5000, 0, 1000, False),
        (1, 0, 0, 1, True),
    ],
)
def test_is_slave_ok(connections: int, put_where: int, push2: int, gap: int, ok: bool) -> None:
    assert is_slave_ok(connections, put_where, push2, gap) is ok


@pytest.mark.parametrize(
    ("put_where", "ack", "gap", "in_sync"),
    [(100, 100, 10, True), (110, 100, 10, False), (109, 100, 10, True), (5, -1, 10, True), (9, -1, 10, False)],
)
def test_slave_in_sync(put_where: int, ack: int, gap: int, in_sync: bool) -> None:
    assert slave_in_sync(put_where, ack, gap) is in_sync


def test_first_report_is_the_request_later_ones_are_acks() -> None:
    p = SlaveProgress("s:1")
    assert (p.request_offset, p.ack_offset) == (-1, -1)
    assert p.on_report(500) is True
    assert p.on_report(700) is False
    assert (p.request_offset, p.ack_offset) == (500, 700)


def test_ack_completes_waiters_in_offset_order_and_shares_acks() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    for offset, name in [(300, "c"), (100, "a"), (200, "b"), (400, "d")]:
        assert w.add(offset, name) is not None
    assert w.on_ack(50) == []
    assert w.on_ack(250) == ["a", "b"]  # one ack, two waiters (group commit)
    assert len(w) == 2
    assert w.on_ack(1000) == ["c", "d"]
    assert len(w) == 0


def test_push2slave_max_offset_is_monotonic() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    w.on_ack(500)
    w.on_ack(200)  # a slower slave reports later: the best ack stays
    assert w.push2slave_max_offset == 500
    assert w.add(400, "x") is None  # already satisfied: nothing to wait for
    assert w.add(500, "y") is None
    assert w.add(501, "z") is not None


def test_expired_waiter_is_not_completed_by_a_later_ack() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    a, b = w.add(100, "a"), w.add(200, "b")
    assert a is not None and b is not None
    assert w.expire(a) is True
    assert w.expire(a) is False
    assert w.on_ack(300) == ["b"]
    assert w.expire(b) is False  # the ack got there first


def test_waiter_bound_is_named() -> None:
    w: AckWaiters[int] = AckWaiters(max_waiters=2)
    w.add(10, 1)
    w.add(20, 2)
    with pytest.raises(TooManyWaitersError, match="ha_max_ack_waiters=2"):
        w.add(30, 3)
    w.on_ack(10)
    assert w.add(30, 3) is not None  # room again after an ack


def test_many_expiries_do_not_grow_the_heap_without_bound() -> None:
    w: AckWaiters[int] = AckWaiters(max_waiters=10)
    for i in range(10_000):
        waiter = w.add(1000 + i, i)
        assert waiter is not None
        w.expire(waiter)
    assert len(w) == 0
    assert len(w._heap) <= 1024 + 1


def test_drain_returns_pending_tokens() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    w.add(20, "b")
    w.add(10, "a")
    expired = w.add(30, "c")
    assert expired is not None
    w.expire(expired)
    assert w.drain() == ["a", "b"]
    assert len(w) == 0
    assert w.on_ack(100) == []


def test_replication_state_table() -> None:
    """A scenario as a table: (event, argument) -> (is_slave_ok(put_where), in_sync count, completed)."""
    s: ReplicationState[str] = ReplicationState(max_gap=1000, max_waiters=100)
    put_where = 5000
    s.waiters.add(4500, "w1")
    s.waiters.add(5000, "w2")
    steps: list[tuple[str, tuple[int, ...], bool, int, list[str]]] = [
        ("add", (1,), False, 0, []),  # connected, no report: ack -1, push2 0 -> 5000 behind
        ("report", (1, 3000), False, 0, []),
        ("add", (2,), False, 0, []),
        ("report", (2, 4200), True, 1, []),
        ("report", (1, 4600), True, 2, ["w1"]),
        ("remove", (2,), True, 1, []),
        ("remove", (1,), False, 0, []),  # push2 stays at 4600, but nobody is connected
        ("add", (3,), True, 0, []),  # a new slave: push2 (kept) is within the gap
        ("report", (3, 5000), True, 1, ["w2"]),
    ]
    for event, args, ok, in_sync, completed in steps:
        done: list[str] = []
        if event == "add":
            s.add_slave(args[0], f"slave{args[0]}")
        elif event == "remove":
            s.remove_slave(args[0])
        else:
            _, done = s.on_report(args[0], args[1])
        assert (s.is_slave_ok(put_where), s.in_sync_slave_count(put_where), done) == (ok, in_sync, completed), (
            event, args
        )


def test_replication_state_rejects_unknown_and_duplicate_connections() -> None:
    s: ReplicationState[str] = ReplicationState(max_gap=10, max_waiters=10)
    s.add_slave(1, "a")
    with pytest.raises(ValueError, match="already"):
        s.add_slave(1, "a")
    with pytest.raises(KeyError, match="unknown connection id 2"):
        s.on_report(2, 0)


def test_backoff_doubles_with_jitter_and_is_bounded() -> None:
    rolls = itertools.cycle([1.0, 0.0])
    b = Backoff(100, 1000, lambda: next(rolls) * 0.999999)
    delays = [b.next_ms() for _ in range(8)]
    assert all(100 <= d <= 1000 for d in delays)
    assert delays[0] == 100 and delays[2] == 399 and delays[3] == 400  # 400*[~1.0, 0.5]
    assert delays[6] == 999 and delays[7] == 500  # capped at max, jitter keeps half
    b.reset()
    assert b.attempt == 0 and b.next_ms() == 100


def test_backoff_validates_bounds() -> None:
    with pytest.raises(ValueError, match="min_ms <= max_ms"):
        Backoff(10, 5, lambda: 0.5)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="ha_transfer_batch_size"):
        HAConfig(ha_transfer_batch_size=0)
    with pytest.raises(ValueError, match="reconnect_backoff_min_ms"):
        HAConfig(reconnect_backoff_min_ms=10, reconnect_backoff_max_ms=5)
    with pytest.raises(ValueError, match="ha_slave_read_buffer_bytes"):
        HAConfig(ha_transfer_batch_size=1 << 20, ha_slave_read_buffer_bytes=1 << 20)
    assert HAConfig(ha_send_heartbeat_interval_ms=200, ha_housekeeping_interval_ms=100).tick_ms == 25
    assert HAConfig().tick_ms == 1000
