"""Message queries on the master and on the slave, and tag filtering end to end, against real servers.

* every message is found by key (``Admin.query_messages_by_key``), by offset msgId and by unique key
  (``Admin.query_message``) on the master (``broker_id=0``) and on the slave (``broker_id=1``), and -- with the
  master killed -- without naming a member (the queries fall back to the slave);
* subscriptions ``A``, ``A || C`` and ``*`` return exactly the matching messages through PullConsumer and
  GroupConsumer; ``Aa`` and ``BB`` share a Java hash code, so the broker's hash filter lets both through and the
  client's re-check keeps only ``Aa``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

from client import Admin, Message, Producer, PullConsumer, PullStatus
from client._group_consumer import GroupConsumer
from client.cluster import LocalCluster
from client.errors import InvalidParameterError, QueryNotFoundError
from common.codec import java_hash
from common.message import MessageQueue
from tests.waiting import poll_until

pytestmark = pytest.mark.integration


def test_every_message_is_found_by_key_and_both_ids_on_master_and_slave(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=1)
    topic = "QueryBoth"
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=2)
    with Producer("p_query", cluster.namesrv_addr) as p:
        sent = [(f"key-{i}", f"body {i}".encode(), p.send(Message(topic, f"body {i}".encode(), keys=f"key-{i}")))
                for i in range(12)]
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    with Admin(cluster.namesrv_addr) as admin:
        with pytest.raises(InvalidParameterError, match="broker_id"):
            admin.query_messages_by_key(topic, "key-0", broker_id=-1)
        for broker_id in (0, 1):
            for key, body, r in sent:
                where = f"{key} on broker id {broker_id}"
                # The slave indexes keys as it dispatches what it replicated, a moment past the catch-up.
                by_key = poll_until(partial(admin.query_messages_by_key, topic, key, broker_id=broker_id), 5,
                                    f"{where}: found by key")
                assert [m.body for m in by_key] == [body], where
                assert admin.query_message(r.offset_msg_id, broker_id=broker_id).body == body, where
                by_uniq = admin.query_message(r.msg_id, topic=topic, broker_id=broker_id)
                assert (by_uniq.body, by_uniq.msg_id) == (body, r.msg_id), where
        with pytest.raises(QueryNotFoundError):
            admin.query_message("0123456789ABCDEF0123456789ABCDEF", topic=topic, broker_id=1)
        cluster.kill_master("broker-a")
        for key, body, r in sent[::3]:
            assert [m.body for m in admin.query_messages_by_key(topic, key)] == [body], f"{key} with master down"
            assert admin.query_message(r.offset_msg_id).body == body
            assert admin.query_message(r.msg_id, topic=topic).body == body


TAGS = ["A", "B", "C", "Aa", "BB"]


def test_tag_filters_return_exactly_the_matching_messages(cluster_factory: Callable[..., LocalCluster]) -> None:
    assert java_hash("Aa") == java_hash("BB")  # the collision the re-check must resolve
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0)
    topic = "TagFilter"
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=2)
    with Producer("p_tags", cluster.namesrv_addr) as p:
        for i in range(40):
            tag = TAGS[i % len(TAGS)]
            p.send(Message(topic, f"{tag}:{i}".encode(), tags=tag))
    want = {tag: {f"{tag}:{i}".encode() for i in range(40) if TAGS[i % len(TAGS)] == tag} for tag in TAGS}

    def expected(*tags: str) -> set[bytes]:
        return set().union(*(want[t] for t in tags))

    with PullConsumer("g_tags_pull", cluster.namesrv_addr) as pc:
        queues = pc.fetch_subscribe_message_queues(topic)
        ends = {mq: pc.max_offset(mq) for mq in queues}
        for expr, tags in (("A", ["A"]), ("A || C", ["A", "C"]), ("*", TAGS)):
            assert _pull_all(pc, queues, expr) == expected(*tags), expr
        # The broker filters on the tag hash, so "Aa" lets the colliding "BB" through; the pull re-checks the tag.
        assert _pull_all(pc, queues, "Aa") == expected("Aa")
        assert _pull_all(pc, queues, "BB || C") == expected("BB", "C")
    for expr, tags in (("A", ["A"]), ("A || C", ["A", "C"]), ("*", TAGS), ("Aa", ["Aa"]), ("BB || C", ["BB", "C"])):
        group = "g_tags_" + "".join(c for c in expr if c.isalnum()) + "_x"
        with GroupConsumer(group, cluster.namesrv_addr, consume_from_where="FIRST_OFFSET",
                           rebalance_interval_s=1.0, pull_suspend_s=0.5) as gc:
            gc.subscribe(topic, expr)
            got = _consume_through(gc, ends)
        assert sorted(got) == sorted(expected(*tags)), expr


def _pull_all(pc: PullConsumer, queues: list[MessageQueue], expr: str) -> set[bytes]:
    out: list[bytes] = []
    for mq in queues:
        offset = 0
        while True:
            r = pc.pull(mq, offset, 32, expr)
            out.extend(m.body for m in r.msg_found_list)
            if r.pull_status is not PullStatus.FOUND and r.next_begin_offset == offset:
                break
            offset = r.next_begin_offset
    assert len(out) == len(set(out)), f"duplicates for {expr!r}"
    return set(out)


def _consume_through(gc: GroupConsumer, ends: dict[MessageQueue, int], timeout_s: float = 15.0) -> list[bytes]:
    """Everything ``gc`` hands out until it has pulled every queue through ``ends``: a wrong message (one the
    filter should have dropped) would be among them, wherever it sits in its queue."""
    got: list[bytes] = []
    core = gc._engine.core

    def pulled_through() -> bool:
        got.extend(m.body for m in gc.poll(0.1))
        with core.lock:
            at = {mq: pq.next_pull_offset for mq, pq in core.pqs.items()}
        return all(at.get(mq, -1) >= end for mq, end in ends.items())

    poll_until(pulled_through, timeout_s, f"{gc.group} pulling every queue through its end {ends}")
    while batch := gc.poll(0):  # pulled means cached: nothing more can come
        got.extend(m.body for m in batch)
    return got
