"""``python -m broker`` as a real process: the seeds' config file, send/pull/offsets over HTTP, registration
with a real nameserver, bad input (right code, clear remark, never a 500), long polling, graceful shutdown and
restart, exit codes for bad configuration and a corrupt store."""

from __future__ import annotations

import json
import signal
import struct
import threading
import time
from typing import Any

import httpx
import pytest

from common.codec import decode_records, encode_batch
from common.codes import PullSysFlag, ResponseCode
from common.message import Message
from common.wire import PULL_HEAD, decode_pull_header, decode_send_reply
from tests.broker.procs import ServerProcess, Servers, write_properties
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

C = ResponseCode
SEEDS = {"brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0",
         "brokerRole": "ASYNC_MASTER", "flushDiskType": "ASYNC_FLUSH"}


def send(c: httpx.Client, topic: str, bodies: list[bytes], queue_id: Any = 0, **params: Any) -> httpx.Response:
    body = encode_batch([Message(topic, b) for b in bodies], born_timestamp_ms=int(time.time() * 1000))
    return c.post("/send", params={"topic": topic, "queueId": queue_id, "group": "pg", **params}, content=body)


def create_topic(c: httpx.Client, topic: str, queues: int = 4) -> None:
    """``POST /topic`` (autoCreateTopicEnable is off: a send never creates a topic)."""
    r = c.post("/topic", json={"topicName": topic, "readQueueNums": queues, "writeQueueNums": queues})
    assert r.status_code == 200, r.text


def pull(c: httpx.Client, topic: str, offset: int, queue_id: int = 0, **params: Any) -> tuple[Any, list[Any]]:
    r = c.get("/pull", params={"group": "cg", "topic": topic, "queueId": queue_id, "offset": offset, **params})
    assert r.status_code == 200, r.text
    return decode_pull_header(r.content), decode_records(r.content[PULL_HEAD.size:])


def test_seeds_file_broker_registers_and_serves(servers: Servers) -> None:
    ns = servers.nameserver()
    b = servers.broker({**SEEDS, "namesrvAddr": ns.addr})
    assert (b.fields[0], b.fields[1], b.fields[2]) == ("broker-a", "0", "ASYNC_MASTER")
    assert b.addr.startswith("127.0.0.1:") and b.ha_addr.startswith("127.0.0.1:")
    with httpx.Client(base_url=b.url, timeout=10) as c, httpx.Client(base_url=ns.url, timeout=10) as nsc:
        create_topic(c, "SeedTopic")
        r = send(c, "SeedTopic", [b"a", b"b", b"c"])
        assert r.status_code == 200, r.text
        reply = decode_send_reply(r.content)
        assert (reply.code, reply.queue_offset, len(reply.commit_log_offsets)) == (0, 0, 3)

        def routed() -> bool:
            r = nsc.get("/route", params={"topic": "SeedTopic"})
            assert "server" not in r.headers, r.headers  # the nameserver sends no banner either
            return r.status_code == 200 and r.json()["brokerDatas"][0]["brokerAddrs"]["0"] == b.addr

        poll_until(routed, 10, "SeedTopic's route at the nameserver")
        poll_until(lambda: pull(c, "SeedTopic", 0)[0].code == C.SUCCESS, 5, "messages dispatched")
        head, msgs = pull(c, "SeedTopic", 0)
        assert [m.body for m in msgs] == [b"a", b"b", b"c"] and head.next_begin_offset == 3
        assert c.get("/offset/max", params={"topic": "SeedTopic", "queueId": 0}).json() == {"offset": 3}
        r = c.post("/offset/consumer", json={"group": "cg", "offsets": [{"topic": "SeedTopic", "queueId": 0,
                                                                        "offset": 3}]})
        assert r.json() == {"updated": 1}
        assert c.get("/offset/consumer", params={"group": "cg", "topic": "SeedTopic", "queueId": 0}).json() == {
            "offset": 3}
        metrics = c.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'rocketmq_messages_in_total{cluster="DefaultCluster",node_id="broker-a-0",node_type="broker",topic="SeedTopic"} 3.0' in metrics.text
    assert b.stop() == 0
    # graceful shutdown: unregistered at once, offsets persisted
    with httpx.Client(base_url=ns.url, timeout=10) as nsc:
        assert nsc.get("/route", params={"topic": "SeedTopic"}).status_code == 404
    saved = json.loads((servers.workdir / "store-broker" / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["SeedTopic@cg"] == {"0": 3}
    assert "unknown configuration keys" not in b.log()


BAD_INPUT: list[tuple[Any, ...]] = [
    # (topic, queueId, body, extra params, http, code, text in remark)
    ("T", 0, b"", {}, 400, 13, "empty"),
    ("T", 0, b"\x00\x00\x00\x50" + b"\x53\x50\x4c\x54" + b"\x00" * 30, {}, 400, 13, "truncated"),
    ("T", 0, encode_batch([Message("T", b"x" * 100)], born_timestamp_ms=1)[:-10], {}, 400, 13, "truncated"),
    ("NoSuchTopic", 0, encode_batch([Message("NoSuchTopic", b"x")], born_timestamp_ms=1), {}, 404, 17,
     "NoSuchTopic"),
    ("T", 8, encode_batch([Message("T", b"x")], born_timestamp_ms=1), {}, 400, 29, "queueId 8"),
    ("T", 0, encode_batch([Message("T", b"x" * 5000)], born_timestamp_ms=1, max_message_size=1 << 20), {}, 400, 13,
     "maxMessageSize 4096"),
    ("in valid", 0, encode_batch([Message("T", b"x")], born_timestamp_ms=1), {}, 400, 13, "in valid"),
    ("T", "zero", encode_batch([Message("T", b"x")], born_timestamp_ms=1), {}, 400, 29, "queueId"),
]


@pytest.fixture(scope="module")
def strict_broker(module_servers: Servers) -> ServerProcess:
    """A broker with auto-create off, small messages and one 8-queue topic ``T``."""
    b = module_servers.broker({**SEEDS, "autoCreateTopicEnable": "false", "maxMessageSize": "4096",
                               "maxRequestBodyBytes": "65536"}, name="strict")
    with httpx.Client(base_url=b.url, timeout=10) as c:
        r = c.post("/topic", json={"topicName": "T", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6})
        assert r.status_code == 200, r.text
    return b


@pytest.mark.parametrize(("topic", "queue_id", "body", "params", "http", "code", "needle"), BAD_INPUT)
def test_bad_send_input(strict_broker: ServerProcess, topic: str, queue_id: Any, body: bytes,
                        params: dict[str, Any], http: int, code: int, needle: str) -> None:
    with httpx.Client(base_url=strict_broker.url, timeout=10) as c:
        r = c.post("/send", params={"topic": topic, "queueId": queue_id, **params}, content=body)
        assert (r.status_code, r.json()["code"]) == (http, code), r.text
        assert needle in r.json()["remark"]
        assert r.json()["broker"] == strict_broker.addr and r.json()["role"] == "ASYNC_MASTER"


def test_wrong_method_unknown_path_oversize_body(strict_broker: ServerProcess) -> None:
    with httpx.Client(base_url=strict_broker.url, timeout=10) as c:
        r = c.put("/send")
        assert (r.status_code, r.json()["code"]) == (405, 3) and "POST" in r.json()["remark"]
        r = c.get("/no/such/path")
        assert (r.status_code, r.json()["code"]) == (404, 3)
        r = c.post("/send", params={"topic": "T", "queueId": 0}, content=b"x" * 70000)
        assert (r.status_code, r.json()["code"]) == (413, 13)
        r = c.get("/pull", params={"group": "cg", "topic": "T", "queueId": 99, "offset": 0})
        assert (r.status_code, r.json()["code"]) == (400, 29) and "queueId 99" in r.json()["remark"]
        r = c.get("/pull", params={"group": "cg", "topic": "Missing", "queueId": 0, "offset": 0})
        assert (r.status_code, r.json()["code"]) == (404, 17)
        r = c.get("/runtime")
        assert r.json()["brokerName"] == "broker-a"
        assert "server" not in r.headers and "date" in r.headers, r.headers  # no banner; Date as RFC 9110 asks


def test_long_polling_over_http(strict_broker: ServerProcess) -> None:
    with httpx.Client(base_url=strict_broker.url, timeout=30) as c:
        start = c.get("/offset/max", params={"topic": "T", "queueId": 3}).json()["offset"]
        result: dict[str, Any] = {}

        def parked() -> None:
            t0 = time.monotonic()
            with httpx.Client(base_url=strict_broker.url, timeout=30) as c2:
                result["pull"] = pull(c2, "T", start, queue_id=3, sysFlag=int(PullSysFlag.SUSPEND),
                                      suspendTimeoutMs=20_000)
            result["elapsed"] = time.monotonic() - t0

        t = threading.Thread(target=parked)
        t.start()
        poll_until(lambda: c.get("/runtime").json()["parkedPulls"] == 1, 10, "the pull to park")
        assert send(c, "T", [b"wake"], queue_id=3).status_code == 200
        t.join(15)
        head, msgs = result["pull"]
        assert head.code == C.SUCCESS and [m.body for m in msgs] == [b"wake"]
        assert result["elapsed"] < 15


def test_graceful_restart_keeps_data_and_metadata(servers: Servers) -> None:
    props = {**SEEDS, "listenPort": "0"}
    b = servers.broker(props)
    with httpx.Client(base_url=b.url, timeout=10) as c:
        create_topic(c, "Keep")
        assert send(c, "Keep", [b"1", b"2"]).status_code == 200
        c.post("/offset/consumer", json={"group": "cg", "offsets": [{"topic": "Keep", "queueId": 0, "offset": 1}]})
        c.post("/subscription-group", json={"groupName": "cg", "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1})
    t0 = time.monotonic()
    assert b.stop(signal.SIGINT) == 0
    assert time.monotonic() - t0 < 10
    b2 = servers.broker(props)
    with httpx.Client(base_url=b2.url, timeout=10) as c:
        poll_until(lambda: pull(c, "Keep", 0)[0].code == C.SUCCESS, 5, "messages after restart")
        assert [m.body for m in pull(c, "Keep", 0)[1]] == [b"1", b"2"]
        assert c.get("/offset/consumer", params={"group": "cg", "topic": "Keep", "queueId": 0}).json() == {
            "offset": 1}
        assert "cg" in c.get("/subscription-groups").json()["subscriptionGroupTable"]


@pytest.mark.parametrize(("props", "needle"), [
    ({"listenPort": "abc"}, "listenPort='abc'"),
    ({"brokerRole": "SLAVE", "brokerId": "0"}, "Slave's brokerId must be > 0"),
    ({"namesrvAddr": "nohost"}, "namesrvAddr"),
])
def test_bad_config_exits_2(servers: Servers, props: dict[str, str], needle: str) -> None:
    path = write_properties(servers.workdir / "bad.properties", {**SEEDS, **props})
    rc, out, err = servers.run_to_exit(["-m", "broker", "-c", str(path)])
    assert rc == 2, err
    assert needle in err and out == ""


def test_corrupt_store_exits_3(servers: Servers) -> None:
    props = {**SEEDS}
    b = servers.broker(props)
    with httpx.Client(base_url=b.url, timeout=10) as c:
        create_topic(c, "Cor")
        r = send(c, "Cor", [b"x" * 100] * 5)
        offsets = decode_send_reply(r.content).commit_log_offsets
    assert b.stop() == 0
    log_file = servers.workdir / "store-broker" / "commitlog" / f"{0:020d}"
    with log_file.open("r+b") as f:  # break the magic of the second record, keep the ones after it intact
        f.seek(offsets[1] + 4)
        f.write(struct.pack(">i", 0x12345678))
    path = write_properties(servers.workdir / "again.properties",
                            {**props, "listenPort": "0", "storePathRootDir": str(servers.workdir / "store-broker"),
                             "mappedFileSizeCommitLog": str(1 << 20)})
    rc, out, err = servers.run_to_exit(["-m", "broker", "-c", str(path)])
    assert rc == 3, (rc, err[-2000:])
    assert "corrupt" in err and out == ""


def test_master_slave_split_sync_and_failover_reads(servers: Servers) -> None:
    ns = servers.nameserver()
    common = {"brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "namesrvAddr": ns.addr,
              "flushDiskType": "ASYNC_FLUSH", "registerNameServerPeriod": "500",
              "registerNameServerPeriodMinMs": "500", "slaveMetadataSyncInterval": "300"}
    master = servers.broker({**common, "brokerId": "0", "brokerRole": "SYNC_MASTER"}, name="master")
    slave = servers.broker({**common, "brokerId": "1", "brokerRole": "SLAVE"}, name="slave")
    assert slave.fields[1:3] == ("1", "SLAVE")
    with httpx.Client(base_url=master.url, timeout=10) as m, httpx.Client(base_url=slave.url, timeout=10) as s:
        assert m.post("/topic", json={"topicName": "HA", "readQueueNums": 2, "writeQueueNums": 2}).status_code == 200
        poll_until(lambda: s.get("/runtime").json()["masterLinkUp"] is True, 15,
                   f"the slave's HA link; slave log: {slave.log()[-1500:]}")
        r = send(m, "HA", [b"1", b"2", b"3"])
        assert decode_send_reply(r.content).code == C.SUCCESS  # SYNC_MASTER with a slave in sync
        poll_until(lambda: s.get("/offset/max", params={"topic": "HA", "queueId": 0}).json()["offset"] == 3, 10,
                   "replication and dispatch on the slave")
        poll_until(lambda: "HA" in s.get("/topics").json()["topicConfigTable"], 10, "topic sync to the slave")
        m.post("/offset/consumer", json={"group": "cg", "offsets": [{"topic": "HA", "queueId": 0, "offset": 2}]})
        poll_until(lambda: s.get("/offsets").json()["offsetTable"].get("HA@cg") == {"0": 2}, 10,
                   "offset sync to the slave")
        # decision 6: slaveReadEnable=false and the master is reachable -> go to the master
        head, msgs = pull(s, "HA", 0)
        assert (head.code, head.suggest_which_broker_id, head.served_by_broker_id, msgs) == (
            C.PULL_RETRY_IMMEDIATELY, 0, 1, [])
        r = send(s, "HA", [b"no"])
        assert (r.status_code, r.json()["code"]) == (503, 14) and "SLAVE" in r.json()["remark"]
        ha = m.get("/ha").json()
        assert ha["connectionCount"] == 1
        master.stop(signal.SIGKILL)
        poll_until(lambda: s.get("/runtime").json()["masterLinkUp"] is False, 30, "the slave to see the master gone")
        head, msgs = pull(s, "HA", 0)
        assert (head.code, head.served_by_broker_id, [x.body for x in msgs]) == (C.SUCCESS, 1, [b"1", b"2", b"3"])
