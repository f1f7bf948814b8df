"""Pure replication state: start offset, the in-sync rule, ack waiters per connected slave, reconnect back-off."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ha.config import HAConfig
from broker.ha.progress import (
    AckWaiters,
    Backoff,
    ReplicationState,
    SlaveProgress,
    TooManyWaitersError,
    report_violation,
    slave_acks_needed,
    slave_in_sync,
    transfer_start_offset,
)

GiB = 1 << 30


@pytest.mark.parametrize(
    ("request_offset", "master_max", "file_size", "expected"),
    [
        (0, 0, GiB, 0),  # both empty
        (0, 2_500_000_000, GiB, 2_147_483_648),  # docs/BEHAVIOUR.md 2.4 example: the master's last file
        (0, 2 * GiB, GiB, 2 * GiB),  # exactly at a boundary: the (empty) next file
        (0, 100, 64, 64),
        (5000, 9000, 64, 5000),  # a non-empty slave resumes from its own offset
        (9999, 9000, 64, 9999),  # even beyond the master (it then only gets heartbeats)
    ],
)
def test_transfer_start_offset(request_offset: int, master_max: int, file_size: int, expected: int) -> None:
    assert transfer_start_offset(request_offset, master_max, file_size) == expected


@pytest.mark.parametrize(
    ("request_offset", "master_min", "expected"),
    [
        (5000, 4096, 5000),  # the master still has the slave's next byte
        (4096, 4096, 4096),
        (1000, 4096, 4096),  # retention deleted it: the master's first file
        (0, 4096, 8192),  # an empty slave still gets the last file
    ],
)
def test_transfer_start_offset_after_retention(request_offset: int, master_min: int, expected: int) -> None:
    assert transfer_start_offset(request_offset, 9000, 4096, master_min) == expected


@pytest.mark.parametrize(
    ("request_offset", "oldest_waiting_end", "master_min", "expected"),
    [
        (0, None, 0, 8192),  # nothing waits: the last file
        (0, 9000, 0, 8192),  # the oldest waiting send is in the last file already
        (0, 8192, 0, 4096),  # it ends exactly at the last file's start: its bytes are in the file before
        (0, 100, 0, 0),  # a send in the first file still waits: streamed from there
        (0, 100, 4096, 4096),  # (retention never deletes that young a file; the master's first file at most)
        (5000, 100, 0, 5000),  # a slave with a log resumes from its own offset, whatever waits
    ],
)
def test_an_empty_slave_is_streamed_from_the_oldest_waiting_sends_file(request_offset: int, oldest_waiting_end: int,
                                                                        master_min: int, expected: int) -> None:
    assert transfer_start_offset(request_offset, 9000, 4096, master_min, oldest_waiting_end) == expected


def test_the_oldest_waiting_end_is_the_lowest_head() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    assert w.oldest_end() is None
    w.add(300, "a", acks=2)
    w.add(200, "b")
    w.add(500, "c")
    assert w.oldest_end() == 200
    w.on_acks([250, 250])
    assert w.oldest_end() == 300
    w.expire(w.add(100, "expired long ago"))  # expired waiters stay in the heaps until acks pass them
    assert w.oldest_end() == 300
    assert len(w) == 2
    w.drain()
    assert w.oldest_end() is None


def test_transfer_start_offset_needs_a_report() -> None:
    with pytest.raises(ValueError, match="not reported"):
        transfer_start_offset(-1, 100, 64)


@pytest.mark.parametrize(
    ("put_where", "ack", "gap", "in_sync"),
    [(100, 100, 10, True), (110, 100, 10, False), (109, 100, 10, True), (5, -1, 10, True), (9, -1, 10, False)],
)
def test_slave_in_sync(put_where: int, ack: int, gap: int, in_sync: bool) -> None:
    assert slave_in_sync(put_where, ack, gap) is in_sync


@pytest.mark.parametrize(
    ("replicas", "min_replicas", "auto", "in_sync_slaves", "needed"),
    [
        # the default (decision 5): one slave ack, SLAVE_NOT_AVAILABLE (None) when no slave is in sync
        (2, 1, False, 0, None),
        (2, 1, False, 1, 1),
        (2, 1, False, 3, 1),  # more in-sync slaves do not make a send wait for more acks
        # inSyncReplicas=1 (RocketMQ 5's default): the master's copy is enough, whatever the slaves do
        (1, 1, False, 0, 0),
        (1, 1, False, 2, 0),
        # three copies: two slave acks, and both slaves must be in sync
        (3, 1, False, 1, None),
        (3, 1, False, 2, 2),
        # enableAutoInSyncReplicas: as many copies as are in sync, between min and inSyncReplicas
        (3, 2, True, 2, 2),
        (3, 2, True, 1, 1),
        (3, 2, True, 0, None),  # below minInSyncReplicas: at once
        (3, 1, True, 0, 0),  # min 1: degrade to the master alone
        (3, 3, True, 1, None),
        (2, 2, True, 5, 1),
    ],
)
def test_slave_acks_needed(replicas: int, min_replicas: int, auto: bool, in_sync_slaves: int,
                           needed: int | None) -> None:
    assert slave_acks_needed(replicas, min_replicas, auto, in_sync_slaves) == needed


def test_first_report_is_the_request_later_ones_are_acks() -> None:
    p = SlaveProgress("s:1")
    assert (p.request_offset, p.ack_offset) == (-1, -1)
    assert p.on_report(500) is True
    assert p.on_report(700) is False
    assert (p.request_offset, p.ack_offset) == (500, 700)


def test_acks_complete_waiters_in_offset_order_and_share_acks() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    for offset, name in [(300, "c"), (100, "a"), (200, "b"), (400, "d")]:
        w.add(offset, name)
    assert w.on_acks([50]) == []
    assert w.on_acks([250]) == ["a", "b"]  # one ack, two waiters (group commit)
    assert len(w) == 2
    assert w.on_acks([1000]) == ["c", "d"]
    assert len(w) == 0


def test_a_waiter_needing_two_acks_waits_for_the_second_best_ack() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    w.add(100, "one", acks=1)
    w.add(100, "two", acks=2)
    w.add(100, "three", acks=3)
    assert w.on_acks([500]) == ["one"]  # one slave connected: groups needing more stay
    assert w.on_acks([500, 90]) == []  # the second slave is behind
    assert w.on_acks([500, 100]) == ["two"]
    assert w.on_acks([500, 100, 99]) == []
    assert len(w) == 1
    with pytest.raises(ValueError, match="at least one slave ack"):
        w.add(100, "none", acks=0)


def test_expired_waiter_is_not_completed_by_a_later_ack() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    a, b = w.add(100, "a"), w.add(200, "b")
    assert w.expire(a) is True
    assert w.expire(a) is False
    assert w.on_acks([300]) == ["b"]
    assert w.expire(b) is False  # the ack got there first


def test_waiter_bound_is_named() -> None:
    w: AckWaiters[int] = AckWaiters(max_waiters=2)
    w.add(10, 1)
    w.add(20, 2, acks=2)
    with pytest.raises(TooManyWaitersError, match="ha_max_ack_waiters=2"):
        w.add(30, 3)
    w.on_acks([10])
    assert w.add(30, 3) is not None  # room again after an ack


def test_many_expiries_do_not_grow_the_heaps_without_bound() -> None:
    w: AckWaiters[int] = AckWaiters(max_waiters=10)
    for i in range(10_000):
        w.expire(w.add(1000 + i, i, acks=1 + i % 3))
    assert len(w) == 0
    assert sum(len(h) for h in w._heaps.values()) <= 1024 + 1


def test_drain_returns_pending_tokens() -> None:
    w: AckWaiters[str] = AckWaiters(max_waiters=10)
    w.add(20, "b", acks=2)
    w.add(10, "a")
    w.expire(w.add(30, "c"))
    assert w.drain() == ["a", "b"]
    assert len(w) == 0
    assert w.on_acks([100, 100]) == []


Step = tuple[str, tuple[int, ...], bool, int, list[str]]


def _play(s: ReplicationState[str], put_where: int, steps: list[Step]) -> None:
    """Each step: (event, args) -> (is_slave_ok(put_where), in-sync slave count, waiter tokens completed)."""
    for event, args, ok, in_sync, completed in steps:
        done: list[str] = []
        if event == "add":
            s.add_slave(args[0], f"slave{args[0]}")
        elif event == "remove":
            s.remove_slave(args[0])
        elif event == "wait":
            assert s.wait(args[0], f"w{args[0]}", acks=args[1]) is not None, (event, args)
        else:
            _, done = s.on_report(args[0], args[1])
        assert (s.is_slave_ok(put_where), s.in_sync_slave_count(put_where), done) == (ok, in_sync, completed), (
            event, args
        )


def test_replication_state_counts_only_connected_slaves() -> None:
    """Issue 10: the in-sync slave dies, a fresh one is still far behind. 4.9.3 kept the dead slave's ack
    (push2SlaveMaxOffset 4900) and said "slave OK"; here nothing connected is in sync, so the send answers at once."""
    s: ReplicationState[str] = ReplicationState(max_gap=1000, max_waiters=100)
    put_where = 5000
    _play(s, put_where, [
        ("add", (1,), False, 0, []),  # connected, no report: ack -1 -> 5001 behind
        ("report", (1, 3000), False, 0, []),
        ("add", (2,), False, 0, []),
        ("report", (2, 4900), True, 1, []),
        ("report", (1, 4600), True, 2, []),
        ("remove", (2,), True, 1, []),
        ("remove", (1,), False, 0, []),  # nobody connected: their acks are gone with them
        ("add", (3,), False, 0, []),  # a fresh slave that has not reported
        ("report", (3, 0), False, 0, []),  # and then reports an empty commit log
    ])
    assert s.push2slave_max_offset == 4900  # kept for the status page only
    assert s.slave_acks_needed(put_where) is None
    _play(s, put_where, [("report", (3, 4001), True, 1, [])])
    assert s.slave_acks_needed(put_where) == 1


def test_a_slave_that_disconnects_while_a_send_waits_no_longer_counts() -> None:
    """A waiter needing two acks: one slave acks, then disconnects; the other's ack alone does not complete it.
    A slave that connects later and reports past the offset does (its first report is an ack)."""
    s: ReplicationState[str] = ReplicationState(max_gap=1000, max_waiters=100, in_sync_replicas=3)
    put_where = 5000
    _play(s, put_where, [
        ("add", (1,), False, 0, []),
        ("add", (2,), False, 0, []),
        ("report", (1, 4800), True, 1, []),
        ("report", (2, 4900), True, 2, []),
    ])
    assert s.slave_acks_needed(put_where) == 2
    _play(s, put_where, [
        ("wait", (5000, 2), True, 2, []),
        ("report", (1, 5000), True, 2, []),  # one of two acks
        ("remove", (1,), True, 1, []),  # ... from a slave that is now gone
        ("report", (2, 5000), True, 1, []),  # the other slave's ack is not enough alone
        ("add", (3,), True, 1, []),
        ("report", (3, 6000), True, 2, ["w5000"]),  # a newcomer holding the bytes completes it
    ])
    assert len(s.waiters) == 0


def test_wait_is_already_satisfied_by_the_connected_slaves_acks() -> None:
    s: ReplicationState[str] = ReplicationState(max_gap=1000, max_waiters=100)
    s.add_slave(1, "a")
    s.add_slave(2, "b")
    s.on_report(1, 500)
    s.on_report(2, 300)
    assert s.wait(500, "x") is None
    assert s.wait(300, "y", acks=2) is None
    assert s.wait(400, "z", acks=2) is not None  # only one slave holds 400
    assert s.wait(100, "v", acks=3) is not None  # only two slaves are connected
    with pytest.raises(ValueError, match="at least one"):
        s.wait(100, "none", acks=0)
    assert s.acks_best_first() == [500, 300]


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
    with pytest.raises(ValueError, match="min_in_sync_replicas"):
        HAConfig(in_sync_replicas=1, min_in_sync_replicas=2)
    with pytest.raises(ValueError, match="in_sync_replicas"):
        HAConfig(in_sync_replicas=0)
    assert HAConfig(ha_send_heartbeat_interval_ms=200, ha_housekeeping_interval_ms=100).tick_ms == 25
    assert HAConfig().tick_ms == 1000


@pytest.mark.parametrize(
    ("offset", "first", "master_max", "sent_to", "refused"),
    [
        (0, True, 0, 0, False),  # an empty slave of an empty master
        (500, True, 500, 0, False),  # a slave that holds everything the master wrote
        (501, True, 500, 0, True),  # a slave ahead of its master (or a forged first report)
        (1 << 62, True, 500, 0, True),
        (300, False, 500, 300, False),  # everything sent has arrived
        (301, False, 500, 300, True),  # an ack for bytes this connection never carried
        (1 << 62, False, 1 << 40, 1 << 40, True),
        (100, False, 500, 300, False),  # behind what was sent (in flight) is fine
    ],
)
def test_report_violation(offset: int, first: bool, master_max: int, sent_to: int, refused: bool) -> None:
    reason = report_violation(offset, first=first, master_max_offset=master_max, sent_to=sent_to)
    assert (reason is not None) is refused
    if reason is not None:
        assert str(offset) in reason


@given(ends=st.lists(st.tuples(st.integers(1, 40_000), st.booleans(), st.integers(1, 2)), max_size=30),
       master_max=st.integers(0, 40_000), file_size=st.sampled_from([64, 4096, 8192]))
def test_an_empty_slave_is_streamed_every_byte_of_every_send_still_waiting(
        ends: list[tuple[int, bool, int]], master_max: int, file_size: int) -> None:
    """Whatever waits (expired waiters left in the heaps included): an empty slave's stream starts at a file start
    at or below every live waiter's put, so every ack it gives is for bytes it was sent -- never past a put it lacks
    (a put never straddles a file start, so the file of its last byte holds all of it)."""
    w: AckWaiters[int] = AckWaiters(max_waiters=100)
    live = []
    for end, expired, acks in ends:
        waiter = w.add(min(end, master_max) or 1, end, acks=acks)
        if expired:
            w.expire(waiter)
        else:
            live.append(waiter.end_offset)
    start = transfer_start_offset(0, master_max, file_size, 0, w.oldest_end())
    assert start % file_size == 0 and start <= master_max
    for end in live:
        assert start <= (end - 1) - (end - 1) % file_size  # the put's file is streamed
