"""The leader's quorum wait, its per-follower dispatcher and the follower's rules (docs/BEHAVIOUR.md 9.4-9.5), as
tables: the quorum index, completions and timeouts, LEADER_PENDING_FULL, TERM_CHANGED, each dispatcher
transition, re-push, the follower's COMPARE answer, its commit bound and its gap timeout; and the dispatcher
against a follower answering by those rules, from logs that diverge in every way, until both logs are one."""

from __future__ import annotations

import pytest

from broker.dledger.dispatcher import EntryDispatcher, PushKind, PushState, Send
from broker.dledger.follower import Agreement, FollowerCode, ParkedAppends, compare_answer
from broker.dledger.quorum import AckCode, Completion, QuorumTracker, quorum_index


@pytest.mark.parametrize(("marks", "expected"), [
    ([10, 8, 5], 8), ([5, 10, 8], 8), ([10, 5], 5), ([10, 9, 8, 7, 6], 8), ([10, 10, 2, 1, 0], 2), ([4], 4),
    ([-1, -1, 3], -1), ([7, 7, 7], 7),
])
def test_quorum_index(marks: list[int], expected: int) -> None:
    assert quorum_index(marks) == expected


def tracker(**kw: int) -> QuorumTracker:
    return QuorumTracker(["n0", "n1", "n2"], **kw)


def test_appends_complete_when_a_majority_holds_them() -> None:
    q = tracker()
    for i in range(4):
        q.add(1, i, f"t{i}", now_ms=0)
        q.ack(1, "n0", i)  # the leader's own copy
    assert q.check(1, now_ms=10) == (-1, [])  # only the leader has them
    q.ack(1, "n2", 1)
    assert q.check(1, now_ms=10) == (1, [Completion("t0", 0, AckCode.SUCCESS), Completion("t1", 1, AckCode.SUCCESS)])
    q.ack(1, "n1", 3)
    assert q.check(1, now_ms=10) == (3, [Completion("t2", 2, AckCode.SUCCESS), Completion("t3", 3, AckCode.SUCCESS)])
    assert q.pending_count(1) == 0
    q.ack(1, "n1", 2)  # a late, smaller ack never lowers a watermark
    assert q.watermarks(1)["n1"] == 3


def test_waiters_time_out_in_order_and_keep_counting_until_a_quorum_passes_them() -> None:
    q = tracker(max_wait_ack_ms=2500, max_pending=2)
    for i, t in enumerate((0, 100, 5000)):
        q.add(1, i, f"t{i}", now_ms=t)
        q.ack(1, "n0", i)
    assert q.check(1, now_ms=2599) == (-1, [Completion("t0", 0, AckCode.WAIT_QUORUM_ACK_TIMEOUT)])
    assert q.check(1, now_ms=2600) == (-1, [Completion("t1", 1, AckCode.WAIT_QUORUM_ACK_TIMEOUT)])
    assert q.check(1, now_ms=2700) == (-1, [])  # t2 is still in time: the walk stops there
    assert q.pending_count(1) == 3 and q.pending_full(1)  # timed-out waiters still count: > maxPendingRequestsNum
    q.ack(1, "n1", 2)
    assert q.check(1, now_ms=2800) == (2, [Completion("t2", 2, AckCode.SUCCESS)])  # no second answer for t0, t1
    assert q.pending_count(1) == 0 and not q.pending_full(1)


def test_pending_full_is_strictly_more_than_the_limit() -> None:
    q = tracker(max_pending=2)
    q.add(3, 0, "a", 0)
    q.add(3, 1, "b", 0)
    assert not q.pending_full(3)
    q.add(3, 2, "c", 0)
    assert q.pending_full(3)
    with pytest.raises(ValueError, match="already waits"):
        q.add(3, 2, "d", 0)


def test_a_new_term_completes_the_old_terms_waiters_with_term_changed() -> None:
    q = tracker()
    q.add(1, 5, "old5", 0)
    q.add(1, 6, "old6", 0)
    q.ack(2, "n0", 7)
    q.add(2, 7, "new", 0)
    idx, done = q.check(2, now_ms=1)
    assert idx == -1
    assert done == [Completion("old5", 5, AckCode.TERM_CHANGED), Completion("old6", 6, AckCode.TERM_CHANGED)]
    assert q.pending_count(1) == 0 and q.pending_count(2) == 1


# -- the dispatcher ---------------------------------------------------------------------------------------------

def test_compare_finds_the_follower_at_the_leaders_end_and_appends() -> None:
    d = EntryDispatcher("n1")
    assert d.poll(0, 9, 0) == [Send(PushKind.COMPARE, 9)]
    assert d.poll(0, 9, 0) == []  # one COMPARE at a time
    d.on_compare(True, 0, 9, 0, 9)
    assert (d.state, d.watermark, d.write_index) == (PushState.APPEND, 9, 10)
    assert d.poll(0, 9, 10) == []  # caught up


@pytest.mark.parametrize(
    ("compare_at", "success", "f_begin", "f_end", "state", "index"),
    [
        (9, True, 0, 12, PushState.TRUNCATE, 9),  # same entry, the follower has more: cut its tail at 9
        (9, False, 0, 5, PushState.COMPARE, 5),  # the follower is shorter: compare at its end
        (9, False, 0, 12, PushState.COMPARE, 8),  # a mismatch inside both logs: one back
        (9, False, 20, 30, PushState.TRUNCATE, 0),  # no overlap (follower starts past the leader's end)
        (9, False, -1, -1, PushState.TRUNCATE, 0),  # an empty follower
        (9, False, 10, 12, PushState.TRUNCATE, 0),  # compare index below the follower's first entry
        (0, False, 0, 12, PushState.TRUNCATE, 0),  # walked past the leader's first entry
    ],
)
def test_compare_transitions(compare_at: int, success: bool, f_begin: int, f_end: int, state: PushState,
                             index: int) -> None:
    d = EntryDispatcher("n1")
    d.compare_index = compare_at
    assert d.poll(0, 9, 0) == [Send(PushKind.COMPARE, compare_at)]
    d.on_compare(success, f_begin, f_end, 0, 9)
    assert d.state is state
    assert (d.truncate_index if state is PushState.TRUNCATE else d.compare_index) == index
    if state is PushState.TRUNCATE:
        assert d.poll(0, 9, 0) == [Send(PushKind.TRUNCATE, index)]
        d.on_truncate(True)
        assert (d.state, d.watermark, d.write_index) == (PushState.APPEND, index, index + 1)


def test_a_failed_truncate_goes_back_to_compare() -> None:
    d = EntryDispatcher("n1")
    d.poll(0, 9, 0)
    d.on_compare(False, -1, -1, 0, 9)
    d.poll(0, 9, 0)
    d.on_truncate(False)
    assert d.state is PushState.COMPARE and d.poll(0, 9, 0) == [Send(PushKind.COMPARE, 9)]


def test_an_empty_leader_appends_from_the_start() -> None:
    d = EntryDispatcher("n1")
    assert d.poll(-1, -1, 0) == []
    assert (d.state, d.watermark, d.write_index) == (PushState.APPEND, -1, 0)
    assert d.poll(0, 2, 1) == [Send(PushKind.APPEND, 0, 3)]


def appending(**kw: int) -> EntryDispatcher:
    d = EntryDispatcher("n1", **kw)
    d.poll(0, 0, 0)
    d.on_compare(True, 0, 0, 0, 0)
    return d


def test_append_pushes_batches_within_the_in_flight_bound_and_acks_move_the_watermark() -> None:
    d = appending(max_batch=4, max_in_flight=10)
    assert d.poll(0, 20, 100) == [Send(PushKind.APPEND, 1, 4), Send(PushKind.APPEND, 5, 4),
                                  Send(PushKind.APPEND, 9, 2)]  # 10 in flight: the bound
    assert d.poll(0, 20, 101) == []
    assert d.on_append(True, 1, 4) == 4
    assert d.poll(0, 20, 102) == [Send(PushKind.APPEND, 11, 4)]
    assert d.on_append(True, 9, 10) == 10  # acks may come out of order; the watermark only rises
    assert d.on_append(True, 5, 8) == 10


def test_the_batch_after_the_watermark_is_pushed_again_after_max_push_timeout() -> None:
    d = appending(max_batch=4, max_push_timeout_ms=1000)
    assert d.poll(0, 4, 0) == [Send(PushKind.APPEND, 1, 4)]
    assert d.poll(0, 4, 1000) == []
    assert d.poll(0, 4, 1001) == [Send(PushKind.APPEND, 1, 4)]
    assert d.poll(0, 4, 1500) == []  # its clock restarted


def test_inconsistent_state_goes_back_to_compare() -> None:
    d = appending()
    d.poll(0, 5, 0)
    d.on_append(False, 1, 5, inconsistent=True)
    assert d.state is PushState.COMPARE and d.poll(0, 5, 1) == [Send(PushKind.COMPARE, 5)]
    assert d.on_append(True, 1, 5) == 0  # a late answer from before the reset changes nothing


def test_commit_when_caught_up_and_idle() -> None:
    d = appending(commit_idle_ms=1000)
    assert d.poll(0, 2, 0) == [Send(PushKind.APPEND, 1, 2)]
    d.on_append(True, 1, 2)
    assert d.poll(0, 2, 1000) == []
    assert d.poll(0, 2, 1001) == [Send(PushKind.COMMIT, 2)]
    assert d.poll(0, 2, 1500) == []


# -- the follower ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("held", "leaders", "code"), [
    (b"t2:m", b"t2:m", FollowerCode.SUCCESS),  # the very entry
    (None, b"t2:m", FollowerCode.INCONSISTENT_STATE),  # the follower's log does not reach the index
    (b"t1:lost", b"t2:", FollowerCode.INCONSISTENT_STATE),  # an old leader's own entry there: not the same
    (b"t1:x", b"t2:y", FollowerCode.INCONSISTENT_STATE),  # another term, the same size
    (b"t2:m", memoryview(b"t2:m"), FollowerCode.SUCCESS),  # the push's entry arrives as a view of the frame
])
def test_compare_succeeds_only_on_the_leaders_very_entry(held: bytes | None, leaders: bytes,
                                                         code: FollowerCode) -> None:
    assert compare_answer(held, leaders) is code


@pytest.mark.parametrize(("steps", "bound"), [
    ([], -1),  # nothing proven: commits nothing, whatever the leader says
    ([("agree", 2, 7)], 7),  # a COMPARE, TRUNCATE or APPEND proved up to 7: the leader's 9 is capped there
    ([("agree", 2, 7), ("agree", 2, 5)], 7),  # a late answer of an earlier batch does not lower it
    ([("agree", 1, 8)], -1),  # proven to the leader of term 1 only: says nothing of term 2's leader
    ([("agree", 2, 8), ("term", 3, 0)], -1),  # a new leader: from nothing again
    ([("agree", 2, 20)], 9),  # never past what the leader says is committed
])
def test_a_follower_commits_no_further_than_it_agrees_with_its_leader(steps: list[tuple[str, int, int]],
                                                                       bound: int) -> None:
    a = Agreement()
    for op, term, index in steps:
        a.agree(term, index) if op == "agree" else a.leader_term(term)
    term = steps[-1][1] if steps and steps[-1][0] == "term" else 2
    assert a.commit_bound(term, leader_committed=9, end_index=15) == bound


LEADER = [b"t1:a", b"t1:b", b"t2:", b"t2:m"]
"""A leader of term 2 whose first entry of its term (index 2) is its empty entry."""


def replicate(follower: list[bytes], leader: list[bytes] = LEADER, max_polls: int = 40) -> list[bytes]:
    """The leader's dispatcher against a follower that answers by the follower's rules: COMPARE by
    :func:`compare_answer`, TRUNCATE by ending its log with the leader's entry, APPEND by continuing its log (the
    real store refuses an entry placed after another of a different size; one of the same size it takes). Returns
    the follower's log once the dispatcher is appending with nothing left to push, or after ``max_polls``."""
    log = list(follower)
    d = EntryDispatcher("n1")
    end = len(leader) - 1
    for now in range(max_polls):
        for s in d.poll(0, end, now):
            if s.kind is PushKind.COMPARE:
                held = log[s.index] if s.index < len(log) else None
                ok = compare_answer(held, leader[s.index]) is FollowerCode.SUCCESS
                d.on_compare(ok, 0 if log else -1, len(log) - 1, 0, end)
            elif s.kind is PushKind.TRUNCATE:
                log[s.index:] = [leader[s.index]]
                d.on_truncate(True)
            elif s.kind is PushKind.APPEND:
                last = s.index + s.count - 1
                if s.index != len(log):
                    d.on_append(False, s.index, last, inconsistent=True)
                    continue
                log += leader[s.index : last + 1]
                d.on_append(True, s.index, last)
        if d.state is PushState.APPEND and d.watermark == end:
            break
    return log


@pytest.mark.parametrize("follower", [
    pytest.param([b"t1:a", b"t1:b", b"t1:lost"], id="an old leader ending at the compared index"),
    pytest.param([b"t1:a", b"t1:b", b"t1:x"], id="the same, its entry the size of the leader's"),
    pytest.param([b"t1:a", b"t1:b", b"t1:lost", b"t1:more", b"t1:and more"], id="a longer divergent tail"),
    pytest.param([b"t1:a", b"t1:b"], id="behind"),
    pytest.param([b"t1:a", b"t1:b", b"t2:", b"t2:m"], id="the same log"),
    pytest.param([], id="empty"),
    pytest.param([b"t0:z"], id="nothing in common"),
])
def test_a_follower_answering_by_the_rules_ends_with_the_leaders_log(follower: list[bytes]) -> None:
    assert replicate(follower) == LEADER


def test_parked_appends_are_taken_in_log_order() -> None:
    h = ParkedAppends()
    assert h.park("b", 5, 8, now_ms=0) is None
    assert h.park("a", 1, 4, now_ms=0) is None
    assert h.park("a2", 1, 4, now_ms=0) is FollowerCode.REPEATED_PUSH
    assert h.take_next(ledger_end=-1) is None  # index 0 has not come
    assert h.take_next(ledger_end=0).token == "a"  # type: ignore[union-attr]
    assert h.take_next(ledger_end=4).token == "b"  # type: ignore[union-attr]
    assert len(h) == 0


def test_a_re_pushed_batch_overlapping_the_log_end_continues_it() -> None:
    h = ParkedAppends()
    h.park("again", 5, 8, now_ms=0)
    assert h.take_next(ledger_end=6).token == "again"  # type: ignore[union-attr]


def test_compare_and_truncate_clear_parked_appends() -> None:
    h = ParkedAppends()
    h.park("a", 3, 3, 0)
    h.park("b", 4, 4, 0)
    assert [p.token for p in h.clear()] == ["a", "b"] and len(h) == 0


def test_parked_appends_are_bounded() -> None:
    h = ParkedAppends(max_parked=2)
    h.park("a", 3, 3, 0)
    h.park("b", 4, 4, 0)
    assert h.park("c", 5, 5, 0) is FollowerCode.PUSH_REQUEST_IS_FULL


def test_sweep_answers_appends_behind_the_log_and_times_out_the_gap() -> None:
    h = ParkedAppends(gap_timeout_ms=1000)
    h.park("behind", 2, 3, now_ms=0)
    h.park("diverged", 4, 4, now_ms=0)
    h.park("gap", 9, 9, now_ms=0)
    h.park("later", 12, 12, now_ms=500)
    out = h.sweep(999, ledger_end=5, holds=lambda p: p.token == "behind")
    assert [(p.token, c) for p, c in out] == [("behind", FollowerCode.SUCCESS),
                                              ("diverged", FollowerCode.INCONSISTENT_STATE)]
    assert h.sweep(999, ledger_end=5, holds=lambda p: True) == []  # the gap is 999 ms old
    out = h.sweep(1000, ledger_end=5, holds=lambda p: True)
    assert [(p.token, c) for p, c in out] == [("gap", FollowerCode.INCONSISTENT_STATE)]  # only the smallest
    assert len(h) == 1


def test_no_gap_timeout_while_the_next_append_is_parked() -> None:
    h = ParkedAppends(gap_timeout_ms=1000)
    h.park("next", 6, 6, now_ms=0)
    h.park("after", 7, 7, now_ms=0)
    assert h.sweep(5000, ledger_end=5, holds=lambda p: True) == []


def test_trim_drops_the_later_batches_of_a_poll() -> None:
    d = appending(max_batch=4, max_in_flight=20)
    assert d.poll(0, 12, 0) == [Send(PushKind.APPEND, 1, 4), Send(PushKind.APPEND, 5, 4), Send(PushKind.APPEND, 9, 4)]
    d.trim(1, 2)  # only entries 1..2 fit the first frame
    assert d.write_index == 3
    assert d.poll(0, 12, 1) == [Send(PushKind.APPEND, 3, 4), Send(PushKind.APPEND, 7, 4), Send(PushKind.APPEND, 11, 2)]
    assert d.on_append(True, 1, 2) == 2
