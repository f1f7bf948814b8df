"""One DLedger member at work (DLedger's ``DLedgerServer``): it wires the roles over one log and one peer port,
in the owner's event loop, and does nothing else.

* :class:`~broker.dledger.elector.LeaderElector` -- campaigns, pre-vote, votes, heartbeats, the leader's quorum
  check, leadership transfer;
* :class:`~broker.dledger.pusher.EntryPusher` -- on the leader: appends, the per-follower push loops, the quorum
  wait and the committed index;
* :class:`~broker.dledger.handler.EntryHandler` -- on a follower: the leader's pushes into the log;
* :class:`~broker.dledger.store.DLedgerStore` -- the log.

The server routes each peer request to its role (a PUSH passes the elector first: it speaks for its leader as a
heartbeat does), runs the state loop that gives each role its look at the clock, and reports role changes and
commits to its owner. It is given its peer channels (a factory): the broker's are :class:`PeerClient`\\ s, a
test's may drop or delay traffic.

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
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.election import HeartbeatCode
from broker.dledger.elector import LeaderElector
from broker.dledger.handler import EntryHandler
from broker.dledger.member import MemberState, Role
from broker.dledger.protocol import (
    Frame,
    MsgType,
    PushReply,
    decode_heartbeat,
    decode_push,
    decode_term,
    decode_vote,
    encode_heartbeat_reply,
    encode_push_reply,
    encode_vote_reply,
)
from broker.dledger.pusher import EntryPusher, PushBuffers
from broker.dledger.store import DLedgerStore, copying
from broker.dledger.transport import ChannelFactory, PeerClient, PeerServer, serve_peers
from broker.dledger.wakeup import Wakeup

__all__ = ["DLedgerServer", "peer_clients"]

log = logging.getLogger(__name__)

#: The state loop's look at the timers when nothing woke it, in s.
_TICK_S = 0.02


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def peer_clients(config: DLedgerConfig) -> ChannelFactory:
    """The member's real connections: a :class:`PeerClient` per peer, with the cluster secret and TLS of
    ``config``."""
    def connect(peer: str) -> PeerClient:
        return PeerClient(config.group, config.self_id, peer, config.peers[peer],
                          max_in_flight=config.max_in_flight + 16, secret=config.auth_secret, tls=config.tls_client)
    return connect


class DLedgerServer:
    """One member.

    Args:
        config: its settings.
        store: its log, loaded.
        channels: makes the channel to each other member (default: :func:`peer_clients`).
        clock_ms: wall clock in ms.
        rng: randomness of the vote back-off.
        on_role_change: ``(role, term, leader id)`` after every change of role.
        on_commit: ``(committed index, committed position)`` after the committed index moved.
        on_leader_addr: ``(leader id, broker address)`` when a heartbeat this member took from its leader gave a
            broker address it did not know for that peer (its master, :mod:`broker.master_seek`).
    """

    def __init__(self, config: DLedgerConfig, store: DLedgerStore, *, channels: ChannelFactory | None = None,
                 clock_ms: Callable[[], int] = _wall_ms, rng: random.Random | None = None,
                 on_role_change: Callable[[Role, int, str | None], None] | None = None,
                 on_commit: Callable[[int, int], None] | None = None,
                 on_leader_addr: Callable[[str, str], None] | None = None) -> None:
        self.config = config
        self._on_leader_addr = on_leader_addr
        self.leader_addrs: dict[str, str] = {}
        """Each peer's broker address, as its last heartbeat as leader gave it."""
        self.store = store
        self._clock = clock_ms
        self._on_role = on_role_change
        self.state = MemberState(config.self_id, config.peers, persist=store.persist_term)
        self.state.restore(*store.load_term())
        self.state.ledger_end_index, self.state.ledger_end_term = store.end_index, store.end_term
        connect = channels or peer_clients(config)
        self._channels = {p: connect(p) for p in config.others}
        self._wake = Wakeup()
        self._stopping = False
        self._run_task: asyncio.Task[None] | None = None
        self._port: PeerServer | None = None
        self.pusher = EntryPusher(config, self.state, store, self._channels, clock_ms=clock_ms,
                                  step_down=self._step_down, on_commit=on_commit)
        self.elector = LeaderElector(config, self.state, self._channels, clock_ms=clock_ms,
                                     rng=rng or random.Random(), wake=self._wake.set, on_elected=self.pusher.start,
                                     on_role_change=self._role_changed, caught_up=self._caught_up,
                                     push_now=self.pusher.kick)
        self.handler = EntryHandler(self.state, store, clock_ms=clock_ms, on_commit=on_commit)

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", sock: socket.socket | None = None) -> int:
        """Listen on the peer port (the one in ``peers``, or ``sock`` already bound to it) and start the member;
        returns the bound port."""
        cfg = self.config
        port = int(cfg.peers[cfg.self_id].rpartition(":")[2])
        self._port = await serve_peers(host, port, group=cfg.group, self_id=cfg.self_id, peers=cfg.peers,
                                       handler=self._handle, secret=cfg.auth_secret, sock=sock, tls=cfg.tls_server,
                                       loopback_only=cfg.loopback_only)
        self.elector.start()
        self._run_task = asyncio.get_running_loop().create_task(self._run(), name=f"dledger-run-{cfg.self_id}")
        return self._port.port

    async def stop(self) -> None:
        self._stopping = True  # the state loop checks it: a cancellation lost in a race cannot keep it running
        if self._run_task is not None:
            self._run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run_task
        await self.elector.stop()
        self.pusher.stop("TERM_CHANGED", "the member stopped")
        await self.pusher.wait_stopped()
        for c in self._channels.values():
            await c.close()
        if self._port is not None:
            await self._port.close()

    def _role_changed(self, role: Role, term: int, leader_id: str | None) -> None:
        if role is not Role.LEADER:
            self.pusher.stop()
        if self._on_role is not None:
            self._on_role(role, term, leader_id)

    def _leader_heard(self, peer: str, broker_addr: str) -> None:
        if self.leader_addrs.get(peer) == broker_addr:
            return
        self.leader_addrs[peer] = broker_addr
        if self._on_leader_addr is not None:
            self._on_leader_addr(peer, broker_addr)

    def _step_down(self, term: int) -> None:
        self.elector.step_down(term)

    def _caught_up(self, peer: str) -> bool:
        return self.pusher.acked(peer) >= self.store.end_index

    # -- the state loop -------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            try:
                now = self._clock()
                await self.elector.tick(now)
                if self.state.role is Role.FOLLOWER:
                    self.handler.tick(now)
                elif self.state.role is Role.LEADER:
                    self.pusher.check_quorum()  # appends past maxWaitAckTimeMs time out without an ack
            except Exception:
                log.exception("dledger %s: state loop step failed", self.state.self_id)
            await self._wake.wait(_TICK_S)

    # -- answering peers ------------------------------------------------------------------------------------
    def _handle(self, peer: str, f: Frame) -> tuple[MsgType, bytes] | Awaitable[tuple[MsgType, bytes]]:
        """The answer to a peer's request, at once when it is known (every request but a PUSH whose entries wait
        for an earlier batch): the transport writes it without a task and a loop turn per request."""
        if f.type is MsgType.PUSH:
            push = decode_push(f.body)
            code = self.elector.on_heartbeat(peer, push.term)
            r = self.handler.on_push(push) if code is HeartbeatCode.SUCCESS else self.handler.refused(code)
            if isinstance(r, PushReply):
                return MsgType.PUSH_REPLY, encode_push_reply(r)
            return self._push_answer(r)
        if f.type is MsgType.VOTE:
            v = self.elector.on_vote(peer, decode_vote(f.body))
            return MsgType.VOTE_REPLY, encode_vote_reply(v.result, v.term)
        if f.type is MsgType.HEARTBEAT:
            term, broker_addr = decode_heartbeat(f.body)
            code = self.elector.on_heartbeat(peer, term)
            if code is HeartbeatCode.SUCCESS and broker_addr:
                self._leader_heard(peer, broker_addr)
            return MsgType.HB_REPLY, encode_heartbeat_reply(code, self.state.term)
        if f.type is MsgType.TAKE_LEADERSHIP:
            code = self.elector.on_take_leadership(peer, decode_term(f.body))
            return MsgType.TAKE_LEADERSHIP_REPLY, encode_heartbeat_reply(code, self.state.term)
        raise ValueError(f"peer {peer} sent a {f.type.name} request")

    @staticmethod
    async def _push_answer(waiter: asyncio.Future[PushReply]) -> tuple[MsgType, bytes]:
        return MsgType.PUSH_REPLY, encode_push_reply(await waiter)

    # -- what the broker uses -------------------------------------------------------------------------------
    async def append(self, body: bytes) -> tuple[int, int]:
        """Append one entry as the leader and wait until a quorum stores it; returns ``(index, position)``.

        Raises:
            AppendError: NOT_LEADER, LEADER_TRANSFERRING, LEADER_PENDING_FULL, WAIT_QUORUM_ACK_TIMEOUT or
                TERM_CHANGED.
            OSError: the disk refused the write (nothing was appended).
        """
        _, _, fut = self.append_nowait(len(body), copying(body))
        return await fut

    def append_nowait(self, body_length: int, build: Callable[[bytearray, int, int], None]
                      ) -> tuple[int, int, asyncio.Future[tuple[int, int]]]:
        """:meth:`EntryPusher.append_nowait`, refused (LEADER_TRANSFERRING) while the leader hands over.

        Raises:
            AppendError: NOT_LEADER, LEADER_TRANSFERRING or LEADER_PENDING_FULL (nothing was appended).
            OSError: the disk refused the write (nothing was appended).
        """
        st, transferee = self.state, self.elector.transferee
        if st.role is Role.LEADER and transferee is not None:
            raise AppendError("LEADER_TRANSFERRING", f"{st.self_id} is handing leadership to {transferee}",
                              st.leader_id)
        return self.pusher.append_nowait(body_length, build)

    async def transfer_leadership(self, target: str, timeout_s: float = 5.0) -> None:
        """:meth:`LeaderElector.transfer_leadership`."""
        await self.elector.transfer_leadership(target, timeout_s)

    @property
    def accepting_appends(self) -> bool:
        """Whether an append now would be taken (the leader, not handing over, not stopping)."""
        return self.state.role is Role.LEADER and self.elector.transferee is None and not self._stopping

    def leads(self, term: int) -> bool:
        """Whether this member is the leader of ``term`` (still)."""
        return self.elector.leads(term) and not self._stopping

    @property
    def push_buffers(self) -> PushBuffers | None:
        """The entries pushed to the followers in this leadership (None when not leading)."""
        return self.pusher.push_buffers

    @property
    def elections(self) -> int:
        return self.elector.elections

    @property
    def leader_addr(self) -> str | None:
        """The broker address of the leader this member knows: its own when it leads, else the one the leader's
        heartbeats gave (None during an election or before the first heartbeat)."""
        st = self.state
        if st.leader_id is None:
            return None
        if st.leader_id == st.self_id:
            return self.config.broker_addr or None
        return self.leader_addrs.get(st.leader_id)

    def status(self) -> dict[str, object]:
        """What ``dledger status`` shows: role, term, leader, the log's indexes; on the leader each peer's acked
        index and lag (entries behind the leader's end)."""
        st, s = self.state, self.store
        peers = {peer: {"ackedIndex": acked, "lag": max(0, s.end_index - acked)}
                 for peer, acked in self.pusher.progress().items()}
        return {"group": self.config.group, "selfId": st.self_id, "peers": dict(self.config.peers),
                "role": st.role.value, "term": st.term, "leaderId": st.leader_id,
                "leaderAddr": self.leader_addr,
                "ledgerBeginIndex": s.begin_index, "ledgerEndIndex": s.end_index,
                "committedIndex": s.committed_index, "elections": self.elections, "peerProgress": peers}
