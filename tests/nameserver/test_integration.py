"""``python -m nameserver`` as a real process on a kernel-chosen port."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import poll_until


class NamesrvProcess(Protocol):
    """What the ``start_nameserver`` fixture (conftest.py) hands back."""

    proc: subprocess.Popen[bytes]
    addr: str

    @property
    def url(self) -> str: ...

    def stop(self, sig_timeout_s: float = ...) -> int: ...

    def log_tail(self, chars: int = ...) -> str: ...

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
M_ADDR, M_HA, S_ADDR, S_HA = "127.0.0.1:10911", "127.0.0.1:10912", "127.0.0.1:10921", "127.0.0.1:10922"
TOPIC_TABLE = {"TopicA": {"topicName": "TopicA", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                          "topicSysFlag": 0, "order": False}}


def broker_body(addr: str, broker_id: int, ha: str, counter: int = 1) -> dict[str, Any]:
    return {"clusterName": "DefaultCluster", "brokerAddr": addr, "brokerName": "broker-a", "brokerId": broker_id,
            "haServerAddr": ha, "dataVersion": {"timestamp": 1, "counter": counter},
            "topicConfigTable": TOPIC_TABLE}


def test_register_route_unregister_cycle(start_nameserver: Callable[..., NamesrvProcess]) -> None:
    ns = start_nameserver()
    with httpx.Client(base_url=ns.url, timeout=5) as c:
        r = c.post("/broker/register", json=broker_body(M_ADDR, 0, M_HA))
        assert (r.status_code, r.json()) == (200, {"masterAddr": None, "haServerAddr": None})
        r = c.post("/broker/register", json=broker_body(S_ADDR, 1, S_HA))
        assert r.json() == {"masterAddr": M_ADDR, "haServerAddr": M_HA}
        route = c.get("/route", params={"topic": "TopicA"}).json()
        assert route == {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                            "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                             "brokerAddrs": {"0": M_ADDR, "1": S_ADDR}}],
        }
        cluster = c.get("/cluster").json()
        assert cluster["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        assert set(cluster["brokerLiveTable"]) == {M_ADDR, S_ADDR}
        assert cluster["brokerLiveTable"][M_ADDR]["haServerAddr"] == M_HA
        assert c.get("/topics").json() == {"topicList": ["TopicA"]}

        assert c.post("/broker/wipe-write-perm", json={"brokerName": "broker-a"}).json() == {"affected": 1}
        assert c.get("/route?topic=TopicA").json()["queueDatas"][0]["perm"] == 4
        assert c.post("/broker/add-write-perm", json={"brokerName": "broker-a"}).json() == {"affected": 1}
        assert c.get("/route?topic=TopicA").json()["queueDatas"][0]["perm"] == 6

        goodbye = {"clusterName": "DefaultCluster", "brokerAddr": M_ADDR, "brokerName": "broker-a", "brokerId": 0}
        assert c.post("/broker/unregister", json=goodbye).json() == {}
        route = c.get("/route?topic=TopicA").json()
        assert route["brokerDatas"][0]["brokerAddrs"] == {"1": S_ADDR}
        assert route["queueDatas"][0]["perm"] == 6
        # The slave without a live master gets nothing back.
        assert c.post("/broker/register", json=broker_body(S_ADDR, 1, S_HA)).json() == {
            "masterAddr": None, "haServerAddr": None}
        goodbye = {**goodbye, "brokerAddr": S_ADDR, "brokerId": 1}
        assert c.post("/broker/unregister", json=goodbye).json() == {}
        r = c.get("/route?topic=TopicA")
        assert r.status_code == 404 and r.json()["code"] == 17
        assert c.get("/cluster").json() == {"brokerAddrTable": {}, "clusterAddrTable": {}, "brokerLiveTable": {}}
    assert ns.stop() == 0, ns.log_tail()


def test_master_expiry_keeps_queue_data_for_live_slave(start_nameserver: Callable[..., NamesrvProcess]) -> None:
    ns = start_nameserver("--broker-expiry-ms", "1500", "--scan-interval-ms", "200")
    with httpx.Client(base_url=ns.url, timeout=5) as c:
        c.post("/broker/register", json=broker_body(M_ADDR, 0, M_HA)).raise_for_status()
        assert c.post("/broker/register", json=broker_body(S_ADDR, 1, S_HA)).json()["masterAddr"] == M_ADDR

        def master_gone() -> bool:
            # The slave keeps registering; the master has gone silent.
            c.post("/broker/register", json=broker_body(S_ADDR, 1, S_HA)).raise_for_status()
            return M_ADDR not in c.get("/cluster").json()["brokerLiveTable"]

        poll_until(master_gone, 10, "the master to expire")
        route = c.get("/route?topic=TopicA").json()
        assert route["brokerDatas"] == [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                                         "brokerAddrs": {"1": S_ADDR}}]
        assert route["queueDatas"] == [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4,
                                        "perm": 6, "topicSysFlag": 0}]
        assert c.post("/broker/register", json=broker_body(S_ADDR, 1, S_HA)).json() == {
            "masterAddr": None, "haServerAddr": None}

        # Once the slave goes silent too, the group and the topic disappear.
        poll_until(lambda: c.get("/route?topic=TopicA").status_code == 404, 10, "the slave to expire")
        assert c.get("/topics").json() == {"topicList": []}
    assert ns.stop() == 0, ns.log_tail()


def test_bad_input_over_http(start_nameserver: Callable[..., NamesrvProcess]) -> None:
    ns = start_nameserver()
    with httpx.Client(base_url=ns.url, timeout=5) as c:
        r = c.post("/broker/register", content=b'{"clusterName": ')
        assert (r.status_code, r.json()["code"]) == (400, 29)
        r = c.post("/broker/register", json={"clusterName": "c", "brokerAddr": "a:1", "brokerName": "b"})
        assert (r.status_code, r.json()["code"]) == (400, 29)
        assert "'brokerId'" in r.json()["remark"]
        r = c.get("/broker/register")
        assert (r.status_code, r.json()["code"]) == (405, 3)
        r = c.delete("/route?topic=x")
        assert r.status_code == 405
        r = c.get("/no/such/path")
        assert (r.status_code, r.json()["code"]) == (404, 3)
        r = c.get("/route", params={"topic": "Unknown"})
        assert r.status_code == 404
        assert r.json()["code"] == 17
        assert r.json()["remark"] == "No topic route info in name server for the topic: Unknown"
        assert c.get("/topics").json() == {"topicList": []}  # still serving after all that

        r = c.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
        assert {"splitmq_nameserver_live_brokers", "splitmq_nameserver_topics",
                "splitmq_nameserver_requests"} <= set(families)
        by_path = {(s.labels["path"], s.labels["status"]): s.value
                   for s in families["splitmq_nameserver_requests"].samples if s.name.endswith("_total")}
        assert by_path[("/broker/register", "400")] == 2
        assert by_path[("/route", "404")] == 1
    assert ns.stop() == 0, ns.log_tail()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_gracefully_with_exit_zero(start_nameserver: Callable[..., NamesrvProcess],
                                                sig: signal.Signals) -> None:
    ns = start_nameserver()
    with httpx.Client(base_url=ns.url, timeout=5) as c:
        assert c.get("/topics").status_code == 200  # a kept-alive connection must not block the stop
        ns.proc.send_signal(sig)
        assert ns.proc.wait(10) == 0, ns.log_tail()
    assert ns.proc.stdout is not None
    assert ns.proc.stdout.read() == b""  # exactly one line was printed (already consumed)


def test_json_logs_and_log_level(start_nameserver: Callable[..., NamesrvProcess]) -> None:
    ns = start_nameserver("--log-format", "json", "--log-level", "info")
    assert ns.stop() == 0
    lines = [json.loads(line) for line in ns.log_tail().splitlines() if line.strip()]
    assert any("serving on" in entry["msg"] for entry in lines), lines


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen", "nohost"], "--listen"),
        (["--listen", "127.0.0.1:http"], "not an integer"),
        (["--listen", "127.0.0.1:70000"], "outside"),
        (["--broker-expiry-ms", "0"], "--broker-expiry-ms"),
        (["--scan-interval-ms", "x"], "--scan-interval-ms"),
        (["--log-format", "xml"], "--log-format"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nameserver", *args], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert needle in proc.stderr


def test_port_in_use_is_a_clear_error(start_nameserver: Callable[..., NamesrvProcess]) -> None:
    ns = start_nameserver()
    proc = subprocess.run([sys.executable, "-m", "nameserver", "--listen", ns.addr], capture_output=True,
                          text=True, timeout=30, cwd=ROOT)
    assert proc.returncode != 0
    assert f"cannot listen on {ns.addr}" in proc.stderr
