"""The dashboard on a cluster with the ACL on: with an admin account it sees the cluster (its sweeps read admin
endpoints); without one its members show as up (they answer) with the refusal and what to do, not as down.
No browser: the collector's snapshot is what the page draws."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from client import Admin, ClientConfig, Credentials
from client.cluster import LocalCluster
from client.dashboard import Collector, build_app
from client.errors import RouteNotFoundError
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


TOKEN = "acl-token"


def _act(app: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = asyncio.run(app.serve("POST", path, b"", json.dumps(body).encode(), ("127.0.0.1", 1),
                                   f"SplitMQ-Dashboard {TOKEN}".encode(), b"127.0.0.1:8080"))
    return answer.status, json.loads(answer.body)


def test_actions_write_only_with_an_admin_account_given_with_them(cluster_factory: Callable[..., LocalCluster]
                                                                   ) -> None:
    """The dashboard itself runs with the admin account (its views need one), yet an action writes with the
    account in its own body: none, or one that is not an admin, is refused in the cluster's words; the admin
    account passes."""
    cluster = cluster_factory(acl=True)
    ns, config = cluster.namesrv_addr, ClientConfig(request_timeout_s=2.0, connect_timeout_s=0.5)
    reader = Credentials(f"reader-{uuid.uuid4().hex[:4]}", "reader-secret")
    assert cluster.acl_file is not None
    with cluster.acl_file.open("a") as f:  # the servers watch the file and reload it
        f.write(f'\n[[accounts]]\naccessKey = "{reader.access_key}"\nsecretKey = "{reader.secret_key}"\n'
                'defaultTopicPerm = "PUB|SUB"\ndefaultGroupPerm = "SUB"\n')
    admin_keys = cluster.admin_credentials
    with Admin(ns, client_config=config, credentials=admin_keys) as admin:
        app = build_app(Collector(admin, ns), ns, token=TOKEN, client_config=config)
        topic = {"topic": "AclDashTopic", "queueNums": 2}
        status, body = _act(app, "/api/actions/topic", topic)
        assert status == 403 and body["codeName"] == "NO_PERMISSION" and "not signed" in body["remark"], body

        def reader_refused() -> dict[str, Any] | None:  # once the brokers loaded the new account
            status, body = _act(app, "/api/actions/topic", dict(topic, accessKey=reader.access_key,
                                                               secretKey=reader.secret_key))
            return body if status == 403 and "not signed" not in body["remark"] else None
        body = poll_until(reader_refused, 20, "a non-admin account refused as such")
        assert body["codeName"] == "NO_PERMISSION" and reader.access_key in body["remark"], body
        with pytest.raises(RouteNotFoundError):
            admin.topic_route("AclDashTopic")  # nothing was written
        status, body = _act(app, "/api/actions/topic", dict(topic, accessKey=admin_keys.access_key,
                                                           secretKey=admin_keys.secret_key))
        assert status == 200 and body["did"].startswith("create topic to broker-a success"), body
        assert {qd.write_queue_nums for qd in admin.topic_route("AclDashTopic").queue_datas} == {2}
