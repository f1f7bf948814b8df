"""The leader's entry pusher on its own (:class:`~broker.dledger.pusher.EntryPusher`): leader ``n0`` with a real
log and an injected clock, its followers in the same loop (a real log and entry handler each) behind channels
that hand each push straight to them, or hold or refuse it -- commit by quorum, Raft's own-term rule, the quorum
timeout and the pending bound, the end of a leadership, a follower with a larger term."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.handler import EntryHandler
from broker.dledger.member import MemberState
from broker.dledger.protocol import Frame, MsgType, PushReply, decode_push, encode_push_reply
from broker.dledger.pusher import EntryPusher
from broker.dledger.store import DLedgerStore
from broker.dledger.transport import PeerError
from broker.store.io import FileIO
from tests.waiting import wait_until

PEERS = {"n0": "x:1", "n1": "x:2", "n2": "x:3"}
TERM = 2


def log(root: Path, name: str) -> DLedgerStore:
    s = DLedgerStore(FileIO(), str(root / f"dledger-{name}"), data_file_size=1 << 16, index_file_size=32 * 256)
    s.load()
    return s


def reply_frame(r: PushReply) -> Frame:
    return Frame(MsgType.PUSH_REPLY, 0, memoryview(encode_push_reply(r)))


class Follower:
    """A follower of ``n0`` in ``term``, in this loop: its log, its entry handler, and the leader's channel to it.
    ``down``: every push fails; ``holding``: APPENDs wait in :attr:`held` until :meth:`release`."""

    def __init__(self, root: Path, peer_id: str, term: int = TERM) -> None:
        self.peer_id = peer_id
        self.store = log(root, peer_id)
        self.state = MemberState(peer_id, PEERS)
        self.state.restore(term, None)
        self.state.change_to_follower(term, "n0")
        self.handler = EntryHandler(self.state, self.store, clock_ms=lambda: 0)
        self.down = False
        self.holding = False
        self.held: list[Callable[[], None]] = []

    def send(self, msg_type: MsgType, body: bytes, timeout_s: float,
             tail: bytes | memoryview = b"") -> asyncio.Future[Frame] | None:
        loop = asyncio.get_running_loop()
        out: asyncio.Future[Frame] = loop.create_future()
        data = bytes(body) + bytes(tail)

        def deliver() -> None:
            if out.done():
                return
            if self.down:
                out.set_exception(PeerError(f"{self.peer_id} is down"))
                return
            r = self.handler.on_push(decode_push(data))
            if isinstance(r, PushReply):
                out.set_result(reply_frame(r))
            else:
                r.add_done_callback(answered)

        def answered(parked: asyncio.Future[PushReply]) -> None:
            if not out.done():
                out.set_result(reply_frame(parked.result()))

        if self.holding and tail:
            self.held.append(deliver)
        else:
            loop.call_soon(deliver)
        return out

    async def request(self, msg_type: MsgType, body: bytes, timeout_s: float,
                      tail: bytes | memoryview = b"") -> Frame:
        fut = self.send(msg_type, body, timeout_s, tail)
        assert fut is not None
        return await fut

    def release(self) -> None:
        held, self.held, self.holding = self.held, [], False
        for deliver in held:
            deliver()

    async def close(self) -> None:
        pass


class Leader:
    """``n0`` leading ``TERM`` over ``followers``; what it commits and whom it steps down for is recorded."""

    def __init__(self, root: Path, **cfg: object) -> None:
        self.now = 50_000
        self.store = log(root, "n0")
        self.state = MemberState("n0", PEERS)
        self.state.restore(TERM, "n0")
        self.followers = {p: Follower(root, p) for p in ("n1", "n2")}
        self.commits: list[int] = []
        self.stepped_down: list[int] = []
        config = DLedgerConfig(group="g", self_id="n0", peers=PEERS, **cfg)  # type: ignore[arg-type]
        self.pusher = EntryPusher(config, self.state, self.store, self.followers, clock_ms=lambda: self.now,
                                  step_down=self.stepped_down.append,
                                  on_commit=lambda index, _pos: self.commits.append(index))

    def lead(self) -> None:
        self.state.change_to_leader(TERM)
        self.pusher.start(TERM)

    async def close(self) -> None:
        self.pusher.stop()
        await self.pusher.wait_stopped()
        for s in [self.store, *(f.store for f in self.followers.values())]:
            s.close()


def run(root: Path, scenario: Callable[[Leader], object], **cfg: object) -> None:
    async def main() -> None:
        leader = Leader(root, **cfg)
        try:
            await asyncio.wait_for(scenario(leader), 30)  # type: ignore[arg-type]
        finally:
            await leader.close()
    asyncio.run(main())


def entries(store: DLedgerStore) -> list[bytes | None]:
    return [store.get(i) for i in range(store.end_index + 1)]


def test_appends_commit_by_quorum_and_every_follower_ends_with_the_leaders_log(tmp_path: Path) -> None:
    async def scenario(ld: Leader) -> None:
        ld.lead()
        assert ld.store.end_index == 0 and ld.store.unit(0) == (0, 48, TERM)  # its empty entry first
        results = await asyncio.gather(*(ld.pusher.append(b"m%d" % i) for i in range(30)))
        assert [i for i, _ in results] == list(range(1, 31))
        assert ld.store.committed_index >= 30 and ld.commits == sorted(ld.commits)
        ld.now += 20  # past commitGap: the idle followers are told the committed index by a COMMIT
        for f in ld.followers.values():
            await wait_until(lambda f=f: f.store.committed_index == 30, 5, f"{f.peer_id} committing 30")
            assert entries(f.store) == entries(ld.store)
        await wait_until(lambda: ld.pusher.progress() == {"n0": 30, "n1": 30, "n2": 30}, 5, "every ack counted")

    run(tmp_path, scenario)


def test_an_entry_of_an_older_term_commits_only_with_one_of_this_term(tmp_path: Path) -> None:
    """Raft's rule (the paper's figure 8): a majority holding an older term's entry does not commit it; it
    commits with the first entry of the leader's own term that a majority holds."""
    async def scenario(ld: Leader) -> None:
        for i in range(3):  # entries 0..2 of term 1, from an earlier leadership; n1 holds them and one more
            ld.store.append_as_leader(1, b"old%d" % i)
            ld.followers["n1"].store.append_as_leader(1, b"old%d" % i)
        ld.followers["n1"].store.append_as_leader(1, b"never committed")
        n1, n2 = ld.followers["n1"], ld.followers["n2"]
        n2.down = True
        n1.holding = True
        ld.lead()  # its empty entry of term 2 is index 3
        await wait_until(lambda: ld.pusher.acked("n1") == 2, 5, "n1 truncated to entry 2 (acked)")
        await wait_until(lambda: n1.held, 5, "the APPEND of entry 3 held")
        assert ld.store.committed_index == -1  # a majority (n0, n1) holds entry 2, of term 1: not committed
        n1.release()
        await wait_until(lambda: ld.store.committed_index == 3, 5, "entry 3, of term 2, committed")
        assert ld.commits == [3] and entries(n1.store) == entries(ld.store)

    run(tmp_path, scenario)


def test_without_a_quorum_appends_time_out_and_past_the_pending_bound_are_refused(tmp_path: Path) -> None:
    async def scenario(ld: Leader) -> None:
        for f in ld.followers.values():
            f.down = True
        ld.lead()
        waiting = [ld.pusher.append_nowait(1, lambda buf, at, _phys: None)[2] for _ in range(3)]
        with pytest.raises(AppendError, match="LEADER_PENDING_FULL"):
            ld.pusher.append_nowait(1, lambda buf, at, _phys: None)
        ld.now += 999
        ld.pusher.check_quorum()
        assert not any(w.done() for w in waiting)
        ld.now += 2
        ld.pusher.check_quorum()  # maxWaitAckTimeMs (1000) passed
        for w in waiting:
            with pytest.raises(AppendError, match="WAIT_QUORUM_ACK_TIMEOUT"):
                await w
        assert ld.store.committed_index == -1

    run(tmp_path, scenario, max_pending=2, max_wait_ack_ms=1000)


def test_the_end_of_the_leadership_fails_every_waiting_append(tmp_path: Path) -> None:
    async def scenario(ld: Leader) -> None:
        for f in ld.followers.values():
            f.down = True
        ld.lead()
        waiting = asyncio.ensure_future(ld.pusher.append(b"w"))
        await wait_until(lambda: ld.store.end_index == 1, 5, "the entry in the leader's log")
        ld.state.change_to_candidate(TERM + 1)
        ld.pusher.stop()
        with pytest.raises(AppendError, match="TERM_CHANGED"):
            await waiting
        with pytest.raises(AppendError, match="NOT_LEADER"):
            await ld.pusher.append(b"too late")
        assert ld.pusher.push_buffers is None and ld.pusher.progress() == {}

    run(tmp_path, scenario)


def test_a_follower_answering_with_a_larger_term_ends_the_leadership(tmp_path: Path) -> None:
    async def scenario(ld: Leader) -> None:
        ld.followers["n1"].state.restore(TERM + 3, None)  # it moved on to a later term
        ld.lead()
        await wait_until(lambda: ld.stepped_down, 5, "the leader told to step down")
        assert ld.stepped_down[0] == TERM + 3

    run(tmp_path, scenario)
