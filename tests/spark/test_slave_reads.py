"""``pullFrom=slave`` against a broker group whose slave does not serve reads fails at planning, naming the key.

The check runs on the driver when a batch read or a stream's first micro-batch is planned, so these tests call
the readers' ``partitions`` directly against a real cluster: no JVM is needed to see the planning fail (and the
same planning succeed when slave reads are on).
"""

from __future__ import annotations

import pytest

from client import Admin, Message, Producer
from client.cluster import LocalCluster
from spark_connector.options import parse_source_options
from spark_connector.slave_reads import SlaveReadsOffError
from spark_connector.source import RocketMQBatchReader, RocketMQStreamReader

pytestmark = pytest.mark.integration


def _cluster(cluster_factory, reads: str) -> LocalCluster:
    cluster = cluster_factory(broker_groups=2, slaves_per_group=1,
                              broker_config={"slaveReadEnable": reads, "messageIndexEnable": "false"})
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("SlaveReads", queue_nums=2)
    with Producer("p", cluster.namesrv_addr) as p:
        p.send_batch([Message("SlaveReads", b"m%d" % i) for i in range(8)])
    return cluster


def _options(cluster: LocalCluster, *, streaming: bool, pull_from: str = "slave"):
    return parse_source_options({"nameserver": cluster.namesrv_addr, "topic": "SlaveReads", "pullFrom": pull_from},
                                streaming=streaming)


def test_pull_from_slave_fails_at_planning_when_slave_reads_are_off(cluster_factory) -> None:
    cluster = _cluster(cluster_factory, "false")
    with pytest.raises(SlaveReadsOffError) as info:
        RocketMQBatchReader(_options(cluster, streaming=False)).partitions()
    text = str(info.value)
    assert "slaveReadEnable=true" in text and "broker-a[1]" in text and "broker-b[1]" in text, text
    assert "pullFrom" in text

    stream = RocketMQStreamReader(_options(cluster, streaming=True))
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    with pytest.raises(SlaveReadsOffError, match="slaveReadEnable=true"):
        stream.partitions(start, end)

    # pullFrom=auto on the same cluster plans as before: the master serves, as the broker settings say.
    assert RocketMQBatchReader(_options(cluster, streaming=False, pull_from="auto")).partitions()


def test_pull_from_slave_plans_when_slave_reads_are_on(cluster_factory) -> None:
    cluster = _cluster(cluster_factory, "true")
    parts = RocketMQBatchReader(_options(cluster, streaming=False)).partitions()
    assert sum(p.value.end - p.value.start for p in parts) == 8
    stream = RocketMQStreamReader(_options(cluster, streaming=True))
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    assert stream.partitions(start, end) == []  # startingOffsets=latest: nothing to read, and no error
