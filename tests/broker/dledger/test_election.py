"""Election rules (docs/BEHAVIOUR.md 9.2-9.3) as tables: each vote-handling rule and reject code in its order, heartbeat
handling, the candidate's count, the leader's count, the timers, pre-vote, and the persisted vote."""

from __future__ import annotations

from typing import Any

import pytest

from broker.dledger.election import (
    ElectionTimings,
    HeartbeatCode,
    HeartbeatVerdict,
    Verdict,
    VoteReply,
    VoteRequest,
    VoteResult,
    count_heartbeats,
    count_votes,
    handle_heartbeat,
    handle_pre_vote,
    handle_vote,
    leader_lost_quorum,
    leader_silent,
)
from broker.dledger.member import MemberState, Role, parse_peers

PEERS = {"n0": "h:1", "n1": "h:2", "n2": "h:3"}
T = ElectionTimings()


class Persisted(list[tuple[int, str | None]]):
    """What a member handed to its ``persist`` callback (the ``currterm`` file's successive contents)."""

    def record(self, term: int, vote: str | None) -> None:
        self.append((term, vote))


def member(**kw: Any) -> MemberState:
    st = MemberState("n0", PEERS, persist=Persisted().record)
    for k, v in kw.items():
        setattr(st, k, v)
    return st


def persisted(st: MemberState) -> Persisted:
    return st.persist.__self__  # type: ignore[attr-defined,no-any-return]


R = VoteResult


@pytest.mark.parametrize(
    ("state", "req", "from_self", "taking", "expected", "increase"),
    [
        # 1. the candidate must be a peer; a network request may not claim to be us
        ({}, VoteRequest(1, -1, -1, "n9"), False, False, R.REJECT_UNKNOWN_LEADER, False),
        ({}, VoteRequest(1, -1, -1, "n0"), False, False, R.REJECT_UNEXPECTED_LEADER, False),
        # 2. the candidate's log must be at least as complete (before any term rule)
        ({"ledger_end_term": 3, "ledger_end_index": 9}, VoteRequest(9, 2, 50, "n1"), False, False,
         R.REJECT_EXPIRED_LEDGER_TERM, False),
        ({"ledger_end_term": 3, "ledger_end_index": 9}, VoteRequest(9, 3, 8, "n1"), False, False,
         R.REJECT_SMALL_LEDGER_END_INDEX, False),
        ({"term": 5, "ledger_end_term": 3, "ledger_end_index": 9}, VoteRequest(1, 2, 50, "n1"), False, False,
         R.REJECT_EXPIRED_LEDGER_TERM, False),  # the ledger rule comes before the term rule
        # 3. terms
        ({"term": 5}, VoteRequest(4, -1, -1, "n1"), False, False, R.REJECT_EXPIRED_VOTE_TERM, False),
        ({"term": 5, "vote_for": "n2"}, VoteRequest(5, -1, -1, "n1"), False, False, R.REJECT_ALREADY_VOTED, False),
        ({"term": 5, "vote_for": "n2", "leader_id": "n2", "role": Role.FOLLOWER}, VoteRequest(5, -1, -1, "n1"),
         False, False, R.REJECT_ALREADY_HAS_LEADER, False),
        ({"term": 5, "vote_for": "n1"}, VoteRequest(5, -1, -1, "n1"), False, False, R.ACCEPT, False),  # a repeat
        ({"term": 5}, VoteRequest(6, -1, -1, "n1"), False, False, R.REJECT_TERM_NOT_READY, True),
        # 4. a term below our ledger's last term
        ({"term": 2, "ledger_end_term": 3, "ledger_end_index": 0}, VoteRequest(2, 3, 0, "n1"), False, False,
         R.REJECT_TERM_SMALL_THAN_LEDGER, False),
        # 5. a leadership transfer to us is under way and the candidate's log is not longer
        ({"term": 5, "ledger_end_term": 4, "ledger_end_index": 7}, VoteRequest(5, 4, 7, "n1"), False, True,
         R.REJECT_TAKING_LEADERSHIP, False),
        ({"term": 5, "ledger_end_term": 4, "ledger_end_index": 7}, VoteRequest(5, 4, 8, "n1"), False, True,
         R.ACCEPT, False),
        # 6. accept
        ({"term": 5, "ledger_end_term": 4, "ledger_end_index": 7}, VoteRequest(5, 4, 7, "n1"), False, False,
         R.ACCEPT, False),
        ({"term": 5}, VoteRequest(5, -1, -1, "n0"), True, False, R.ACCEPT, False),  # our own vote
    ],
)
def test_vote_rules_in_order(state: dict[str, Any], req: VoteRequest, from_self: bool, taking: bool,
                             expected: VoteResult, increase: bool) -> None:
    st = member(**state)
    assert handle_vote(st, req, from_self=from_self, taking_leadership=taking) == (expected, increase)
    if expected is R.ACCEPT:
        assert st.vote_for == req.candidate_id
        assert persisted(st)[-1:] in ([(st.term, req.candidate_id)], [])
    elif expected is R.REJECT_TERM_NOT_READY:
        assert (st.role, st.leader_id, st.known_max_term, st.term) == (Role.CANDIDATE, None, req.term, 5)


def test_a_vote_is_persisted_before_it_counts_and_never_given_twice() -> None:
    st = member(term=3)
    assert handle_vote(st, VoteRequest(3, -1, -1, "n1"), from_self=False)[0] is R.ACCEPT
    assert persisted(st) == [(3, "n1")]
    assert handle_vote(st, VoteRequest(3, -1, -1, "n2"), from_self=False)[0] is R.REJECT_ALREADY_VOTED
    restarted = member()
    restarted.restore(*persisted(st)[-1])
    assert handle_vote(restarted, VoteRequest(3, -1, -1, "n2"), from_self=False)[0] is R.REJECT_ALREADY_VOTED


def test_next_term_takes_the_largest_known_term_and_clears_the_vote() -> None:
    st = member(term=3, vote_for="n0")
    assert st.next_term() == 4 and st.vote_for is None
    st.known_max_term = 9
    assert st.next_term() == 9
    assert persisted(st) == [(4, None), (9, None)]
    st.role = Role.FOLLOWER
    with pytest.raises(RuntimeError, match="candidate"):
        st.next_term()


@pytest.mark.parametrize(("n", "peers", "quorum"), [(2, 3, True), (1, 3, False), (2, 2, True), (1, 2, False),
                                                     (3, 5, True), (2, 5, False), (1, 1, True)])
def test_is_quorum(n: int, peers: int, quorum: bool) -> None:
    st = MemberState("n0", {f"n{i}": f"h:{i + 1}" for i in range(peers)})
    assert st.is_quorum(n) is quorum


def test_parse_peers() -> None:
    assert parse_peers("n0-127.0.0.1:40911;n1-127.0.0.1:40912") == {"n0": "127.0.0.1:40911", "n1": "127.0.0.1:40912"}
    for bad in ("n0127.0.0.1:1", "n0-host", "n0-h:0", "n0-h:1;n0-h:2", "-h:1", ""):
        with pytest.raises(ValueError, match="dLegerPeers"):
            parse_peers(bad)
    with pytest.raises(ValueError, match="not one of the peers"):
        MemberState("n7", PEERS)


H = HeartbeatCode


@pytest.mark.parametrize(
    ("state", "term", "leader", "expected", "role_after", "leader_after"),
    [
        ({"term": 5}, 5, "n9", H.UNKNOWN_MEMBER, Role.CANDIDATE, None),
        ({"term": 5}, 5, "n0", H.UNEXPECTED_MEMBER, Role.CANDIDATE, None),
        ({"term": 5}, 4, "n1", H.EXPIRED_TERM, Role.CANDIDATE, None),
        ({"term": 5}, 5, "n1", H.SUCCESS, Role.FOLLOWER, "n1"),  # no leader known: follow it
        ({"term": 5, "role": Role.FOLLOWER, "leader_id": "n1"}, 5, "n1", H.SUCCESS, Role.FOLLOWER, "n1"),
        ({"term": 5, "role": Role.FOLLOWER, "leader_id": "n2"}, 5, "n1", H.INCONSISTENT_LEADER, Role.FOLLOWER, "n2"),
        ({"term": 5, "role": Role.FOLLOWER, "leader_id": "n2"}, 6, "n1", H.TERM_NOT_READY, Role.CANDIDATE, None),
    ],
)
def test_heartbeat_rules(state: dict[str, Any], term: int, leader: str, expected: HeartbeatCode, role_after: Role,
                         leader_after: str | None) -> None:
    st = member(**state)
    code, increase = handle_heartbeat(st, term, leader)
    assert (code, st.role, st.leader_id) == (expected, role_after, leader_after)
    assert increase is (expected is H.TERM_NOT_READY)


def rep(result: VoteResult, term: int = 5) -> VoteReply:
    return VoteReply(result, term)


@pytest.mark.parametrize(
    ("replies", "verdict", "retry_ms"),
    [
        ([rep(R.ACCEPT), rep(R.ACCEPT), None], Verdict.PASSED, 0),
        ([rep(R.ACCEPT), None, None], Verdict.WAIT_TO_REVOTE, 500),  # no quorum of answers
        ([rep(R.ACCEPT), rep(R.REJECT_EXPIRED_VOTE_TERM, 9), None], Verdict.WAIT_TO_VOTE_NEXT, 500),  # larger term
        ([rep(R.ACCEPT), rep(R.REJECT_ALREADY_HAS_LEADER), None], Verdict.WAIT_TO_REVOTE, 500 + 6000),
        ([rep(R.ACCEPT), rep(R.REJECT_SMALL_LEDGER_END_INDEX), rep(R.REJECT_EXPIRED_LEDGER_TERM)],
         Verdict.WAIT_TO_REVOTE, 500 + 1000),  # the others have longer logs
        ([rep(R.ACCEPT), rep(R.REJECT_TERM_NOT_READY), None], Verdict.REVOTE_IMMEDIATELY, 0),
        ([rep(R.ACCEPT), rep(R.REJECT_ALREADY_VOTED), rep(R.REJECT_ALREADY_VOTED)], Verdict.WAIT_TO_VOTE_NEXT, 500),
        ([rep(R.UNKNOWN), rep(R.ACCEPT), None], Verdict.WAIT_TO_REVOTE, 500),  # UNKNOWN is no answer
    ],
)
def test_count_votes(replies: list[VoteReply | None], verdict: Verdict, retry_ms: int) -> None:
    st = member(term=5)
    got = count_votes(st, 5, replies, rand_ms=500, timings=T)
    assert (got.verdict, got.retry_after_ms) == (verdict, retry_ms)


@pytest.mark.parametrize(
    ("replies", "verdict", "term"),
    [
        ([(H.SUCCESS, 5), None], HeartbeatVerdict.OK, 5),  # with the leader itself: 2 of 3
        ([None, None], HeartbeatVerdict.NO_QUORUM, 5),
        ([(H.TERM_NOT_READY, 5), None], HeartbeatVerdict.RESEND_NOW, 5),
        ([(H.EXPIRED_TERM, 8), (H.SUCCESS, 5)], HeartbeatVerdict.STEP_DOWN, 8),
        ([(H.INCONSISTENT_LEADER, 5), (H.SUCCESS, 5)], HeartbeatVerdict.STEP_DOWN, 5),
    ],
)
def test_count_heartbeats(replies: list[tuple[HeartbeatCode, int] | None], verdict: HeartbeatVerdict,
                          term: int) -> None:
    st = member(term=5, role=Role.LEADER, leader_id="n0")
    assert count_heartbeats(st, replies) == (verdict, term)


@pytest.mark.parametrize(("silent_ms", "campaign"), [(6000, False), (6001, True), (100, False)])
def test_timers(silent_ms: int, campaign: bool) -> None:
    assert leader_silent(10_000 + silent_ms, 10_000, T) is campaign
    assert leader_lost_quorum(10_000 + silent_ms, 10_000, T) is campaign


@pytest.mark.parametrize(
    ("state", "req", "heard_ms_ago", "expected"),
    [
        ({"term": 5, "role": Role.FOLLOWER, "leader_id": "n2"}, VoteRequest(6, 4, 10, "n1"), 1000,
         R.REJECT_LEADER_ALIVE),  # the healthy majority keeps its leader
        ({"term": 5, "role": Role.LEADER, "leader_id": "n0"}, VoteRequest(6, 4, 10, "n1"), 0, R.REJECT_LEADER_ALIVE),
        ({"term": 5, "role": Role.FOLLOWER, "leader_id": "n2"}, VoteRequest(6, 4, 10, "n1"), 6001, R.ACCEPT),
        ({"term": 5}, VoteRequest(6, 4, 10, "n1"), 0, R.ACCEPT),  # a candidate knows no leader
        # a candidate that already voted for itself in that term would refuse the real vote (no split vote)
        ({"term": 6, "vote_for": "n0"}, VoteRequest(6, 4, 10, "n1"), 0, R.REJECT_ALREADY_VOTED),
        ({"term": 6, "vote_for": "n1"}, VoteRequest(6, 4, 10, "n1"), 0, R.ACCEPT),
        ({"term": 5, "ledger_end_term": 4, "ledger_end_index": 11}, VoteRequest(6, 4, 10, "n1"), 0,
         R.REJECT_SMALL_LEDGER_END_INDEX),
        ({"term": 7}, VoteRequest(6, 4, 10, "n1"), 0, R.REJECT_EXPIRED_VOTE_TERM),
        ({"term": 5}, VoteRequest(6, 4, 10, "n0"), 0, R.REJECT_UNEXPECTED_LEADER),
        ({"term": 5}, VoteRequest(6, 4, 10, "x"), 0, R.REJECT_UNKNOWN_LEADER),
    ],
)
def test_pre_vote_never_changes_state(state: dict[str, Any], req: VoteRequest, heard_ms_ago: int,
                                      expected: VoteResult) -> None:
    st = member(**state)
    before = (st.role, st.term, st.vote_for, st.leader_id, st.known_max_term)
    got = handle_pre_vote(st, req, now_ms=100_000, last_leader_heartbeat_ms=100_000 - heard_ms_ago, timings=T)
    assert got is expected
    assert (st.role, st.term, st.vote_for, st.leader_id, st.known_max_term) == before
    assert persisted(st) == []
