"""Leader election at work (docs/BEHAVIOUR.md 9.3, DLedger's ``DLedgerLeaderElector``): the timers of each role,
campaigns with pre-vote, the answers to votes, heartbeats and hand-overs, the leader's heartbeat rounds and its
quorum check, and leadership transfer. The rules are :mod:`broker.dledger.election`'s; this module drives them
with the clock, the randomness and the peers' channels.

* a follower whose leader is silent for the election timeout becomes a candidate;
* a candidate campaigns when its back-off is over: with ``pre_vote`` it first asks whether the others would vote
  for it in the next term, and raises the term only when a majority would (:meth:`LeaderElector._campaign`);
* a leader sends a heartbeat round every ``heartBeatTimeIntervalMs``, and steps down once no round reached a
  majority for the election timeout;
* the leader hands leadership to a member (``transfer_leadership``, or ``preferredLeaderIds`` by itself) once that
  member holds every entry: it asks it to campaign at once, without pre-vote.

Every change of role goes through here and is reported (``on_role_change``); winning calls ``on_elected`` first,
which makes the leader's log and push loops ready (:class:`~broker.dledger.pusher.EntryPusher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.election import (
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
from broker.dledger.member import MemberState, Role
from broker.dledger.protocol import (
    Frame,
    MsgType,
    Vote,
    decode_heartbeat_reply,
    decode_vote_reply,
    encode_heartbeat,
    encode_term,
    encode_vote,
)
from broker.dledger.transport import PeerChannel, PeerError

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)

#: A leader checks this often whether the preferred member caught up (``preferredLeaderIds``), in ms.
_HAND_OVER_CHECK_MS = 1000
#: A transfer looks at the target's progress and at the election this often, in s (bounded by its deadline).
_TRANSFER_POLL_S = 0.01


class LeaderElector:
    """One member's election.

    Args:
        config: the member's settings (timings, ``pre_vote``, peers, the preferred leader, request timeout).
        state: this member; the elector is the only one that changes its role.
        channels: one per other member.
        clock_ms: wall clock in ms.
        rng: randomness of the vote back-off.
        wake: asks the state loop for a look now (a term to raise, a heartbeat to resend).
        on_elected: ``(term)`` -- this member won ``term``: called before the change is reported.
        on_role_change: ``(role, term, leader id)`` after every change of role.
        caught_up: ``(member)`` -- whether it holds every entry of this leader's log.
        push_now: asks the leader's push loops for a look now (a transfer waits for the target).
    """

    def __init__(self, config: DLedgerConfig, state: MemberState, channels: Mapping[str, PeerChannel], *,
                 clock_ms: Callable[[], int], rng: random.Random, wake: Callable[[], None],
                 on_elected: Callable[[int], None], on_role_change: Callable[[Role, int, str | None], None],
                 caught_up: Callable[[str], bool], push_now: Callable[[], None]) -> None:
        self.config = config
        self._state = state
        self._channels = channels
        self._clock = clock_ms
        self._rng = rng
        self._wake = wake
        self._on_elected = on_elected
        self._on_role_change = on_role_change
        self._caught_up = caught_up
        self._push_now = push_now
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []  # the leader's heartbeat rounds and hand-over
        self.elections = 0
        """Vote rounds this member started."""
        self.last_leader_heartbeat_ms = 0
        """When (ms) a leader was last heard from (a heartbeat or a push it sent)."""
        self.last_quorum_heartbeat_ms = 0
        """When (ms) this leader's last heartbeat round reached a majority (it steps down once that is older than
        the election timeout)."""
        self._next_vote_ms = 0
        self._next_heartbeat_ms = 0
        self._next_transfer_check_ms = 0
        self._increase_term_now = False
        self._last_verdict = Verdict.WAIT_TO_REVOTE
        self._last_role = (state.role, state.term, state.leader_id)
        self.transferee: str | None = None
        """The member this leader is handing leadership to (it refuses appends meanwhile)."""
        self._take_over = False  # the leader asked this member to campaign: no pre-vote
        self._round_over: asyncio.Future[None] | None = None
        """Set while a vote round waits for replies; resolved when the round became moot (a larger term asked for
        our vote, a leader spoke), so a candidate answers TERM_NOT_READY only until its loop catches up."""
        self._pre_vote_granted: tuple[int, str, int] | None = None
        """``(term, candidate, when ms)`` of the last pre-vote this candidate granted (see :meth:`_yields_to`)."""
        self._silent_leader: str | None = None
        """The leader whose silence made this member campaign, until a leader speaks again: a vote round does not
        wait for its answer once every other member has answered (see :meth:`_collect_votes`)."""

    def _rand_ms(self) -> int:
        t = self.config.timings
        return self._rng.randrange(t.min_vote_interval_ms, t.max_vote_interval_ms)

    def start(self) -> None:
        """The member starts: a leader is presumed heard from now, and the first campaign waits a random back-off
        (members started together do not all campaign at once)."""
        self.last_leader_heartbeat_ms = self._clock()
        self._next_vote_ms = self._clock() + self._rand_ms()

    def leads(self, term: int) -> bool:
        """Whether this member is the leader of ``term`` (still)."""
        st = self._state
        return st.role is Role.LEADER and st.term == term and not self._stopped

    async def stop(self) -> None:
        """No more campaigns or heartbeats (a member stopping)."""
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def _changed(self) -> None:
        """Report a change of role, term or leader (once per change)."""
        st = self._state
        now = (st.role, st.term, st.leader_id)
        if now == self._last_role:
            return
        self._last_role = now
        log.info("dledger %s: %s in term %d, leader %s", st.self_id, st.role.value, st.term, st.leader_id)
        if st.role is not Role.LEADER:
            for t in self._tasks:
                t.cancel()
            self._tasks = []
        self._on_role_change(st.role, st.term, st.leader_id)

    def _spawn(self, coro: Any) -> None:
        """A task of this leadership (cancelled when it ends)."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    # -- the state loop -------------------------------------------------------------------------------------
    async def tick(self, now: int) -> None:
        """The state loop's look at the timers of this member's role (``now`` in ms)."""
        st, t = self._state, self.config.timings
        if st.role is Role.FOLLOWER:
            if leader_silent(now, self.last_leader_heartbeat_ms, t):
                log.warning("dledger %s: leader %s silent for %d ms, campaigning", st.self_id, st.leader_id,
                            now - self.last_leader_heartbeat_ms)
                self._silent_leader = st.leader_id
                st.change_to_candidate(st.term)
                self._last_verdict = Verdict.WAIT_TO_VOTE_NEXT  # this term's vote went to the silent leader
                # Every follower noticed the same missed heartbeats: a random start in [0, max - min) spreads the
                # candidates (fewer split votes) without adding the minimum back-off to every failover.
                self._next_vote_ms = now + self._rand_ms() - t.min_vote_interval_ms
                self._changed()
        elif st.role is Role.CANDIDATE:
            if now >= self._next_vote_ms or self._increase_term_now:
                await self._campaign()
        elif leader_lost_quorum(now, self.last_quorum_heartbeat_ms, t):
            log.warning("dledger %s: no heartbeat quorum for %d ms, stepping down", st.self_id,
                        now - self.last_quorum_heartbeat_ms)
            st.change_to_candidate(st.term)
            self._last_verdict = Verdict.WAIT_TO_VOTE_NEXT
            self._next_vote_ms = now + self._rand_ms()
            self._changed()
        else:
            if now >= self._next_heartbeat_ms:
                self._next_heartbeat_ms = now + t.heartbeat_interval_ms
                self._spawn(self._heartbeat_round())
            self._maybe_hand_over(now)

    # -- campaigning ----------------------------------------------------------------------------------------
    async def _campaign(self) -> None:
        st, now = self._state, self._clock()
        if self._increase_term_now:
            self._increase_term_now = False
            st.next_term()
            # A candidate of this new term asked for our vote: give it time to ask again before competing.
            self._last_verdict = Verdict.WAIT_TO_REVOTE
            self._next_vote_ms = now + self._rand_ms()
            return
        if self._last_verdict is Verdict.WAIT_TO_VOTE_NEXT:
            take_over, self._take_over = self._take_over, False  # the leader asked: no pre-vote
            asked_ms = self._clock()
            if self.config.pre_vote and not take_over and not await self._pre_vote(st.term + 1):
                self._next_vote_ms = self._clock() + self._rand_ms()
                return
            if st.role is not Role.CANDIDATE:
                return  # a leader spoke during the pre-vote: this member follows it now
            if not take_over and self._yields_to(st.term + 1, asked_ms):
                self._next_vote_ms = self._clock() + self._rand_ms()
                return
            st.next_term()
        term = st.term
        req = VoteRequest(term, st.ledger_end_term, st.ledger_end_index, st.self_id)
        own, _ = handle_vote(st, req, from_self=True)
        if own is VoteResult.ACCEPT:
            log.info("dledger %s: voted for %s in term %d", st.self_id, st.self_id, term)
        self.elections += 1
        replies = await self._collect_votes(term, own, encode_vote(Vote(term, req.ledger_end_term,
                                                                         req.ledger_end_index, False)))
        if st.role is not Role.CANDIDATE or st.term != term:
            return  # a heartbeat or a larger term arrived meanwhile
        v = count_votes(st, term, replies, rand_ms=self._rand_ms(), timings=self.config.timings)
        log.info("dledger %s: vote for term %d: %s (%s)", st.self_id, term, v.verdict.value,
                 ", ".join("none" if r is None else r.result.value for r in replies))
        self._last_verdict = v.verdict
        if v.verdict is Verdict.PASSED:
            self._become_leader(term)
            return
        if v.known_max_term > term:
            st.change_to_candidate(v.known_max_term)
        self._next_vote_ms = self._clock() + v.retry_after_ms

    def _yields_to(self, term: int, since_ms: int) -> bool:
        """Whether this candidate, whose pre-vote for ``term`` passed, leaves ``term`` to another candidate: one
        with a smaller id whose pre-vote for the same term it granted since ``since_ms`` (their pre-votes
        crossed; both raising the term would split the vote, as happened in 2 of 20 failovers). The other's vote
        request then raises this member's term and gets its vote. Once per crossing: a candidate that asked and
        then never campaigned cannot hold this one back twice."""
        granted, self._pre_vote_granted = self._pre_vote_granted, None
        if granted is None:
            return False
        g_term, peer, at_ms = granted
        if g_term != term or at_ms < since_ms or peer >= self._state.self_id:
            return False
        log.info("dledger %s: %s asked for term %d too; leaving the term to it", self._state.self_id, peer, term)
        return True

    async def _pre_vote(self, term: int) -> bool:
        """Would a majority vote for this member in ``term``? Changes nothing anywhere."""
        st = self._state
        body = encode_vote(Vote(term, st.ledger_end_term, st.ledger_end_index, True))
        replies = await self._collect_votes(term, VoteResult.ACCEPT, body)
        granted = sum(1 for r in replies if r is not None and r.result is VoteResult.ACCEPT)
        if not st.is_quorum(granted):
            log.info("dledger %s: pre-vote for term %d got %d of %d; not raising the term", st.self_id, term,
                     granted, st.peer_count)
        return st.is_quorum(granted)

    async def _collect_votes(self, term: int, own: VoteResult, body: bytes) -> list[VoteReply | None]:
        """Ask every peer (a vote or a pre-vote); stop waiting once the verdict is known -- a quorum accepted, or
        accepted or asked to revote once their term caught up (REJECT_TERM_NOT_READY), or can no longer -- or after
        a heartbeat interval and a random share of the back-off, so a dead peer that never answers (its host gone,
        its port still accepting) cannot stall a round. Nor is the leader whose silence started the campaign
        waited for once every other member has answered: it was heard from by nobody for the election timeout,
        and a split vote (two candidates of one term, each refusing the other) would otherwise wait for it until
        the deadline before its back-off even began -- the failover times past 3 s with 500 ms heartbeats. A
        vote is still counted only when it arrives: this bounds the wait, not what wins."""
        st = self._state
        replies: list[VoteReply | None] = [VoteReply(own, term)]
        accepted = int(own is VoteResult.ACCEPT)
        not_ready = 0
        loop = asyncio.get_running_loop()
        tasks = {loop.create_task(c.request(MsgType.VOTE, body, self.config.request_timeout_s)): p
                 for p, c in self._channels.items()}
        silent = {t for t, p in tasks.items() if p == self._silent_leader}
        # DLedger waits 2000 ms plus a random [0, 1000); here one heartbeat interval plus a random share of the vote
        # back-off (the same 2-2.7 s with the default 2000 ms): a member that does not answer a vote within a
        # heartbeat interval is as good as dead for this round, and a split vote must not wait seconds for it.
        tm = self.config.timings
        deadline = loop.time() + (tm.heartbeat_interval_ms
                                  + self._rng.random() * (tm.max_vote_interval_ms - tm.min_vote_interval_ms)) / 1000
        over = self._round_over = loop.create_future()
        try:
            pending: set[asyncio.Future[Any]] = set(tasks)
            while (pending and not st.is_quorum(accepted + not_ready)
                   and st.is_quorum(accepted + not_ready + len(pending))):
                done, pending = await asyncio.wait(pending | {over}, timeout=max(0.0, deadline - loop.time()),
                                                   return_when=asyncio.FIRST_COMPLETED)
                pending.discard(over)
                if not done or over in done:
                    break
                for t in done:
                    reply = self._vote_reply(t)
                    replies.append(reply)
                    if reply is not None:
                        accepted += reply.result is VoteResult.ACCEPT
                        not_ready += reply.result is VoteResult.REJECT_TERM_NOT_READY
                if pending and pending <= silent:
                    break  # only the silent leader has not answered
        finally:
            self._round_over = None
            if not over.done():
                over.cancel()
            for t in tasks:
                t.cancel()
        return replies

    @staticmethod
    def _vote_reply(task: asyncio.Future[Any]) -> VoteReply | None:
        try:
            return VoteReply(*decode_vote_reply(task.result().body))
        except (PeerError, ValueError):
            return None

    def _end_round(self) -> None:
        if self._round_over is not None and not self._round_over.done():
            self._round_over.set_result(None)

    def _become_leader(self, term: int) -> None:
        st = self._state
        st.change_to_leader(term)
        self._silent_leader = None
        self.last_quorum_heartbeat_ms = self._clock()
        self._next_heartbeat_ms = 0
        self._on_elected(term)
        self._changed()
        self._wake()

    def step_down(self, term: int) -> None:
        """A member answered with the larger ``term``: back to candidate, and campaign in a new term at once."""
        self._state.change_to_candidate(term)
        self._increase_term_now = True
        self._changed()

    # -- answering peers ------------------------------------------------------------------------------------
    def on_vote(self, peer: str, v: Vote) -> VoteReply:
        """A vote or pre-vote request of ``peer``."""
        st = self._state
        req = VoteRequest(v.term, v.ledger_end_term, v.ledger_end_index, peer)
        if v.pre_vote:
            now = self._clock()
            result = handle_pre_vote(st, req, now_ms=now, last_leader_heartbeat_ms=self.last_leader_heartbeat_ms,
                                     timings=self.config.timings)
            if result is VoteResult.ACCEPT and st.role is Role.CANDIDATE:
                self._pre_vote_granted = (v.term, peer, now)
            return VoteReply(result, st.term)
        result, increase = handle_vote(st, req, from_self=False)
        if result is VoteResult.ACCEPT:
            log.info("dledger %s: voted for %s in term %d", st.self_id, peer, st.term)
        if increase:
            self._increase_term_now = True
            self._end_round()
            self._changed()
            self._wake()
        return VoteReply(result, st.term)

    def on_heartbeat(self, peer: str, term: int) -> HeartbeatCode:
        """A heartbeat of ``peer`` as the leader of ``term``, or a push (which speaks for its leader the same)."""
        code, increase = handle_heartbeat(self._state, term, peer)
        if code is HeartbeatCode.SUCCESS:
            self.last_leader_heartbeat_ms = self._clock()
            self._silent_leader = None
            self._end_round()
        if increase:
            self._increase_term_now = True
            self._wake()
        self._changed()
        return code

    def on_take_leadership(self, peer: str, term: int) -> HeartbeatCode:
        """The leader ``peer`` of ``term`` asks this follower to campaign now (no pre-vote: the leader wants it)."""
        st = self._state
        if term < st.term:
            return HeartbeatCode.EXPIRED_TERM
        if st.role is not Role.FOLLOWER or st.leader_id != peer or term != st.term:
            return HeartbeatCode.INCONSISTENT_LEADER
        log.info("dledger %s: %s hands leadership over in term %d; campaigning", st.self_id, peer, term)
        st.change_to_candidate(st.term)
        self._last_verdict = Verdict.WAIT_TO_VOTE_NEXT
        self._take_over = True
        self._next_vote_ms = 0
        self._changed()
        self._wake()
        return HeartbeatCode.SUCCESS

    # -- leading --------------------------------------------------------------------------------------------
    async def _ask_all(self, msg: MsgType, body: bytes, timeout_s: float) -> list[Frame | None]:
        async def one(p: str, c: PeerChannel) -> Frame | None:
            try:
                return await c.request(msg, body, timeout_s)
            except PeerError as e:
                log.debug("dledger %s: %s to %s failed: %s", self._state.self_id, msg.name, p, e)
                return None
        return list(await asyncio.gather(*(one(p, c) for p, c in self._channels.items())))

    async def _heartbeat_round(self) -> None:
        st, term = self._state, self._state.term
        timeout = self.config.timings.heartbeat_interval_ms / 1000
        frames = await self._ask_all(MsgType.HEARTBEAT, encode_heartbeat(term, self.config.broker_addr), timeout)
        if st.role is not Role.LEADER or st.term != term:
            return
        verdict, t = count_heartbeats(st, [None if f is None else decode_heartbeat_reply(f.body) for f in frames])
        if verdict is HeartbeatVerdict.OK:
            self.last_quorum_heartbeat_ms = self._clock()
        elif verdict is HeartbeatVerdict.RESEND_NOW:
            self._next_heartbeat_ms = 0
            self._wake()
        elif verdict is HeartbeatVerdict.STEP_DOWN:
            st.change_to_candidate(max(t, st.term))
            self._next_vote_ms = self._clock() + self._rand_ms()
            self._changed()

    def _maybe_hand_over(self, now: int) -> None:
        """A leader that is not the preferred one hands over once the preferred member has every entry (checked
        once a second)."""
        target = self.config.preferred_leader_id
        if (not target or target == self._state.self_id or self.transferee is not None
                or now < self._next_transfer_check_ms):
            return
        self._next_transfer_check_ms = now + _HAND_OVER_CHECK_MS
        if self._caught_up(target):
            self._spawn(self._hand_over_quietly(target))

    async def _hand_over_quietly(self, target: str) -> None:
        try:
            await self.transfer_leadership(target)
        except (AppendError, ValueError) as e:
            log.warning("dledger %s: handing leadership to preferred %s failed: %s", self._state.self_id, target, e)

    async def transfer_leadership(self, target: str, timeout_s: float = 5.0) -> None:
        """Hand leadership to ``target``: refuse appends (LEADER_TRANSFERRING), wait until it has every entry, ask
        it to campaign at once, and wait until it leads (or ``timeout_s`` seconds passed).

        Raises:
            ValueError: ``target`` is not a peer.
            AppendError: NOT_LEADER, or TRANSFER_FAILED (not caught up, refused, or no new leader in time).
        """
        st = self._state
        if target not in self.config.peers:
            raise ValueError(f"{target} is not a member of group {self.config.group} ({', '.join(self.config.peers)})")
        if st.role is not Role.LEADER:
            raise AppendError("NOT_LEADER", f"{st.self_id} is {st.role.value}; the leader is {st.leader_id}",
                              st.leader_id)
        if target == st.self_id:
            return
        if self.transferee is not None:
            raise AppendError("TRANSFER_FAILED", f"a transfer to {self.transferee} is already running", st.self_id)
        term, loop = st.term, asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.transferee = target
        try:
            while not self._caught_up(target):
                if not self.leads(term) or loop.time() > deadline:
                    raise AppendError("TRANSFER_FAILED", f"{target} did not catch up with this leader's log within "
                                      f"{timeout_s} s", st.leader_id)
                self._push_now()
                await asyncio.sleep(_TRANSFER_POLL_S)  # the follower's acks move its watermark
            await self._ask_to_take_over(target, term, max(0.1, deadline - loop.time()))
            while self.leads(term):
                if loop.time() > deadline:
                    raise AppendError("TRANSFER_FAILED", f"{target} did not win an election within {timeout_s} s",
                                      st.leader_id)
                await asyncio.sleep(_TRANSFER_POLL_S)  # its vote request (a larger term) deposes this leader
            log.info("dledger %s: handed leadership to %s (now term %d, leader %s)", st.self_id, target, st.term,
                     st.leader_id)
        finally:
            self.transferee = None

    async def _ask_to_take_over(self, target: str, term: int, timeout_s: float) -> None:
        leader = self._state.leader_id
        try:
            f = await self._channels[target].request(MsgType.TAKE_LEADERSHIP, encode_term(term), timeout_s)
            code, _ = decode_heartbeat_reply(f.body)
        except (PeerError, ValueError) as e:
            raise AppendError("TRANSFER_FAILED", f"{target} did not answer: {e}", leader) from None
        if code is not HeartbeatCode.SUCCESS:
            raise AppendError("TRANSFER_FAILED", f"{target} refused to take leadership ({code.name})", leader)
