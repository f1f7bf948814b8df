"""Retention on real broker processes (issue 13): an operator's clean on master and slave, consumers below the
new minimum moved to it, the figures in /metrics and /runtime, and a slave that was away while its master deleted
the files it needed catching up from the master's oldest file."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from client import Admin, GroupConsumer, MessageQueue, PullConsumer, PullStatus
from client.cluster import LocalCluster
from tests.ha.support import (
    commitlog_files,
    create_topic,
    ha_cluster,
    max_offset,
    poll_until,
    produce,
    wait_slave_linked,
)

pytestmark = [pytest.mark.integration, pytest.mark.ha]

FILE_SIZE = 64 * 1024
#: Files expire 0.72 s after their last write; deleteWhen is an hour that never comes during a test (the
#: cleaner's own passes wait a minute) and the disk-usage trigger is raised from 75 % to 95 % of the real
#: partition (a test machine's disk may well be 75 % full: each broker's first pass, at start, then deleted
#: every expired file on its own), so only the operator's request deletes.
RETENTION = {"fileReservedTime": "0.0002", "cleanResourceInterval": "60000", "messageIndexEnable": "true",
             "maxHashSlotNum": "1000", "maxIndexNum": "4000", "diskMaxUsedSpaceRatio": "95",
             "diskSpaceCleanForciblyRatio": "97"}


def clean_until_deleted(admin: Admin, broker_id: int = 0) -> dict[int, dict[str, object]]:
    """Ask for a clean until member ``broker_id`` deleted something (files need 0.72 s to expire)."""
    def attempt() -> dict[int, dict[str, object]] | None:
        reports = admin.clean_expired_files("broker-a")
        return reports if int(reports[broker_id].get("deletedFiles", 0)) > 0 else None  # type: ignore[call-overload]
    return poll_until(attempt, 15.0, f"broker-a[{broker_id}] deleting expired files", interval_s=0.2)


def metric(addr: str, name: str) -> float:
    text = httpx.get(f"http://{addr}/metrics", timeout=5.0).text
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m is not None, f"{name} not in /metrics of {addr}"
    return float(m.group(1))


def test_clean_moves_min_offsets_and_consumers_follow(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, commitlog_file_size_bytes=FILE_SIZE, config=RETENTION)
    create_topic(cluster, "Ret", queue_nums=1)
    ns = cluster.namesrv_addr
    produce(ns, "Ret", 400)  # ~7 files of 64 KiB
    mq = MessageQueue("Ret", "broker-a", 0)
    with PullConsumer("lagging", ns) as pc:
        pc.update_consume_offset(mq, 10)
    wait_slave_linked(cluster)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    files_before = len(commitlog_files(master))
    with Admin(ns) as admin:
        reports = clean_until_deleted(admin)
        rep = reports[0]
        new_min = admin.min_offset(mq)
        assert new_min > 10
        assert rep["minOffset"] == master.runtime()["commitLogMinOffset"] > 0
        assert rep["lostMessages"] == {"lagging": new_min - 10}
        assert len(commitlog_files(master)) < files_before
        # the slave applies the same retention to its own copy (and the master may delete one more file)
        reports = clean_until_deleted(admin, broker_id=1)
        assert int(slave.runtime()["commitLogMinOffset"]) > 0
        new_min = admin.min_offset(mq)
        # min offsets, metrics and runtime show it at once
        assert metric(master.addr, "splitmq_commitlog_min_offset") == master.runtime()["commitLogMinOffset"]
        assert metric(master.addr, "splitmq_retention_files_deleted_total") >= 1
        assert metric(master.addr, "splitmq_store_writeable") == 1
        assert 0 < metric(master.addr, "splitmq_disk_used_ratio") < 1
        rt = master.runtime()
        assert rt["storeWriteable"] is True and rt["retentionFilesDeleted"] >= 1
        # a key query of a deleted message finds nothing, not an error; a kept one is found
        assert admin.query_messages_by_key("Ret", "k0") == []
        assert len(admin.query_messages_by_key("Ret", "k399")) == 1
    with PullConsumer("reader", ns) as pc:
        r = pc.pull(mq, 0, 32)
        assert (r.pull_status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, new_min)
        assert pc.pull(mq, new_min, 32).pull_status is PullStatus.FOUND
    # a group consumer whose committed offset was deleted jumps to the new min and reads the rest exactly once
    with GroupConsumer("lagging", ns) as gc:
        gc.subscribe("Ret")
        got: list[int] = []
        deadline_reads = 400 - new_min

        def read() -> bool | None:
            got.extend(m.queue_offset for m in gc.poll(timeout_s=0.5))
            return True if len(got) >= deadline_reads else None

        poll_until(read, 20.0, "the group consumer reading from the new min")
        assert sorted(got) == list(range(new_min, 400)), (got[:5], new_min)


def test_a_slave_away_while_its_files_were_deleted_catches_up_from_the_oldest_file(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    """The slave drops its log to follow the master only because the master is authenticated (haAuthSecret):
    from an unauthenticated one it refuses (issue 39; tests/broker/ha/test_no_log_drop_on_one_frame.py)."""
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, commitlog_file_size_bytes=FILE_SIZE,
                         config={**RETENTION, "haAuthSecret": "a cluster secret of some length"})
    create_topic(cluster, "Away", queue_nums=1)
    ns = cluster.namesrv_addr
    produce(ns, "Away", 100)
    wait_slave_linked(cluster)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    slave.stop()
    slave_end = max_offset(master)
    produce(ns, "Away", 500, start=100)
    with Admin(ns) as admin:
        poll_until(lambda: (admin.clean_expired_files("broker-a") and
                            int(master.runtime()["commitLogMinOffset"]) > slave_end) or None,
                   15.0, "the master deleting past the slave's end")
    slave.start()
    wait_slave_linked(cluster)

    oldest = int(master.runtime()["commitLogMinOffset"])
    poll_until(lambda: int(slave.runtime()["commitLogMinOffset"]) == oldest or None, 20.0,
               "the slave restarting its log at the master's oldest file")
    assert int(master.runtime()["commitLogMinOffset"]) == oldest  # nothing deleted meanwhile
    assert max_offset(slave) == max_offset(master)
    mq = MessageQueue("Away", "broker-a", 0)
    with Admin(ns) as admin:
        master_min, master_max = admin.min_offset(mq), admin.max_offset(mq)
    assert master_min > 0

    def slave_offset(kind: str) -> int:
        r = httpx.get(f"http://{slave.addr}/offset/{kind}", params={"topic": "Away", "queueId": 0}, timeout=5.0)
        return int(r.json()["offset"])

    # the slave's queue holds what the master still has, from the same min offset to the same max
    poll_until(lambda: slave_offset("max") == master_max or None, 10.0, "the slave dispatching the new bytes")
    assert slave_offset("min") == master_min
    with PullConsumer("from-slave", ns) as pc:
        r = pc.pull(mq, master_min, 32)
        assert r.pull_status is PullStatus.FOUND and r.msg_found_list[0].queue_offset == master_min
