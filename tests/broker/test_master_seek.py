"""How a slave knows its master (broker.master_seek): the decisions as tables, no I/O, no clock."""

from __future__ import annotations

import pytest

from broker.master_seek import (
    SEEK_MAX_S,
    SEEK_MIN_S,
    MasterSeek,
    after_round,
    follow_leader,
    needs_master,
    on_answer,
    seek_delay_s,
)
from broker.registration import RegisterResult

M = "127.0.0.1:10911"
M_HA = "127.0.0.1:10912"
N = "127.0.0.1:20911"
N_HA = "127.0.0.1:20912"


@pytest.mark.parametrize(
    ("seek", "link_up", "fixed_ha", "expected"),
    [
        (MasterSeek(), False, False, True),  # started before its master: keep asking
        (MasterSeek(), True, True, True),  # a fixed HA address still needs the client address (metadata sync)
        (MasterSeek(M, M_HA), True, False, False),  # known and linked: only the period
        (MasterSeek(M, M_HA), False, False, True),  # link down: the master may have moved
        (MasterSeek(M, None), False, True, False),  # link down with haMasterAddress: asking cannot move it
    ],
)
def test_needs_master(seek: MasterSeek, link_up: bool, fixed_ha: bool, expected: bool) -> None:
    assert needs_master(seek, link_up=link_up, fixed_ha=fixed_ha) is expected


@pytest.mark.parametrize(
    ("seek", "answer", "expected", "sync_now"),
    [
        # the master came up: both addresses, and the metadata sync runs at once
        (MasterSeek(misses=3), RegisterResult(M, M_HA), MasterSeek(M, M_HA, 3), True),
        # the same master again: nothing to sync early
        (MasterSeek(M, M_HA), RegisterResult(M, M_HA), MasterSeek(M, M_HA), False),
        # a new master
        (MasterSeek(M, M_HA), RegisterResult(N, N_HA), MasterSeek(N, N_HA), True),
        # the master is gone from the nameserver: the sync pauses, the HA client keeps the old address
        (MasterSeek(M, M_HA), RegisterResult(None, None), MasterSeek(None, M_HA), False),
        # still none
        (MasterSeek(), RegisterResult(None, None), MasterSeek(), False),
    ],
)
def test_on_answer(seek: MasterSeek, answer: RegisterResult, expected: MasterSeek, sync_now: bool) -> None:
    assert on_answer(seek, answer) == (expected, sync_now)


def test_after_round_counts_misses_and_resets() -> None:
    s = after_round(after_round(MasterSeek(), still_needed=True), still_needed=True)
    assert s.misses == 2
    assert after_round(s, still_needed=False).misses == 0


@pytest.mark.parametrize(
    ("misses", "rand", "expected"),
    [
        (0, 0.5, SEEK_MIN_S),  # the middle of the jitter is the base
        (1, 0.5, 2 * SEEK_MIN_S),
        (2, 0.5, SEEK_MAX_S),  # 0.5 -> 1 -> 2, bounded
        (9, 0.5, SEEK_MAX_S),
        (10_000, 0.5, SEEK_MAX_S),  # no overflow after a long wait
        (0, 0.0, SEEK_MIN_S * 0.8),  # jitter: -20 % ...
        (9, 0.999999, SEEK_MAX_S * 1.2),  # ... to +20 %
    ],
)
def test_seek_delay_doubles_bounded_with_jitter(misses: int, rand: float, expected: float) -> None:
    assert seek_delay_s(misses, rand) == pytest.approx(expected, rel=1e-5)


def test_seek_delay_never_exceeds_the_bound_plus_jitter() -> None:
    assert max(seek_delay_s(m, r / 10) for m in range(40) for r in range(10)) < SEEK_MAX_S * 1.2


ADDRS = {"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"}


@pytest.mark.parametrize(
    ("current", "following", "leader", "addrs", "expected"),
    [
        # a new leader whose heartbeat gave its address: that is the master, sync at once
        ("127.0.0.1:1", True, "n1", ADDRS, ("127.0.0.1:2", True)),
        # the same leader: nothing to do
        ("127.0.0.1:2", True, "n1", ADDRS, ("127.0.0.1:2", False)),
        # a leader whose address is not heard yet (it came in a push first): no master until its heartbeat
        ("127.0.0.1:1", True, "n2", ADDRS, (None, False)),
        # an election: no leader, no master (the dead leader's address is never kept)
        ("127.0.0.1:1", False, None, ADDRS, (None, False)),
        # a candidate still naming the old leader is not following it
        ("127.0.0.1:1", False, "n0", ADDRS, (None, False)),
        # first heartbeat after start
        (None, True, "n0", ADDRS, ("127.0.0.1:1", True)),
    ],
)
def test_follow_leader(current: str | None, following: bool, leader: str | None, addrs: dict[str, str],
                       expected: tuple[str | None, bool]) -> None:
    assert follow_leader(current, following=following, leader_id=leader, leader_addrs=addrs) == expected
