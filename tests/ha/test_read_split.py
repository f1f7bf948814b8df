"""Read/write splitting against real brokers: every row of docs/BEHAVIOUR.md 3.2.1 and decision 6.

``accessMessageInMemoryMaxRatio=0`` makes every found message "cold" (``suggestPullingFromSlave``); the default
40 % of RAM makes none cold with these small stores. After every pull the consumer stores the suggestion
(``pull_from_which_node_table``) and its next pull of that queue goes to the suggested member
(``served_by_broker_id``).

| serving | slaveReadEnable | slow | suggest (checked in)                                            |
|---------|-----------------|------|-----------------------------------------------------------------|
| master  | false           | any  | 0 (test_slave_read_disabled...)                                 |
| master  | true            | no   | group brokerId (test_slave_read_enabled_fast...)                |
| master  | true            | yes  | group whichBrokerWhenConsumeSlowly (test_slave_read_enabled_slow...) |
| slave   | false           | any  | 0, and no messages while the master link is up (decision 6)     |
| slave   | true            | no   | group brokerId (test_slave_read_enabled_fast...)                |
| slave   | true            | yes  | group whichBrokerWhenConsumeSlowly (test_slave_read_enabled_slow...) |

The slave with ``slaveReadEnable=false`` serving while its master is down is in test_failover.py.
"""

from __future__ import annotations

import functools

import pytest

from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullResult, PullStatus
from client.cluster import LocalCluster
from tests.ha.support import create_topic, get_json, ha_cluster, poll_until, wait_slave_linked

pytestmark = [pytest.mark.integration, pytest.mark.ha]

N = 240
TOPIC = "Split"


def fill(cluster: LocalCluster) -> None:
    """``N`` messages in the one queue of ``TOPIC``, replicated and dispatched on every slave."""
    create_topic(cluster, TOPIC, queue_nums=1)
    with Producer("pg", cluster.namesrv_addr) as p:
        for start in range(0, N, 80):
            p.send_batch([Message(TOPIC, b"%d" % (start + i)) for i in range(80)])
    wait_slave_linked(cluster)

    def dispatched(addr: str) -> bool:
        return bool(get_json(addr, "/offset/max", topic=TOPIC, queueId=0)["offset"] == N)

    for b in cluster.brokers:
        poll_until(functools.partial(dispatched, b.addr), 10, f"{b} dispatched {N} messages")


def set_group(cluster: LocalCluster, group: str, *, broker_id: int = 0, slowly: int = 1) -> None:
    """Update the group on the master and wait until every slave has synced it."""
    with Admin(cluster.namesrv_addr) as admin:
        admin.update_subscription_group(group, broker_id=broker_id, which_broker_when_consume_slowly=slowly)
    want = {"brokerId": broker_id, "whichBrokerWhenConsumeSlowly": slowly}

    def synced(addr: str) -> bool:
        cfg = get_json(addr, "/subscription-groups")["subscriptionGroupTable"].get(group, {})
        return all(cfg.get(k) == v for k, v in want.items())

    for b in cluster.brokers:
        poll_until(functools.partial(synced, b.addr), 10, f"group {group} {want} on {b}")


def step(c: PullConsumer, mq: MessageQueue, offset: int, served: int, suggest: int,
         status: PullStatus = PullStatus.FOUND) -> PullResult:
    r = c.pull(mq, offset, max_nums=32)
    got = (r.pull_status, r.served_by_broker_id, r.suggest_which_broker_id, c.pull_from_which_node_table[mq])
    assert got == (status, served, suggest, suggest), (offset, r)
    if status is PullStatus.FOUND:
        assert [m.queue_offset for m in r.msg_found_list] == list(range(offset, r.next_begin_offset))
    return r


def test_slave_read_disabled_reads_stay_on_the_master(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1,
                         config={"slaveReadEnable": "false", "accessMessageInMemoryMaxRatio": "0"})
    fill(cluster)
    set_group(cluster, "cg", broker_id=1, slowly=1)  # would send readers to the slave if it were read-enabled
    with PullConsumer("cg", cluster.namesrv_addr) as c:
        mq = c.fetch_subscribe_message_queues(TOPIC)[0]
        offset = 0
        while offset < N:  # row master/false: suggest 0 on every pull, cold or not
            offset = step(c, mq, offset, served=0, suggest=0).next_begin_offset
        step(c, mq, N, served=0, suggest=0, status=PullStatus.NO_NEW_MSG)
    with PullConsumer("cg", cluster.namesrv_addr, connect_broker_by_user=True, default_broker_id=1) as pinned:
        mq = pinned.fetch_subscribe_message_queues(TOPIC)[0]
        # row slave/false, master link up: no messages, "retry at the master" (decision 6)
        r = step(pinned, mq, 0, served=1, suggest=0, status=PullStatus.NO_MATCHED_MSG)
        assert (r.msg_found_list, r.next_begin_offset) == ([], 0)


def test_slave_read_enabled_slow_consumer_goes_to_the_slave_and_back(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=2,
                         config={"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": "0"})
    fill(cluster)
    for group, slowly in (("cg1", 1), ("cg2", 2)):
        set_group(cluster, group, broker_id=0, slowly=slowly)
        with PullConsumer(group, cluster.namesrv_addr) as c:
            mq = c.fetch_subscribe_message_queues(TOPIC)[0]
            # row master/true/slow: whichBrokerWhenConsumeSlowly
            offset = step(c, mq, 0, served=0, suggest=slowly).next_begin_offset
            # row slave/true/slow: the next pull is on that slave, which keeps the reader there
            while offset < N:
                offset = step(c, mq, offset, served=slowly, suggest=slowly).next_begin_offset
            # caught up: nothing found, no "slow" hint -> the group's brokerId (the master)
            step(c, mq, N, served=slowly, suggest=0, status=PullStatus.NO_NEW_MSG)
            step(c, mq, N, served=0, suggest=0, status=PullStatus.NO_NEW_MSG)


def test_slave_read_enabled_fast_consumer_follows_the_groups_broker_id(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, config={"slaveReadEnable": "true"})
    fill(cluster)
    with PullConsumer("cg", cluster.namesrv_addr) as c:
        mq = c.fetch_subscribe_message_queues(TOPIC)[0]
        # row master/true/not slow: the group's brokerId (default 0) -> stays on the master
        offset = step(c, mq, 0, served=0, suggest=0).next_begin_offset
        offset = step(c, mq, offset, served=0, suggest=0).next_begin_offset
        set_group(cluster, "cg", broker_id=1)
        offset = step(c, mq, offset, served=0, suggest=1).next_begin_offset
        # row slave/true/not slow: the group's brokerId (1) -> stays on the slave
        offset = step(c, mq, offset, served=1, suggest=1).next_begin_offset
        set_group(cluster, "cg", broker_id=0)
        # ... brokerId 0 -> back to the master
        offset = step(c, mq, offset, served=1, suggest=0).next_begin_offset
        step(c, mq, offset, served=0, suggest=0)
