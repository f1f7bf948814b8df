"""The dashboard's view of a DLedger group: every peer with its role, a killed leader listed as down (as a peer
and as the member that was id 0) while the new leader takes id 0. No browser: the collector's snapshot is what
the page draws."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from client import Admin, ClientConfig
from client.cluster import LocalCluster
from client.dashboard import Collector
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.slow, pytest.mark.timeout(90)]


def _group(collector: Collector) -> dict[str, Any]:
    collector.sweep()
    snap = collector.snapshot()
    assert snap["ok"], snap["error"]
    group: dict[str, Any] = snap["groups"][0]
    return group


def test_dledger_peers_and_a_killed_leader(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(mode="dledger", peers_per_group=3)
    old = cluster.leader("broker-a")
    with Admin(cluster.namesrv_addr, client_config=ClientConfig(request_timeout_s=1.0,
                                                                connect_timeout_s=0.5)) as admin:
        collector = Collector(admin, cluster.namesrv_addr)
        def three_peers() -> dict[str, Any] | None:
            g = _group(collector)
            return g if len(g["peers"]) == 3 and all(p["up"] for p in g["peers"]) else None

        group = poll_until(three_peers, 20, "three DLedger peers up in the snapshot")
        assert group["dledger"] is True
        assert sorted(p["role"] for p in group["peers"]) == ["FOLLOWER", "FOLLOWER", "LEADER"]
        assert collector.snapshot()["replication"] == []  # DLedger progress lives in the peers' rows

        cluster.kill_master("broker-a")
        old_peer = f"n{old.broker_id}"

        def after_failover() -> dict[str, Any] | None:
            g = _group(collector)
            peers = {p["peerId"]: p for p in g["peers"]}
            dead = [m for m in g["members"] if m["addr"] == old.addr]
            leader = [m for m in g["members"] if m["id"] == 0 and m["up"]]
            ok = (not peers[old_peer]["up"] and dead and not dead[0]["up"] and leader
                  and leader[0]["addr"] != old.addr)
            return g if ok else None

        group = poll_until(after_failover, 30, f"{old_peer} down and a new leader serving as id 0")
        roles = {p["peerId"]: p.get("role") for p in group["peers"]}
        assert "LEADER" in roles.values() and roles[old_peer] is None, roles
        assert len({m["addr"] for m in group["members"]}) == len(group["members"])  # no member twice
