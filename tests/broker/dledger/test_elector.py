"""The elector on its own (:class:`~broker.dledger.elector.LeaderElector`): one member ``n1`` with an injected clock
and randomness, and scripted peers that answer its requests at once (no sockets): the silent leader, pre-vote and
the vote, a larger term, the leader's heartbeat verdicts, a hand-over asked for, a transfer, and two candidates
whose pre-votes crossed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.election import ElectionTimings, HeartbeatCode, VoteResult
from broker.dledger.elector import LeaderElector
from broker.dledger.member import MemberState, Role
from broker.dledger.protocol import (
    Frame,
    MsgType,
    Vote,
    decode_heartbeat,
    decode_term,
    decode_vote,
    encode_heartbeat_reply,
    encode_vote_reply,
)
from broker.dledger.transport import PeerError
from tests.waiting import wait_until

T = ElectionTimings(heartbeat_interval_ms=100, max_heartbeat_leak=3, min_vote_interval_ms=50,
                    max_vote_interval_ms=150)
PEERS = {"n0": "x:1", "n1": "x:2", "n2": "x:3"}

#: ``(peer, request type, body) -> (answer type, answer body)``; raise PeerError for no answer.
Script = Callable[[str, MsgType, bytes], tuple[MsgType, bytes]]


class ScriptedPeer:
    """A channel to ``peer_id`` whose answers come from a script, at once; it records what it was asked."""

    def __init__(self, peer_id: str, script: Script, asked: list[tuple[str, MsgType, bytes]]) -> None:
        self._peer_id = peer_id
        self._script = script
        self._asked = asked

    @property
    def peer_id(self) -> str:
        return self._peer_id

    async def request(self, msg_type: MsgType, body: bytes, timeout_s: float,
                      tail: bytes | memoryview = b"") -> Frame:
        self._asked.append((self._peer_id, msg_type, bytes(body)))
        answer_type, answer = self._script(self._peer_id, msg_type, bytes(body))
        return Frame(answer_type, 0, memoryview(answer))

    def send(self, msg_type: MsgType, body: bytes, timeout_s: float,
             tail: bytes | memoryview = b"") -> asyncio.Future[Frame] | None:
        return None

    async def close(self) -> None:
        pass


def granting(peer: str, msg_type: MsgType, body: bytes) -> tuple[MsgType, bytes]:
    """Every peer grants every vote and pre-vote and takes every heartbeat."""
    if msg_type is MsgType.VOTE:
        return MsgType.VOTE_REPLY, encode_vote_reply(VoteResult.ACCEPT, decode_vote(body).term)
    if msg_type is MsgType.HEARTBEAT:
        return MsgType.HB_REPLY, encode_heartbeat_reply(HeartbeatCode.SUCCESS, decode_heartbeat(body)[0])
    raise PeerError(f"{peer} does not answer {msg_type.name}")


class Member:
    """``n1``'s elector with its collaborators recorded."""

    def __init__(self, script: Script = granting, **cfg: object) -> None:
        self.now = 1_000_000
        self.state = MemberState("n1", PEERS)
        self.asked: list[tuple[str, MsgType, bytes]] = []
        self.roles: list[tuple[Role, int, str | None]] = []
        self.elected: list[int] = []
        self.caught_up: set[str] = set()
        self.script = script
        channels = {p: ScriptedPeer(p, lambda *a: self.script(*a), self.asked) for p in PEERS if p != "n1"}
        config = DLedgerConfig(group="g", self_id="n1", peers=PEERS, timings=T, **cfg)  # type: ignore[arg-type]
        self.elector = LeaderElector(config, self.state, channels, clock_ms=lambda: self.now, rng=random.Random(7),
                                     wake=lambda: None, on_elected=self.elected.append,
                                     on_role_change=lambda *r: self.roles.append(r),
                                     caught_up=lambda p: p in self.caught_up, push_now=lambda: None)
        self.elector.start()

    async def after(self, ms: int) -> None:
        """The clock moves ``ms`` on and the state loop looks."""
        self.now += ms
        await self.elector.tick(self.now)

    def asked_for(self, msg_type: MsgType) -> list[tuple[str, bytes]]:
        return [(p, b) for p, t, b in self.asked if t is msg_type]

    async def lead(self) -> None:
        """Follow ``n0``, hear nothing from it, campaign and win (every peer grants)."""
        assert self.elector.on_heartbeat("n0", self.state.term) is HeartbeatCode.SUCCESS
        await self.after(T.election_timeout_ms + 1)
        await self.after(T.max_vote_interval_ms)
        assert self.state.role is Role.LEADER


def test_a_follower_whose_leader_went_silent_asks_first_then_campaigns_and_wins() -> None:
    async def main() -> None:
        m = Member()
        await m.lead()
        votes = [decode_vote(b) for _, b in m.asked_for(MsgType.VOTE)]
        assert [(v.term, v.pre_vote) for v in votes] == [(1, True), (1, True), (1, False), (1, False)]
        assert m.elected == [1] and (m.state.term, m.state.vote_for) == (1, "n1")
        assert m.roles == [(Role.FOLLOWER, 0, "n0"), (Role.CANDIDATE, 0, None), (Role.LEADER, 1, "n1")]
        assert m.elector.elections == 1 and m.elector.leads(1)

    asyncio.run(main())


@pytest.mark.parametrize(("pre_vote_answers", "raises"), [
    ({"n0": VoteResult.REJECT_LEADER_ALIVE, "n2": VoteResult.ACCEPT}, True),  # n1 and n2: a majority
    ({"n0": VoteResult.REJECT_LEADER_ALIVE, "n2": VoteResult.REJECT_LEADER_ALIVE}, False),
    ({"n0": VoteResult.ACCEPT, "n2": VoteResult.REJECT_EXPIRED_LEDGER_TERM}, True),
    ({"n0": VoteResult.REJECT_ALREADY_VOTED, "n2": VoteResult.REJECT_SMALL_LEDGER_END_INDEX}, False),
])
def test_the_term_is_raised_only_when_a_majority_granted_the_pre_vote(
        pre_vote_answers: dict[str, VoteResult], raises: bool) -> None:
    def script(peer: str, msg_type: MsgType, body: bytes) -> tuple[MsgType, bytes]:
        v = decode_vote(body)
        result = pre_vote_answers[peer] if v.pre_vote else VoteResult.ACCEPT
        return MsgType.VOTE_REPLY, encode_vote_reply(result, 0 if v.pre_vote else v.term)

    async def main() -> None:
        m = Member(script)
        m.elector.on_heartbeat("n0", 0)
        await m.after(T.election_timeout_ms + 1)
        await m.after(T.max_vote_interval_ms)
        real_votes = [b for _, b in m.asked_for(MsgType.VOTE) if not decode_vote(b).pre_vote]
        assert (m.state.term, bool(real_votes)) == ((1, True) if raises else (0, False))

    asyncio.run(main())


def test_a_vote_request_of_a_larger_term_is_answered_once_the_term_caught_up() -> None:
    async def main() -> None:
        m = Member()
        m.elector.on_heartbeat("n0", 0)
        assert m.elector.on_vote("n2", Vote(5, -1, -1, False)).result is VoteResult.REJECT_TERM_NOT_READY
        assert m.state.role is Role.CANDIDATE and m.state.term == 0
        await m.after(1)  # the state loop raises the term at once, and leaves the vote to the asker
        assert (m.state.term, m.state.vote_for) == (5, None)
        assert m.elector.on_vote("n2", Vote(5, -1, -1, False)).result is VoteResult.ACCEPT
        assert m.elector.on_vote("n0", Vote(5, -1, -1, False)).result is VoteResult.REJECT_ALREADY_VOTED

    asyncio.run(main())


@pytest.mark.parametrize(("answer", "after_ms", "role"), [
    (HeartbeatCode.SUCCESS, T.election_timeout_ms, Role.LEADER),  # the round renewed the lease
    (None, T.election_timeout_ms - 1, Role.LEADER),  # no quorum, but not yet for the election timeout
    (None, T.election_timeout_ms, Role.CANDIDATE),  # the same wait without a renewal: it steps down
    (HeartbeatCode.INCONSISTENT_LEADER, 0, Role.CANDIDATE),  # another leader reported: at once
    (HeartbeatCode.EXPIRED_TERM, 0, Role.CANDIDATE),  # a larger term reported: at once
])
def test_a_leaders_heartbeat_round_keeps_it_or_steps_it_down(
        answer: HeartbeatCode | None, after_ms: int, role: Role) -> None:
    async def main() -> None:
        m = Member()
        await m.lead()
        term = m.state.term

        def heartbeats(peer: str, msg_type: MsgType, body: bytes) -> tuple[MsgType, bytes]:
            if answer is None:
                raise PeerError(f"{peer} is down")
            return MsgType.HB_REPLY, encode_heartbeat_reply(answer, term + (answer is HeartbeatCode.EXPIRED_TERM))

        def round_over() -> bool:
            if answer is None:
                return len(m.asked_for(MsgType.HEARTBEAT)) == 2  # nothing to see: the lease is not renewed
            if answer is HeartbeatCode.SUCCESS:
                return m.elector.last_quorum_heartbeat_ms == m.now
            return m.state.role is Role.CANDIDATE

        m.script = heartbeats
        await m.after(1)  # a heartbeat round goes out
        await wait_until(round_over, 5, "the heartbeat round answered")
        await m.after(after_ms)
        assert m.state.role is role
        if role is Role.CANDIDATE:
            assert not m.elector.leads(term) and m.roles[-1][0] is Role.CANDIDATE


@pytest.mark.parametrize(("role", "leader", "term", "code"), [
    (Role.FOLLOWER, "n0", 3, HeartbeatCode.SUCCESS),
    (Role.FOLLOWER, "n0", 2, HeartbeatCode.EXPIRED_TERM),
    (Role.FOLLOWER, "n0", 4, HeartbeatCode.INCONSISTENT_LEADER),
    (Role.FOLLOWER, "n2", 3, HeartbeatCode.INCONSISTENT_LEADER),  # not our leader asks
    (Role.CANDIDATE, None, 3, HeartbeatCode.INCONSISTENT_LEADER),
])
def test_a_hand_over_is_taken_only_from_this_members_leader_in_its_term(
        role: Role, leader: str | None, term: int, code: HeartbeatCode) -> None:
    """Taken, the member campaigns at its next look without a pre-vote (the leader itself asked)."""
    async def main() -> None:
        m = Member()
        m.state.restore(3, None)
        if role is Role.FOLLOWER:
            assert leader is not None
            m.state.change_to_follower(3, leader)
        assert m.elector.on_take_leadership("n0", term) is code
        if code is HeartbeatCode.SUCCESS:
            await m.after(1)
            votes = [decode_vote(b) for _, b in m.asked_for(MsgType.VOTE)]
            assert {(v.term, v.pre_vote) for v in votes} == {(4, False)} and m.state.role is Role.LEADER

    asyncio.run(main())


def test_a_transfer_waits_for_the_target_then_asks_it_and_ends_when_it_leads() -> None:
    async def main() -> None:
        m = Member()
        await m.lead()
        term = m.state.term
        with pytest.raises(AppendError, match=r"TRANSFER_FAILED.*did not catch up"):
            await m.elector.transfer_leadership("n2", timeout_s=0.05)
        assert m.elector.transferee is None

        def take_over(peer: str, msg_type: MsgType, body: bytes) -> tuple[MsgType, bytes]:
            assert (peer, msg_type, decode_term(body)) == ("n2", MsgType.TAKE_LEADERSHIP, term)
            m.elector.on_vote("n2", Vote(term + 1, m.state.ledger_end_term, m.state.ledger_end_index, False))
            return MsgType.TAKE_LEADERSHIP_REPLY, encode_heartbeat_reply(HeartbeatCode.SUCCESS, term)

        m.script = take_over
        m.caught_up.add("n2")
        await m.elector.transfer_leadership("n2", timeout_s=5.0)
        assert m.state.role is Role.CANDIDATE and m.elector.transferee is None
        with pytest.raises(AppendError, match="NOT_LEADER"):
            await m.elector.transfer_leadership("n0")
        with pytest.raises(ValueError, match="not a member"):
            await m.elector.transfer_leadership("n9")

    asyncio.run(main())


@pytest.mark.parametrize(("asker", "raises"), [("n0", False), ("n2", True)])
def test_of_two_candidates_whose_pre_votes_crossed_only_the_smaller_id_raises_the_term(asker: str,
                                                                                       raises: bool) -> None:
    """``n1`` grants ``asker``'s pre-vote while its own pre-vote round runs: both would raise the term and split
    the vote, so ``n1`` leaves the term to a smaller id (``n0``) and campaigns against a larger one (``n2``)."""
    async def main() -> None:
        m = Member()
        m.elector.on_heartbeat("n0", 0)
        await m.after(T.election_timeout_ms + 1)

        def crossed(peer: str, msg_type: MsgType, body: bytes) -> tuple[MsgType, bytes]:
            v = decode_vote(body)
            if not v.pre_vote:
                raise PeerError(f"{peer} does not answer the vote")
            if peer == asker:  # its own pre-vote for the same term reached n1 meanwhile: granted
                assert m.elector.on_vote(asker, Vote(v.term, -1, -1, True)).result is VoteResult.ACCEPT
            return MsgType.VOTE_REPLY, encode_vote_reply(VoteResult.ACCEPT, 0)

        m.script = crossed
        await m.after(T.max_vote_interval_ms)
        assert (m.state.term, m.state.vote_for) == ((1, "n1") if raises else (0, None))

    asyncio.run(main())
