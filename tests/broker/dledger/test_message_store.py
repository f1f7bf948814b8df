"""The broker's store in DLedger mode, three members in one event loop (fast timings): records inside entries,
queues built from committed entries only, a partitioned leader's unacknowledged sends never reach a consumer,
and recovery after a crash."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from broker.dledger.config import DLedgerConfig
from broker.dledger.election import ElectionTimings
from broker.dledger.entry import BODY_OFFSET
from broker.dledger.member import Role
from broker.dledger.message_store import DLedgerMessageStore
from broker.dledger.server import DLedgerServer, peer_clients
from broker.store.api import GetMessageStatus, PutMessageStatus
from common.codec import decode_batch, decode_records, encode_batch
from common.codes import BrokerRole, SysFlag
from common.message import Message
from tests.broker.dledger.faults import Faults, FaultyNetwork
from tests.broker.store.conftest import FakeClock, batch, small_config
from tests.waiting import wait_until

HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x10"

#: Fast, but tolerant of a loaded machine: three members share one event loop with the stores' file work, so a
#: stall of a few hundred ms must not start an election in the middle of a scenario (TERM_CHANGED).
TIMINGS = ElectionTimings(heartbeat_interval_ms=150, max_heartbeat_leak=6, min_vote_interval_ms=50,
                          max_vote_interval_ms=200)


class Members:
    """Three members ``n0..n2``, each a :class:`DLedgerMessageStore` with its node attached."""

    def __init__(self, root: Path, clock: Callable[[], int] | None = None) -> None:
        self.root = root
        self.clock = clock
        self.socks = [socket.socket() for _ in range(3)]
        for s in self.socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
        self.peers = {f"n{i}": f"127.0.0.1:{s.getsockname()[1]}" for i, s in enumerate(self.socks)}
        self.stores: dict[str, DLedgerMessageStore] = {}
        self.nodes: dict[str, DLedgerServer] = {}
        self.net = FaultyNetwork()
        """The faults between the members (every member's requests pass them)."""

    def faults(self, node: DLedgerServer) -> Faults:
        return self.net[node.state.self_id]

    def open(self, peer: str) -> DLedgerMessageStore:
        extra = {"clock_ms": self.clock} if self.clock is not None else {}
        store = DLedgerMessageStore(small_config(self.root / peer, broker_role=BrokerRole.SLAVE, **extra),
                                    self_id=peer, index_file_size=32 * 1024)
        store.load()
        store.start()
        return store

    async def start(self) -> None:
        for peer in self.peers:
            store = self.stores[peer] = self.open(peer)
            cfg = DLedgerConfig(group="g", self_id=peer, peers=self.peers, timings=TIMINGS, max_wait_ack_ms=1000)
            node = self.nodes[peer] = DLedgerServer(cfg, store.ledger, on_commit=store.committed_moved,
                                                    channels=self.net.channels(peer, peer_clients(cfg)))
            store.attach(node)
            await node.start(sock=self.socks[int(peer[1:])])

    async def leader(self) -> tuple[DLedgerServer, DLedgerMessageStore]:
        node = await wait_until(lambda: next((n for n in self.nodes.values() if n.state.role is Role.LEADER
                                         and all(m.state.leader_id == n.state.self_id for m in self.nodes.values()
                                                 if m is not n and not self.faults(m).blocked)), None), 10, "a leader")
        return node, await self.serve(node)

    async def serve(self, node: DLedgerServer) -> DLedgerMessageStore:
        """What the broker's role handler does for a new leader: once its whole log is committed, it rebuilds the
        queue offsets from the dispatched queues and takes writes."""
        store = self.stores[node.state.self_id]
        await wait_until(lambda: store.ledger.end_index == store.ledger.committed_index, 10, "the leader's log committed")
        store.set_broker_role(BrokerRole.SYNC_MASTER)
        return store

    async def stop(self) -> None:
        for peer, node in self.nodes.items():
            await node.stop()
            self.stores[peer].shutdown()
        for s in self.socks:
            s.close()


def run(root: Path, scenario: Callable[[Members], Awaitable[None]], clock: Callable[[], int] | None = None) -> None:
    async def main() -> None:
        m = Members(root, clock)
        try:
            await m.start()
            await asyncio.wait_for(scenario(m), 60)
        finally:
            await m.stop()
    asyncio.run(main())


def queue_bodies(store: DLedgerMessageStore, topic: str = "T", start: int | None = None) -> list[bytes]:
    """Every body of queue 0 from ``start`` (default: the queue's min offset)."""
    store.dispatch_available()
    offset = store.get_min_offset_in_queue(topic, 0) if start is None else start
    out: list[bytes] = []
    while True:
        r = store.get_message("g", topic, 0, offset, 1000, 1 << 24)
        if r.status is not GetMessageStatus.FOUND:
            return out
        out += [m.body for rec in r.records for m in decode_records(rec)]
        offset = r.next_begin_offset


def test_records_sit_in_entries_and_queues_see_only_committed_ones(tmp_path: Path) -> None:
    async def scenario(m: Members) -> None:
        _, store = await m.leader()
        result = store.append_batch("T", 0, batch("T", 3), born_host=HOST)
        assert result.status is PutMessageStatus.PUT_OK and result.committed is not None
        assert queue_bodies(store) == []  # appended, not yet committed: not in the queue
        _, pos = await result.committed
        assert result.wrote_offset == pos + BODY_OFFSET
        records = decode_records(store.look_message_by_offset(result.wrote_offset) or b"")
        assert records[0].commit_log_offset == result.wrote_offset  # PHYSICALOFFSET = entry position + 48
        assert result.physical_offsets[0] == result.wrote_offset
        assert len(queue_bodies(store)) == 3
        for peer, other in m.stores.items():
            await wait_until(lambda other=other: len(queue_bodies(other)) == 3, 5, f"{peer} to dispatch the batch")
            assert other.max_physical_offset == store.max_physical_offset

    run(tmp_path, scenario)


def test_a_partitioned_leaders_unacknowledged_sends_never_reach_a_consumer(tmp_path: Path) -> None:
    async def scenario(m: Members) -> None:
        node, store = await m.leader()
        ok = store.append_batch("T", 0, batch("T", 1, body=b"shared"), born_host=HOST)
        await ok.committed  # type: ignore[misc]
        old = node.state.self_id
        others = [p for p in m.peers if p != old]
        m.faults(node).block(*others)
        for p in others:
            m.faults(m.nodes[p]).block(old)
        lost = [store.append_batch("T", 0, batch("T", 1, body=b"lost%d" % i), born_host=HOST) for i in range(4)]
        assert all(r.status is PutMessageStatus.PUT_OK for r in lost)
        new = await wait_until(lambda: next((m.nodes[p] for p in others if m.nodes[p].state.role is Role.LEADER), None),
                          10, "the majority electing a new leader")
        new_store = await m.serve(new)
        kept = new_store.append_batch("T", 0, batch("T", 1, body=b"majority"), born_host=HOST)
        await kept.committed  # type: ignore[misc]
        for r in lost:
            assert r.committed is not None
            await asyncio.wait([r.committed])
            assert r.committed.exception() is not None
        assert queue_bodies(store) == [b"shared"]  # the lonely leader never dispatched its tail
        m.faults(node).heal()
        for p in others:
            m.faults(m.nodes[p]).heal()
        await wait_until(lambda: node.state.role is Role.FOLLOWER and queue_bodies(store) == [b"shared", b"majority"],
                    10, "the old leader following, its tail cut, the majority's message dispatched")
        assert all(b"lost" not in (node.store.get(i) or b"") for i in range(node.store.end_index + 1))

    run(tmp_path, scenario)


def test_a_crashed_member_recovers_its_queues_and_dispatch(tmp_path: Path) -> None:
    async def scenario(m: Members) -> None:
        node, store = await m.leader()
        for i in range(5):
            r = store.append_batch("T", 0, batch("T", 2, body=b"m%d" % i), born_host=HOST)
            await r.committed  # type: ignore[misc]
        follower = next(p for p in m.peers if p != node.state.self_id)
        fstore = m.stores[follower]
        await wait_until(lambda: len(queue_bodies(fstore)) == 10, 5, "the follower to dispatch every message")
        await m.nodes[follower].stop()
        fstore.crash()
        again = m.open(follower)  # recovery: the log's end, the queues cut to it, dispatch resumed
        try:
            assert len(queue_bodies(again)) == 10
            assert again.max_physical_offset == store.max_physical_offset
            assert again.ledger.committed_index >= again.ledger.end_index - 1
        finally:
            again.shutdown()
        m.nodes.pop(follower)
        m.stores.pop(follower)

    run(tmp_path, scenario)


def test_retention_deletes_the_oldest_entries_and_a_follower_far_behind_restarts_at_the_leaders_begin(
        tmp_path: Path) -> None:
    clock = FakeClock(int(time.time() * 1000))

    async def scenario(m: Members) -> None:
        node, store = await m.leader()
        laggard = next(p for p in m.peers if p != node.state.self_id)
        m.faults(node).block(laggard)
        m.faults(m.nodes[laggard]).block(node.state.self_id)
        for p in m.peers:  # the third member must not elect the laggard meanwhile
            if p not in (laggard, node.state.self_id):
                m.faults(m.nodes[p]).block(laggard)
                m.faults(m.nodes[laggard]).block(p)
        for i in range(150):  # ~2 KiB entries in 64 KiB data files: 5 files
            r = store.append_batch("T", 0, batch("T", 10, body=b"m%03d" % i + b"x" * 100), born_host=HOST)
            await r.committed  # type: ignore[misc]
        assert len(store.ledger.data.files) >= 4
        before = queue_bodies(store)
        # Retention deletes only flushed files. Under ASYNC_FLUSH the flush thread leaves a tail under
        # flushCommitLogLeastPages for up to flushCommitLogThoroughInterval (10 s): flush it all now.
        await asyncio.to_thread(store.commitlog.flush)
        assert store.commitlog.flushed_where >= store.max_physical_offset
        clock.now_ms += 100 * 3_600_000  # every closed file is older than fileReservedTime (72 h)
        cleaner = store.cleaner
        n = cleaner.deletable(cleaner.decide(manual=True))
        assert n >= 2
        for _ in range(n):
            assert cleaner.delete_oldest() is not None
        ledger = store.ledger
        assert ledger.begin_index > 0 and ledger.get(0) is None and ledger.get(ledger.begin_index) is not None
        assert store.commitlog.min_offset == ledger.data.files[0].start > 0
        lo = store.get_min_offset_in_queue("T", 0)
        assert lo > 0
        kept = queue_bodies(store)
        assert kept == before[lo:]  # the newest messages stay, in order, from the queue's new min offset
        for f in m.nodes.values():
            m.faults(f).heal()
        after = store.append_batch("T", 0, batch("T", 1, body=b"after"), born_host=HOST)
        await after.committed  # type: ignore[misc]
        far = m.stores[laggard]
        await wait_until(lambda: far.ledger.begin_index == ledger.begin_index and queue_bodies(far)[-1:] == [b"after"],
                    10, "the laggard to restart its log at the leader's begin and catch up")
        assert far.get_min_offset_in_queue("T", 0) == lo
        assert queue_bodies(far) == [*kept, b"after"]

    run(tmp_path, scenario, clock)


def test_the_leader_dispatches_its_entries_from_the_hand_over_only_for_the_same_index_and_term(
        tmp_path: Path) -> None:
    """The append hands its records to dispatch (no parse of the bytes back); a hand-over noted for another term
    -- an entry of a lost leadership that a new leader replaced at the same index -- is never used."""
    async def scenario(m: Members) -> None:
        _, store = await m.leader()
        entries = store.entries
        used: list[int] = []
        parsed: list[int] = []
        real_handover, real_file = entries._dispatch_handover, entries._dispatch_file

        def handover(entry, notify):  # type: ignore[no-untyped-def]
            used.append(entry[0])
            real_handover(entry, notify)

        def from_file(mm, start, size, pos, limit, budget_end, notify):  # type: ignore[no-untyped-def]
            parsed.append(start + pos)
            return real_file(mm, start, size, pos, limit, budget_end, notify)

        entries._dispatch_handover = handover  # type: ignore[method-assign]
        entries._dispatch_file = from_file  # type: ignore[method-assign]
        first = store.append_batch("T", 0, batch("T", 2, body=b"own"), born_host=HOST)
        await first.committed  # type: ignore[misc]
        assert queue_bodies(store) == [b"own", b"own"]
        assert used == [first.wrote_offset] and parsed == []
        second = store.append_batch("T", 0, batch("T", 2, body=b"other"), born_host=HOST)
        index, term = entries._handed[-1]
        entries._handed[-1] = (index, term - 1)  # as if noted while leading an older term
        await second.committed  # type: ignore[misc]
        assert queue_bodies(store) == [b"own", b"own", b"other", b"other"]
        assert used == [first.wrote_offset] and parsed == [second.wrote_offset]

    run(tmp_path, scenario)


def test_a_new_leader_reads_back_the_idempotent_records_of_its_log(tmp_path: Path) -> None:
    """What fills a new leader's duplicate window: every idempotent record of its log, those of the old leader's
    entries included (none of the plain ones); the leader's own entries that no quorum stored yet too."""
    idem = int(SysFlag.IDEMPOTENT)

    def items(*keys: str, bit: bool = True) -> list[Any]:
        return decode_batch(encode_batch([Message("T", b"x" * 50) for _ in keys], born_timestamp_ms=1,
                                         uniq_keys=list(keys), sys_flag=idem if bit else 0))

    async def scenario(m: Members) -> None:
        node, store = await m.leader()
        results = [store.append_batch("T", 0, items("a", "b"), born_host=HOST),
                   store.append_batch("T", 0, items("p", bit=False), born_host=HOST),
                   store.append_batch("T", 0, items("c"), born_host=HOST)]
        for r in results:
            await r.committed  # type: ignore[misc]
        want = [(b"a", results[0].physical_offsets[0], 0), (b"b", results[0].physical_offsets[1], 1),
                (b"c", results[2].physical_offsets[0], 3)]
        old = node.state.self_id
        await node.stop()
        new = await wait_until(lambda: next((n for p, n in m.nodes.items() if p != old
                                             and n.state.role is Role.LEADER), None), 10, "a new leader")
        new_store = await m.serve(new)
        assert [(k.key, k.offset, k.queue_offset) for k in new_store.idempotent_keys(0)] == want
        since = results[0].store_timestamp
        assert [k.key for k in new_store.idempotent_keys(since)] == (
            [b"c"] if results[2].store_timestamp > since else [])
        lonely = next(p for p in m.peers if p not in (old, new.state.self_id))
        m.faults(new).block(lonely)  # no quorum: the next entry stays uncommitted on the leader
        r = new_store.append_batch("T", 0, items("d"), born_host=HOST)
        assert r.status is PutMessageStatus.PUT_OK and not r.committed.done()  # type: ignore[union-attr]
        assert [k.key for k in new_store.idempotent_keys(0)] == [b"a", b"b", b"c", b"d"]
        assert new_store.entry_committed(r.entry) is False  # type: ignore[arg-type]
        m.faults(new).heal()
        await r.committed  # type: ignore[misc]
        assert new_store.entry_committed(r.entry) is True  # type: ignore[arg-type]
        m.nodes.pop(old)
        m.stores.pop(old).shutdown()

    run(tmp_path, scenario)
