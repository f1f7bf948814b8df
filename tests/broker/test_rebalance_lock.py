"""Queue locks of orderly consumption: the lock table's rules as a table (injected clock), its bound, and the
``/queue/lock`` / ``/queue/unlock`` endpoints on a master and a slave (in-process controller)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.rebalance_lock import REBALANCE_LOCK_MAX_LIVE_MS, RebalanceLockTable
from common.codes import BrokerRole
from common.message import MessageQueue
from common.queue_lock import LockBatchRequest, lock_response
from common.requests import ArgumentError
from tests.broker.fakes import run_with_broker

Q0, Q1 = ("T", 0), ("T", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


# (what happened before: [(ms after start, client, op, queues)], asking client, ms of the ask, queues asked,
#  queues it holds after the ask)
LOCK_TABLE = [
    pytest.param([], "a", 0, [Q0, Q1], {Q0, Q1}, id="free queues are given"),
    pytest.param([(0, "a", "lock", [Q0])], "b", 1_000, [Q0, Q1], {Q1}, id="held by another live client: refused"),
    pytest.param([(0, "a", "lock", [Q0])], "b", REBALANCE_LOCK_MAX_LIVE_MS, [Q0], set(),
                 id="exactly at the expiry: still held"),
    pytest.param([(0, "a", "lock", [Q0])], "b", REBALANCE_LOCK_MAX_LIVE_MS + 1, [Q0], {Q0},
                 id="expired lock is taken over"),
    pytest.param([(0, "a", "lock", [Q0])], "a", REBALANCE_LOCK_MAX_LIVE_MS + 1, [Q0], {Q0},
                 id="own expired lock is taken again"),
    pytest.param([(0, "a", "lock", [Q0]), (50_000, "a", "lock", [Q0])], "b", 100_000, [Q0], set(),
                 id="renewal moves the expiry"),
    pytest.param([(0, "a", "lock", [Q0]), (50_000, "a", "lock", [Q0])], "b", 110_001, [Q0], {Q0},
                 id="renewed lock expires max_live after the renewal"),
    pytest.param([(0, "a", "lock", [Q0]), (10, "a", "unlock", [Q0])], "b", 20, [Q0], {Q0},
                 id="unlocked queue is free at once"),
    pytest.param([(0, "a", "lock", [Q0]), (10, "b", "unlock", [Q0])], "b", 20, [Q0], set(),
                 id="unlock by another client does nothing"),
    pytest.param([(0, "a", "lock", [Q0]), (0, "a", "lock", [Q0])], "a", 1, [Q0], {Q0},
                 id="same client locks twice: one entry, held"),
]


@pytest.mark.parametrize(("before", "asker", "at_ms", "queues", "held"), LOCK_TABLE)
def test_lock_table(before: list[tuple[int, str, str, list[tuple[str, int]]]], asker: str, at_ms: int,
                    queues: list[tuple[str, int]], held: set[tuple[str, int]]) -> None:
    clock = Clock()
    start = clock.now
    table = RebalanceLockTable(clock)
    for ms, client, op, qs in before:
        clock.now = start + ms
        (table.try_lock if op == "lock" else table.unlock)("g", client, qs)
    clock.now = start + at_ms
    assert table.try_lock("g", asker, queues) == held
    for q in held:
        assert table.holder("g", q) == asker


def test_groups_are_separate_and_unlock_drops_entries() -> None:
    clock = Clock()
    table = RebalanceLockTable(clock)
    assert table.try_lock("g1", "a", [Q0]) == {Q0}
    assert table.try_lock("g2", "b", [Q0]) == {Q0}  # another group: its own lock on the same queue
    assert len(table) == 2
    assert table.unlock("g1", "a", [Q0, Q1]) == {Q0}
    assert len(table) == 1 and table.holder("g1", Q0) is None and table.holder("g2", Q0) == "b"
    table.clear()
    assert len(table) == 0 and table.holder("g2", Q0) is None


def test_entry_bound_sweeps_expired_then_refuses_new_but_renews() -> None:
    clock = Clock()
    table = RebalanceLockTable(clock, max_live_ms=100, max_entries=2)
    assert table.try_lock("g", "a", [Q0, Q1]) == {Q0, Q1}
    assert table.try_lock("g", "a", [("T", 2)]) == set()  # full, nothing expired
    assert table.try_lock("g", "a", [Q0]) == {Q0}  # a renewal always fits
    clock.now += 50
    assert table.try_lock("g", "a", [Q0]) == {Q0}
    clock.now += 60  # Q1 expired (110 ms old), Q0 not (60 ms)
    assert table.try_lock("h", "b", [("T", 2)]) == {("T", 2)}
    assert len(table) == 2 and table.holder("g", Q1) is None and table.holder("g", Q0) == "a"


def test_bad_bounds_refused() -> None:
    with pytest.raises(ValueError, match="max_live_ms"):
        RebalanceLockTable(Clock(), max_live_ms=0)
    with pytest.raises(ValueError, match="max_entries"):
        RebalanceLockTable(Clock(), max_entries=0)


def body(client: str, *queue_ids: int, broker: str = "broker-a", group: str = "cg") -> bytes:
    return LockBatchRequest(group, client, tuple(MessageQueue("T", broker, i) for i in queue_ids)).to_json()


def test_lock_endpoints_on_a_master(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/queue/lock", content=body("c1", 0, 1))
        assert r.status_code == 200, r.text
        assert lock_response(r.json()) == {MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1)}
        r = await client.post("/queue/lock", content=body("c2", 1, 2))
        assert lock_response(r.json()) == {MessageQueue("T", "broker-a", 2)}
        r = await client.post("/queue/unlock", content=body("c1", 1))
        assert r.json() == {"unlocked": 1}
        r = await client.post("/queue/lock", content=body("c2", 1))
        assert lock_response(r.json()) == {MessageQueue("T", "broker-a", 1)}
        assert ctrl.queue_locks.holder("cg", ("T", 1)) == "c2"

    run_with_broker(tmp_path, scenario)


@pytest.mark.parametrize(("payload", "names"), [
    (b"not json", "JSON"),
    (json.dumps({"clientId": "c", "mqSet": []}).encode(), "consumerGroup"),
    (json.dumps({"consumerGroup": "cg", "mqSet": []}).encode(), "clientId"),
    (json.dumps({"consumerGroup": "cg", "clientId": "c", "mqSet": {}}).encode(), "mqSet"),
    (json.dumps({"consumerGroup": "cg", "clientId": "c", "mqSet": [5]}).encode(), "mqSet[0]"),
    (json.dumps({"consumerGroup": "cg", "clientId": "c",
                 "mqSet": [{"topic": "T", "brokerName": "broker-a", "queueId": -1}]}).encode(), "queueId"),
    (json.dumps({"consumerGroup": "cg", "clientId": "c",
                 "mqSet": [{"topic": "T", "brokerName": "broker-a", "queueId": 0}] * 10_001}).encode(),
     "MAX_QUEUES_PER_REQUEST"),
    (body("c", 0, broker="broker-b"), "broker-b"),
    (json.dumps({"consumerGroup": "cg", "clientId": "c",
                 "mqSet": [{"topic": "T/x", "brokerName": "broker-a", "queueId": 0}]}).encode(), "mqSet[0].topic"),
    (json.dumps({"consumerGroup": "g/x", "clientId": "c", "mqSet": []}).encode(), "group"),
])
def test_bad_lock_requests_are_refused_clearly(tmp_path: Path, payload: bytes, names: str) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        for path in ("/queue/lock", "/queue/unlock"):
            r = await client.post(path, content=payload)
            assert (r.status_code, r.json()["code"]) == (400, 29), r.text
            assert names in r.json()["remark"]
        assert len(ctrl.queue_locks) == 0

    run_with_broker(tmp_path, scenario)


def test_a_slave_refuses_locks(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/queue/lock", content=body("c1", 0))
        assert r.json()["code"] == 14 and "SLAVE" in r.json()["remark"], r.text
        assert len(ctrl.queue_locks) == 0

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                  max_size=4), max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={"consumerGroup": JSON | st.sampled_from(["cg", ""]),
                                             "clientId": JSON | st.just("c1"),
                                             "mqSet": JSON | st.lists(st.dictionaries(
                                                 st.sampled_from(["topic", "brokerName", "queueId"]),
                                                 JSON | st.sampled_from(["T", "broker-a", 0, 3]), max_size=3),
                                                 max_size=3)})


@settings(max_examples=200, deadline=None, database=None)
@given(FIELDS)
def test_lock_body_decoder_refuses_clearly(body: dict[str, Any]) -> None:
    """Any JSON object: a request, or an ArgumentError naming what is wrong -- nothing else escapes."""
    try:
        req = LockBatchRequest.from_json(body)
    except ArgumentError as e:
        assert e.message
        return
    assert LockBatchRequest.from_json(json.loads(req.to_json())) == LockBatchRequest(
        req.consumer_group, req.client_id, tuple(sorted(req.queues)))


def test_a_master_that_steps_down_forgets_its_locks(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/queue/lock", content=body("c1", 0, 1))
        assert len(lock_response(r.json())) == 2 and len(ctrl.queue_locks) == 2
        await ctrl._became_slave()  # what the DLedger role handler runs when the leader steps down
        assert len(ctrl.queue_locks) == 0

    run_with_broker(tmp_path, scenario)
