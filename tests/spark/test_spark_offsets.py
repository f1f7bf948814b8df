"""Offsets that cannot lie (issue 36 point 1), in a real Spark session against real clusters: a streaming
checkpoint from another cluster, a checkpoint beyond a queue's end, offsets that expired, a queue that vanished,
and batch ranges outside a queue. Each fails with ``failOnDataLoss=true`` (the default) in one line naming the
queue, the offsets and the option, and goes on from the earliest offset still there with ``false``.

The module's cluster (one group with a slave) keeps small commit-log files that expire at once but are only
deleted when a test asks (``Admin.clean_expired_files``), and refuses SQL92 (``enablePropertyFilter=false``,
RocketMQ's default), so a pushed-down filter has to fall back.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Admin, Message, MessageQueue, Producer
from client.cluster import LocalCluster
from tests.waiting import poll_until

pytestmark = [pytest.mark.spark, pytest.mark.integration]

#: Files expire 0.72 s after their last write; only an operator's clean deletes them (see tests/ha).
RETENTION = {"fileReservedTime": "0.0002", "cleanResourceInterval": "60000", "diskMaxUsedSpaceRatio": "95",
             "diskSpaceCleanForciblyRatio": "97", "slaveMetadataSyncInterval": "300"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("loss"), broker_groups=1, slaves_per_group=1, broker_config=RETENTION,
                      commitlog_file_size_bytes=64 * 1024) as c:
        yield c


def _topic(ns: str, topic: str, queues: int) -> None:
    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=queues)


def _produce(ns: str, topic: str, per_queue: dict[int, int], *, body: bytes = b"m", first: int = 0) -> None:
    with Producer("loss-producer", ns) as p:
        for qid, n in per_queue.items():
            for i in range(first, first + n, 100):
                p.send_batch([Message(topic, body + b"/%d/%d" % (qid, j)) for j in range(i, min(first + n, i + 100))],
                             MessageQueue(topic, "broker-a", qid))


def _stream(spark: Any, ns: str, topic: str, ckpt: Path, **options: str) -> tuple[int, BaseException | None]:
    """An availableNow query from ``ckpt``: (rows read, the error it ended with)."""
    seen: list[int] = []
    reader = (spark.readStream.format("rocketmq").option("nameserver", ns).option("topic", topic)
              .option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.foreachBatch(lambda df, _i: seen.append(df.count()))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    except Exception as e:  # the StreamingQueryException the user sees
        return sum(seen), e
    assert not q.isActive, "the availableNow query did not finish within 120 s"
    return sum(seen), None


def _loss_line(e: BaseException | None) -> str:
    """The first line of a failed query, checked to hold the connector's one-line DataLossError."""
    assert e is not None, "the query should have failed"
    text = str(e)
    first = text.splitlines()[0]
    assert "spark_connector.errors.DataLossError: " in first and "Traceback" not in text, text[:3000]
    return first.split("spark_connector.errors.DataLossError: ", 1)[1]


def _strip_identities(ckpt: Path, into: Path) -> None:
    """A copy of ``ckpt`` as a connector without group identities wrote it (an older checkpoint)."""
    shutil.copytree(ckpt, into)
    for f in (into / "offsets").iterdir():
        if f.name.isdigit():
            lines = f.read_text().split("\n")
            lines[2] = json.dumps({k: v for k, v in json.loads(lines[2]).items() if k != "@groups"})
            f.write_text("\n".join(lines))
            crc = f.with_name(f".{f.name}.crc")
            crc.unlink(missing_ok=True)


def test_a_checkpoint_of_another_cluster_fails_and_lenient_goes_on(
        spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    topic = "LossForeign"
    _topic(cluster.namesrv_addr, topic, 2)
    _produce(cluster.namesrv_addr, topic, {0: 12, 1: 20})
    ckpt = tmp_path / "ckpt"
    assert _stream(spark, cluster.namesrv_addr, topic, ckpt) == (32, None)
    old = tmp_path / "old-format"
    _strip_identities(ckpt, old)
    # the example's story: the same checkpoint meets a fresh cluster that reuses the group and topic names
    with LocalCluster(tmp_path / "fresh", broker_groups=1, slaves_per_group=0) as fresh:
        ns = fresh.namesrv_addr
        _topic(ns, topic, 2)
        _produce(ns, topic, {0: 5, 1: 30})
        rows, error = _stream(spark, ns, topic, ckpt)
        line = _loss_line(error)
        assert rows == 0 and line.startswith(
            f"the checkpoint of this query does not fit topic {topic} any more: broker group broker-a holds another "
            f"store than the checkpoint's (group identity "), line
        assert f"its checkpointed offsets {topic}@broker-a:0=12, {topic}@broker-a:1=20 mean nothing there. " \
               "Set failOnDataLoss=false to go on from the earliest offsets still there" in line, line
        # a checkpoint without identities is checked by offsets: queue 0's 12 is beyond the fresh queue's 5
        rows, error = _stream(spark, ns, topic, old)
        line = _loss_line(error)
        assert f"{topic}@broker-a:0 is checkpointed at offset 12, beyond its max offset 5" in line, line
        assert "failOnDataLoss=false" in line
        assert _stream(spark, ns, topic, ckpt, failOnDataLoss="false") == (35, None)  # all of the fresh cluster's
        assert _stream(spark, ns, topic, ckpt) == (0, None)  # and the checkpoint belongs to it now


def _clean(cluster: LocalCluster) -> None:
    """Delete expired commit-log files of broker-a's members now, until each has deleted some: a member whose
    files expired later (the slave wrote them after the master) deletes in a later pass than the other."""
    deleted: dict[int, int] = {}
    with Admin(cluster.namesrv_addr) as admin:
        def every_member_deleted() -> dict[int, int] | None:
            for bid, r in admin.clean_expired_files("broker-a").items():
                deleted[bid] = deleted.get(bid, 0) + int(r.get("deletedFiles", 0))
            return deleted if deleted and all(deleted.values()) else None

        poll_until(every_member_deleted, 20, "both members deleting expired files", interval_s=0.3)


def test_offsets_that_expired_unread(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    ns, topic = cluster.namesrv_addr, "LossExpired"
    _topic(ns, topic, 1)
    _produce(ns, topic, {0: 10})
    ckpt = tmp_path / "ckpt"
    assert _stream(spark, ns, topic, ckpt) == (10, None)
    _produce(ns, topic, {0: 600}, body=b"y" * 400, first=10)  # about four 64 KiB files
    cluster.wait_slave_caught_up("broker-a", 30)
    _clean(cluster)
    with Admin(ns) as admin:
        low = admin.min_offset(MessageQueue(topic, "broker-a", 0))
    rows, error = _stream(spark, ns, topic, ckpt)
    line = _loss_line(error)
    assert rows == 0 and f"{topic}@broker-a:0 is checkpointed at offset 10, below its min offset " in line, line
    assert "(those messages expired unread). Set failOnDataLoss=false" in line
    min_offset = int(line.split("below its min offset ", 1)[1].split(" ", 1)[0])
    assert 10 < min_offset < 610 and low == min_offset
    assert _stream(spark, ns, topic, ckpt, failOnDataLoss="false") == (610 - min_offset, None)

    with pytest.raises(Exception) as e:  # the same rule for a batch range
        (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
         .option("startingOffsets", json.dumps({topic: {"broker-a": {"0": 3}}})).load().collect())
    first = str(e.value).splitlines()[0]
    assert (f"DataLossError: option startingOffsets: {topic}@broker-a:0 starts at 3, below its min offset "
            f"{min_offset} (expired). Set failOnDataLoss=false to start such queues at their earliest offset still "
            "there, or change startingOffsets") in first, str(e.value)[:2000]
    lenient = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
               .option("failOnDataLoss", "false").option("startingOffsets", json.dumps({topic: {"broker-a": {"0": 3}}}))
               .load().count())
    assert lenient == 610 - min_offset


def test_a_queue_that_vanished(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    ns, topic = cluster.namesrv_addr, "LossShrink"
    _topic(ns, topic, 4)
    _produce(ns, topic, {0: 3, 1: 3, 2: 4, 3: 5})
    ckpt = tmp_path / "ckpt"
    assert _stream(spark, ns, topic, ckpt) == (15, None)
    _topic(ns, topic, 2)  # its read queues shrink to 2: queues 2 and 3 leave the route
    _produce(ns, topic, {0: 2}, first=50)
    rows, error = _stream(spark, ns, topic, ckpt)
    assert rows == 0
    line = _loss_line(error)
    assert f"{topic}@broker-a:2 (checkpointed at 4) is no longer in the route; {topic}@broker-a:3 (checkpointed " \
           "at 5) is no longer in the route. Set failOnDataLoss=false" in line, line
    assert _stream(spark, ns, topic, ckpt, failOnDataLoss="false") == (2, None)


def test_batch_ranges_beyond_a_queue(spark: Any, cluster: LocalCluster) -> None:
    ns, topic = cluster.namesrv_addr, "LossBatch"
    _topic(ns, topic, 1)
    _produce(ns, topic, {0: 8})
    for option, value, says in (("startingOffsets", 9, "starts at 9, beyond its max offset 8"),
                                ("endingOffsets", 20, "ends at 20, beyond its max offset 8")):
        spec = json.dumps({topic: {"broker-a": {"0": value}}})
        with pytest.raises(Exception) as e:
            spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic).option(option, spec) \
                .load().collect()
        assert f"DataLossError: option {option}: {topic}@broker-a:0 {says}. Set failOnDataLoss=false" in \
            str(e.value).splitlines()[0], str(e.value)[:2000]
    lenient = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
               .option("failOnDataLoss", "false").option("endingOffsets", json.dumps({topic: {"broker-a": {"0": 20}}}))
               .load().count())
    assert lenient == 8


def test_a_pushed_sql92_filter_falls_back_where_brokers_refuse_it(spark: Any, cluster: LocalCluster) -> None:
    ns, topic = cluster.namesrv_addr, "LossNoSql"
    _topic(ns, topic, 1)
    with Producer("loss-producer", ns) as p:
        p.send_batch([Message(topic, b"k%d" % i, keys=f"k{i % 5}") for i in range(40)], MessageQueue(topic, "broker-a", 0))
    rows = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic).load()
            .where("keys IN ('k1', 'k3')").collect())
    assert sorted(r.queueOffset for r in rows) == [i for i in range(40) if i % 5 in (1, 3)]
