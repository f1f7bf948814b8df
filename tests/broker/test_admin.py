"""Offsets, message lookups, topics and groups, heartbeats, status endpoints, and registration with fake
nameservers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.registration import BrokerIdentity, RegisterResult, build_register_body, pick_register_result
from common.codec import create_offset_msg_id, decode_records, encode_batch
from common.codes import BrokerRole
from common.message import Message
from common.route import DataVersion, TopicConfig
from tests.broker.fakes import STORE_HOST, FakeHAClient, run_with_broker
from tests.waiting import wait_until


async def put(ctrl: Any, client: Any, *msgs: Message, queue_id: int = 0) -> list[int]:
    body = encode_batch(list(msgs), born_timestamp_ms=1, uniq_keys=[f"UNIQ{i}" for i in range(len(msgs))])
    r = await client.post("/send", params={"topic": msgs[0].topic, "queueId": queue_id}, content=body)
    assert r.status_code == 200, r.text
    ctrl.store.dispatch_available()
    from common.wire import decode_send_reply

    return list(decode_send_reply(r.content).commit_log_offsets)


def test_consumer_offsets_endpoints(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        q = {"group": "cg", "topic": "T", "queueId": 1}
        r = await client.get("/offset/consumer", params=q)
        assert (r.status_code, r.json()["code"]) == (404, 22)
        assert "cg" in r.json()["remark"] and "queue 1" in r.json()["remark"]
        r = await client.post("/offset/consumer", json={"group": "cg", "offsets": [
            {"topic": "T", "queueId": 1, "offset": 7}, {"topic": "T", "queueId": 2, "offset": 9}]})
        assert r.json() == {"updated": 2}
        assert (await client.get("/offset/consumer", params=q)).json() == {"offset": 7}
        assert (await client.get("/offsets")).json()["offsetTable"] == {"T@cg": {"1": 7, "2": 9}}

    run_with_broker(tmp_path, scenario)


@pytest.mark.parametrize("body", [
    b"not json", b"[]", json.dumps({"offsets": []}).encode(), json.dumps({"group": "g", "offsets": {}}).encode(),
    json.dumps({"group": "g", "offsets": [{"topic": "T", "queueId": "1", "offset": 1}]}).encode(),
    json.dumps({"group": "g", "offsets": [{"topic": "T", "queueId": 1, "offset": -5}]}).encode(),
    json.dumps({"group": "g", "offsets": [{"topic": "T/x", "queueId": 1, "offset": 5}]}).encode(),
    json.dumps({"group": "g", "offsets": [5]}).encode(),
])
def test_update_offsets_bad_body(tmp_path: Path, body: bytes) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/offset/consumer", content=body)
        assert (r.status_code, r.json()["code"]) == (400, 29), r.text
        assert ctrl.offsets.table() == {}

    run_with_broker(tmp_path, scenario)


def test_min_max_search_offsets(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, Message("T", b"a"), Message("T", b"b"))
        q = {"topic": "T", "queueId": 0}
        assert (await client.get("/offset/min", params=q)).json() == {"offset": 0}
        assert (await client.get("/offset/max", params=q)).json() == {"offset": 2}
        assert (await client.get("/offset/search", params={**q, "timestamp": 0})).json() == {"offset": 0}
        assert (await client.get("/offset/search", params={**q, "timestamp": 10**12})).json() == {"offset": 2}
        r = await client.get("/offset/max", params={"topic": "T", "queueId": "x"})
        assert (r.status_code, r.json()["code"]) == (400, 29)
        r = await client.get("/offset/search", params=q)
        assert (r.status_code, r.json()["code"]) == (400, 29) and "timestamp" in r.json()["remark"]

    run_with_broker(tmp_path, scenario)


def test_message_lookups(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        offsets = await put(ctrl, client, Message("T", b"a", keys="K1"), Message("T", b"b", keys=["K2", "K3"]))
        msg_id = create_offset_msg_id(STORE_HOST, offsets[1])
        r = await client.get("/message", params={"offsetMsgId": msg_id})
        assert r.status_code == 200 and decode_records(r.content)[0].body == b"b"
        r = await client.get("/message", params={"phyOffset": offsets[0]})
        assert decode_records(r.content)[0].body == b"a"
        r = await client.get("/message", params={"phyOffset": 10**9})
        assert (r.status_code, r.json()["code"]) == (404, 22)
        r = await client.get("/message", params={"offsetMsgId": "XYZ"})
        assert (r.status_code, r.json()["code"]) == (400, 29) and "offsetMsgId" in r.json()["remark"]
        r = await client.get("/message")
        assert (r.status_code, r.json()["code"]) == (400, 29)
        r = await client.get("/message/key", params={"topic": "T", "key": "K3"})
        assert [m.body for m in decode_records(r.content)] == [b"b"]
        r = await client.get("/message/key", params={"topic": "T", "key": "none"})
        assert (r.status_code, r.json()["code"]) == (404, 22)
        r = await client.get("/message/uniq", params={"topic": "T", "msgId": "UNIQ0"})
        assert [m.body for m in decode_records(r.content)] == [b"a"]

    run_with_broker(tmp_path, scenario)


def test_topic_create_update(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        tc = {"topicName": "Orders", "readQueueNums": 3, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0,
              "order": False}
        r = await client.post("/topic", json=tc)
        assert r.json() == {"topic": tc}
        table = (await client.get("/topics")).json()
        assert table["topicConfigTable"]["Orders"] == tc and table["dataVersion"]["counter"] >= 1
        saved = json.loads((tmp_path / "config" / "topics.json").read_text())
        assert saved["topicConfigTable"]["Orders"] == tc
        for bad, code in ((dict(tc, topicName="a/b"), 13), (dict(tc, readQueueNums=0), 29),
                          (dict(tc, perm="rw"), 29), (dict(tc, topicName="TBW102"), 29), ({}, 29),
                          (dict(tc, writeQueueNums=100000), 29)):
            r = await client.post("/topic", json=bad)
            assert r.json()["code"] == code, (bad, r.text)
            assert r.status_code == 400

    run_with_broker(tmp_path, scenario)


def test_subscription_groups(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/subscription-group", json={"groupName": "g", "brokerId": 1,
                                                           "whichBrokerWhenConsumeSlowly": 2})
        assert r.status_code == 200 and r.json()["brokerId"] == 1 and r.json()["retryMaxTimes"] == 16
        table = (await client.get("/subscription-groups")).json()
        assert table["subscriptionGroupTable"]["g"]["whichBrokerWhenConsumeSlowly"] == 2
        for bad in ({"brokerId": 1}, {"groupName": "g", "brokerId": -1}, {"groupName": "g", "brokerId": "x"},
                    {"groupName": "a b"}):
            r = await client.post("/subscription-group", json=bad)
            assert (r.status_code, r.json()["code"]) == (400, 29), r.text

    run_with_broker(tmp_path, scenario)


def test_heartbeat_and_client_table(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        hb = {"clientId": "c1", "producerGroups": ["pg"], "consumerGroups": [
            {"group": "cg", "messageModel": "CLUSTERING", "subscriptions": [{"topic": "T", "expression": "*"}]}]}
        assert (await client.post("/heartbeat", json=hb)).json() == {}
        await client.post("/heartbeat", json=dict(hb, clientId="c0"))
        assert ctrl.clients.consumer_ids("cg") == ["c0", "c1"]
        for bad in ({"clientId": ""}, {"clientId": "c", "consumerGroups": [{"group": "bad group"}]},
                    {"clientId": "c", "producerGroups": "pg"}, {"clientId": "c", "consumerGroups": [
                        {"group": "g", "subscriptions": [{"expression": "*"}]}]}):
            r = await client.post("/heartbeat", json=bad)
            assert (r.status_code, r.json()["code"]) == (400, 29), r.text

    run_with_broker(tmp_path, scenario)


def test_client_table_expiry_and_bounds() -> None:
    from broker.clients import ClientTable
    from client.errors import InvalidParameterError

    now = [0]
    t = ClientTable(clock_ms=lambda: now[0], expire_ms=120_000, max_groups=1, max_clients_per_group=1)
    t.heartbeat("c1", [], [{"group": "g"}])
    with pytest.raises(InvalidParameterError, match="maxClientsPerGroup=1"):
        t.heartbeat("c2", [], [{"group": "g"}])
    with pytest.raises(InvalidParameterError, match="maxGroups=1"):
        t.heartbeat("c1", [], [{"group": "h"}])
    now[0] = 120_001
    assert t.expire() == 1 and t.consumer_ids("g") == []


def test_runtime_ha_metrics(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        rt = (await client.get("/runtime")).json()
        assert (rt["brokerName"], rt["brokerId"], rt["role"], rt["addr"]) == ("broker-a", 1, "SLAVE",
                                                                              "127.0.0.1:10911")
        assert rt["haAddr"] == "127.0.0.1:20912" and "commitLogMaxOffset" in rt and "putTps" in rt
        ha = (await client.get("/ha")).json()
        assert ha["role"] == "SLAVE" and ha["client"]["connected"] is True
        r = await client.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "splitmq_parked_pulls" in r.text
        for path in ("/delay-offsets", "/offsets", "/topics", "/subscription-groups"):
            assert (await client.get(path)).status_code == 200

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE)


# --- registration -----------------------------------------------------------------------------------------

IDENT = BrokerIdentity("C", "broker-a", 0, "127.0.0.1:1", "127.0.0.1:2")


def test_register_body_perm_and_with_broker_permission() -> None:
    topics = {"T": TopicConfig("T", 2, 2, 6), "TBW102": TopicConfig("TBW102", 8, 8, 7)}
    body = build_register_body(IDENT, topics, DataVersion(5, 1), 6)
    assert body["topicConfigTable"]["T"]["perm"] == 6 and body["topicConfigTable"]["TBW102"]["perm"] == 7
    assert (body["brokerAddr"], body["haServerAddr"], body["brokerId"], body["clusterName"]) == (
        "127.0.0.1:1", "127.0.0.1:2", 0, "C")
    assert body["dataVersion"] == {"timestamp": 5, "counter": 1}
    ro = build_register_body(IDENT, topics, DataVersion(), 4)
    assert ro["topicConfigTable"]["T"]["perm"] == 4 and ro["topicConfigTable"]["TBW102"]["perm"] == 4


def test_pick_register_result() -> None:
    a, b = RegisterResult(None, None), RegisterResult("m:1", "m:2")
    assert pick_register_result([None, a, b]) is b
    assert pick_register_result([a, None]) is a
    assert pick_register_result([None, None]) is None


class FakeNameservers:
    def __init__(self, answer: dict[str, Any] | None = None, fail: set[str] | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.answer = answer or {"masterAddr": None, "haServerAddr": None}
        self.fail = fail or set()
        self.event = asyncio.Event()

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        self.requests.append((host, request.url.path, json.loads(request.content)))
        self.event.set()
        if host in self.fail:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=self.answer if request.url.path == "/broker/register" else {})

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.requests) < n:
                self.event.clear()
                await self.event.wait()


def test_registration_at_start_after_topic_change_and_unregister(tmp_path: Path) -> None:
    ns = FakeNameservers(fail={"10.0.0.2:9876"})

    async def scenario(ctrl: Any, client: Any) -> None:
        await ns.wait_for(2)
        assert {r[0] for r in ns.requests} == {"10.0.0.1:9876", "10.0.0.2:9876"}
        body = ns.requests[0][2]
        assert body["brokerAddr"] == "127.0.0.1:10911" and body["haServerAddr"] == "127.0.0.1:20912"
        assert "TBW102" in body["topicConfigTable"]
        await client.post("/topic", json={"topicName": "New", "readQueueNums": 1, "writeQueueNums": 1})
        # POST /topic answers after the registration round
        assert any("New" in r[2]["topicConfigTable"] for r in ns.requests)

    run_with_broker(tmp_path, scenario, http_client=ns.client(), namesrv_addr=("10.0.0.1:9876", "10.0.0.2:9876"))
    assert [r[1] for r in ns.requests[-2:]] == ["/broker/unregister", "/broker/unregister"]
    assert ns.requests[-1][2] == {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911",
                                  "brokerName": "broker-a", "brokerId": 0}


def test_auto_created_topic_registers_at_once(tmp_path: Path) -> None:
    ns = FakeNameservers()

    async def scenario(ctrl: Any, client: Any) -> None:
        await ns.wait_for(1)
        body = encode_batch([Message("Fresh", b"x")], born_timestamp_ms=1)
        await client.post("/send", params={"topic": "Fresh", "queueId": 0}, content=body)
        await ns.wait_for(2)
        assert "Fresh" in ns.requests[1][2]["topicConfigTable"]

    run_with_broker(tmp_path, scenario, http_client=ns.client(), namesrv_addr=("10.0.0.1:9876",))


def test_slave_follows_master_from_registration(tmp_path: Path) -> None:
    ns = FakeNameservers(answer={"masterAddr": "10.0.0.9:10911", "haServerAddr": "10.0.0.9:10912"})
    link = FakeHAClient(connected=False)

    async def scenario(ctrl: Any, client: Any) -> None:
        await wait_until(lambda: ctrl.registrar.rounds >= 1, 5, "a registration round")
        assert ctrl.master_addr == "10.0.0.9:10911"
        assert link.master == "10.0.0.9:10912"

    run_with_broker(tmp_path, scenario, http_client=ns.client(), namesrv_addr=("10.0.0.1:9876",),
                    role=BrokerRole.SLAVE, ha_client=link)


def test_slave_with_fixed_ha_master_ignores_registration(tmp_path: Path) -> None:
    ns = FakeNameservers(answer={"masterAddr": "10.0.0.9:10911", "haServerAddr": "10.0.0.9:10912"})
    link = FakeHAClient(connected=False)

    async def scenario(ctrl: Any, client: Any) -> None:
        await wait_until(lambda: ctrl.registrar.rounds >= 1, 5, "a registration round")
        assert ctrl.master_addr == "10.0.0.9:10911" and link.master is None

    run_with_broker(tmp_path, scenario, http_client=ns.client(), namesrv_addr=("10.0.0.1:9876",),
                    role=BrokerRole.SLAVE, ha_client=link, ha_master_address="10.0.0.8:10912")
