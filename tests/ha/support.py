"""Helpers for the HA / read-write-split acceptance tests: real clusters of processes (``LocalCluster``).

Every cluster here uses fast registration and metadata-sync periods, so that a restarted master is seen by its
slave and by clients within about a second; anything slower would make the kill loops take minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from client import Admin, Message, MessageExt, Producer
from client.cluster import BrokerHandle, LocalCluster
from common.codec import decode_records
from tests import waiting

T = TypeVar("T")

#: Broker settings every HA test cluster gets (tests add their own on top).
FAST: dict[str, str] = {
    "registerNameServerPeriod": "1000",
    "registerNameServerPeriodMinMs": "500",
    "slaveMetadataSyncInterval": "1000",
    "haSendHeartbeatInterval": "1000",
    "flushConsumerOffsetInterval": "500",
    # The index preallocates 400 MB per broker; no HA test queries by key, and CI disks are small.
    "messageIndexEnable": "false",
    # RocketMQ's broker default, which these tests were written against (LocalCluster turns slave reads on);
    # a test of the split sets it to true itself.
    "slaveReadEnable": "false",
}


#: Commit-log file size of the test clusters.
SMALL_FILES = 4 * 1024 * 1024


def produce(namesrv: str, topic: str, n: int, *, start: int = 0, body_bytes: int = 1000) -> None:
    """``n`` messages, 32 per ``send_batch``: message ``seq`` (from ``start``) has key ``k<seq>`` and a body of
    ``body_bytes`` bytes followed by its sequence number."""
    body = b"r" * body_bytes
    with Producer("pg", namesrv) as p:
        for at in range(start, start + n, 32):
            p.send_batch([Message(topic, body + b"%d" % j, keys=f"k{j}") for j in range(at, min(at + 32, start + n))])


def fast(**extra: str) -> dict[str, str]:
    """``FAST`` plus ``extra`` broker settings."""
    return {**FAST, **extra}


def poll_until(fn: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.02) -> T:
    """:func:`tests.waiting.poll_until` where a server not answering yet (HTTP or socket error, a missing key or a
    bad value in its answer) counts as "not yet"."""
    return waiting.poll_until(fn, timeout_s, what, interval_s=interval_s,
                              ignore=(httpx.HTTPError, OSError, KeyError, ValueError))


def get_json(addr: str, path: str, **params: Any) -> Any:
    r = httpx.get(f"http://{addr}{path}", params=params, timeout=5.0)
    r.raise_for_status()
    return r.json()


def ha_of(b: BrokerHandle) -> dict[str, Any]:
    """``GET /ha`` of one broker."""
    obj = get_json(b.addr, "/ha")
    assert isinstance(obj, dict)
    return obj


def max_offset(b: BrokerHandle) -> int:
    """The broker's commit-log max offset."""
    return int(b.runtime()["commitLogMaxOffset"])


def wait_slave_linked(cluster: LocalCluster, name: str = "broker-a", timeout_s: float = 15.0) -> None:
    """Until the master has as many HA connections as the group has running slaves, each acked to its max."""
    master = cluster.broker(name, 0)
    want = sum(1 for b in cluster.brokers if b.name == name and b.broker_id != 0 and b.running())

    def linked() -> bool:
        ha = ha_of(master)
        return ha["connectionCount"] == want and all(s["ackOffset"] >= ha["masterMaxOffset"] for s in ha["slaves"])

    poll_until(linked, timeout_s, f"{want} slave(s) of {name} connected and caught up")


def slave_record(slave: BrokerHandle, phy_offset: int) -> MessageExt | None:
    """The record at ``phy_offset`` in the slave's commit log, when the slave has all of its bytes."""
    r = httpx.get(f"http://{slave.addr}/message", params={"phyOffset": phy_offset}, timeout=5.0)
    if r.status_code != 200:
        return None
    msgs = decode_records(r.content, broker_name=slave.name)
    if not msgs or msgs[0].commit_log_offset != phy_offset:
        return None
    return msgs[0] if max_offset(slave) >= phy_offset + msgs[0].store_size else None


def commitlog_files(b: BrokerHandle) -> dict[int, Path]:
    """``{start offset: path}`` of the broker's commit-log files."""
    return {int(p.name): p for p in (b.store_dir / "commitlog").iterdir() if p.name.isdigit()}


def create_topic(cluster: LocalCluster, topic: str, queue_nums: int = 2, **kwargs: Any) -> None:
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queue_nums, **kwargs)


def ha_cluster(factory: Callable[..., LocalCluster], *, config: dict[str, str] | None = None,
               **kwargs: Any) -> LocalCluster:
    """A started cluster with the fast settings (plus ``config``) and 4 MiB commit-log files (the 1 GiB default
    would fill the disk of a CI machine running several clusters)."""
    kwargs.setdefault("commitlog_file_size_bytes", SMALL_FILES)
    return factory(broker_config=fast(**(config or {})), **kwargs)
