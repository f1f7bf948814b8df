"""Slave metadata sync against real processes (docs/BEHAVIOUR.md 5, decision 7): topics, subscription groups and consumer
offsets created on the master reach the slave within one ``slaveMetadataSyncInterval`` plus a margin, and the
slave keeps them across a crash-restart while its master is away."""

from __future__ import annotations

import time

import pytest

from client import Admin, MessageQueue, PullConsumer
from tests.ha.support import get_json, ha_cluster, poll_until

pytestmark = [pytest.mark.integration, pytest.mark.ha]

PERIOD_S = 1.0
MARGIN_S = 1.5


def slave_view(addr: str) -> tuple[dict, dict, dict]:
    return (get_json(addr, "/topics")["topicConfigTable"], get_json(addr, "/subscription-groups")[
        "subscriptionGroupTable"], get_json(addr, "/offsets")["offsetTable"])


def has_all(addr: str) -> bool:
    topics, groups, offsets = slave_view(addr)
    t, g = topics.get("Meta", {}), groups.get("mg", {})
    return (t.get("readQueueNums"), g.get("brokerId"), g.get("retryMaxTimes"), offsets.get("Meta@mg")) == (
        3, 1, 5, {"0": 7, "2": 9})


def test_topic_group_and_offsets_reach_the_slave_and_survive_its_restart(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1,
                         config={"slaveMetadataSyncInterval": str(int(PERIOD_S * 1000))})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    assert not has_all(slave.addr)
    t0 = time.monotonic()
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("Meta", queue_nums=3)
        admin.update_subscription_group("mg", broker_id=1, retry_max_times=5)
    with PullConsumer("mg", cluster.namesrv_addr) as c:
        c.update_consume_offset(MessageQueue("Meta", "broker-a", 0), 7)
        c.update_consume_offset(MessageQueue("Meta", "broker-a", 2), 9)
    created = time.monotonic()
    poll_until(lambda: has_all(slave.addr), PERIOD_S + MARGIN_S + (created - t0), "metadata on the slave")
    took = time.monotonic() - created
    print(f"\nmetadata on the slave {took * 1000:.0f} ms after the last item was created (period {PERIOD_S} s)")
    assert took <= PERIOD_S + MARGIN_S
    master.stop()  # nothing can re-sync the slave from here on
    slave.kill()
    slave.start()
    assert has_all(slave.addr), slave_view(slave.addr)
