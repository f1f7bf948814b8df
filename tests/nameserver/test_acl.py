"""The nameserver's ACL in process: admin-only table changes, broker-group ownership (no takeover by another
account), open or protected route queries, and a rule for every route."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.signing import Credentials, SigningAuth
from nameserver.routeinfo import RouteInfo
from nameserver.server import NAMESRV_RULES, NamesrvConfig, build_gate, create_app, namesrv_rules
from tests.serving import serving

ACCOUNTS = """
[[accounts]]
accessKey = "broker-a-owner"
secretKey = "owner-secret"
admin = true
[[accounts]]
accessKey = "intruder"
secretKey = "intruder-secret"
admin = true
[[accounts]]
accessKey = "app"
secretKey = "app-secret"
topicPerms = ["T=PUB"]
"""
OWNER, INTRUDER, APP = (SigningAuth(Credentials(a, s)) for a, s in
                        (("broker-a-owner", "owner-secret"), ("intruder", "intruder-secret"), ("app", "app-secret")))
MASTER = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911", "brokerName": "broker-a",
          "brokerId": 0, "haServerAddr": "127.0.0.1:10912",
          "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}}
FAKE = {**MASTER, "brokerAddr": "127.0.0.1:6666", "haServerAddr": "127.0.0.1:6667"}


def run(tmp_path: Path, scenario: Callable[[httpx.AsyncClient, RouteInfo], Awaitable[None]], **config: Any) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(ACCOUNTS)
    ri = RouteInfo()
    gate = build_gate(NamesrvConfig(acl_enable=True, acl_file=str(acl), **config))
    app = create_app(ri, addr="127.0.0.1:9876", acl=gate)

    async def main() -> None:
        async with serving(app) as client:
            await scenario(client, ri)

    asyncio.run(main())


def test_rules_cover_every_route() -> None:
    assert create_app(RouteInfo()).route_keys == frozenset(NAMESRV_RULES) == frozenset(namesrv_rules(protect_routes=True))


def test_a_fake_broker_with_another_account_changes_no_route(tmp_path: Path) -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo) -> None:
        assert (await c.post("/broker/register", json=MASTER, auth=OWNER)).status_code == 200
        before = ((await c.get("/route", params={"topic": "T"})).json(), (await c.get("/cluster")).json())
        for body in (FAKE, {**FAKE, "brokerId": 1}, {**FAKE, "brokerId": 7}):
            r = await c.post("/broker/register", json=body, auth=INTRUDER)
            assert (r.status_code, r.json()["code"]) == (403, 16), r.text
            assert "account intruder may not register or unregister broker group broker-a" in r.json()["remark"]
        r = await c.post("/broker/unregister", json=MASTER, auth=INTRUDER)
        assert r.status_code == 403
        for body, auth in ((FAKE, None), (FAKE, APP)):  # unsigned; signed but not admin
            assert (await c.post("/broker/register", json=body, auth=auth)).status_code == 403
        after = ((await c.get("/route", params={"topic": "T"})).json(), (await c.get("/cluster")).json())
        assert after[0] == before[0]
        assert after[1]["brokerAddrTable"] == before[1]["brokerAddrTable"]
        # the owner's brokers leave: the name is free, and another account may take it
        assert (await c.post("/broker/unregister", json=MASTER, auth=OWNER)).status_code == 200
        assert (await c.post("/broker/register", json=FAKE, auth=INTRUDER)).status_code == 200

    run(tmp_path, scenario)


def test_admin_operations_need_admin(tmp_path: Path) -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo) -> None:
        for path in ("/broker/wipe-write-perm", "/broker/add-write-perm"):
            r = await c.post(path, json={"brokerName": "broker-a"}, auth=APP)
            assert r.status_code == 403 and "account app has no admin permission" in r.json()["remark"]
            assert (await c.post(path, json={"brokerName": "broker-a"}, auth=OWNER)).status_code == 200
        assert (await c.get("/metrics")).status_code == 403
        assert (await c.get("/metrics", auth=OWNER)).status_code == 200

    run(tmp_path, scenario)


@pytest.mark.parametrize("protect", [False, True])
def test_route_queries_open_or_protected(tmp_path: Path, protect: bool) -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo) -> None:
        assert (await c.post("/broker/register", json=MASTER, auth=OWNER)).status_code == 200
        unsigned = [(await c.get(p, params=q)).status_code
                    for p, q in (("/route", {"topic": "T"}), ("/cluster", {}), ("/topics", {}))]
        assert unsigned == ([403, 403, 403] if protect else [200, 200, 200])
        assert (await c.get("/route", params={"topic": "T"}, auth=APP)).status_code == 200  # PUB is enough
        r = await c.get("/route", params={"topic": "U"}, auth=APP)
        assert r.status_code == (403 if protect else 404)
        assert (await c.get("/topics", auth=APP)).status_code == 200

    run(tmp_path, scenario, acl_protect_routes=protect)


def test_a_forwarded_for_header_does_not_make_a_peer_white_listed(
        tmp_path: Path, start_nameserver: Callable[..., Any]) -> None:
    """A real nameserver judges the address the connection comes from: ``X-Forwarded-For`` from a loopback peer
    (a proxy-aware server trusts it from 127.0.0.1) must not pass the global white list."""
    acl = tmp_path / "acl.toml"
    acl.write_text('globalWhiteRemoteAddresses = ["10.9.*.*"]\n' + ACCOUNTS)
    ns = start_nameserver("--acl-enable", "--acl-file", str(acl), "--acl-protect-routes")
    with httpx.Client(base_url=ns.url, timeout=5) as c:
        for headers in ({}, {"X-Forwarded-For": "10.9.1.1"}, {"Forwarded": "for=10.9.1.1"}):
            r = c.get("/cluster", headers=headers)
            assert (r.status_code, r.json()["code"]) == (403, 16), (headers, r.text)
        assert c.get("/cluster", auth=APP).status_code == 200
