"""The orderly push consumer's queue locks: the local view as a table (injected clock), and against a real
broker -- a queue another client holds locked is not consumed until it is unlocked, the consumer's own queues
are locked on the master while it runs, and close unlocks them at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest

from client import Admin, Message, MessageExt, Producer
from client._orderly import LockView
from client._push_consumer import ConsumeStatus, PushConsumer
from client.cluster import LocalCluster
from common.message import MessageQueue
from common.queue_lock import LockBatchRequest, lock_response
from tests.waiting import poll_until

Q0, Q1 = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# (answers: [(seconds after start, asked, granted)], seconds of the check, queue, held?)
VIEW_TABLE = [
    pytest.param([], 0, Q0, False, id="never granted"),
    pytest.param([(0, [Q0, Q1], [Q0])], 0, Q0, True, id="granted"),
    pytest.param([(0, [Q0, Q1], [Q0])], 0, Q1, False, id="refused"),
    pytest.param([(0, [Q0], [Q0])], 30, Q0, True, id="30 s after the grant: still fresh"),
    pytest.param([(0, [Q0], [Q0])], 30.01, Q0, False, id="older than 30 s: stale"),
    pytest.param([(0, [Q0], [Q0]), (20, [Q0], [Q0])], 45, Q0, True, id="renewal keeps it fresh"),
    pytest.param([(0, [Q0], [Q0]), (20, [Q0], [])], 21, Q0, False, id="renewal refused: lost at once"),
    pytest.param([(0, [Q0], [Q0]), (20, [Q1], [Q1])], 21, Q0, True, id="an answer about other queues changes nothing"),
]


@pytest.mark.parametrize(("answers", "at", "mq", "held"), VIEW_TABLE)
def test_lock_view(answers: list[tuple[float, list[MessageQueue], list[MessageQueue]]], at: float,
                   mq: MessageQueue, held: bool) -> None:
    clock = Clock()
    start = clock.now
    view = LockView(clock)
    for t, asked, granted in answers:
        clock.now = start + t
        view.granted(asked, set(granted))
    clock.now = start + at
    assert view.holds(mq) is held


def test_lock_view_forget() -> None:
    view = LockView(Clock())
    view.granted([Q0, Q1], {Q0, Q1})
    view.forget(Q0)
    assert not view.holds(Q0) and view.holds(Q1) and view.locked() == {Q1}


def raw_lock(addr: str, path: str, group: str, client_id: str, queues: list[MessageQueue]) -> httpx.Response:
    body = LockBatchRequest(group, client_id, tuple(queues)).to_json()
    r = httpx.post(f"http://{addr}{path}", content=body, timeout=5.0)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.integration
def test_queue_locked_by_another_client_is_not_consumed_until_unlocked(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0)
    topic, group = "OrderLocks", "g_order_locks"
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=2)
    master = cluster.broker("broker-a", 0).addr
    q0, q1 = MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-a", 1)
    r = raw_lock(master, "/queue/lock", group, "intruder", [q0])
    assert lock_response(r.json()) == {q0}
    with Producer("pg_order_locks", cluster.namesrv_addr) as p:
        for q in (q0, q1):
            for i in range(5):
                p.send(Message(topic, f"{q.queue_id}:{i}".encode()), q)
    seen: list[str] = []
    lock = threading.Lock()

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.extend(m.body.decode() for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(group, cluster.namesrv_addr, on_messages, orderly=True, rebalance_interval_s=0.3,
                     heartbeat_interval_s=1.0, pull_suspend_s=0.5, consume_from_where="FIRST_OFFSET")
    c.subscribe(topic)
    with c:
        poll_until(lambda: len(seen) >= 5, 20, "queue 1's five messages")
        # The consumer holds queue 1 locked on the master, and several rebalances pass without queue 0.
        assert lock_response(raw_lock(master, "/queue/lock", group, "intruder", [q1]).json()) == set()
        rounds = c.stats()["rebalances"]
        poll_until(lambda: c.stats()["rebalances"] >= rounds + 3, 20, "three more rebalances")
        with lock:
            assert sorted(seen) == [f"1:{i}" for i in range(5)], seen
        assert q0 not in c.assignment()
        raw_lock(master, "/queue/unlock", group, "intruder", [q0])
        poll_until(lambda: len(seen) >= 10, 20, "queue 0's messages after the intruder unlocked it")
        with lock:
            assert [s for s in seen if s.startswith("0:")] == [f"0:{i}" for i in range(5)]
    # Closed: both queues were unlocked at once (not left to the 60 s expiry).
    assert lock_response(raw_lock(master, "/queue/lock", group, "next", [q0, q1]).json()) == {q0, q1}
