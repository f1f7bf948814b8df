"""Three DLedger members in one event loop on loopback, with fast timings (heartbeat 100 ms, election timeout
300 ms): one leader, quorum-acknowledged appends, failover, no commit without a quorum, a divergent tail cut,
pre-vote, restart, and bad bytes on the peer port."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.election import ElectionTimings
from broker.dledger.member import Role
from broker.dledger.protocol import Hello, MsgType, encode_frame, encode_hello
from broker.dledger.server import DLedgerServer, peer_clients
from broker.dledger.store import DLedgerStore
from broker.store.io import FileIO
from tests.broker.dledger.faults import Faults, FaultyNetwork
from tests.waiting import wait_until

FAST = ElectionTimings(heartbeat_interval_ms=100, max_heartbeat_leak=3, min_vote_interval_ms=50,
                       max_vote_interval_ms=150)
T = TypeVar("T")


def broker_addr(peer: str) -> str:
    """The broker (HTTP) address member ``peer`` announces as leader."""
    return f"broker-{peer}:10911"


#: FAST with a leader lease of ten heartbeats (1 s) instead of three: for the tests of appends and commits, not of
#: failover, so that a loop stall of a loaded machine (three members share this one loop) does not depose the
#: leader between its election and the appends.
STEADY = attrs.evolve(FAST, max_heartbeat_leak=10)


class Group:
    """``n`` members ``n0..`` with stores under ``root``; ports bound before any member starts."""

    def __init__(self, root: Path, n: int = 3, **cfg: object) -> None:
        self.root = root
        self.socks = [socket.socket() for _ in range(n)]
        for s in self.socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
        self.peers = {f"n{i}": f"127.0.0.1:{s.getsockname()[1]}" for i, s in enumerate(self.socks)}
        self.cfg = cfg
        self.net = FaultyNetwork()
        """The faults between the members (every member's requests pass them)."""
        self.nodes: dict[str, DLedgerServer] = {}
        self.commits: dict[str, list[int]] = {p: [] for p in self.peers}
        self.announced: dict[str, list[tuple[str, str]]] = {p: [] for p in self.peers}
        """Each member's ``on_leader_addr`` reports: (leader, broker address)."""

    def _store(self, peer: str) -> DLedgerStore:
        s = DLedgerStore(FileIO(), str(self.root / f"dledger-{peer}"), data_file_size=1 << 16,
                         index_file_size=32 * 1024)
        s.load()
        return s

    def faults(self, node: DLedgerServer) -> Faults:
        """What ``node`` drops or holds of its traffic with each peer."""
        return self.net[node.state.self_id]

    async def start(self, peer: str) -> DLedgerServer:
        settings = {"timings": FAST, "max_wait_ack_ms": 1000, **self.cfg}  # a test's own settings win
        cfg = DLedgerConfig(group="g", self_id=peer, peers=self.peers, broker_addr=broker_addr(peer),
                            **settings)  # type: ignore[arg-type]
        node = DLedgerServer(cfg, self._store(peer), channels=self.net.channels(peer, peer_clients(cfg)),
                             on_commit=lambda i, _p: self.commits[peer].append(i),
                             on_leader_addr=lambda lead, addr: self.announced[peer].append((lead, addr)))
        i = int(peer[1:])
        sock = self.socks[i]
        if sock.fileno() == -1:  # restarted: bind the same port again
            sock = self.socks[i] = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", int(self.peers[peer].rpartition(":")[2])))
        await node.start(sock=sock)
        self.nodes[peer] = node
        return node

    async def start_all(self) -> None:
        for p in self.peers:
            await self.start(p)

    async def stop(self, peer: str) -> None:
        node = self.nodes.pop(peer)
        await node.stop()
        node.store.close()
        self.socks[int(peer[1:])].close()

    async def stop_all(self) -> None:
        for p in list(self.nodes):
            await self.stop(p)

    def leader(self) -> DLedgerServer | None:
        leaders = [n for n in self.nodes.values() if n.state.role is Role.LEADER]
        if len(leaders) != 1:
            return None
        lead = leaders[0]
        followers = [n for n in self.nodes.values() if n is not lead and not self.faults(lead).blocked]
        ok = all(n.state.role is Role.FOLLOWER and n.state.leader_id == lead.state.self_id
                 and n.state.term == lead.state.term for n in followers if not self.faults(n).blocked)
        return lead if ok else None

    async def wait_leader(self, timeout_s: float = 10.0) -> DLedgerServer:
        return await wait_until(self.leader, timeout_s, f"one leader among {sorted(self.nodes)}")


def run(root: Path, scenario: Callable[[Group], Awaitable[None]], **cfg: object) -> None:
    async def main() -> None:
        g = Group(root, **cfg)
        try:
            await g.start_all()
            await asyncio.wait_for(scenario(g), 60)  # a hang fails here, with the members stopped below
        finally:
            await g.stop_all()
            for s in g.socks:
                s.close()
    asyncio.run(main())


def entries(node: DLedgerServer, upto: int) -> list[bytes | None]:
    return [node.store.get(i) for i in range(upto + 1)]


def test_three_members_elect_one_leader_and_commit_by_quorum(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        terms = {n.state.term for n in g.nodes.values()}
        assert len(terms) == 1
        results = await asyncio.gather(*(lead.append(b"m%d" % i) for i in range(50)))
        assert [i for i, _ in results] == sorted(i for i, _ in results)
        last = results[-1][0]
        assert lead.store.committed_index >= last
        for n in g.nodes.values():  # every follower gets every entry and learns the commit
            await wait_until(lambda n=n: n.store.committed_index >= last, 5, f"{n.state.self_id} committing {last}")
            assert entries(n, last) == entries(lead, last)

    run(tmp_path, scenario, timings=STEADY)


def test_followers_pushed_one_shared_buffer_hold_the_leaders_very_entries(tmp_path: Path) -> None:
    """The entries read for a push are shared by the followers pushed the same range (one read of the log, one
    buffer on both sockets): each follower still ends with byte-identical entries, one at a time and in batches,
    and a new leadership reads its own (the old one's buffers are dropped)."""
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        assert lead.push_buffers is not None
        reads0 = lead.push_buffers.reads
        for i in range(40):  # one at a time: both followers are pushed the same one-entry range
            await lead.append(bytes([i % 251]) * (100 + 37 * i))
        one_by_one = lead.push_buffers.reads - reads0
        assert one_by_one <= 48, f"{one_by_one} reads of the log for 40 entries pushed to two followers"
        results = await asyncio.gather(*(lead.append(b"b%d" % i * 50) for i in range(60)))
        last = results[-1][0]
        for n in g.nodes.values():
            await wait_until(lambda n=n: n.store.end_index >= last, 5, f"{n.state.self_id} holding {last}")
            assert entries(n, last) == entries(lead, last)
        old_buffers = lead.push_buffers
        await lead.transfer_leadership(next(p for p in g.nodes if p != lead.state.self_id))
        assert lead.push_buffers is None
        new = await g.wait_leader()
        assert new.push_buffers is not None and new.push_buffers is not old_buffers
        index, _ = await new.append(b"after the hand-over")
        for n in g.nodes.values():
            await wait_until(lambda n=n: n.store.end_index >= index, 5, f"{n.state.self_id} holding {index}")
            assert entries(n, index) == entries(new, index)

    run(tmp_path, scenario, timings=STEADY)


def test_the_leader_dies_a_follower_with_every_committed_entry_takes_over(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        acked = [await lead.append(b"a%d" % i) for i in range(20)]
        old = lead.state.self_id
        t0 = time.monotonic()
        await g.stop(old)
        new = await g.wait_leader()
        took = time.monotonic() - t0
        assert new.state.self_id != old and new.state.term > lead.state.term - 1
        for index, _ in acked:
            assert new.store.get(index) is not None
        index, _ = await new.append(b"after")
        assert index > acked[-1][0]
        assert took < 5, took
        await g.start(old)  # it comes back as a follower and catches up
        back = g.nodes[old]
        await wait_until(lambda: back.store.committed_index >= index, 5, "the old leader catching up")
        assert entries(back, index) == entries(new, index)

    run(tmp_path, scenario)


def test_followers_learn_each_new_leaders_broker_address_from_its_heartbeats(tmp_path: Path) -> None:
    """A follower's master is its Raft leader (broker.master_seek): the leader's heartbeats carry its broker address,
    reported once per new address, and ``status()`` gives it."""
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        first = lead.state.self_id
        for n in g.nodes.values():
            if n is not lead:
                await wait_until(lambda n=n: n.status()["leaderAddr"] == broker_addr(first), 5,
                                 f"{n.state.self_id} knowing the broker address of {first}")
                assert g.announced[n.state.self_id] == [(first, broker_addr(first))]  # once, not per heartbeat
        await g.stop(first)
        new = await g.wait_leader()
        survivor = next(n for n in g.nodes.values() if n is not new)
        await wait_until(lambda: survivor.status()["leaderAddr"] == broker_addr(new.state.self_id), 5,
                         "the survivor knowing the new leader's broker address")
        assert g.announced[survivor.state.self_id][-1] == (new.state.self_id, broker_addr(new.state.self_id))
        assert new.status()["leaderAddr"] == broker_addr(new.state.self_id)  # a leader gives its own

    run(tmp_path, scenario)


def test_no_commit_without_a_quorum_and_pending_full(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        others = [p for p in g.peers if p != lead.state.self_id]
        g.faults(lead).block(*others)
        for p in others:
            g.faults(g.nodes[p]).block(lead.state.self_id)
        t0 = time.monotonic()
        with pytest.raises(AppendError) as e:
            await lead.append(b"lonely")
        assert e.value.code in ("WAIT_QUORUM_ACK_TIMEOUT", "TERM_CHANGED")
        assert time.monotonic() - t0 < 2.5  # maxWaitAckTimeMs 1000 (or the step-down after 300 ms)

    run(tmp_path, scenario)


def test_pending_full_answers_at_once(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        for p in g.peers:
            if p != lead.state.self_id:
                g.faults(lead).block(p)
        waiting = [asyncio.ensure_future(lead.append(b"w%d" % i)) for i in range(4)]
        await asyncio.sleep(0)
        with pytest.raises(AppendError, match="LEADER_PENDING_FULL"):
            await lead.append(b"one too many")
        for w in waiting:
            with pytest.raises(AppendError):
                await w

    run(tmp_path, scenario, max_pending=3)


def test_an_old_leaders_unacknowledged_tail_is_cut_when_it_rejoins(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        committed, _ = await lead.append(b"shared")
        old = lead.state.self_id
        others = [p for p in g.peers if p != old]
        g.faults(lead).block(*others)
        for p in others:
            g.faults(g.nodes[p]).block(old)
        lonely = [asyncio.ensure_future(lead.append(b"lost%d" % i)) for i in range(5)]
        new = await wait_until(lambda: next((g.nodes[p] for p in others if g.nodes[p].state.role is Role.LEADER), None),
                          10, "the majority electing a new leader")
        index, _ = await new.append(b"majority")
        for f in lonely:
            with pytest.raises(AppendError):
                await f
        g.faults(lead).heal()
        for p in others:
            g.faults(g.nodes[p]).heal()
        await wait_until(lambda: lead.state.role is Role.FOLLOWER and lead.store.committed_index >= index, 10,
                    "the old leader following and catching up")
        assert entries(lead, index) == entries(new, index)
        assert b"lost" not in b"".join(e or b"" for e in entries(lead, lead.store.end_index))
        assert lead.store.get(committed) == new.store.get(committed)

    run(tmp_path, scenario)


def test_a_healed_old_leader_whose_log_ends_at_the_compared_index_catches_up(tmp_path: Path) -> None:
    """The old leader took one entry nobody else got, then was cut off; the others elected a leader, whose empty
    entry (another term, another size) sits at that index, and which took one more entry. Healed, the old leader's
    log ends exactly at an index the new leader compares: only a COMPARE that looks at the entry there sends the
    new leader one further back, to truncate there. One answering SUCCESS for any entry there would have it push
    from the next index for ever, each push refused ("append from N refused": placed after the wrong entry)."""
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        committed, _ = await lead.append(b"shared")
        for n in g.nodes.values():
            await wait_until(lambda n=n: n.store.committed_index >= committed, 5, f"{n.state.self_id} committing")
        old = lead.state.self_id
        others = [p for p in g.peers if p != old]
        g.faults(lead).block(*others)
        for p in others:
            g.faults(g.nodes[p]).block(old)
        lonely = asyncio.ensure_future(lead.append(b"lost"))
        await wait_until(lambda: lead.store.end_index == committed + 1, 5, "the lonely entry in the old leader's log")
        new = await wait_until(lambda: next((g.nodes[p] for p in others if g.nodes[p].state.role is Role.LEADER),
                                            None), 10, "the majority electing a new leader")
        index, _ = await new.append(b"majority")
        assert index == committed + 2 and new.store.unit(committed + 1)[2] == new.state.term  # type: ignore[index]
        with pytest.raises(AppendError):
            await lonely
        assert lead.store.end_index == committed + 1  # it ends at the index of the new leader's empty entry
        g.faults(lead).heal()
        for p in others:
            g.faults(g.nodes[p]).heal()
        await wait_until(lambda: lead.state.role is Role.FOLLOWER and lead.store.committed_index >= index, 10,
                         "the old leader following and catching up")
        assert entries(lead, index) == entries(new, index)
        assert b"lost" not in b"".join(e or b"" for e in entries(lead, lead.store.end_index))

    run(tmp_path, scenario)


def test_pre_vote_keeps_an_isolated_follower_from_deposing_the_leader(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        term = lead.state.term
        loner = next(n for n in g.nodes.values() if n is not lead)
        g.faults(loner).block(*(p for p in g.peers if p != loner.state.self_id))
        for n in g.nodes.values():
            if n is not loner:
                g.faults(n).block(loner.state.self_id)
        await asyncio.sleep(10 * FAST.election_timeout_ms / 1000)  # the fault lasts 10 election timeouts
        g.faults(loner).heal()
        for n in g.nodes.values():
            g.faults(n).heal()
        await wait_until(lambda: loner.state.role is Role.FOLLOWER and loner.state.leader_id == lead.state.self_id,
                    5, "the healed member following the same leader")
        assert lead.state.role is Role.LEADER and lead.state.term == term
        await lead.append(b"still here")

    run(tmp_path, scenario)


def test_a_vote_round_does_not_wait_for_the_silent_leader_once_the_others_answered(tmp_path: Path) -> None:
    """A follower cut off from a leader that never answers (its port silent): once the other member has answered
    its (pre-)vote -- here with a refusal, as the other candidate of a split vote would -- the round ends without
    waiting a heartbeat interval for the leader whose silence started it."""
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        lone = next(n for n in g.nodes.values() if n is not lead)
        # A long heartbeat interval (the round's deadline) but the usual election timeout for this member.
        elector = lone.elector
        elector.config = attrs.evolve(elector.config, timings=attrs.evolve(FAST, heartbeat_interval_ms=1000,
                                                                            max_heartbeat_leak=1))
        rounds: list[float] = []
        collect = elector._collect_votes

        async def timed(*args: object) -> object:
            t0 = time.monotonic()
            try:
                return await collect(*args)  # type: ignore[arg-type]
            finally:
                rounds.append(time.monotonic() - t0)

        elector._collect_votes = timed  # type: ignore[method-assign,assignment]
        g.faults(lead).block(lone.state.self_id)  # the leader's heartbeats and pushes never reach it
        g.faults(lone).delay_s[lead.state.self_id] = 30.0  # and its requests to the leader are never answered
        await wait_until(lambda: len(rounds) >= 2, 10, "two pre-vote rounds of the cut-off member")
        # The other follower still hears the leader and refuses at once; without the rule each round would last
        # the 1 s deadline.
        assert max(rounds) < 0.5, rounds
        assert lead.state.role is Role.LEADER  # pre-vote: nobody was deposed
        g.faults(lone).delay_s.clear()
        g.faults(lead).heal()

    run(tmp_path, scenario)


def test_all_members_restart_with_every_committed_entry_and_their_votes(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        acked = [await lead.append(b"r%d" % i) for i in range(30)]
        await g.stop_all()
        for p in g.peers:
            persisted = g._store(p)
            term_vote = persisted.load_term()
            persisted.close()
            node = await g.start(p)  # the term and vote of the currterm file: no second vote in that term
            assert (node.state.term, node.state.vote_for) == term_vote
        lead = await g.wait_leader()
        for index, _ in acked:
            assert lead.store.get(index) is not None
        await lead.append(b"again")

    run(tmp_path, scenario)


def test_garbage_on_the_peer_port_closes_that_connection_only(tmp_path: Path) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        host, _, port = g.peers["n0"].rpartition(":")
        for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00\x0c\x44\x4c\x01\x09" + bytes(8),
                     b"\x7f\xff\xff\xff\x44\x4c\x01\x06" + bytes(8)):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(junk)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the member
            writer.close()
            await writer.wait_closed()
        await lead.append(b"fine")

    run(tmp_path, scenario)


def test_bad_hellos_and_frames_are_logged_and_closed_and_the_log_is_untouched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(g: Group) -> None:
        lead = await g.wait_leader()
        await lead.append(b"before")
        target = next(n for n in g.nodes.values() if n is not lead)
        tid = target.state.self_id
        end = target.store.end_pos
        host, _, port = g.peers[tid].rpartition(":")
        bad = {
            "wrong group": encode_frame(MsgType.HELLO, 0, encode_hello(Hello("other", "n0", tid))),
            "unknown peer": encode_frame(MsgType.HELLO, 0, encode_hello(Hello("g", "n9", tid))),
            "not HELLO": encode_frame(MsgType.PUSH, 1, b"\x00" * 40),
            "truncated": encode_frame(MsgType.HELLO, 0, encode_hello(Hello("g", "n0", tid)))[:-3],
            "absurd size": b"\x7f\xff\xff\xff" + encode_frame(MsgType.HELLO, 0)[4:],
        }
        for what, data in bad.items():
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(data)
            if what == "truncated":
                writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 5) == b"", what  # closed by the member
            writer.close()
            await writer.wait_closed()
        assert target.store.end_pos == end  # nothing reached the log
        for needle in ("group 'other'", "unknown peer 'n9'", "not HELLO"):
            assert any(needle in r.getMessage() for r in caplog.records), needle
        await lead.append(b"after")

    with caplog.at_level(logging.INFO, logger="broker.dledger"):
        run(tmp_path, scenario)


def test_entries_appended_while_pushes_are_out_go_to_a_follower_in_few_frames(tmp_path: Path) -> None:
    """With ``max_pushes_in_flight`` pushes out to a follower (held 30 ms each way by the faults), entries
    appended one by one meanwhile wait and go together: far fewer APPEND frames than entries, and every follower
    still holds every entry."""
    async def scenario(g: Group) -> None:
        async def all_hold(index: int) -> None:
            for n in g.nodes.values():
                def holds(n: DLedgerServer = n) -> bool:
                    return n.store.end_index >= index
                await wait_until(holds, 5, f"{n.state.self_id} holding {index}")

        lead = await g.wait_leader()
        first, _ = await lead.append(b"first")  # every follower past COMPARE: pushing entries as they come
        await all_hold(first)
        leader_id = lead.state.self_id
        frames: dict[str, list[int]] = {p: [] for p in g.peers if p != leader_id}

        def counting(sender: str, to: str, msg_type: MsgType, entry_bytes: int) -> None:
            if sender == leader_id and msg_type is MsgType.PUSH and entry_bytes:
                frames[to].append(entry_bytes)  # an APPEND (COMPARE and TRUNCATE travel in the body)

        g.net.tap = counting
        for peer in frames:
            g.faults(lead).delay_s[peer] = 0.03
        pending = []
        for i in range(40):
            pending.append(asyncio.ensure_future(lead.append(b"e%02d" % i)))
            await asyncio.sleep(0.003)  # pacing, so each append has the loop to itself (not a synchronisation)
        last = max(i for i, _ in await asyncio.gather(*pending))
        await all_hold(last)
        for n in g.nodes.values():
            assert entries(n, last) == entries(lead, last)
        for peer, sizes in frames.items():
            assert 0 < len(sizes) <= 20, f"{len(sizes)} APPEND frames to {peer} for 40 entries"

    run(tmp_path, scenario, max_pushes_in_flight=1)
