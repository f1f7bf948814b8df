"""The SDK against real nameserver and broker processes (``LocalCluster``)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus, SendStatus
from client.errors import TransportError

pytestmark = pytest.mark.integration


def drain(consumer: PullConsumer, mq: MessageQueue, start: int = 0) -> list:
    out = []
    offset = start
    for _ in range(10_000):
        r = consumer.pull(mq, offset, max_nums=32)
        if r.pull_status is not PullStatus.FOUND:
            assert r.pull_status is PullStatus.NO_NEW_MSG, (mq, offset, r)
            return out
        out.extend(r.msg_found_list)
        offset = r.next_begin_offset
    raise AssertionError(f"{mq} did not drain")


def test_produce_10000_and_pull_them_all_back(cluster_factory) -> None:
    cluster = cluster_factory(broker_groups=2, slaves_per_group=0)
    with Admin(cluster.namesrv_addr) as admin:
        assert admin.create_topic("Big", queue_nums=4) == ["broker-a", "broker-b"]
    sent: dict[str, tuple[Message, object]] = {}
    lock = threading.Lock()
    with Producer("pg", cluster.namesrv_addr) as p:
        def worker(w: int) -> None:
            for i in range(1000):
                m = Message("Big", b"w%d-%d" % (w, i), tags=f"T{i % 3}", keys=[f"k{w}-{i}"],
                            properties={"w": str(w), "i": str(i)})
                r = p.send(m)
                with lock:
                    sent[r.msg_id] = (m, r)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for start in range(0, 6000, 100):
            msgs = [Message("Big", b"b%d" % (start + j), keys=f"bk{start + j}") for j in range(100)]
            for m, r in zip(msgs, p.send_batch(msgs), strict=True):
                sent[r.msg_id] = (m, r)
        for t in threads:
            t.join(60)
    assert len(sent) == 10_000
    assert all(r.send_status is SendStatus.SEND_OK for _, r in sent.values())

    with PullConsumer("cg", cluster.namesrv_addr) as c:
        mqs = c.fetch_subscribe_message_queues("Big")
        assert len(mqs) == 8
        got = {}
        per_queue = defaultdict(int)
        for mq in mqs:
            msgs = drain(c, mq)
            per_queue[mq] = len(msgs)
            assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
            for m in msgs:
                got[m.msg_id] = m
        assert all(per_queue[mq] > 0 for mq in mqs), per_queue  # every queue received messages
        assert set(got) == set(sent)
        for msg_id, (m, r) in sent.items():
            g = got[msg_id]
            assert (g.body, g.tags, g.keys, g.topic) == (m.body, m.tags, m.keys, m.topic)
            assert all(g.properties[k] == v for k, v in m.properties.items())
            assert (g.broker_name, g.queue_id, g.queue_offset, g.offset_msg_id) == (
                r.message_queue.broker_name, r.message_queue.queue_id, r.queue_offset, r.offset_msg_id)
        for i, mq in enumerate(mqs):
            assert c.fetch_consume_offset(mq) == -1
            c.update_consume_offset(mq, i + 1)
        for i, mq in enumerate(mqs):
            assert c.fetch_consume_offset(mq) == i + 1
            assert c.max_offset(mq) == per_queue[mq]
            assert c.min_offset(mq) == 0
    with Admin(cluster.namesrv_addr) as admin:
        progress = admin.consumer_progress("cg", "Big")
        assert sum(q.lag for q in progress) == 10_000 - sum(range(1, 9))
        some_id, (m, r) = next(iter(sent.items()))
        assert admin.query_message(r.offset_msg_id).body == m.body
        assert admin.query_message(some_id, topic="Big").body == m.body


def test_killed_broker_is_routed_around_and_pulls_fail_fast(cluster_factory) -> None:
    cluster = cluster_factory(broker_groups=2, slaves_per_group=0)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("K", queue_nums=2)
    with Producer("pg", cluster.namesrv_addr) as p, PullConsumer("cg", cluster.namesrv_addr) as c:
        for i in range(8):
            p.send(Message("K", b"%d" % i))
        mqs = c.fetch_subscribe_message_queues("K")
        cluster.broker("broker-b", 0).kill()
        t = time.monotonic()
        brokers = {p.send(Message("K", b"after%d" % i)).message_queue.broker_name for i in range(20)}
        assert brokers == {"broker-a"}
        assert time.monotonic() - t < 10
        dead = next(mq for mq in mqs if mq.broker_name == "broker-b")
        t = time.monotonic()
        with pytest.raises(TransportError) as ei:
            c.pull(dead, 0)
        assert ei.value.retriable and "broker-b" in str(ei.value)
        assert time.monotonic() - t < 5
        live = next(mq for mq in mqs if mq.broker_name == "broker-a")
        assert c.pull(live, 0).pull_status is PullStatus.FOUND


def test_nameservers_down_cached_routes_keep_working(cluster_factory) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0, nameservers=2)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("N", queue_nums=2)
    with Producer("pg", cluster.namesrv_addr) as p, PullConsumer("cg", cluster.namesrv_addr) as c:
        r0 = p.send(Message("N", b"before"))
        mqs = c.fetch_subscribe_message_queues("N")
        for ns in cluster.nameserver_handles:
            ns.kill()
        assert p.client.update_topic_route_from_nameserver("N") is False
        r1 = p.send(Message("N", b"after"))
        assert r1.send_status is SendStatus.SEND_OK
        bodies = [m.body for mq in mqs for m in drain(c, mq)]
        assert sorted(bodies) == [b"after", b"before"]
        assert r0.msg_id != r1.msg_id
