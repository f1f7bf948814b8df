"""Transactional messages on the broker, in process: the pure check rules as tables, the check queues' bounds,
the end request's arguments, and the service over a real file store with an injected clock (prepare, end,
idempotence, check rounds, re-put counts, discard, restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.metadata import ConsumerOffsetManager
from broker.store.file_store import FileMessageStore
from broker.transaction import CheckQueues, CheckRules, TransactionalMessageService
from broker.transaction.rules import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    HalfView,
    OpView,
    Verdict,
    check_times_of,
    committed_properties,
    judge,
    op_offset_after,
    plan_round,
)
from client.errors import InvalidParameterError, MessageIllegalError, QueryNotFoundError
from common.codec import batch_item, decode_records, encode_properties, pack_host
from common.codes import SysFlag
from common.properties import (
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    UNIQ_KEY,
)
from common.requests import ArgumentError
from common.transaction import EndTransactionRequest, TransactionCheck, TransactionResolution
from tests.broker.delay_support import T0, FakeClock, make_store

RULES = CheckRules(timeout_ms=6000, check_max=15)
NOW = 100_000


def half(qo: int, txid: str = "A", born: int = 0, checks: int = 0) -> HalfView:
    return HalfView(qo, txid, born, checks)


# --- the rules ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("view", "settled", "expected"), [
    (half(0, "A", born=NOW - 6000), set(), Verdict.CHECK),               # exactly transactionTimeOut old
    (half(0, "A", born=NOW - 5999), set(), Verdict.WAIT),                # 1 ms too young
    (half(0, "A", born=NOW - 5999), {"A"}, Verdict.SETTLED),             # an op record wins over age
    (half(0, "A", born=NOW - 60_000, checks=14), set(), Verdict.CHECK),  # the 15th check is still made
    (half(0, "A", born=NOW - 60_000, checks=15), set(), Verdict.DISCARD),  # transactionCheckMax reached
    (half(0, "A", born=NOW, checks=15), set(), Verdict.DISCARD),         # discarded before the age test
    (half(0, "A", born=NOW - 60_000, checks=15), {"A"}, Verdict.SETTLED),  # settled before discarded
    (half(0, "B", born=NOW - 60_000), {"A"}, Verdict.CHECK),             # another transaction's op record
    (half(0, "A", born=NOW + 5000), set(), Verdict.WAIT),                # born in the future (clock skew)
])
def test_judge(view: HalfView, settled: set[str], expected: Verdict) -> None:
    assert judge(view, settled, NOW, RULES) is expected


@pytest.mark.parametrize(("halves", "settled", "actions", "next_offset"), [
    ([], set(), [], 7),
    ([half(7, "A"), half(8, "B")], {"B"}, [(7, Verdict.CHECK), (8, Verdict.SETTLED)], 9),
    # the first young message ends the round; the old re-put copy behind it waits for the next round
    ([half(7, "A"), half(8, "B", born=NOW), half(9, "C")], set(), [(7, Verdict.CHECK)], 8),
    ([half(7, "A", born=NOW)], set(), [], 7),
    ([half(7, "A", checks=15), half(8, "A", checks=3)], set(), [(7, Verdict.DISCARD), (8, Verdict.CHECK)], 9),
])
def test_plan_round(halves: list[HalfView], settled: set[str], actions: list[tuple[int, Verdict]],
                    next_offset: int) -> None:
    plan = plan_round(7, halves, settled, NOW, RULES)
    assert [(h.queue_offset, v) for h, v in plan.actions] == actions
    assert plan.next_offset == next_offset


@pytest.mark.parametrize(("ops", "half_offset", "expected"), [
    ([], 10, 3),
    ([OpView(3, "A", 5), OpView(4, "B", 9)], 10, 5),   # both transactions wholly below the check offset
    ([OpView(3, "A", 5), OpView(4, "B", 11)], 10, 4),  # B may still have a copy at offset 10: keep its op
    ([OpView(3, "A", 12), OpView(4, "B", 1)], 10, 3),  # stops at the first op still needed
    ([OpView(3, "A", 10)], 10, 4),                      # half end 10 = every copy below offset 10
])
def test_op_offset_after(ops: list[OpView], half_offset: int, expected: int) -> None:
    assert op_offset_after(3, ops, half_offset) == expected


def test_committed_properties_restore_the_real_topic_and_keep_the_id() -> None:
    props = {REAL_TOPIC: "T", REAL_QID: "3", TRANSACTION_CHECK_TIMES: "2", UNIQ_KEY: "U", TRAN_MSG: "true",
             PGROUP: "P", "k": "v"}
    assert committed_properties(props) == ("T", 3, {UNIQ_KEY: "U", TRAN_MSG: "true", PGROUP: "P", "k": "v"})
    with pytest.raises(ValueError, match="REAL_QID"):
        committed_properties({REAL_TOPIC: "T", REAL_QID: "-1"})
    assert [check_times_of(p) for p in ({}, {TRANSACTION_CHECK_TIMES: "4"}, {TRANSACTION_CHECK_TIMES: "x"})] == \
        [0, 4, 0]


@pytest.mark.parametrize(("query", "needle"), [
    ({}, "group"),
    ({"group": "P", "topic": "T", "transactionId": "A", "commitLogOffset": "-1", "commitOrRollback": "COMMIT"},
     "commitLogOffset"),
    ({"group": "P", "topic": "T", "transactionId": "A", "commitLogOffset": "1", "commitOrRollback": "MAYBE"},
     "COMMIT or ROLLBACK"),
    ({"group": "P", "topic": "T", "transactionId": "A/../x", "commitLogOffset": "1", "commitOrRollback": "COMMIT"},
     "transactionId"),
    ({"group": "P", "topic": "T", "transactionId": "A", "commitLogOffset": "1", "commitOrRollback": "COMMIT",
      "fromTransactionCheck": "yes"}, "fromTransactionCheck"),
])
def test_end_request_arguments_are_checked(query: dict[str, str], needle: str) -> None:
    with pytest.raises(ArgumentError, match=needle):
        EndTransactionRequest.from_query(query)


def test_end_request_round_trip() -> None:
    from urllib.parse import parse_qsl

    req = EndTransactionRequest("P", "%RETRY%x", "ABC", 42, TransactionResolution.ROLLBACK, from_check=True)
    assert EndTransactionRequest.from_query(dict(parse_qsl(req.to_query()))) == req


# --- the check queues -----------------------------------------------------------------------------------------

def _check(txid: str) -> TransactionCheck:
    return TransactionCheck(txid, 0, 0, "T", 0, 1, b"")


def test_check_queues_bounds_and_wakeups() -> None:
    async def main() -> None:
        q = CheckQueues(max_per_group=2, max_groups=1, max_parked=1)
        waiter = asyncio.create_task(q.take("P", 10, 5.0))
        await asyncio.sleep(0)
        assert q.parked == 1
        assert await q.take("P", 10, 5.0) == []  # past max_parked: answered at once
        assert q.offer("P", _check("A"))
        assert [c.transaction_id for c in await asyncio.wait_for(waiter, 1.0)] == ["A"]
        assert q.offer("P", _check("B")) and q.offer("P", _check("C"))
        assert not q.offer("P", _check("D"))  # full: the oldest (B) goes
        assert not q.offer("Q", _check("E"))  # past max_groups
        assert [c.transaction_id for c in await q.take("P", 1, 0)] == ["C"]
        assert [c.transaction_id for c in await q.take("P", 1, 0)] == ["D"]
        assert await q.take("P", 1, 0.01) == []
        assert q.dropped == 2
        waiter = asyncio.create_task(q.take("P", 10, 30.0))
        await asyncio.sleep(0)
        q.close()
        assert await asyncio.wait_for(waiter, 1.0) == []

    asyncio.run(main())


# --- the service over a real store ----------------------------------------------------------------------------

BORN_HOST = pack_host("10.0.0.9", 5000)


class Broker:
    """A file store, the consumer offsets and the service, all on one fake clock (no event loop needed)."""

    def __init__(self, root: Path, clock: FakeClock, rules: CheckRules = RULES) -> None:
        self.root = root
        self.clock = clock
        self.store: FileMessageStore = make_store(root, clock)
        self.offsets = ConsumerOffsetManager(root / "config", clock_ms=clock)
        self.offsets.load()
        self.svc = TransactionalMessageService(
            self.store, self.offsets, CheckQueues(), rules=rules, interval_ms=1000, clock_ms=clock,
            store_host=pack_host("127.0.0.1", 10911), catch_up_dispatch=self.catch_up)

    def catch_up(self) -> bool:
        while self.store.dispatch_available():
            pass
        return True

    def prepare(self, txid: str, topic: str = "T", queue_id: int = 1, born: int | None = None) -> int:
        props = encode_properties({UNIQ_KEY: txid, TRAN_MSG: "true", PGROUP: "P", "k": "v"})
        item = batch_item(f"body-{txid}".encode(), props, sys_flag=int(SysFlag.TRANSACTION_PREPARED),
                          born_timestamp=self.clock() if born is None else born)
        half_item = self.svc.half_item(topic, queue_id, "P", [item])
        result = self.store.append_batch(HALF_TOPIC, 0, [half_item], born_host=BORN_HOST)
        self.catch_up()
        return result.wrote_offset

    def end(self, txid: str, offset: int, resolution: TransactionResolution, topic: str = "T") -> str:
        out = self.svc.end(EndTransactionRequest("P", topic, txid, offset, resolution))
        self.catch_up()
        return out.state

    def bodies(self, topic: str, queue_id: int = 0) -> list[str]:
        self.catch_up()
        res = self.store.get_message("g", topic, queue_id, 0, 1000, 1 << 24)
        return [decode_records(r)[0].body.decode() for r in res.records]

    def round(self) -> tuple[int, int, int]:
        r = self.svc.check_round()
        self.catch_up()
        return r.checked, r.discarded, r.settled

    def taken(self) -> list[TransactionCheck]:
        return asyncio.run(self.svc.checks.take("P", 64, 0))

    def close(self) -> None:
        self.offsets.persist()
        self.store.shutdown()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path, FakeClock(T0))
    yield b
    b.store.shutdown()


def test_half_message_is_stored_apart_and_commit_writes_the_real_message_once(broker: Broker) -> None:
    offset = broker.prepare("A")
    assert broker.bodies("T", 1) == []
    assert broker.bodies(HALF_TOPIC) == ["body-A"]
    assert broker.end("A", offset, TransactionResolution.COMMIT) == "COMMITTED"
    assert broker.end("A", offset, TransactionResolution.COMMIT) == "ALREADY_ENDED"
    assert broker.end("A", offset, TransactionResolution.ROLLBACK) == "ALREADY_ENDED"
    assert broker.bodies("T", 1) == ["body-A"]
    res = broker.store.get_message("g", "T", 1, 0, 10, 1 << 20)
    msg = decode_records(res.records[0])[0]
    assert msg.properties[UNIQ_KEY] == "A" and msg.properties["k"] == "v"
    assert REAL_TOPIC not in msg.properties and not msg.sys_flag & int(SysFlag.TRANSACTION_ROLLBACK)
    assert len(broker.bodies(OP_TOPIC)) == 1


def test_rollback_writes_only_the_op_record(broker: Broker) -> None:
    offset = broker.prepare("A")
    assert broker.end("A", offset, TransactionResolution.ROLLBACK) == "ROLLED_BACK"
    assert broker.bodies("T", 1) == [] and len(broker.bodies(OP_TOPIC)) == 1
    broker.clock.advance(60_000)
    assert broker.round() == (0, 0, 1)  # settled: never checked


def test_end_naming_the_wrong_message_is_refused(broker: Broker) -> None:
    offset = broker.prepare("A")
    with pytest.raises(QueryNotFoundError, match="no half message"):
        broker.end("A", offset + 1, TransactionResolution.COMMIT)
    with pytest.raises(InvalidParameterError, match="transactionId"):
        broker.end("B", offset, TransactionResolution.COMMIT)
    with pytest.raises(InvalidParameterError, match="topic"):
        broker.end("A", offset, TransactionResolution.COMMIT, topic="Other")
    assert broker.bodies("T", 1) == []


def test_prepared_sends_are_one_undelayed_message_with_a_group(broker: Broker) -> None:
    item = batch_item(b"x", encode_properties({UNIQ_KEY: "A"}), sys_flag=4, born_timestamp=1)
    with pytest.raises(MessageIllegalError, match="one message"):
        broker.svc.half_item("T", 0, "P", [item, item])
    with pytest.raises(MessageIllegalError, match="producer group"):
        broker.svc.half_item("T", 0, "", [item])
    delayed = batch_item(b"x", encode_properties({UNIQ_KEY: "A", "DELAY": "2"}), sys_flag=4, born_timestamp=1)
    with pytest.raises(MessageIllegalError, match="delay level"):
        broker.svc.half_item("T", 0, "P", [delayed])


def test_check_rounds_recheck_with_a_count_then_discard(tmp_path: Path) -> None:
    b = Broker(tmp_path, FakeClock(T0), CheckRules(timeout_ms=1000, check_max=2))
    b.prepare("A")
    assert b.round() == (0, 0, 0)  # too young
    b.clock.advance(1000)
    assert b.round() == (1, 0, 0)
    (check,) = b.taken()
    assert (check.transaction_id, check.topic, check.queue_id, check.check_times) == ("A", "T", 1, 1)
    copy = decode_records(check.record)[0]
    assert copy.topic == HALF_TOPIC and copy.properties[TRANSACTION_CHECK_TIMES] == "1"
    assert b.round() == (1, 0, 0)  # the re-put copy keeps its born time: checked again next round
    assert [c.check_times for c in b.taken()] == [2]
    assert b.round() == (0, 1, 0)  # transactionCheckMax=2 reached: moved aside
    assert b.bodies(CHECK_MAX_TOPIC) == ["body-A"] and b.bodies("T", 1) == []
    assert b.round() == (0, 0, 0)
    b.store.shutdown()


def test_a_check_answered_commit_settles_every_copy(broker: Broker) -> None:
    first = broker.prepare("A")
    broker.prepare("B")
    broker.clock.advance(6000)
    assert broker.round() == (2, 0, 0)
    checks = {c.transaction_id: c for c in broker.taken()}
    assert broker.end("A", checks["A"].commit_log_offset, TransactionResolution.COMMIT) == "COMMITTED"
    assert broker.round() == (1, 0, 1)  # A's copy settled, B asked again
    assert broker.bodies("T", 1) == ["body-A"]
    # A late end of the first copy (the producer's own, after the check's) changes nothing.
    assert checks["A"].commit_log_offset != first
    assert broker.end("A", first, TransactionResolution.COMMIT) == "ALREADY_ENDED"
    assert broker.bodies("T", 1) == ["body-A"]


def test_restart_remembers_settled_transactions_and_the_check_offsets(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    b = Broker(tmp_path, clock)
    a = b.prepare("A")
    b.prepare("B")
    b.end("A", a, TransactionResolution.COMMIT)
    clock.advance(6000)
    assert b.round() == (1, 0, 1)  # B checked (re-put), A settled; the op offset moves past A's op record
    assert b.offsets.query("CID_SYS_RMQ_TRANS", OP_TOPIC, 0) == 1
    b.close()
    again = Broker(tmp_path, clock)
    asyncio.run(_start_stop(again.svc))
    # A late end of A after the restart: its op record is behind the op offset but still remembered.
    assert again.end("A", a, TransactionResolution.COMMIT) == "ALREADY_ENDED"
    assert again.round() == (1, 0, 0)  # B's copy is checked again; the persisted offsets were used
    assert [c.transaction_id for c in again.taken()] == ["B"]
    assert again.bodies("T", 1) == ["body-A"]
    again.store.shutdown()


async def _start_stop(svc: TransactionalMessageService) -> None:
    await svc.start()
    await svc.stop()
