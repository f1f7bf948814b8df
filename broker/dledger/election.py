"""Leader election (docs/BEHAVIOUR.md 9.3, DLedger's ``DLedgerLeaderElector``), as pure rules over a
:class:`~broker.dledger.member.MemberState`:

* :func:`handle_vote` -- a vote request, each reject rule in DLedger's order;
* :func:`handle_heartbeat` -- a leader's heartbeat at a follower;
* :func:`count_votes` -- a candidate's verdict on its replies, with the back-off before its next try;
* :func:`count_heartbeats` -- a leader's verdict on its heartbeat round;
* :func:`handle_pre_vote` -- SplitMQ's pre-vote (Raft thesis 9.6, absent from DLedger): "would you vote for me in
  the next term?", answered without changing anything, so a member cut off from the group and then healed cannot
  depose a healthy leader by arriving with a higher term.

Clocks and randomness come in as arguments; nothing here sleeps or sends.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from broker.dledger.member import MemberState, Role

__all__ = [
    "ElectionTimings",
    "HeartbeatCode",
    "HeartbeatVerdict",
    "Verdict",
    "VoteReply",
    "VoteRequest",
    "VoteResult",
    "VoteVerdict",
    "count_heartbeats",
    "count_votes",
    "handle_heartbeat",
    "handle_pre_vote",
    "handle_vote",
    "leader_lost_quorum",
    "leader_silent",
]


class VoteResult(enum.Enum):
    """Answers to a vote request (DLedger's ``VoteResponse.RESULT``)."""

    UNKNOWN = "UNKNOWN"
    ACCEPT = "ACCEPT"
    REJECT_UNKNOWN_LEADER = "REJECT_UNKNOWN_LEADER"
    REJECT_UNEXPECTED_LEADER = "REJECT_UNEXPECTED_LEADER"
    REJECT_EXPIRED_VOTE_TERM = "REJECT_EXPIRED_VOTE_TERM"
    REJECT_ALREADY_VOTED = "REJECT_ALREADY_VOTED"
    REJECT_ALREADY_HAS_LEADER = "REJECT_ALREADY_HAS_LEADER"
    REJECT_TERM_NOT_READY = "REJECT_TERM_NOT_READY"
    REJECT_TERM_SMALL_THAN_LEDGER = "REJECT_TERM_SMALL_THAN_LEDGER"
    REJECT_EXPIRED_LEDGER_TERM = "REJECT_EXPIRED_LEDGER_TERM"
    REJECT_SMALL_LEDGER_END_INDEX = "REJECT_SMALL_LEDGER_END_INDEX"
    REJECT_TAKING_LEADERSHIP = "REJECT_TAKING_LEADERSHIP"
    REJECT_LEADER_ALIVE = "REJECT_LEADER_ALIVE"
    """Pre-vote only: this member heard from a leader within the election timeout."""


class HeartbeatCode(enum.Enum):
    SUCCESS = "SUCCESS"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"
    UNEXPECTED_MEMBER = "UNEXPECTED_MEMBER"
    EXPIRED_TERM = "EXPIRED_TERM"
    INCONSISTENT_LEADER = "INCONSISTENT_LEADER"
    TERM_NOT_READY = "TERM_NOT_READY"


class Verdict(enum.Enum):
    """A candidate's reading of a vote round (DLedger's ``VoteResponse.ParseResult``)."""

    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"
    """Try again in the same term."""
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"
    PASSED = "PASSED"
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"
    """Try again in the next term."""


@attrs.frozen(kw_only=True)
class ElectionTimings:
    """DLedger's timing keys (docs/BEHAVIOUR.md 9.1)."""

    heartbeat_interval_ms: int = 2000
    """``heartBeatTimeIntervalMs``."""
    max_heartbeat_leak: int = 3
    """``maxHeartBeatLeak``: heartbeats a follower may miss before it campaigns (and a leader may fail before it
    steps down)."""
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000

    @property
    def election_timeout_ms(self) -> int:
        return self.max_heartbeat_leak * self.heartbeat_interval_ms


@attrs.frozen
class VoteRequest:
    term: int
    ledger_end_term: int
    ledger_end_index: int
    candidate_id: str
    """DLedger's ``leaderId`` field: the member asking for the vote."""


@attrs.frozen
class VoteReply:
    result: VoteResult
    term: int
    """The replier's current term (a candidate learns of larger terms from it)."""


def _ledger_reject(state: MemberState, req: VoteRequest) -> VoteResult | None:
    if req.ledger_end_term < state.ledger_end_term:
        return VoteResult.REJECT_EXPIRED_LEDGER_TERM
    if req.ledger_end_term == state.ledger_end_term and req.ledger_end_index < state.ledger_end_index:
        return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    return None


def handle_vote(state: MemberState, req: VoteRequest, *, from_self: bool, taking_leadership: bool = False
                ) -> tuple[VoteResult, bool]:
    """Answer a vote request; mutates ``state`` (a vote, or a step down to candidate on a larger term).

    Args:
        state: this member.
        req: the request.
        from_self: the candidate is this member (its own vote, handled locally, not over the network).
        taking_leadership: this member is taking leadership (a transfer to it is under way).

    Returns:
        ``(result, increase_term_now)``: the answer, and whether this member must campaign in a new term at once
        (it saw a larger term: DLedger's ``needIncreaseTermImmediately``).
    """
    if not state.is_peer(req.candidate_id):
        return VoteResult.REJECT_UNKNOWN_LEADER, False
    if not from_self and req.candidate_id == state.self_id:
        return VoteResult.REJECT_UNEXPECTED_LEADER, False
    ledger = _ledger_reject(state, req)
    if ledger is not None:
        return ledger, False
    if req.term < state.term:
        return VoteResult.REJECT_EXPIRED_VOTE_TERM, False
    if req.term == state.term:
        if state.vote_for is not None and state.vote_for != req.candidate_id:
            has_leader = state.leader_id is not None
            return (VoteResult.REJECT_ALREADY_HAS_LEADER if has_leader else VoteResult.REJECT_ALREADY_VOTED), False
    else:
        state.change_to_candidate(req.term)  # a larger term: step down, and vote only once our term caught up
        return VoteResult.REJECT_TERM_NOT_READY, True
    if req.term < state.ledger_end_term:
        return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, False
    if (not from_self and taking_leadership and req.ledger_end_term == state.ledger_end_term
            and state.ledger_end_index >= req.ledger_end_index):
        return VoteResult.REJECT_TAKING_LEADERSHIP, False
    state.vote(req.candidate_id)
    return VoteResult.ACCEPT, False


def handle_pre_vote(state: MemberState, req: VoteRequest, *, now_ms: int, last_leader_heartbeat_ms: int,
                    timings: ElectionTimings) -> VoteResult:
    """Would this member vote for ``req.candidate_id`` in term ``req.term``? Changes nothing.

    Granted only when this member knows no live leader (a leader never grants; a follower grants once its leader
    has been silent for the election timeout), the term is not behind, this member has not already given its vote
    in that term to another (a candidate that raised its term and voted for itself would refuse the real vote:
    promising it would start a second candidate of the same term, a split vote), and the candidate's log is at
    least as complete (the same ledger rules as a vote).
    """
    if not state.is_peer(req.candidate_id):
        return VoteResult.REJECT_UNKNOWN_LEADER
    if req.candidate_id == state.self_id:
        return VoteResult.REJECT_UNEXPECTED_LEADER
    if req.term < state.term:
        return VoteResult.REJECT_EXPIRED_VOTE_TERM
    if state.role is Role.LEADER or (
            state.role is Role.FOLLOWER and state.leader_id is not None
            and now_ms - last_leader_heartbeat_ms <= timings.election_timeout_ms):
        return VoteResult.REJECT_LEADER_ALIVE
    if req.term == state.term and state.vote_for not in (None, req.candidate_id):
        return VoteResult.REJECT_ALREADY_VOTED
    ledger = _ledger_reject(state, req)
    if ledger is not None:
        return ledger
    return VoteResult.ACCEPT


@attrs.frozen
class VoteVerdict:
    verdict: Verdict
    retry_after_ms: int
    """Back-off before the next round (0: at once)."""
    known_max_term: int
    """The largest term heard of in the replies (the candidate steps to it when larger than its own)."""


def count_votes(state: MemberState, term: int, replies: Sequence[VoteReply | None], *, rand_ms: int,
                timings: ElectionTimings) -> VoteVerdict:
    """A candidate's verdict on a round of ``term`` (``None``: no answer from that peer; its own vote included).

    Args:
        state: the candidate (its peer count and known max term).
        term: the round's term.
        replies: one per peer asked.
        rand_ms: a random back-off in ``[min_vote_interval_ms, max_vote_interval_ms)`` (injected).
        timings: the timing keys.
    """
    valid = accepted = not_ready = bigger_ledger = 0
    already_has_leader = False
    known_max = state.known_max_term
    for r in replies:
        if r is None or r.result is VoteResult.UNKNOWN:
            continue
        valid += 1
        known_max = max(known_max, r.term) if r.result is VoteResult.REJECT_EXPIRED_VOTE_TERM else known_max
        if r.result is VoteResult.ACCEPT:
            accepted += 1
        elif r.result is VoteResult.REJECT_ALREADY_HAS_LEADER:
            already_has_leader = True
        elif r.result in (VoteResult.REJECT_EXPIRED_LEDGER_TERM, VoteResult.REJECT_SMALL_LEDGER_END_INDEX):
            bigger_ledger += 1
        elif r.result is VoteResult.REJECT_TERM_NOT_READY:
            not_ready += 1
    q = state.is_quorum
    if known_max > term:
        return VoteVerdict(Verdict.WAIT_TO_VOTE_NEXT, rand_ms, known_max)
    if already_has_leader:
        return VoteVerdict(Verdict.WAIT_TO_REVOTE, rand_ms + 3 * timings.heartbeat_interval_ms, known_max)
    if not q(valid):
        return VoteVerdict(Verdict.WAIT_TO_REVOTE, rand_ms, known_max)
    if not q(valid - bigger_ledger):
        return VoteVerdict(Verdict.WAIT_TO_REVOTE, rand_ms + timings.max_vote_interval_ms, known_max)
    if q(accepted):
        return VoteVerdict(Verdict.PASSED, 0, known_max)
    if q(accepted + not_ready):
        return VoteVerdict(Verdict.REVOTE_IMMEDIATELY, 0, known_max)
    return VoteVerdict(Verdict.WAIT_TO_VOTE_NEXT, rand_ms, known_max)


def handle_heartbeat(state: MemberState, term: int, leader_id: str) -> tuple[HeartbeatCode, bool]:
    """A leader's heartbeat at this member; mutates ``state`` (follows a new leader, or steps down on a larger
    term).

    Returns:
        ``(code, increase_term_now)``; on SUCCESS the caller records the heartbeat's arrival time.
    """
    if not state.is_peer(leader_id):
        return HeartbeatCode.UNKNOWN_MEMBER, False
    if leader_id == state.self_id:
        return HeartbeatCode.UNEXPECTED_MEMBER, False
    if term < state.term:
        return HeartbeatCode.EXPIRED_TERM, False
    if term == state.term:
        if state.leader_id is None:
            state.change_to_follower(term, leader_id)
            return HeartbeatCode.SUCCESS, False
        if state.leader_id == leader_id:
            return HeartbeatCode.SUCCESS, False
        return HeartbeatCode.INCONSISTENT_LEADER, False
    state.change_to_candidate(term)
    return HeartbeatCode.TERM_NOT_READY, True


class HeartbeatVerdict(enum.Enum):
    """A leader's reading of one heartbeat round."""

    OK = "OK"
    """A quorum answered SUCCESS: the leader's lease on its role is renewed."""
    RESEND_NOW = "RESEND_NOW"
    """A quorum only with TERM_NOT_READY (followers catching up on the term): send again at once."""
    STEP_DOWN = "STEP_DOWN"
    """A larger term or another leader was reported: back to candidate."""
    NO_QUORUM = "NO_QUORUM"
    """No quorum this round (the leader steps down once that lasts the election timeout)."""


def count_heartbeats(state: MemberState, replies: Sequence[tuple[HeartbeatCode, int] | None]
                     ) -> tuple[HeartbeatVerdict, int]:
    """A leader's verdict on a heartbeat round (its own success counted by the caller as one reply).

    Args:
        replies: ``(code, replier's term)`` per follower, ``None`` when it did not answer.

    Returns:
        ``(verdict, term)``: with STEP_DOWN, the term to become candidate in.
    """
    success = not_ready = 0
    for r in replies:
        if r is None:
            continue
        code, term = r
        if code is HeartbeatCode.EXPIRED_TERM and term > state.term:
            return HeartbeatVerdict.STEP_DOWN, term
        if code is HeartbeatCode.INCONSISTENT_LEADER:
            return HeartbeatVerdict.STEP_DOWN, state.term
        if code is HeartbeatCode.SUCCESS:
            success += 1
        elif code is HeartbeatCode.TERM_NOT_READY:
            not_ready += 1
    if state.is_quorum(success + 1):
        return HeartbeatVerdict.OK, state.term
    if state.is_quorum(success + not_ready + 1):
        return HeartbeatVerdict.RESEND_NOW, state.term
    return HeartbeatVerdict.NO_QUORUM, state.term


def leader_silent(now_ms: int, last_leader_heartbeat_ms: int, timings: ElectionTimings) -> bool:
    """A follower campaigns once its leader has been silent longer than ``maxHeartBeatLeak`` heartbeats."""
    return now_ms - last_leader_heartbeat_ms > timings.election_timeout_ms


def leader_lost_quorum(now_ms: int, last_quorum_heartbeat_ms: int, timings: ElectionTimings) -> bool:
    """A leader steps down once no heartbeat round reached a quorum for ``maxHeartBeatLeak`` heartbeats."""
    return now_ms - last_quorum_heartbeat_ms > timings.election_timeout_ms
