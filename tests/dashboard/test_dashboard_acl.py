"""The dashboard on a cluster with the ACL on: with an admin account it sees the cluster (its sweeps read admin
endpoints); without one its members show as up (they answer) with the refusal and what to do, not as down.
No browser: the collector's snapshot is what the page draws."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from client import Admin, ClientConfig
from client.cluster import LocalCluster
from client.dashboard import Collector
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _snapshot(admin: Admin, ns: str) -> dict[str, Any]:
    collector = Collector(admin, ns)
    collector.sweep()
    return collector.snapshot()


def test_an_admin_account_sees_the_cluster_and_no_account_sees_why_not(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(acl=True)
    ns, config = cluster.namesrv_addr, ClientConfig(request_timeout_s=2.0, connect_timeout_s=0.5)
    with Admin(ns, client_config=config, credentials=cluster.admin_credentials) as admin:
        def members_up() -> dict[str, Any] | None:
            snap = _snapshot(admin, ns)
            ok = snap["ok"] and snap["groups"] and all(m["up"] for m in snap["groups"][0]["members"])
            return snap if ok else None

        snap = poll_until(members_up, 20, "the ACL cluster's members up in the dashboard's snapshot")
        assert {m["id"] for m in snap["groups"][0]["members"]} == {0, 1}
    with Admin(ns, client_config=config) as anonymous:
        collector = Collector(anonymous, ns)
        collector.sweep()
        for m in collector.snapshot()["groups"][0]["members"]:
            collector.probe(m["addr"])
        members = collector.snapshot()["groups"][0]["members"]
    assert len(members) == 2
    for m in members:  # refused, yet answering: up, with what to do
        assert m["up"] is True and "request not signed" in m["error"] and "admin account" in m["error"], m
