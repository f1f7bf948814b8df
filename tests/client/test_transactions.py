"""Transactional messages against real servers (issue 17 acceptance): commit, rollback, unknown-then-commit and
unknown-then-rollback by check (sync and async producers), a producer killed mid-transaction (another producer
process of the group answers the check), a broker SIGKILLed between prepare and commit, and a check answered
UNKNOW that leaves the transaction open for a later check.

Each scenario ends with the consumer seeing exactly the committed messages, once each; a committed *sentinel*
sent last to the same one-queue topic proves the earlier outcomes are final when it arrives. Half messages stay
out of sight: the half and op topics refuse pulls on the master and on the slave, while the slave holds their
replicated records. Brokers run with ``transactionCheckInterval=500`` and ``transactionTimeOut=1000``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from client import (
    Admin,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    PullConsumer,
    PullStatus,
    TransactionProducer,
)
from client._transaction import _TransactionCore
from client.cluster import LocalCluster
from client.errors import ClientClosedError, MessageIllegalError, NoPermissionError
from client.lowlevel import BrokerClient
from common.codec import decode_records
from common.message import MessageQueue
from common.transaction import EndTransactionRequest, TransactionCheck, TransactionResolution
from tests.waiting import poll_until, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAST_CHECKS = {"transactionCheckInterval": "500", "transactionTimeOut": "1000"}
COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


class Decisions:
    """Local transactions decided by the message body ``<first>-<on check>-<name>``; records the checks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked: dict[str, int] = {}
        self.topics: set[str] = set()

    @staticmethod
    def _state(code: str) -> LocalTransactionState:
        return {"C": COMMIT, "R": ROLLBACK, "U": UNKNOW}[code]

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return self._state(msg.body.decode().split("-")[0])

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        body = msg.body.decode()
        with self.lock:
            self.checked[body] = self.checked.get(body, 0) + 1
            self.topics.add(msg.topic)
        return self._state(body.split("-")[1])


def drain(consumer: PullConsumer, mq: MessageQueue, until: str, timeout_s: float = 20.0) -> list[str]:
    """Every body of ``mq`` from offset 0 up to and including ``until`` (fails after ``timeout_s``)."""
    seen: list[str] = []
    offset = 0
    deadline = time.monotonic() + timeout_s
    while until not in seen:
        assert time.monotonic() < deadline, f"{until} not consumed within {timeout_s} s; saw {seen}"
        r = consumer.pull(mq, offset, max_nums=64, suspend_timeout_s=1.0)
        if r.pull_status is PullStatus.FOUND:
            seen += [m.body.decode() for m in r.msg_found_list]
        offset = r.next_begin_offset
    return seen


def one_queue_topic(cluster: LocalCluster, topic: str) -> None:
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=1)


def assert_half_topics_hidden(cluster: LocalCluster, broker_id: int) -> None:
    """Pulls of the half and op topics are refused by this member; its half queue is not empty."""
    member = cluster.broker("broker-a", broker_id)
    with BrokerClient(cluster.namesrv_addr) as low:
        for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
            mq = MessageQueue(topic, "broker-a", 0)
            with pytest.raises(NoPermissionError, match="forbidden"):
                low.pull_raw_from(member.addr, mq, 0, group="txn-snoop")
    r = httpx.get(f"http://{member.addr}/offset/max", params={"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": 0})
    assert r.status_code == 200 and r.json()["offset"] > 0, f"{member}: {r.text}"


def test_commit_rollback_and_checks_with_sync_and_async_producers(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=1,
                              broker_config={**FAST_CHECKS, "slaveReadEnable": "true"})
    topic = "TxnOutcomes"
    one_queue_topic(cluster, topic)
    decisions = Decisions()
    sync_bodies = ["C-C-commit", "R-C-rollback", "U-C-check-commit", "U-R-check-rollback"]
    with TransactionProducer("txn-group", cluster.namesrv_addr, decisions, topics=[topic],
                             check_poll_s=1.0) as producer:
        results = [producer.send_message_in_transaction(Message(topic, b.encode()), i)
                   for i, b in enumerate(sync_bodies)]
        assert [r.local_transaction_state for r in results] == [COMMIT, ROLLBACK, UNKNOW, UNKNOW]
        assert all(r.msg_id == r.transaction_id and r.message_queue.topic == topic for r in results)

        async def async_part() -> None:
            # Its own group: the check of its UNKNOW transaction can only be answered by it.
            async with AsyncTransactionProducer("txn-group-async", cluster.namesrv_addr, decisions, topics=[topic],
                                                check_poll_s=1.0) as ap:
                await ap.send_message_in_transaction(Message(topic, b"C-C-async-commit"))
                await ap.send_message_in_transaction(Message(topic, b"U-C-async-check-commit"))
                await ap.send_message_in_transaction(Message(topic, b"R-R-async-rollback"))
                await wait_until(lambda: ap.answered_checks or None, 15, "the async producer answers its check")

        asyncio.run(async_part())
        # The sync producer answers the checks of its group.
        poll_until(lambda: all(decisions.checked.get(b) for b in ("U-C-check-commit", "U-R-check-rollback",
                                                                    "U-C-async-check-commit")) or None,
                   15, "the three UNKNOW transactions checked back")
        producer.send_message_in_transaction(Message(topic, b"C-C-sentinel"))
    with PullConsumer("txn-reader", cluster.namesrv_addr) as consumer:
        (mq,) = consumer.fetch_subscribe_message_queues(topic)
        seen = drain(consumer, mq, "C-C-sentinel")
    assert sorted(seen) == sorted(["C-C-commit", "U-C-check-commit", "C-C-async-commit", "U-C-async-check-commit",
                                   "C-C-sentinel"]), seen
    # The committed message keeps the id the producer got; the offset msgId is new.
    with PullConsumer("txn-reader-2", cluster.namesrv_addr) as consumer:
        first = consumer.pull(mq, 0, max_nums=1).msg_found_list[0]
    assert first.body == b"C-C-commit" and first.msg_id == results[0].msg_id
    assert first.offset_msg_id != results[0].offset_msg_id
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    with BrokerClient(cluster.namesrv_addr) as low:
        slave = cluster.broker("broker-a", 1)
        raw = low.pull_raw_from(slave.addr, mq, 0, group="txn-slave-reader", max_nums=64)
    assert raw.served_by_broker_id == 1, raw
    assert sorted(m.body.decode() for m in decode_records(raw.records)) == sorted(seen), "the slave's view"
    for broker_id in (0, 1):
        assert_half_topics_hidden(cluster, broker_id)
    assert decisions.topics == {topic}, "a check shows the message under its real topic"
    # The check service runs on the master only, and a slave hands out no checks.
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    assert master.runtime()["transactions"]["running"] and not slave.runtime()["transactions"]["running"]
    started = time.monotonic()
    r = httpx.get(f"http://{slave.addr}/transaction/checks", params={"group": "txn-group", "timeoutMs": 5000})
    assert (r.status_code, r.json()) == (200, {"checks": []}) and time.monotonic() - started < 2


def test_a_producer_killed_mid_transaction_is_covered_by_another_of_its_group(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0, broker_config=FAST_CHECKS)
    topic = "TxnKilledProducer"
    one_queue_topic(cluster, topic)
    args = [sys.executable, "-m", "tests.client.txn_member", cluster.namesrv_addr, "txn-killed", topic]
    with subprocess.Popen([*args, "hang"], cwd=ROOT, stdout=subprocess.PIPE, text=True) as first:
        assert first.stdout is not None
        assert first.stdout.readline().split() == ["PREPARED", "killed-1"]
        first.kill()  # mid local transaction: the half message is stored, no end will come
    with subprocess.Popen([*args, "answer"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as second:
        assert second.stdin is not None and second.stdout is not None
        try:
            assert second.stdout.readline().strip() == "READY"
            checked = second.stdout.readline().split()
            assert checked[0] == "CHECKED" and int(checked[2]) >= 1, checked
            with PullConsumer("txn-killed-reader", cluster.namesrv_addr) as consumer:
                (mq,) = consumer.fetch_subscribe_message_queues(topic)
                assert drain(consumer, mq, "killed-1") == ["killed-1"]
                with TransactionProducer("txn-other", cluster.namesrv_addr, Decisions(), check_poll_s=1.0) as p:
                    p.send_message_in_transaction(Message(topic, b"C-C-sentinel"))
                seen = drain(consumer, mq, "C-C-sentinel")
                assert seen == ["killed-1", "C-C-sentinel"]
                assert consumer.pull(mq, 0, max_nums=1).msg_found_list[0].msg_id == checked[1]
        finally:
            second.stdin.close()
            second.wait(15)


def test_a_broker_killed_between_prepare_and_commit_resolves_by_check_after_restart(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0, broker_config=FAST_CHECKS)
    topic = "TxnBrokerKilled"
    one_queue_topic(cluster, topic)
    master = cluster.broker("broker-a", 0)

    class KillThenCommit(Decisions):
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            if arg == "kill":
                master.kill()  # SIGKILL between the stored half message and the end
            return COMMIT

    decisions = KillThenCommit()
    with TransactionProducer("txn-crash", cluster.namesrv_addr, decisions, topics=[topic],
                             check_poll_s=1.0, send_timeout_s=5.0) as producer:
        r = producer.send_message_in_transaction(Message(topic, b"C-C-crashed"), "kill")
        assert r.local_transaction_state is COMMIT  # the end failed (logged); the check will resolve it
        master.start()
        # the answer's end request acknowledged, not only the listener asked: the sentinel's commit must come after
        poll_until(lambda: (decisions.checked.get("C-C-crashed") and producer.answered_checks >= 1) or None, 20,
                   "the check after the restart, answered COMMIT")
        producer.send_message_in_transaction(Message(topic, b"C-C-sentinel"))
    with PullConsumer("txn-crash-reader", cluster.namesrv_addr) as consumer:
        (mq,) = consumer.fetch_subscribe_message_queues(topic)
        seen = drain(consumer, mq, "C-C-sentinel")
    assert seen == ["C-C-crashed", "C-C-sentinel"]


class UnknowAtFirstCheck(Decisions):
    """Undecided at the first check of a transaction, committed at the next one."""

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        super().check_local_transaction(msg)
        with self.lock:
            return UNKNOW if self.checked[msg.body.decode()] == 1 else COMMIT


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_check_answered_unknow_leaves_the_transaction_open_for_a_later_check(
        cluster_factory: Callable[..., LocalCluster], kind: str) -> None:
    """UNKNOW at a check sends no end: the transaction stays open, the broker checks again, and the COMMIT given at
    that later check delivers the message. A mutant that ended it as ROLLBACK at an UNKNOW check passed every
    other test (none answered a check UNKNOW); here it loses the message, and no second check comes."""
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0, broker_config=FAST_CHECKS)
    topic = f"TxnUnknowAtCheck{kind}"
    one_queue_topic(cluster, topic)
    decisions = UnknowAtFirstCheck()
    body = "U-U-checked-twice"

    def checked_twice_and_answered(answered: int) -> bool | None:
        return (decisions.checked.get(body, 0) >= 2 and answered >= 1) or None

    if kind == "sync":
        with TransactionProducer("txn-unknow", cluster.namesrv_addr, decisions, topics=[topic],
                                 check_poll_s=1.0) as producer:
            assert producer.send_message_in_transaction(Message(topic, body.encode())).local_transaction_state \
                is UNKNOW
            poll_until(lambda: checked_twice_and_answered(producer.answered_checks), 20,
                       "a second check after UNKNOW, answered COMMIT")
            producer.send_message_in_transaction(Message(topic, b"C-C-sentinel"))
    else:
        async def scenario() -> None:
            async with AsyncTransactionProducer("txn-unknow-async", cluster.namesrv_addr, decisions, topics=[topic],
                                                check_poll_s=1.0) as ap:
                r = await ap.send_message_in_transaction(Message(topic, body.encode()))
                assert r.local_transaction_state is UNKNOW
                await wait_until(lambda: checked_twice_and_answered(ap.answered_checks), 20,
                                 "a second check after UNKNOW, answered COMMIT")
                await ap.send_message_in_transaction(Message(topic, b"C-C-sentinel"))

        asyncio.run(scenario())
    with PullConsumer(f"txn-unknow-reader-{kind}", cluster.namesrv_addr) as consumer:
        (mq,) = consumer.fetch_subscribe_message_queues(topic)
        assert drain(consumer, mq, "C-C-sentinel") == [body, "C-C-sentinel"]


@pytest.mark.parametrize(("state", "resolution"), [(UNKNOW, None), (COMMIT, TransactionResolution.COMMIT),
                                                  (ROLLBACK, TransactionResolution.ROLLBACK)])
def test_a_check_is_answered_by_an_end_request_unless_unknow(state: LocalTransactionState,
                                                             resolution: TransactionResolution | None) -> None:
    """The rule both producers run (``_TransactionCore.answer_op``): COMMIT and ROLLBACK end the transaction
    ``fromTransactionCheck``; UNKNOW makes no request at all."""
    core = _TransactionCore("txn-unit", Decisions(), (), send_timeout_s=1.0, retries=0, check_poll_s=1.0,
                            max_message_size=1024)
    check = TransactionCheck("TX1", 4242, 7, "TxnUnit", 0, 1, b"")
    op = core.answer_op("127.0.0.1:1", check, state)
    if resolution is None:
        with pytest.raises(StopIteration):
            next(op)
        assert core.answered_checks == 0
        return
    req = next(op)
    end = EndTransactionRequest.from_query(dict(parse_qsl(urlsplit(req.target).query)))
    assert (req.method, end.transaction_id, end.commit_log_offset, end.resolution, end.from_check) == \
        ("POST", "TX1", 4242, resolution, True)


class _NoChecks:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        raise AssertionError("no local transaction may run for a refused message")


def test_misuse_is_refused_before_any_io() -> None:
    with pytest.raises(TypeError, match="check_local_transaction"):
        TransactionProducer("g", "127.0.0.1:1", _NoChecks())  # type: ignore[arg-type]
    producer = TransactionProducer("g", "127.0.0.1:1", Decisions())
    with pytest.raises(MessageIllegalError, match="delay level"):
        producer.send_message_in_transaction(Message("T", b"x", delay_level=2))
    with pytest.raises(MessageIllegalError, match="reserved"):
        producer.send_message_in_transaction(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"))
    producer.close()
    producer.close()
    with pytest.raises(ClientClosedError):
        producer.send_message_in_transaction(Message("T", b"x"))
