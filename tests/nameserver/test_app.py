"""The nameserver's router served in process (tests/serving.py, an injected clock): shapes and bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.routeinfo import RouteInfo
from nameserver.server import NamesrvConfig, create_app
from tests.serving import serving

MASTER = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911", "brokerName": "broker-a",
          "brokerId": 0, "haServerAddr": "127.0.0.1:10912", "dataVersion": {"timestamp": 1, "counter": 1},
          "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                                     "topicSysFlag": 0, "order": False}}}


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def run(scenario: Callable[[httpx.AsyncClient, RouteInfo, Clock], Awaitable[None]], **app_kw: Any) -> None:
    ri, clock = RouteInfo(), Clock()
    app = create_app(ri, clock_ms=clock, addr="127.0.0.1:9876", **app_kw)

    async def main() -> None:
        async with serving(app) as client:
            await scenario(client, ri, clock)

    asyncio.run(main())


def test_register_route_and_cluster_shapes() -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        r = await c.post("/broker/register", json=MASTER)
        assert (r.status_code, r.json()) == (200, {"masterAddr": None, "haServerAddr": None})
        clock.now_ms = 2_000
        slave = {**MASTER, "brokerAddr": "127.0.0.1:10921", "brokerId": 1, "haServerAddr": "127.0.0.1:10922"}
        r = await c.post("/broker/register", json=slave)
        assert r.json() == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}
        r = await c.get("/route", params={"topic": "T"})
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                            "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                             "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:10921"}}],
        }
        r = await c.get("/cluster")
        assert r.json()["brokerLiveTable"] == {
            "127.0.0.1:10911": {"lastUpdateTimestamp": 1_000, "haServerAddr": "127.0.0.1:10912"},
            "127.0.0.1:10921": {"lastUpdateTimestamp": 2_000, "haServerAddr": "127.0.0.1:10922"},
        }
        assert r.json()["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        assert (await c.get("/topics")).json() == {"topicList": ["T"]}
        r = await c.post("/broker/wipe-write-perm", json={"brokerName": "broker-a"})
        assert r.json() == {"affected": 1}
        assert (await c.get("/route?topic=T")).json()["queueDatas"][0]["perm"] == 4
        r = await c.post("/broker/add-write-perm", json={"brokerName": "broker-a"})
        assert r.json() == {"affected": 1}
        assert (await c.get("/route?topic=T")).json()["queueDatas"][0]["perm"] == 6
        r = await c.post("/broker/unregister", json={k: MASTER[k] for k in
                                                      ("clusterName", "brokerAddr", "brokerName", "brokerId")})
        assert (r.status_code, r.json()) == (200, {})
        assert (await c.get("/route?topic=T")).json()["brokerDatas"][0]["brokerAddrs"] == {"1": "127.0.0.1:10921"}

    run(scenario)


def test_topic_without_queue_data_is_topic_not_exist() -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        r = await c.get("/route", params={"topic": "NOPE"})
        assert r.status_code == 404
        assert r.json() == {"code": 17, "remark": "No topic route info in name server for the topic: NOPE",
                            "broker": "127.0.0.1:9876"}

    run(scenario)


BAD_REGISTER = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (json.dumps({k: v for k, v in MASTER.items() if k != "brokerName"}).encode(), "'brokerName'"),
    (json.dumps({k: v for k, v in MASTER.items() if k != "clusterName"}).encode(), "'clusterName'"),
    (json.dumps({k: v for k, v in MASTER.items() if k != "brokerAddr"}).encode(), "'brokerAddr'"),
    (json.dumps({k: v for k, v in MASTER.items() if k != "brokerId"}).encode(), "'brokerId'"),
    (json.dumps({k: v for k, v in MASTER.items() if k != "haServerAddr"}).encode(), "'haServerAddr'"),
    (json.dumps({**MASTER, "brokerId": "0"}).encode(), "'brokerId' must be an integer"),
    (json.dumps({**MASTER, "brokerId": True}).encode(), "'brokerId' must be an integer"),
    (json.dumps({**MASTER, "brokerId": -1}).encode(), "'brokerId'=-1 is outside"),
    (json.dumps({**MASTER, "brokerName": ""}).encode(), "'brokerName' must not be empty"),
    (json.dumps({**MASTER, "brokerName": 7}).encode(), "'brokerName' must be a string"),
    (json.dumps({**MASTER, "dataVersion": [1]}).encode(), "'dataVersion'"),
    (json.dumps({**MASTER, "dataVersion": {"counter": "x"}}).encode(), "dataVersion.'counter'"),
    (json.dumps({**MASTER, "topicConfigTable": [1]}).encode(), "'topicConfigTable'"),
    (json.dumps({**MASTER, "topicConfigTable": {"T": 5}}).encode(), "topicConfigTable['T']"),
    (json.dumps({**MASTER, "topicConfigTable": {"T": {"perm": "rw"}}}).encode(), "'perm'"),
    (json.dumps({**MASTER, "topicConfigTable": {"T": {"readQueueNums": -3}}}).encode(), "'readQueueNums'"),
    (json.dumps({**MASTER, "topicConfigTable": {"T": {"topicName": "U"}}}).encode(), "differs from its key"),
    (json.dumps({**MASTER, "topicConfigTable": {"": {}}}).encode(), "not a valid topic name"),
    (json.dumps({**MASTER, "topicConfigTable": {"T": {"order": "false"}}}).encode(), "'order'"),
    (b"\xff\xfe", "not valid JSON"),
]


@pytest.mark.parametrize(("body", "remark_part"), BAD_REGISTER)
def test_bad_register_bodies_are_invalid_parameter(body: bytes, remark_part: str) -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        r = await c.post("/broker/register", content=body)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == 29
        assert remark_part in r.json()["remark"]
        assert ri.cluster_info().broker_live_table == {}

    run(scenario)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "remark_part"),
    [
        ("GET", "/route", None, 400, 29, "'topic'"),
        ("GET", "/route?topic=", None, 400, 29, "'topic' must not be empty"),
        ("POST", "/broker/unregister", b"{}", 400, 29, "'clusterName'"),
        ("POST", "/broker/wipe-write-perm", b"{}", 400, 29, "'brokerName'"),
        ("POST", "/broker/add-write-perm", b'{"brokerName": null}', 400, 29, "'brokerName'"),
        ("GET", "/broker/register", None, 405, 3, "use POST"),
        ("POST", "/route", b"{}", 405, 3, "use GET"),
        ("GET", "/nope", None, 404, 3, "no such endpoint"),
    ],
)
def test_bad_requests(method: str, path: str, body: bytes | None, status: int, code: int,
                      remark_part: str) -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        r = await c.request(method, path, content=body)
        assert r.status_code == status, r.text
        assert r.json()["code"] == code
        assert remark_part in r.json()["remark"]

    run(scenario)


def test_body_over_limit_is_413() -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        r = await c.post("/broker/register", content=b"x" * 2000)
        assert r.status_code == 413

    run(scenario, max_body_bytes=1000)


def test_metrics_count_requests_and_tables() -> None:
    async def scenario(c: httpx.AsyncClient, ri: RouteInfo, clock: Clock) -> None:
        await c.post("/broker/register", json=MASTER)
        await c.get("/route?topic=NOPE")
        await c.get("/some/random/path")
        r = await c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(r.text) for s in fam.samples}
        assert samples[("splitmq_nameserver_live_brokers", ())] == 1
        assert samples[("splitmq_nameserver_topics", ())] == 1
        req = "splitmq_nameserver_requests_total"
        assert samples[(req, (("path", "/broker/register"), ("status", "200")))] == 1
        assert samples[(req, (("path", "/route"), ("status", "404")))] == 1
        assert samples[(req, (("path", "other"), ("status", "404")))] == 1

    run(scenario)


def test_two_apps_in_one_process_have_separate_metrics() -> None:
    create_app(RouteInfo())
    create_app(RouteInfo())  # a shared global registry would raise "Duplicated timeseries"


def test_config_rejects_non_positive_values() -> None:
    with pytest.raises(ValueError, match="scan_interval_ms"):
        NamesrvConfig(scan_interval_ms=0)
    with pytest.raises(ValueError, match="broker_expiry_ms"):
        NamesrvConfig(broker_expiry_ms=-5)
