"""The group identity of a broker group's store (broker/group_identity.py): minted once by a master, persisted,
copied to slaves by the metadata sync; and against real processes: master and slave agree, a restart keeps it,
a wiped store or another cluster has another one."""

from __future__ import annotations

import asyncio
import json
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.group_identity import FILE_NAME, GroupIdentity, valid_identity
from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.slave_sync import SlaveSynchronizer
from client import Admin
from client.cluster import LocalCluster
from client.lowlevel import BrokerClient
from tests.waiting import poll_until

A = "a" * 32
B = "b" * 32
clock = count(1000).__next__


def _identity(tmp_path: Path, ids: list[str] | None = None) -> GroupIdentity:
    it = iter(ids or [A, B])
    return GroupIdentity(tmp_path, "broker-a", clock_ms=clock, mint=lambda: next(it))


def test_minted_once_persisted_and_reloaded(tmp_path: Path) -> None:
    ident = _identity(tmp_path)
    assert ident.value is None
    assert ident.ensure_minted() == A
    assert ident.ensure_minted() == A  # never minted twice
    stored = json.loads((tmp_path / FILE_NAME).read_text())
    assert stored["groupIdentity"] == A and stored["brokerName"] == "broker-a"
    again = _identity(tmp_path, [B])
    again.load()
    assert again.value == A and again.ensure_minted() == A
    assert again.to_json()["groupIdentity"] == A


def test_a_wiped_store_mints_a_new_identity(tmp_path: Path) -> None:
    _identity(tmp_path).ensure_minted()
    (tmp_path / FILE_NAME).unlink()
    fresh = _identity(tmp_path, [B])
    fresh.load()
    assert fresh.value is None and fresh.ensure_minted() == B


def test_a_malformed_file_leaves_it_unknown(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text(json.dumps({"groupIdentity": "not-hex"}))
    ident = _identity(tmp_path)
    ident.load()
    assert ident.value is None


def test_slave_adopts_the_masters_identity(tmp_path: Path) -> None:
    slave = _identity(tmp_path)
    assert not slave.adopt({"brokerName": "broker-a", "groupIdentity": None})  # the master has none yet
    assert slave.value is None
    assert slave.adopt({"brokerName": "broker-a", "groupIdentity": A, "createdMs": 5})
    assert not slave.adopt({"brokerName": "broker-a", "groupIdentity": A})
    assert slave.adopt({"brokerName": "broker-a", "groupIdentity": B})  # the master is the authority
    reloaded = _identity(tmp_path)
    reloaded.load()
    assert reloaded.value == B
    with pytest.raises(ValueError, match="not 32 hex"):
        slave.adopt({"brokerName": "broker-a", "groupIdentity": "x"})
    with pytest.raises(ValueError, match="broker-b"):
        slave.adopt({"brokerName": "broker-b", "groupIdentity": A})
    assert valid_identity(A) and not valid_identity(A.upper()) and not valid_identity(None)


def test_metadata_sync_copies_the_identity(tmp_path: Path) -> None:
    answers: dict[str, Any] = {"/identity": {"brokerName": "broker-a", "groupIdentity": A, "createdMs": 1}}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in answers:
            return httpx.Response(200, json=answers[request.url.path])
        return httpx.Response(500, json={"code": 1, "remark": "not in this test"})

    ident = _identity(tmp_path)

    async def run() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = SlaveSynchronizer(master_addr=lambda: "127.0.0.1:1", own_addr="127.0.0.1:2", client=client,
                                     topics=TopicConfigManager(tmp_path, clock_ms=clock),
                                     offsets=ConsumerOffsetManager(tmp_path, clock_ms=clock),
                                     groups=SubscriptionGroupManager(tmp_path, clock_ms=clock),
                                     delay_offsets=DelayOffsetManager(tmp_path), identity=ident)
            return await sync.sync_all()

    assert asyncio.run(run()) == 1  # the four tables failed here; the identity item on its own succeeded
    assert ident.value == A


def _identities(admin: Admin, cluster: LocalCluster) -> dict[int, Any]:
    return {b.broker_id: admin.broker_runtime(b.addr).get("groupIdentity") for b in cluster.members("broker-a")}


@pytest.mark.integration
def test_master_and_slave_agree_across_restarts_and_clusters_differ(tmp_path: Path) -> None:
    config = {"slaveMetadataSyncInterval": "300"}
    with LocalCluster(tmp_path / "one", broker_groups=1, slaves_per_group=1, broker_config=config) as cluster, \
            Admin(cluster.namesrv_addr) as admin:
        def agreed() -> dict[int, Any] | None:
            ids = _identities(admin, cluster)
            return ids if ids[0] is not None and ids[0] == ids[1] else None

        first = poll_until(agreed, timeout_s=20, what="the slave to copy the master's group identity")
        master = cluster.broker("broker-a", 0)
        with BrokerClient(cluster.namesrv_addr) as client:  # what readers ask (any account may)
            assert client.group_identity(master.addr) == client.group_identity(cluster.broker("broker-a", 1).addr)
            assert client.group_identity(master.addr) == first[0]
        master.stop()
        assert admin.broker_runtime(cluster.broker("broker-a", 1).addr)["groupIdentity"] == first[0]
        master.start()
        assert _identities(admin, cluster) == first  # a restart keeps it
    with LocalCluster(tmp_path / "two", broker_groups=1, slaves_per_group=0) as other, Admin(other.namesrv_addr) as a2:
        assert a2.broker_runtime(other.broker("broker-a", 0).addr)["groupIdentity"] not in (None, first[0])
