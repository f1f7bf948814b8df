"""One DLedger member at work: the election, the leader's replication and quorum wait, the follower's entry
handling, over :mod:`broker.dledger.transport`, in the owner's event loop. The rules are the pure modules'; this
module only drives them with a clock, the network and the store.

Two departures from DLedger, both for safety:

* a new leader appends an empty entry in its term first and commits an index only when the entry there is of
  its own term (Raft's rule; DLedger commits older-term entries by count, which the Raft paper's figure 8 shows
  can lose a committed entry); readers skip empty entries;
* pre-vote (``pre_vote``, on by default): before a candidate raises the term by itself it asks whether the others
  would vote for it, and a member that hears from a live leader says no, so a member cut off and then healed
  cannot depose a healthy leader.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from broker.dledger.dispatcher import EntryDispatcher, PushKind, PushState
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
from broker.dledger.entry import read_entry_header
from broker.dledger.follower import EntryHandler, FollowerCode
from broker.dledger.member import MemberState, Role
from broker.dledger.protocol import (
    Frame,
    MsgType,
    PushCode,
    PushReply,
    Vote,
    decode_heartbeat_reply,
    decode_push,
    decode_push_reply,
    decode_term,
    decode_vote,
    decode_vote_reply,
    encode_heartbeat_reply,
    encode_push_head,
    encode_push_reply,
    encode_term,
    encode_vote,
    encode_vote_reply,
)
from broker.dledger.quorum import AckCode, QuorumTracker
from broker.dledger.store import DLedgerStore, EntryRefused, copying
from broker.dledger.transport import FaultLayer, PeerClient, PeerError, PeerServer, serve_peers

__all__ = ["AppendError", "DLedgerNode", "NodeConfig", "PushBuffers", "Wakeup"]

log = logging.getLogger(__name__)

_TICK_S = 0.02


@attrs.frozen(kw_only=True)
class NodeConfig:
    """A member's settings (docs/SEMANTICS.md 9.1; the broker builds it from its ``dLeger*`` keys)."""

    group: str
    self_id: str
    peers: Mapping[str, str]
    """Every member's id -> ``host:port`` of its peer port, this one included."""
    timings: ElectionTimings = attrs.field(factory=ElectionTimings)
    pre_vote: bool = True
    max_pending: int = 10_000
    """``maxPendingRequestsNum``."""
    max_wait_ack_ms: int = 2500
    """``maxWaitAckTimeMs``."""
    max_push_timeout_ms: int = 1000
    """``maxPushTimeOutMs``."""
    max_batch_entries: int = 64
    max_batch_bytes: int = 4 << 20
    max_in_flight: int = 1000
    max_pushes_in_flight: int = 2
    """APPEND requests out to one follower at once at most: entries appended while they are out wait for the next
    push and go in one frame (with several senders, fewer and larger pushes cost the leader and the follower less
    per entry; a lone sender finds no push out and is pushed at once). A push out longer than
    ``max_push_timeout_ms`` does not hold the next one back."""
    request_timeout_s: float = 3.0
    preferred_leader_id: str | None = None
    """``preferredLeaderIds``: a leader hands leadership to this member once it has every entry."""
    auth_secret: bytes = attrs.field(default=b"", repr=False)
    """``haAuthSecret``: every peer connection passes the handshake of :mod:`broker.peer_auth` first, both ways
    ('' = none)."""
    tls_server: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: the peer port accepts TLS only, with this context (None: plain TCP)."""
    tls_client: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: connections to the other members use TLS with this context (verifies them)."""


class AppendError(Exception):
    """An append that did not commit: ``code`` is NOT_LEADER, LEADER_PENDING_FULL, WAIT_QUORUM_ACK_TIMEOUT or
    TERM_CHANGED; ``leader_id`` the leader this member knows (None when none)."""

    def __init__(self, code: str, message: str, leader_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.leader_id = leader_id


class Wakeup:
    """A wake-up flag a loop waits on with a timeout: a plain future and a timer, so a cancellation always
    reaches the waiter (``asyncio.wait_for`` on Python 3.11 can lose one that races with the inner wait)."""

    def __init__(self) -> None:
        self._set = False
        self._fut: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Return when set (since the last wait) or after ``timeout_s``; clears the flag."""
        if not self._set:
            loop = asyncio.get_running_loop()
            fut = self._fut = loop.create_future()
            timer = loop.call_later(timeout_s, _resolve, fut)
            try:
                await fut
            finally:
                timer.cancel()
                self._fut = None
        self._set = False


class PushBuffers:
    """The entries read for APPEND pushes, kept for the followers pushed the same range: one copy out of the log
    and one buffer on every follower's socket (the transport does not join it into a frame), where each follower
    took its own copy before -- on the leader's one loop, per batch.

    Valid for one leadership: a leader's log only grows (it truncates only as a follower, after its dispatchers
    stopped), so the entries at an index do not change while it holds them; each leadership makes its own. Holds
    the ``max_ranges`` latest ranges (the followers in step ask for the same one, one after the other).

    Args:
        store: the leader's log.
        max_ranges: ranges kept at most (each at most ``max_bytes`` of a :meth:`get`).
    """

    def __init__(self, store: DLedgerStore, max_ranges: int) -> None:
        self._store = store
        self._recent: collections.deque[tuple[tuple[int, int, int], tuple[bytes, int]]] = collections.deque(
            maxlen=max(1, max_ranges))
        self.reads = 0
        """Ranges read from the log (the others were shared)."""

    def get(self, first: int, last: int, max_bytes: int) -> tuple[bytes, int]:
        """:meth:`DLedgerStore.get_range` of ``first..last``, the very bytes object another follower got for it."""
        key = (first, last, max_bytes)
        for k, v in self._recent:
            if k == key:
                return v
        v = self._store.get_range(first, last, max_bytes)
        self.reads += 1
        if v[1] >= first:
            self._recent.append((key, v))
        return v


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class DLedgerNode:
    """One member.

    Args:
        config: its settings.
        store: its log, loaded.
        faults: the fault layer (tests).
        clock_ms: wall clock in ms.
        rng: randomness of the vote back-off.
        on_role_change: ``(role, term, leader id)`` after every change of role.
        on_commit: ``(committed index, committed position)`` after the committed index moved.
    """

    def __init__(self, config: NodeConfig, store: DLedgerStore, *, faults: FaultLayer | None = None,
                 clock_ms: Callable[[], int] = _wall_ms, rng: random.Random | None = None,
                 on_role_change: Callable[[Role, int, str | None], None] | None = None,
                 on_commit: Callable[[int, int], None] | None = None) -> None:
        self.config = config
        self.store = store
        self.faults = faults or FaultLayer()
        self._clock = clock_ms
        self._rng = rng or random.Random()
        self._on_role = on_role_change
        self._on_commit = on_commit
        self.state = MemberState(config.self_id, config.peers, persist=store.persist_term)
        self.state.restore(*store.load_term())
        self.state.ledger_end_index, self.state.ledger_end_term = store.end_index, store.end_term
        self._others = [p for p in config.peers if p != config.self_id]
        self._clients = {p: PeerClient(config.group, config.self_id, p, config.peers[p], self.faults,
                                       max_in_flight=config.max_in_flight + 16, secret=config.auth_secret,
                                       tls=config.tls_client)
                         for p in self._others}
        self._server: PeerServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_tasks: list[asyncio.Task[None]] = []
        self._wake = Wakeup()
        self._new_data = {p: Wakeup() for p in self._others}  # one per follower's dispatcher
        self._stopping = False
        self.last_leader_heartbeat_ms = 0
        self._last_quorum_heartbeat_ms = 0
        self._next_vote_ms = 0
        self._next_heartbeat_ms = 0
        self._increase_term_now = False
        self._last_verdict = Verdict.WAIT_TO_REVOTE
        self._tracker: QuorumTracker | None = None
        self.push_buffers: PushBuffers | None = None
        """The entries pushed to the followers in this leadership (None when not leading)."""
        self._futures: dict[int, tuple[asyncio.Future[tuple[int, int]], int]] = {}
        self._handler = EntryHandler()
        self._pending_entries: dict[int, bytes | memoryview] = {}  # parked APPEND batches by first index
        self._last_sweep_ms = 0
        self.elections = 0
        self._last_role = (self.state.role, self.state.term, self.state.leader_id)
        self._transferee: str | None = None
        self._round_over: asyncio.Future[None] | None = None
        """Set while a vote round waits for replies; resolved when the round became moot (a larger term asked for
        our vote, a leader spoke), so a candidate answers TERM_NOT_READY only until its loop catches up."""
        self._matched = (-1, -1)
        """``(term, index)``: the last index this follower knows agrees with the leader of that term (a COMPARE,
        TRUNCATE or APPEND proved it); it commits no further (Raft: ``min(leaderCommit, last new entry)``)."""
        self._take_over = False
        self._next_transfer_check_ms = 0
        self._pre_vote_granted: tuple[int, str, int] | None = None
        """``(term, candidate, when ms)`` of the last pre-vote this candidate granted (see :meth:`_yields_to`)."""
        self._silent_leader: str | None = None
        """The leader whose silence made this member campaign, until a leader speaks again: a vote round does not
        wait for its answer once every other member has answered (see :meth:`_collect_votes`)."""

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", sock: socket.socket | None = None) -> int:
        """Listen on the peer port (the one in ``peers``, or ``sock`` already bound to it) and start the member;
        returns the bound port."""
        port = int(self.config.peers[self.config.self_id].rpartition(":")[2])
        self._server = await serve_peers(host, port, group=self.config.group, self_id=self.config.self_id,
                                         peers=self.config.peers, handler=self._handle, faults=self.faults,
                                         secret=self.config.auth_secret, sock=sock, tls=self.config.tls_server)
        self.last_leader_heartbeat_ms = self._clock()
        self._next_vote_ms = self._clock() + self._rand_ms()
        self._tasks.append(asyncio.get_running_loop().create_task(self._run(), name=f"dledger-run-{self.config.self_id}"))
        return self._server.port

    async def stop(self) -> None:
        self._stopping = True  # every loop checks it: a cancellation lost in a race cannot keep one running
        for t in self._tasks + self._leader_tasks:
            t.cancel()
        for t in self._tasks + self._leader_tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._fail_pending("TERM_CHANGED", "the member stopped")
        for c in self._clients.values():
            await c.close()
        if self._server is not None:
            await self._server.close()

    def _rand_ms(self) -> int:
        t = self.config.timings
        return self._rng.randrange(t.min_vote_interval_ms, t.max_vote_interval_ms)

    def _role_changed(self) -> None:
        st = self.state
        now = (st.role, st.term, st.leader_id)
        if now != self._last_role:
            self._last_role = now
            log.info("dledger %s: %s in term %d, leader %s", st.self_id, st.role.value, st.term, st.leader_id)
            if st.role is not Role.LEADER:
                self._stop_leading()
            if self._on_role is not None:
                self._on_role(st.role, st.term, st.leader_id)

    # -- the state loop -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._step()
            except Exception:
                log.exception("dledger %s: state loop step failed", self.state.self_id)
            await self._wake.wait(_TICK_S)

    async def _step(self) -> None:
        st, now, t = self.state, self._clock(), self.config.timings
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
                self._role_changed()
            elif now - self._last_sweep_ms >= 1000:
                self._last_sweep_ms = now
                self._sweep(now)
        elif st.role is Role.CANDIDATE:
            if now >= self._next_vote_ms or self._increase_term_now:
                await self._campaign()
        else:
            if leader_lost_quorum(now, self._last_quorum_heartbeat_ms, t):
                log.warning("dledger %s: no heartbeat quorum for %d ms, stepping down", st.self_id,
                            now - self._last_quorum_heartbeat_ms)
                st.change_to_candidate(st.term)
                self._last_verdict = Verdict.WAIT_TO_VOTE_NEXT
                self._next_vote_ms = now + self._rand_ms()
                self._role_changed()
            elif now >= self._next_heartbeat_ms:
                self._next_heartbeat_ms = now + t.heartbeat_interval_ms
                self._leader_tasks.append(asyncio.get_running_loop().create_task(self._heartbeat_round()))
                self._leader_tasks = [x for x in self._leader_tasks if not x.done()]
            self._check_quorum()
            self._maybe_hand_over(now)

    async def _ask_all(self, msg: MsgType, body: bytes, timeout_s: float) -> list[Frame | None]:
        async def one(p: str) -> Frame | None:
            try:
                return await self._clients[p].request(msg, body, timeout_s)
            except PeerError as e:
                log.debug("dledger %s: %s to %s failed: %s", self.state.self_id, msg.name, p, e)
                return None
        return list(await asyncio.gather(*(one(p) for p in self._others)))

    async def _campaign(self) -> None:
        st, now = self.state, self._clock()
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
        if g_term != term or at_ms < since_ms or peer >= self.state.self_id:
            return False
        log.info("dledger %s: %s asked for term %d too; leaving the term to it", self.state.self_id, peer, term)
        return True

    async def _collect_votes(self, term: int, own: VoteResult, body: bytes) -> list[VoteReply | None]:
        """Ask every peer (a vote or a pre-vote); stop waiting once the verdict is known -- a quorum accepted, or
        accepted or asked to revote once their term caught up (REJECT_TERM_NOT_READY), or can no longer -- or after
        a heartbeat interval and a random share of the back-off, so a dead peer that never answers (its host gone,
        its port still accepting) cannot stall a round. Nor is the leader whose silence started the campaign
        waited for once every other member has answered: it was heard from by nobody for the election timeout,
        and a split vote (two candidates of one term, each refusing the other) would otherwise wait for it until
        the deadline before its back-off even began -- the failover times past 3 s with 500 ms heartbeats. A
        vote is still counted only when it arrives: this bounds the wait, not what wins."""
        st = self.state
        replies: list[VoteReply | None] = [VoteReply(own, term)]
        accepted = int(own is VoteResult.ACCEPT)
        not_ready = 0
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._clients[p].request(MsgType.VOTE, body, self.config.request_timeout_s))
                 for p in self._others]
        silent = {t for t, p in zip(tasks, self._others, strict=True) if p == self._silent_leader}
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
                    try:
                        reply = VoteReply(*decode_vote_reply(t.result().body))
                    except (PeerError, ValueError):
                        replies.append(None)
                        continue
                    replies.append(reply)
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

    def _end_round(self) -> None:
        if self._round_over is not None and not self._round_over.done():
            self._round_over.set_result(None)

    async def _pre_vote(self, term: int) -> bool:
        st = self.state
        body = encode_vote(Vote(term, st.ledger_end_term, st.ledger_end_index, True))
        replies = await self._collect_votes(term, VoteResult.ACCEPT, body)
        granted = sum(1 for r in replies if r is not None and r.result is VoteResult.ACCEPT)
        if not st.is_quorum(granted):
            log.info("dledger %s: pre-vote for term %d got %d of %d; not raising the term", st.self_id, term,
                     granted, st.peer_count)
        return st.is_quorum(granted)

    # -- leading --------------------------------------------------------------------------------------------
    def _become_leader(self, term: int) -> None:
        st = self.state
        st.change_to_leader(term)
        self._silent_leader = None
        now = self._clock()
        self._last_quorum_heartbeat_ms = now
        self._next_heartbeat_ms = 0
        self._tracker = QuorumTracker(self.config.peers, max_pending=self.config.max_pending,
                                      max_wait_ack_ms=self.config.max_wait_ack_ms)
        # An empty entry of this term first: entries of older terms commit with it (Raft's rule).
        index, _ = self.store.append_as_leader(term, b"")
        self._after_local_append(index)
        loop = asyncio.get_running_loop()
        self.push_buffers = PushBuffers(self.store, 2 * len(self._others))
        self._leader_tasks = [loop.create_task(self._replicate(p, term, self.push_buffers)) for p in self._others]
        self._role_changed()
        self._wake.set()

    def _stop_leading(self) -> None:
        for t in self._leader_tasks:
            t.cancel()
        self._leader_tasks = []
        self._fail_pending("TERM_CHANGED", "leadership changed before a quorum stored the entry")
        self._tracker = None
        self.push_buffers = None

    def _fail_pending(self, code: str, message: str) -> None:
        futures, self._futures = self._futures, {}
        for fut, _ in futures.values():
            if not fut.done():
                fut.set_exception(AppendError(code, message, self.state.leader_id))

    def _kick(self) -> None:
        """New entries or acks: every dispatcher looks again."""
        for w in self._new_data.values():
            w.set()

    def _after_local_append(self, index: int) -> None:
        st = self.state
        st.ledger_end_index, st.ledger_end_term = self.store.end_index, self.store.end_term
        assert self._tracker is not None
        self._tracker.ack(st.term, st.self_id, index)
        self._kick()

    async def append(self, body: bytes) -> tuple[int, int]:
        """Append one entry as the leader and wait until a quorum stores it; returns ``(index, position)``.

        Raises:
            AppendError: NOT_LEADER, LEADER_PENDING_FULL, WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED.
            OSError: the disk refused the write (nothing was appended).
        """
        _, _, fut = self.append_nowait(len(body), copying(body))
        return await fut

    def append_nowait(self, body_length: int, build: Callable[[bytearray, int, int], None]
                      ) -> tuple[int, int, asyncio.Future[tuple[int, int]]]:
        """Append one entry as the leader now (its body written by ``build``, see
        :meth:`DLedgerStore.append_built`) and return ``(index, position, future)``; the future completes with
        ``(index, position)`` once a quorum stores the entry, or fails with :class:`AppendError`. Call it on the
        member's event loop.

        Raises:
            AppendError: NOT_LEADER or LEADER_PENDING_FULL (nothing was appended).
            OSError: the disk refused the write (nothing was appended).
        """
        st = self.state
        if st.role is not Role.LEADER or self._tracker is None:
            raise AppendError("NOT_LEADER", f"{st.self_id} is {st.role.value}; the leader is {st.leader_id}",
                              st.leader_id)
        if self._transferee is not None:
            raise AppendError("LEADER_TRANSFERRING", f"{st.self_id} is handing leadership to {self._transferee}",
                              st.leader_id)
        term = st.term
        if self._tracker.pending_full(term):
            raise AppendError("LEADER_PENDING_FULL", f"more than {self.config.max_pending} appends wait for a "
                                                     f"quorum (maxPendingRequestsNum)", st.leader_id)
        index, pos = self.store.append_built(term, body_length, build)
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._futures[index] = (fut, pos)
        self._tracker.add(term, index, index, self._clock())
        self._after_local_append(index)
        if not self._others:
            # A member alone is its own quorum. With others the leader's own entry cannot move the quorum index
            # (its watermark is the highest; a quorum needs a follower's); acks and the state loop's tick check.
            self._check_quorum()
        return index, pos, fut

    def _check_quorum(self) -> None:
        tracker, st = self._tracker, self.state
        if tracker is None or st.role is not Role.LEADER:
            return
        idx, done = tracker.check(st.term, self._clock())
        if idx > self.store.committed_index:
            unit = self.store.unit(idx)
            committed = unit is not None and unit[2] == st.term and self.store.update_committed(st.term, idx, st.term)
            if committed and self._on_commit is not None:
                self._on_commit(self.store.committed_index, self.store.committed_pos)
        for c in done:
            entry = self._futures.get(c.index)
            if entry is None:
                continue
            fut, pos = entry
            if c.code is AckCode.SUCCESS:
                del self._futures[c.index]
                if not fut.done():
                    fut.set_result((c.index, pos))
            elif not fut.done():
                del self._futures[c.index]
                fut.set_exception(AppendError(c.code.value, f"entry {c.index} was not stored by a quorum within "
                                              f"{self.config.max_wait_ack_ms} ms (maxWaitAckTimeMs)"
                                              if c.code is AckCode.WAIT_QUORUM_ACK_TIMEOUT else
                                              f"the term moved on before entry {c.index} reached a quorum",
                                              st.leader_id))

    # -- leadership transfer (docs/SEMANTICS.md 9.3, preferredLeaderIds) ------------------------------------------
    def _maybe_hand_over(self, now: int) -> None:
        """A leader that is not the preferred one hands over once the preferred member has every entry (checked
        once a second)."""
        target = self.config.preferred_leader_id
        if (not target or target == self.state.self_id or self._transferee is not None
                or now < self._next_transfer_check_ms or self._tracker is None):
            return
        self._next_transfer_check_ms = now + 1000
        if self._tracker.watermarks(self.state.term).get(target, -1) >= self.store.end_index:
            task = asyncio.get_running_loop().create_task(self._hand_over_quietly(target))
            self._leader_tasks.append(task)

    async def _hand_over_quietly(self, target: str) -> None:
        try:
            await self.transfer_leadership(target)
        except (AppendError, ValueError) as e:
            log.warning("dledger %s: handing leadership to preferred %s failed: %s", self.state.self_id, target, e)

    async def transfer_leadership(self, target: str, timeout_s: float = 5.0) -> None:
        """Hand leadership to ``target``: refuse appends (LEADER_TRANSFERRING), wait until it has every entry, ask
        it to campaign at once, and wait until it leads (or the attempt times out).

        Raises:
            ValueError: ``target`` is not a peer.
            AppendError: NOT_LEADER, or TRANSFER_FAILED (not caught up, refused, or no new leader in time).
        """
        st = self.state
        if target not in self.config.peers:
            raise ValueError(f"{target} is not a member of group {self.config.group} ({', '.join(self.config.peers)})")
        if st.role is not Role.LEADER or self._tracker is None:
            raise AppendError("NOT_LEADER", f"{st.self_id} is {st.role.value}; the leader is {st.leader_id}",
                              st.leader_id)
        if target == st.self_id:
            return
        if self._transferee is not None:
            raise AppendError("TRANSFER_FAILED", f"a transfer to {self._transferee} is already running", st.self_id)
        term, loop = st.term, asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._transferee = target
        try:
            while self._tracker is not None and self._tracker.watermarks(term).get(target, -1) < self.store.end_index:
                if not self.leads(term) or loop.time() > deadline:
                    raise AppendError("TRANSFER_FAILED", f"{target} did not catch up with entry {self.store.end_index} "
                                      f"within {timeout_s} s", st.leader_id)
                self._kick()
                await asyncio.sleep(0.01)  # bounded by the deadline; the follower's acks move the watermark
            try:
                f = await self._clients[target].request(MsgType.TAKE_LEADERSHIP, encode_term(term),
                                                        max(0.1, deadline - loop.time()))
                code, _ = decode_heartbeat_reply(f.body)
            except (PeerError, ValueError) as e:
                raise AppendError("TRANSFER_FAILED", f"{target} did not answer: {e}", st.leader_id) from None
            if code is not HeartbeatCode.SUCCESS:
                raise AppendError("TRANSFER_FAILED", f"{target} refused to take leadership ({code.name})",
                                  st.leader_id)
            while self.leads(term):
                if loop.time() > deadline:
                    raise AppendError("TRANSFER_FAILED", f"{target} did not win an election within {timeout_s} s",
                                      st.leader_id)
                await asyncio.sleep(0.01)  # bounded: its vote request (a larger term) deposes this leader
            log.info("dledger %s: handed leadership to %s (now term %d, leader %s)", st.self_id, target, st.term,
                     st.leader_id)
        finally:
            self._transferee = None

    def _on_take_leadership(self, peer: str, term: int) -> bytes:
        """The leader asks this follower to campaign now (no pre-vote: the leader itself wants it)."""
        st = self.state
        if term < st.term:
            code = HeartbeatCode.EXPIRED_TERM
        elif st.role is not Role.FOLLOWER or st.leader_id != peer or term != st.term:
            code = HeartbeatCode.INCONSISTENT_LEADER
        else:
            code = HeartbeatCode.SUCCESS
            log.info("dledger %s: %s hands leadership over in term %d; campaigning", st.self_id, peer, term)
            st.change_to_candidate(st.term)
            self._last_verdict = Verdict.WAIT_TO_VOTE_NEXT
            self._take_over = True
            self._next_vote_ms = 0
            self._role_changed()
            self._wake.set()
        return encode_heartbeat_reply(code, st.term)

    async def _heartbeat_round(self) -> None:
        st, term = self.state, self.state.term
        timeout = self.config.timings.heartbeat_interval_ms / 1000
        frames = await self._ask_all(MsgType.HEARTBEAT, encode_term(term), timeout)
        if st.role is not Role.LEADER or st.term != term:
            return
        verdict, t = count_heartbeats(st, [None if f is None else decode_heartbeat_reply(f.body) for f in frames])
        if verdict is HeartbeatVerdict.OK:
            self._last_quorum_heartbeat_ms = self._clock()
        elif verdict is HeartbeatVerdict.RESEND_NOW:
            self._next_heartbeat_ms = 0
            self._wake.set()
        elif verdict is HeartbeatVerdict.STEP_DOWN:
            st.change_to_candidate(max(t, st.term))
            self._next_vote_ms = self._clock() + self._rand_ms()
            self._role_changed()

    async def _replicate(self, peer: str, term: int, buffers: PushBuffers) -> None:
        """The dispatcher of one follower while this member leads ``term`` (``buffers``: this leadership's)."""
        cfg, st, store = self.config, self.state, self.store
        disp = EntryDispatcher(peer, max_in_flight=cfg.max_in_flight, max_batch=cfg.max_batch_entries,
                               max_push_timeout_ms=cfg.max_push_timeout_ms)
        client = self._clients[peer]
        inflight: set[asyncio.Future[Any]] = set()
        appends: dict[asyncio.Future[Any], int] = {}  # APPEND pushes out -> sent at ms
        try:
            while st.role is Role.LEADER and st.term == term and not self._stopping:
                now = self._clock()
                if (len(appends) >= cfg.max_pushes_in_flight
                        and now - min(appends.values()) <= cfg.max_push_timeout_ms):
                    # Pushes enough are out: what is appended meanwhile goes in one frame when one comes back.
                    await self._new_data[peer].wait(0.01)
                    continue
                for s in disp.poll(store.begin_index, store.end_index, now, store.committed_index):
                    if s.kind in (PushKind.COMPARE, PushKind.TRUNCATE):
                        await self._compare_or_truncate(client, disp, s.kind, s.index, term)
                    elif s.kind is PushKind.APPEND:
                        # at most max_batch_bytes, and never past the end of a data file
                        body, last = buffers.get(s.index, s.index + s.count - 1, cfg.max_batch_bytes)
                        if last < s.index + s.count - 1:
                            disp.trim(s.index, last)
                        t = self._send_push(client, disp, term, s.index, last, body)
                        inflight.add(t)
                        t.add_done_callback(inflight.discard)
                        appends[t] = now
                        t.add_done_callback(appends.pop)
                        if last < s.index + s.count - 1:
                            break
                    else:
                        t = self._send_push(client, disp, term, -1, -1, b"")
                        inflight.add(t)
                        t.add_done_callback(inflight.discard)
                await self._new_data[peer].wait(0.01 if disp.owes_commit(store.committed_index) else 0.05)
        finally:
            for t in inflight:
                t.cancel()

    async def _compare_or_truncate(self, client: PeerClient, disp: EntryDispatcher, kind: PushKind, index: int,
                                   term: int) -> None:
        store = self.store
        entry = store.get(index)
        if entry is None:
            disp.reset()
            return
        body = encode_push_head(kind, term, store.committed_index, index, 1) + entry
        try:
            f = await client.request(MsgType.PUSH, body, self.config.request_timeout_s)
            r = decode_push_reply(f.body)
        except (PeerError, ValueError) as e:
            log.debug("dledger %s: %s to %s failed: %s", self.state.self_id, kind.value, client.peer_id, e)
            disp.reset() if kind is PushKind.TRUNCATE else disp.on_compare_failed()
            await asyncio.sleep(0.5 if isinstance(e, PeerError) else 0)
            return
        if self._term_reply(r):
            return
        if r.code not in (PushCode.SUCCESS, PushCode.INCONSISTENT_STATE):
            disp.on_compare_failed() if kind is PushKind.COMPARE else disp.reset()
            await asyncio.sleep(0.05)  # not following us yet (our first heartbeat is on its way)
            return
        if kind is PushKind.COMPARE:
            disp.on_compare(r.code is PushCode.SUCCESS, r.begin_index, r.end_index, store.begin_index,
                            store.end_index)
        else:
            disp.on_truncate(r.code is PushCode.SUCCESS)
            if r.code is PushCode.SUCCESS and self._tracker is not None:
                self._tracker.ack(term, client.peer_id, index)
                self._check_quorum()

    def _send_push(self, client: PeerClient, disp: EntryDispatcher, term: int, first: int, last: int,
                   entries: bytes) -> asyncio.Future[Any]:
        """Push entries ``first..last`` (none: a COMMIT) to the follower; returns a future done once the answer
        was handled (cancel it to forget the push). Written at once when the transport can
        (:meth:`PeerClient.send`: no task and no await per push, on the loop every send shares); else, with a
        fault set or no connection yet, by a task (:meth:`_push`)."""
        kind = PushKind.APPEND if entries else PushKind.COMMIT
        head = encode_push_head(kind, term, self.store.committed_index, first if entries else -1,
                                last - first + 1 if entries else 0)
        fut = client.send(MsgType.PUSH, head, self.config.request_timeout_s, entries)
        if fut is None:
            return asyncio.get_running_loop().create_task(self._push(client, disp, term, first, last, entries, head))
        fut.add_done_callback(functools.partial(self._push_answered, client, disp, term, first, last,
                                                bool(entries)))
        return fut

    def _push_answered(self, client: PeerClient, disp: EntryDispatcher, term: int, first: int, last: int,
                       has_entries: bool, fut: asyncio.Future[Frame]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # pushed again after maxPushTimeOutMs
        if self.faults.active:  # set since the push went out: the answer passes the layer too
            task = asyncio.get_running_loop().create_task(
                self._answer_through_faults(client, disp, term, first, last, has_entries, fut.result()))
            self._leader_tasks.append(task)
            return
        self._on_push_answer(client, disp, term, first, last, has_entries, fut.result())

    async def _answer_through_faults(self, client: PeerClient, disp: EntryDispatcher, term: int, first: int,
                                     last: int, has_entries: bool, f: Frame) -> None:
        if await self.faults.passes(client.peer_id):
            self._on_push_answer(client, disp, term, first, last, has_entries, f)

    async def _push(self, client: PeerClient, disp: EntryDispatcher, term: int, first: int, last: int,
                    entries: bytes, head: bytes) -> None:
        try:
            f = await client.request(MsgType.PUSH, head, self.config.request_timeout_s, entries)
        except PeerError:
            return  # pushed again after maxPushTimeOutMs
        self._on_push_answer(client, disp, term, first, last, bool(entries), f)

    def _on_push_answer(self, client: PeerClient, disp: EntryDispatcher, term: int, first: int, last: int,
                        has_entries: bool, f: Frame) -> None:
        try:
            r = decode_push_reply(f.body)
        except ValueError:
            return  # pushed again after maxPushTimeOutMs
        if not has_entries or self._term_reply(r):
            return
        if r.code is PushCode.SUCCESS:
            disp.on_append(True, first, min(last, r.acked_index))
            committed = self.store.committed_index
            if self._tracker is not None and self.state.term == term:
                self._tracker.ack(term, client.peer_id, min(last, r.acked_index))
                self._check_quorum()
            # The ack frees this follower's window; the others need a look only when the commit moved (they
            # carry it to their followers). A window freed with nothing left to push wakes nobody: the next
            # append does (the second follower's ack of every batch was a loop turn for nothing).
            if self.store.committed_index != committed:
                self._kick()
            elif disp.state is not PushState.APPEND or disp.write_index <= self.store.end_index:
                self._new_data[client.peer_id].set()
        elif r.code is PushCode.INCONSISTENT_STATE:
            disp.on_append(False, first, last, inconsistent=True)
            self._new_data[client.peer_id].set()

    def _term_reply(self, r: PushReply) -> bool:
        """A follower answered with a larger term: step down. True when it did."""
        st = self.state
        if r.term > st.term:
            st.change_to_candidate(r.term)
            self._increase_term_now = True
            self._role_changed()
            return True
        return False

    # -- answering peers ------------------------------------------------------------------------------------
    def _handle(self, peer: str, f: Frame) -> tuple[MsgType, bytes] | Awaitable[tuple[MsgType, bytes]]:
        """The answer to a peer's request, at once when it is known (every request but a PUSH whose entries wait
        for an earlier batch): the transport writes it without a task and a loop turn per request."""
        if f.type is MsgType.PUSH:
            r = self._on_push(peer, f)
            if isinstance(r, PushReply):
                return MsgType.PUSH_REPLY, encode_push_reply(r)
            return self._push_answer(r)
        if f.type is MsgType.VOTE:
            return MsgType.VOTE_REPLY, self._on_vote(peer, f)
        if f.type is MsgType.HEARTBEAT:
            return MsgType.HB_REPLY, self._on_heartbeat(peer, decode_term(f.body))
        if f.type is MsgType.TAKE_LEADERSHIP:
            return MsgType.TAKE_LEADERSHIP_REPLY, self._on_take_leadership(peer, decode_term(f.body))
        raise ValueError(f"peer {peer} sent a {f.type.name} request")

    def _on_vote(self, peer: str, f: Frame) -> bytes:
        v = decode_vote(f.body)
        req = VoteRequest(v.term, v.ledger_end_term, v.ledger_end_index, peer)
        st = self.state
        if v.pre_vote:
            result = handle_pre_vote(st, req, now_ms=self._clock(),
                                     last_leader_heartbeat_ms=self.last_leader_heartbeat_ms,
                                     timings=self.config.timings)
            if result is VoteResult.ACCEPT and st.role is Role.CANDIDATE:
                self._pre_vote_granted = (v.term, peer, self._clock())
            return encode_vote_reply(result, st.term)
        result, increase = handle_vote(st, req, from_self=False)
        if result is VoteResult.ACCEPT:
            log.info("dledger %s: voted for %s in term %d", st.self_id, peer, st.term)
        if increase:
            self._increase_term_now = True
            self._end_round()
            self._role_changed()
            self._wake.set()
        return encode_vote_reply(result, st.term)

    def _on_heartbeat(self, peer: str, term: int) -> bytes:
        return encode_heartbeat_reply(self._on_heartbeat_code(peer, term), self.state.term)

    def _on_heartbeat_code(self, peer: str, term: int) -> HeartbeatCode:
        code, increase = handle_heartbeat(self.state, term, peer)
        if code is HeartbeatCode.SUCCESS:
            self.last_leader_heartbeat_ms = self._clock()
            self._silent_leader = None
            self._end_round()
        if increase:
            self._increase_term_now = True
            self._wake.set()
        self._role_changed()
        return code

    def _reply(self, code: PushCode, index: int = -1) -> PushReply:
        s = self.store
        return PushReply(code, self.state.term, index if index >= 0 else s.end_index, s.begin_index, s.end_index)

    @staticmethod
    async def _push_answer(waiter: asyncio.Future[PushReply]) -> tuple[MsgType, bytes]:
        return MsgType.PUSH_REPLY, encode_push_reply(await waiter)

    def _on_push(self, peer: str, f: Frame) -> PushReply | asyncio.Future[PushReply]:
        """The reply to a PUSH, or the future of it while its entries are parked behind a missing batch."""
        push = decode_push(f.body)
        st, store = self.state, self.store
        # A push speaks for its leader as a heartbeat does (the same checks; a candidate follows it).
        hb = self._on_heartbeat_code(peer, push.term)
        if hb is not HeartbeatCode.SUCCESS:
            return self._reply({HeartbeatCode.EXPIRED_TERM: PushCode.EXPIRED_TERM,
                                HeartbeatCode.INCONSISTENT_LEADER: PushCode.INCONSISTENT_LEADER}.get(
                                    hb, PushCode.NOT_FOLLOWER))
        if push.kind is PushKind.COMMIT:
            self._commit_to(push.committed_index)
            return self._reply(PushCode.SUCCESS)
        if self._matched[0] != st.term:
            self._matched = (st.term, -1)  # a new leader: nothing is known to agree until it compares
        if push.kind in (PushKind.COMPARE, PushKind.TRUNCATE):
            for p in self._handler.clear():
                self._pending_entries.pop(p.first_index, None)
                self._answer(p.token, self._reply(PushCode.INCONSISTENT_STATE))
            entry = bytes(push.entries)
            if push.kind is PushKind.COMPARE:
                if store.get(push.first_index) != entry:
                    return self._reply(PushCode.INCONSISTENT_STATE)
                self._agree(push.first_index)
                return self._reply(PushCode.SUCCESS)
            try:
                store.truncate(entry)
            except (EntryRefused, ValueError) as e:
                log.error("dledger %s: truncate at %d refused: %s", st.self_id, push.first_index, e)
                return self._reply(PushCode.INCONSISTENT_STATE)
            self._synced()
            self._agree(push.first_index)
            self._commit_to(push.committed_index)
            return self._reply(PushCode.SUCCESS)
        last = push.first_index + push.n_entries - 1
        waiter: asyncio.Future[PushReply] = asyncio.get_running_loop().create_future()
        code = self._handler.park(waiter, push.first_index, last, self._clock())
        if code is not None:
            return self._reply(PushCode.REPEATED_PUSH if code is FollowerCode.REPEATED_PUSH
                               else PushCode.INCONSISTENT_STATE)
        # The transport hands each frame over in a buffer of its own (FrameDecoder.feed: a view of the bytes
        # read, or a copy out of its buffer): parking the view keeps that buffer, not one more copy of the entries.
        self._pending_entries[push.first_index] = push.entries
        self._drain(push.committed_index)
        return waiter.result() if waiter.done() else waiter

    def _drain(self, committed: int) -> None:
        """Append every parked batch that continues the log, in order."""
        store = self.store
        while (p := self._handler.take_next(store.end_index)) is not None:
            data = memoryview(self._pending_entries.pop(p.first_index, b""))
            reply = self._reply(PushCode.SUCCESS, p.last_index)
            at = 0
            try:
                while at < len(data):
                    h = read_entry_header(data, at)
                    if h.size < 48 or at + h.size > len(data):
                        raise EntryRefused(f"entry at byte {at} of a batch claims {h.size} bytes")
                    if h.entry_index > store.end_index:
                        store.append_as_follower(data[at : at + h.size])
                    at += h.size
                self._synced()
                self._agree(p.last_index)
            except (EntryRefused, OSError) as e:
                log.warning("dledger %s: append from %d refused: %s", self.state.self_id, p.first_index, e)
                reply = self._reply(PushCode.INCONSISTENT_STATE)
            self._answer(p.token, reply)
        self._commit_to(committed)

    @staticmethod
    def _answer(token: object, reply: PushReply) -> None:
        if isinstance(token, asyncio.Future) and not token.done():
            token.set_result(reply)

    def _synced(self) -> None:
        self.state.ledger_end_index, self.state.ledger_end_term = self.store.end_index, self.store.end_term

    def _agree(self, index: int) -> None:
        st = self.state
        if self._matched[0] == st.term:
            self._matched = (st.term, max(self._matched[1], index))
        else:
            self._matched = (st.term, index)

    def _commit_to(self, index: int) -> None:
        st, store = self.state, self.store
        index = min(index, self._matched[1] if self._matched[0] == st.term else -1)
        if store.update_committed(st.term, min(index, store.end_index), st.term) and self._on_commit is not None:
            self._on_commit(store.committed_index, store.committed_pos)

    def _sweep(self, now: int) -> None:
        store = self.store
        for p, code in self._handler.sweep(now, store.end_index,
                                           lambda p: store.get(p.last_index) is not None):
            self._pending_entries.pop(p.first_index, None)
            self._answer(p.token, self._reply(PushCode.SUCCESS if code is FollowerCode.SUCCESS
                                              else PushCode.INCONSISTENT_STATE, p.last_index))

    @property
    def accepting_appends(self) -> bool:
        """Whether an append now would be taken (the leader, not handing over, not stopping)."""
        return self.state.role is Role.LEADER and self._transferee is None and not self._stopping

    def leads(self, term: int) -> bool:
        """Whether this member is the leader of ``term`` (still)."""
        return self.state.role is Role.LEADER and self.state.term == term and not self._stopping

    def status(self) -> dict[str, object]:
        """What ``dledger status`` shows: role, term, leader, the log's indexes; on the leader each peer's acked
        index and lag (entries behind the leader's end)."""
        st, s = self.state, self.store
        peers: dict[str, dict[str, int]] = {}
        if self._tracker is not None and st.role is Role.LEADER:
            for peer, acked in self._tracker.watermarks(st.term).items():
                peers[peer] = {"ackedIndex": acked, "lag": max(0, s.end_index - acked)}
        return {"group": self.config.group, "selfId": st.self_id, "peers": dict(self.config.peers),
                "role": st.role.value, "term": st.term, "leaderId": st.leader_id,
                "ledgerBeginIndex": s.begin_index, "ledgerEndIndex": s.end_index,
                "committedIndex": s.committed_index, "elections": self.elections, "peerProgress": peers}
