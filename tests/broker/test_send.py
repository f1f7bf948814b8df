"""``POST /send`` against a fake store: codes, remarks, auto-create, durability waits (docs/BEHAVIOUR.md 2.9-2.11)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from broker.store.api import PutMessageStatus
from common.codec import BATCH_ITEM_HEAD, BATCH_MAGIC, body_crc, encode_batch
from common.codes import BrokerRole, FlushDiskType, ResponseCode
from common.message import Message
from common.properties import encode_properties
from common.wire import decode_send_reply
from tests.broker.fakes import STORE_HOST, FakeHAService, FakeStore, run_with_broker


def batch(topic: str = "T", n: int = 1, body: bytes = b"hello", **kw: Any) -> bytes:
    return encode_batch([Message(topic, body, **kw) for _ in range(n)], born_timestamp_ms=1)


async def send(client: Any, body: bytes, topic: str = "T", queue_id: int | str = 0, **params: Any) -> Any:
    return await client.post("/send", params={"topic": topic, "queueId": queue_id, "group": "pg", **params},
                             content=body)


def error(r: Any) -> tuple[int, int, str]:
    body = r.json()
    return r.status_code, body["code"], body["remark"]


def test_send_ok_reply(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, batch(n=3))
        assert r.status_code == 200
        reply = decode_send_reply(r.content)
        assert (reply.code, reply.queue_id, reply.queue_offset, reply.store_host) == (0, 0, 0, STORE_HOST)
        assert len(reply.commit_log_offsets) == 3
        r = await send(client, batch())
        assert decode_send_reply(r.content).queue_offset == 3
        assert ctrl.ha_service.notified == 2

    run_with_broker(tmp_path, scenario)


def test_auto_create_topic_queue_count(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        assert (await send(client, batch("Auto1"), "Auto1")).status_code == 200
        assert ctrl.topics.get("Auto1").write_queue_nums == 4
        assert (await send(client, batch("Auto2"), "Auto2", defaultTopicQueueNums=2)).status_code == 200
        assert ctrl.topics.get("Auto2").write_queue_nums == 2
        assert (await send(client, batch("Auto3"), "Auto3", defaultTopicQueueNums=64)).status_code == 200
        assert ctrl.topics.get("Auto3").write_queue_nums == 8
        status, code, remark = error(await send(client, batch("Auto2"), "Auto2", queue_id=2))
        assert (status, code) == (400, ResponseCode.INVALID_PARAMETER)
        assert "queueId 2" in remark and "Auto2" in remark and "broker-a" in remark

    run_with_broker(tmp_path, scenario)


def test_unknown_topic_without_auto_create(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        status, code, remark = error(await send(client, batch("Nope"), "Nope"))
        assert (status, code) == (404, ResponseCode.TOPIC_NOT_EXIST)
        assert "Nope" in remark and "broker-a" in remark
        assert ctrl.topics.get("Nope") is None

    run_with_broker(tmp_path, scenario, auto_create_topic_enable=False)


def test_retry_topic_is_created_even_without_auto_create(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, batch("%RETRY%cg"), "%RETRY%cg")
        assert r.status_code == 200
        assert ctrl.topics.get("%RETRY%cg").write_queue_nums == 1

    run_with_broker(tmp_path, scenario, auto_create_topic_enable=False)


def test_slave_refuses_writes(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, batch())
        status, code, remark = error(r)
        assert (status, code) == (503, ResponseCode.SERVICE_NOT_AVAILABLE)
        assert "broker-a" in remark and "SLAVE" in remark
        assert r.json()["role"] == "SLAVE" and r.json()["broker"] == "127.0.0.1:10911"

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE)


@pytest.mark.parametrize(
    ("body", "topic", "queue_id", "http", "code", "needle"),
    [
        (b"", "T", 0, 400, 13, "empty"),
        (b"\x00\x00\x00\x30garbage", "T", 0, 400, 13, "truncated"),
        (batch()[:-3], "T", 0, 400, 13, "truncated"),
        (b"\x00" * 40, "T", 0, 400, 13, "magic"),
        (batch(), "bad/topic", 0, 400, 13, "bad/topic"),
        (batch(), "a" * 200, 0, 400, 13, "longer than 127"),
        (batch(), "T", 99, 400, 29, "queueId 99"),
        (batch(), "T", -1, 400, 29, "queueId -1"),
        (batch(), "T", "x", 400, 29, "queueId"),
        (batch(), "SCHEDULE_TOPIC_XXXX", 0, 403, 16, "forbidden"),
    ],
)
def test_bad_input(tmp_path: Path, body: bytes, topic: str, queue_id: Any, http: int, code: int, needle: str) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        status, got, remark = error(await send(client, body, topic, queue_id))
        assert (status, got) == (http, code), remark
        assert needle in remark

    run_with_broker(tmp_path, scenario)


def test_crc_mismatch_refused(tmp_path: Path) -> None:
    body = bytearray(batch())
    struct.pack_into(">i", body, 8, 12345)

    async def scenario(ctrl: Any, client: Any) -> None:
        status, code, remark = error(await send(client, bytes(body)))
        assert (status, code) == (400, 13) and "CRC" in remark

    run_with_broker(tmp_path, scenario)


def test_oversize_message(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        status, code, remark = error(await send(client, batch(body=b"x" * 2000)))
        assert (status, code) == (400, 13) and "maxMessageSize 1024" in remark
        assert (await send(client, batch(body=b"x" * 100))).status_code == 200

    run_with_broker(tmp_path, scenario, max_message_size=1024)


def test_body_over_request_limit_is_413(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, b"x" * 5000)
        assert (r.status_code, r.json()["code"]) == (413, 13)

    run_with_broker(tmp_path, scenario, max_request_body_bytes=4096)


def test_missing_arguments(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/send", params={"queueId": 0}, content=batch())
        assert (r.status_code, r.json()["code"]) == (400, 29) and "'topic'" in r.json()["remark"]
        r = await client.post("/send", params={"topic": "T"}, content=batch())
        assert (r.status_code, r.json()["code"]) == (400, 29) and "'queueId'" in r.json()["remark"]

    run_with_broker(tmp_path, scenario)


def test_permissions(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        status, code, remark = error(await send(client, batch()))
        assert (status, code) == (403, 16) and "brokerPermission=4" in remark

    run_with_broker(tmp_path, scenario, broker_permission=4)

    async def topic_perm(ctrl: Any, client: Any) -> None:
        r = await client.post("/topic", json={"topicName": "RO", "readQueueNums": 2, "writeQueueNums": 2, "perm": 4})
        assert r.status_code == 200
        status, code, remark = error(await send(client, batch("RO"), "RO"))
        assert (status, code) == (403, 16) and "RO" in remark

    run_with_broker(tmp_path / "2", topic_perm)


def test_a_query_sent_again_is_checked_against_the_brokers_state_each_time(tmp_path: Path) -> None:
    """The send processor keeps the headers whose arguments and topic name passed, by their query; what depends on
    the broker's state (the topic's permission, its queues) is checked on every send, and a query that failed its
    checks is checked again."""
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/topic", json={"topicName": "P", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
        assert r.status_code == 200
        for _ in range(2):
            assert (await send(client, batch("P"), "P", queue_id=1)).status_code == 200
        r = await client.post("/topic", json={"topicName": "P", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        assert r.status_code == 200
        status, code, remark = error(await send(client, batch("P"), "P", queue_id=1))
        assert (status, code) == (400, ResponseCode.INVALID_PARAMETER) and "queueId 1" in remark
        r = await client.post("/topic", json={"topicName": "P", "readQueueNums": 2, "writeQueueNums": 2, "perm": 4})
        assert r.status_code == 200
        status, code, remark = error(await send(client, batch("P"), "P", queue_id=1))
        assert (status, code) == (403, 16) and "P" in remark
        for _ in range(2):  # refused, then refused again (never kept as checked)
            status, code, remark = error(await send(client, batch(), "bad/topic"))
            assert (status, code) == (400, 13) and "bad/topic" in remark
        assert ctrl.topics.get("bad/topic") is None

    run_with_broker(tmp_path, scenario)


def test_wrong_method_and_unknown_path(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.get("/send")
        assert (r.status_code, r.json()["code"]) == (405, 3)
        r = await client.get("/nope")
        assert (r.status_code, r.json()["code"]) == (404, 3)

    run_with_broker(tmp_path, scenario)


@pytest.mark.parametrize(
    ("status", "http", "code"),
    [
        (PutMessageStatus.MESSAGE_ILLEGAL, 400, 13),
        (PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, 400, 13),
        (PutMessageStatus.SERVICE_NOT_AVAILABLE, 503, 14),
        (PutMessageStatus.OS_PAGE_CACHE_BUSY, 503, 2),
        (PutMessageStatus.CREATE_MAPPED_FILE_FAILED, 503, 14),
        (PutMessageStatus.UNKNOWN_ERROR, 500, 1),
    ],
)
def test_store_failure_mapping(tmp_path: Path, status: PutMessageStatus, http: int, code: int) -> None:
    store = FakeStore()
    store.fail_next = status

    async def scenario(ctrl: Any, client: Any) -> None:
        got_status, got, remark = error(await send(client, batch()))
        assert (got_status, got) == (http, code)
        assert status.value in remark and "topic T queue 0" in remark

    run_with_broker(tmp_path, scenario, store=store)


# --- durability: SYNC_FLUSH and SYNC_MASTER (replica status wins) ------------------------------------------


F_ASYNC, F_SYNC = FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH
R_ASYNC, R_SYNC = BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER
C = ResponseCode


@pytest.mark.parametrize(
    ("flush", "role", "flush_ok", "slave_ok", "ack", "expected"),
    [
        (F_ASYNC, R_ASYNC, False, False, False, C.SUCCESS),
        (F_SYNC, R_ASYNC, True, False, False, C.SUCCESS),
        (F_SYNC, R_ASYNC, False, False, False, C.FLUSH_DISK_TIMEOUT),
        (F_ASYNC, R_SYNC, False, True, True, C.SUCCESS),
        (F_ASYNC, R_SYNC, False, False, True, C.SLAVE_NOT_AVAILABLE),
        (F_ASYNC, R_SYNC, False, True, False, C.FLUSH_SLAVE_TIMEOUT),
        (F_SYNC, R_SYNC, False, True, True, C.FLUSH_DISK_TIMEOUT),
        (F_SYNC, R_SYNC, False, True, False, C.FLUSH_SLAVE_TIMEOUT),
        (F_SYNC, R_SYNC, False, False, True, C.SLAVE_NOT_AVAILABLE),
        (F_SYNC, R_SYNC, True, True, True, C.SUCCESS),
    ],
)
def test_durability_codes(tmp_path: Path, flush: FlushDiskType, role: BrokerRole, flush_ok: bool, slave_ok: bool,
                          ack: bool, expected: ResponseCode) -> None:
    ha = FakeHAService(slave_ok=slave_ok, ack=ack)

    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, batch(n=2))
        assert r.status_code == 200
        assert decode_send_reply(r.content).code == expected
        if role is R_SYNC and slave_ok:
            assert ha.waits == [(ctrl.store.max_physical_offset, 2.0)]  # syncFlushTimeout 2000 ms
        else:
            assert ha.waits == []

    run_with_broker(tmp_path, scenario, store=FakeStore(flush_ok=flush_ok), ha_service=ha, flush_disk_type=flush,
                    role=role)


def test_slave_ack_timeout_is_bounded(tmp_path: Path) -> None:
    ha = FakeHAService(slave_ok=True, ack=None)  # completes False only at its timeout

    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, batch())
        assert decode_send_reply(r.content).code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert ha.waits[0][1] == 0.2

    run_with_broker(tmp_path, scenario, ha_service=ha, role=BrokerRole.SYNC_MASTER, sync_flush_timeout_ms=200)


def raw_item(body: bytes, props: dict[str, str]) -> bytes:
    p = encode_properties(props)
    return BATCH_ITEM_HEAD.pack(34 + len(body) + len(p), BATCH_MAGIC, body_crc(body), 0, 0, 1, len(body)) + body + \
        struct.pack(">H", len(p)) + p


def test_wait_false_skips_durability_wait(tmp_path: Path) -> None:
    ha = FakeHAService(slave_ok=False)

    async def scenario(ctrl: Any, client: Any) -> None:
        r = await send(client, raw_item(b"x", {"WAIT": "false"}) * 2)
        assert decode_send_reply(r.content).code == ResponseCode.SUCCESS
        r = await send(client, raw_item(b"x", {"WAIT": "false"}) + raw_item(b"y", {"WAIT": "true"}))
        assert decode_send_reply(r.content).code == ResponseCode.SLAVE_NOT_AVAILABLE

    run_with_broker(tmp_path, scenario, ha_service=ha, role=BrokerRole.SYNC_MASTER)


def test_metrics_count_stored_messages(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await send(client, batch(n=3))
        text = (await client.get("/metrics")).text
        assert 'rocketmq_messages_in_total{cluster="DefaultCluster",node_id="broker-a-0",node_type="broker",topic="T"} 3.0' in text
        assert "rocketmq_throughput_in_total" in text

    run_with_broker(tmp_path, scenario)
