"""SQL92 subscriptions served by a slave (read/write splitting): a real master + slave with ``slaveReadEnable``,
a consumer pinned to the slave gets exactly the messages whose properties match, and a consumer group with an
SQL92 subscription consumes exactly those too."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from client import (
    AsyncGroupConsumer,
    ConsumeFromWhere,
    ConsumeStatus,
    GroupConsumer,
    Message,
    MessageExt,
    MessageQueue,
    MessageSelector,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
)
from client.errors import BrokerError, NoPermissionError
from client.lowlevel import BrokerClient
from common.sql92 import MAX_SQL_LENGTH
from tests.ha.support import create_topic, get_json, ha_cluster, poll_until, wait_slave_linked

pytestmark = [pytest.mark.integration, pytest.mark.ha]

TOPIC = "SqlSplit"
N = 120
EXPR = "region = 'EU' AND amount > 100"


def props(i: int) -> dict[str, str]:
    region = ("EU", "US", "")[i % 3]
    return ({"region": region} if region else {}) | {"amount": str(i * 3)}


def expected() -> set[bytes]:
    return {b"m%d" % i for i in range(N) if props(i).get("region") == "EU" and i * 3 > 100}


def test_sql_subscription_read_from_the_slave(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, config={"slaveReadEnable": "true"}, broker_groups=1, slaves_per_group=1)
    create_topic(cluster, TOPIC, queue_nums=2)
    with Producer("sql-pg", cluster.namesrv_addr) as p:
        p.send_batch([Message(TOPIC, b"m%d" % i, tags="T", properties=props(i)) for i in range(N)])
    wait_slave_linked(cluster)
    slave = cluster.broker("broker-a", 1)

    def on_slave() -> bool:
        synced = TOPIC in str(get_json(slave.addr, "/topics"))  # its topic table, copied from the master
        return synced and sum(get_json(slave.addr, "/offset/max", topic=TOPIC, queueId=q)["offset"]
                              for q in (0, 1)) == N

    poll_until(on_slave, 15, f"{TOPIC} and its {N} messages on the slave")

    got: list[bytes] = []
    with PullConsumer("sql-slave-reader", cluster.namesrv_addr, connect_broker_by_user=True,
                      default_broker_id=1) as c:
        for mq in c.fetch_subscribe_message_queues(TOPIC):
            offset = 0
            for _ in range(N):  # bounded: each pull moves the offset or ends the queue
                r = c.pull(mq, offset, max_nums=8, sub_expression=MessageSelector.sql(EXPR))
                if r.pull_status is PullStatus.NO_NEW_MSG:
                    break
                if r.pull_status is PullStatus.FOUND:
                    assert r.served_by_broker_id == 1, r
                    got += [m.body for m in r.msg_found_list]
                assert r.next_begin_offset > offset, r
                offset = r.next_begin_offset
    assert sorted(got) == sorted(expected())
    assert len(got) == len(set(got))

    # An expression near MAX_SQL_LENGTH travels in the query string and is served too.
    long_expr = (EXPR + " AND (" + " OR ".join(f"amount = {i * 3}" for i in range(0, N, 2)) + ")"
                 + " AND region <> '" + "é%&?" * 600 + "'")
    assert 2000 < len(long_expr) < MAX_SQL_LENGTH
    with PullConsumer("sql-slave-long", cluster.namesrv_addr, connect_broker_by_user=True, default_broker_id=1) as c:
        found: list[bytes] = []
        for mq in c.fetch_subscribe_message_queues(TOPIC):
            r = c.pull(mq, 0, max_nums=N, sub_expression=MessageSelector.sql(long_expr))
            assert r.served_by_broker_id == 1
            found += [m.body for m in r.msg_found_list]
    assert sorted(found) == sorted(b for b in expected() if int(b[1:]) % 2 == 0)

    # A bad expression that skipped the SDK's check is refused by the slave itself.
    with BrokerClient(cluster.namesrv_addr) as raw:
        with pytest.raises(BrokerError) as info:
            raw.pull_raw_from(slave.addr, MessageQueue(TOPIC, "broker-a", 0), 0, group="sql-raw",
                              sub_expression=MessageSelector("amount > 'x'", "SQL92"))
        assert info.value.code == 23 and "cannot be compared" in str(info.value)

    # A consumer group with an SQL92 subscription consumes exactly the matching messages.
    seen: set[bytes] = set()
    with GroupConsumer("sql-group", cluster.namesrv_addr, consume_from_where=ConsumeFromWhere.FIRST_OFFSET) as g:
        g.subscribe(TOPIC, MessageSelector.sql(EXPR))

        def consumed() -> bool:
            seen.update(m.body for m in g.poll(timeout_s=0.2))
            return seen >= expected()

        poll_until(consumed, 30, "the group consumed every matching message")
    assert seen == expected()

    # The push consumer and the asyncio group consumer take the same selector.
    pushed: set[bytes] = set()
    lock = threading.Lock()

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            pushed.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    push = PushConsumer("sql-push", cluster.namesrv_addr, on_messages, consume_from_where="FIRST_OFFSET",
                        pull_suspend_s=0.5)
    push.subscribe(TOPIC, MessageSelector.sql(EXPR))
    with push:
        poll_until(lambda: pushed >= expected(), 30, "the push consumer consumed every matching message")
    assert pushed == expected()

    async def consume_async() -> set[bytes]:
        got: set[bytes] = set()
        a = AsyncGroupConsumer("sql-async", cluster.namesrv_addr, consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                               rebalance_interval_s=0.5)  # its first round misses its own heartbeat (routes unknown)
        a.subscribe(TOPIC, MessageSelector.sql(EXPR))
        async with a:
            deadline = asyncio.get_running_loop().time() + 30
            while got < expected() and asyncio.get_running_loop().time() < deadline:
                got.update(m.body for m in await a.poll(timeout_s=0.2))
        return got

    assert asyncio.run(consume_async()) == expected()


def test_a_broker_with_the_filter_off_refuses_sql_subscriptions(cluster_factory,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    cluster = ha_cluster(cluster_factory, config={"enablePropertyFilter": "false"}, broker_groups=1,
                         slaves_per_group=0)
    create_topic(cluster, TOPIC, queue_nums=1)
    with Producer("sql-pg", cluster.namesrv_addr) as p:
        p.send(Message(TOPIC, b"m0", properties={"region": "EU"}))
    mq = MessageQueue(TOPIC, "broker-a", 0)
    with PullConsumer("sql-off", cluster.namesrv_addr) as c:
        with pytest.raises(NoPermissionError, match="enablePropertyFilter=false"):
            c.pull(mq, 0, sub_expression=MessageSelector.sql("region = 'EU'"))
        assert c.pull(mq, 0, sub_expression="*").pull_status is PullStatus.FOUND  # TAG pulls are served
    # A consumer group hears it from its heartbeat (and from every pull), rather than consuming nothing quietly.
    caplog.set_level(logging.WARNING, logger="client._requests")
    with GroupConsumer("sql-off-group", cluster.namesrv_addr, heartbeat_interval_s=0.2) as g:
        g.subscribe(TOPIC, MessageSelector.sql("region = 'EU'"))

        def warned() -> bool:
            g.poll(timeout_s=0.05)
            return any("enablePropertyFilter=false" in r.getMessage() for r in caplog.records)

        poll_until(warned, 15, "a warning naming enablePropertyFilter")
