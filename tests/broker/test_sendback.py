"""Send-back (docs/BEHAVIOUR.md 8.3, broker side): the pure decisions, and ``POST /consumer/sendback`` over a real
file store -- retry topic with a delay, DLQ, the checks and their codes, and the full loop with the scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.processor.consumer_manager import ConsumerManageProcessor
from broker.processor.sendback import SendBackProcessor
from broker.retry import (
    SendBackTarget,
    build_send_back_properties,
    decide_send_back,
    reroute_retry_batch,
    retry_send_dlq_topic,
)
from broker.store.file_store import FileMessageStore
from common.codec import BatchItem, batch_item
from common.codes import BrokerRole, FlushDiskType, Perm
from common.properties import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    REAL_QID,
    REAL_TOPIC,
    RECONSUME_TIME,
    RETRY_TOPIC,
    UNIQ_KEY,
    decode_properties,
    encode_properties,
)
from remoting.router import Router
from tests.broker.delay_support import FakeClock, drain, make_service, make_store, put, read_all
from tests.broker.fakes import FakeHAService, make_controller
from tests.serving import serving

# --- pure decisions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reconsume", "max_times", "delay", "expected"), [
    (0, 16, 0, (SendBackTarget.RETRY, 3)),
    (1, 16, 0, (SendBackTarget.RETRY, 4)),
    (15, 16, 0, (SendBackTarget.RETRY, 18)),
    (16, 16, 0, (SendBackTarget.DLQ, 0)),
    (17, 16, 5, (SendBackTarget.DLQ, 0)),
    (0, 16, 1, (SendBackTarget.RETRY, 1)),      # the consumer's level wins
    (3, 16, -1, (SendBackTarget.DLQ, 0)),       # < 0: straight to the DLQ
    (0, 0, 0, (SendBackTarget.DLQ, 0)),         # no retries at all
    (2, 3, 0, (SendBackTarget.RETRY, 5)),
    (3, 3, 0, (SendBackTarget.DLQ, 0)),
])
def test_decide_send_back(reconsume: int, max_times: int, delay: int, expected: tuple[SendBackTarget, int]) -> None:
    assert decide_send_back(reconsume, max_times, delay) == expected


@pytest.mark.parametrize(("topic", "reconsume", "props", "group_max", "expected"), [
    ("%RETRY%g", 17, {MAX_RECONSUME_TIMES: "16"}, 16, "%DLQ%g"),
    ("%RETRY%g", 16, {MAX_RECONSUME_TIMES: "16"}, 16, None),
    ("%RETRY%g", 4, {MAX_RECONSUME_TIMES: "3"}, 16, "%DLQ%g"),
    ("%RETRY%g", 17, {}, 16, "%DLQ%g"),                     # no property: the group's retryMaxTimes
    ("%RETRY%g", 2, {MAX_RECONSUME_TIMES: "bad"}, 1, "%DLQ%g"),
    ("%RETRY%g", 0, {MAX_RECONSUME_TIMES: "-1"}, 16, "%DLQ%g"),
    ("Orders", 99, {MAX_RECONSUME_TIMES: "1"}, 16, None),  # only retry topics
])
def test_retry_send_dlq_topic(topic: str, reconsume: int, props: dict[str, str], group_max: int,
                              expected: str | None) -> None:
    assert retry_send_dlq_topic(topic, reconsume, props, group_max) == expected


def test_reroute_retry_batch_sends_over_limit_batches_to_the_dlq_without_delay() -> None:
    def item(body: bytes, props: dict[str, str]) -> BatchItem:
        return batch_item(body, encode_properties(props), born_timestamp=1)

    items = [item(b"a", {MAX_RECONSUME_TIMES: "3", DELAY: "4", "user": "x"}), item(b"b", {"TAGS": "TagB"})]
    assert reroute_retry_batch("%RETRY%g", 3, items, 16) is None
    assert reroute_retry_batch("Orders", 9, items, 1) is None
    assert reroute_retry_batch("%RETRY%g", 9, [], 1) is None
    topic, queue_id, out = reroute_retry_batch("%RETRY%g", 4, items, 16) or ("", -1, [])
    assert (topic, queue_id) == ("%DLQ%g", 0)
    first, second = (decode_properties(i.properties) for i in out)
    assert first == {MAX_RECONSUME_TIMES: "3", "user": "x"}
    assert (items[0].delay_level, out[0].delay_level) == (4, 0)  # the store must not delay the DLQ copy
    assert out[1] is items[1] and second["TAGS"] == "TagB"  # untouched items are not copied
    assert bytes(out[0].body) == b"a" and out[0].body_crc == items[0].body_crc


def test_build_send_back_properties_keeps_the_first_origin() -> None:
    first = build_send_back_properties({"user": "x", UNIQ_KEY: "U"}, original_topic="Orders", original_msg_id="U",
                                       reconsume_times=0, max_reconsume_times=16, delay_level=3)
    assert first == {"user": "x", UNIQ_KEY: "U", RETRY_TOPIC: "Orders", ORIGIN_MESSAGE_ID: "U",
                     RECONSUME_TIME: "1", MAX_RECONSUME_TIMES: "16", DELAY: "3"}
    again = build_send_back_properties(first, original_topic="%RETRY%g", original_msg_id="V", reconsume_times=1,
                                       max_reconsume_times=16, delay_level=0)
    assert again[RETRY_TOPIC] == "Orders" and again[ORIGIN_MESSAGE_ID] == "U"
    assert DELAY not in again and again[RECONSUME_TIME] == "2"


# --- the endpoint ---------------------------------------------------------------------------------------------------

Scenario = Callable[[Any, httpx.AsyncClient, FileMessageStore], Awaitable[Any]]


def run(tmp_path: Path, scenario: Scenario, *, clock: FakeClock | None = None, role: BrokerRole =
        BrokerRole.ASYNC_MASTER, **config: Any) -> Any:
    """A controller (not started) over a real file store, with the send-back and consumer-management routes (the
    send-back's retry queue choice made predictable)."""
    clock = clock or FakeClock()
    store = make_store(tmp_path / "store", clock)

    async def main() -> Any:
        ctrl = make_controller(tmp_path, role=role, store=store, **config)  # type: ignore[arg-type]
        send_back = SendBackProcessor(ctrl.config, addr=ctrl.addr, store=store, topics=ctrl.topics,
                                      groups=ctrl.groups, metrics=ctrl.metrics, durability=ctrl.durability,
                                      request_registration=ctrl.request_registration, rand=lambda lo, hi: hi)
        consumers = ConsumerManageProcessor(ctrl.config, addr=ctrl.addr, clients=ctrl.clients, offsets=ctrl.offsets,
                                            last_pulls=ctrl.last_pulls, topics=ctrl.topics, groups=ctrl.groups,
                                            request_registration=ctrl.request_registration, clock_ms=clock)
        routes = {**send_back.routes(), **consumers.routes()}
        router = Router(routes, max_body_bytes=1 << 20, identity=lambda: (ctrl.addr, ctrl.role_name))
        async with serving(router) as client:
            return await scenario(ctrl, client, store)

    try:
        return asyncio.run(main())
    finally:
        store.shutdown()


def _original(store: FileMessageStore, reconsume_times: int = 0) -> int:
    r = put(store, "Orders", b"payload", queue_id=2, reconsume_times=reconsume_times, flag=3,
            props={UNIQ_KEY: "UID1", "TAGS": "TagA", "KEYS": "k1"})
    return r.wrote_offset


def _body(offset: int, **kw: Any) -> dict[str, Any]:
    return {"group": "g", "offset": offset, "originMsgId": "UID1", "originTopic": "Orders", **kw}


def test_send_back_goes_to_the_retry_topic_with_a_delay(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        offset = _original(store)
        r = await client.post("/consumer/sendback", json=_body(offset))
        assert (r.status_code, r.json()) == (200, {})
        [m] = read_all(store, "SCHEDULE_TOPIC_XXXX", 2)  # level 3 with "1s 2s 3s" -> queue 2
        assert (m.body, m.flag, m.reconsume_times, m.born_host) == (b"payload", 3, 1, "10.1.2.3:40123")
        assert m.properties[REAL_TOPIC] == "%RETRY%g" and m.properties[REAL_QID] == "0"
        assert m.properties[RETRY_TOPIC] == "Orders"
        assert m.properties[ORIGIN_MESSAGE_ID] == "UID1"
        assert m.properties[DELAY] == "3" and m.properties["TAGS"] == "TagA"
        assert m.properties[RECONSUME_TIME] == "1" and m.properties[MAX_RECONSUME_TIMES] == "16"
        tc = ctrl.topics.get("%RETRY%g")
        assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (1, 1, int(Perm.READ | Perm.WRITE))
        assert ctrl.groups.get("g") is not None  # auto-created

    run(tmp_path, scenario)


@pytest.mark.parametrize(("reconsume", "extra"), [(16, {}), (0, {"delayLevel": -1}), (2, {"maxReconsumeTimes": 2})])
def test_send_back_goes_to_the_dlq(tmp_path: Path, reconsume: int, extra: dict[str, int]) -> None:
    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        offset = _original(store, reconsume_times=reconsume)
        r = await client.post("/consumer/sendback", json=_body(offset, **extra))
        assert r.status_code == 200, r.text
        [m] = read_all(store, "%DLQ%g", 0)
        assert m.reconsume_times == reconsume + 1 and DELAY not in m.properties
        assert m.properties[RETRY_TOPIC] == "Orders"
        tc = ctrl.topics.get("%DLQ%g")
        assert (tc.write_queue_nums, tc.perm) == (1, int(Perm.READ | Perm.WRITE))
        assert read_all(store, "SCHEDULE_TOPIC_XXXX", 2) == []

    run(tmp_path, scenario)


def test_retry_queue_nums_zero_drops_the_message(tmp_path: Path) -> None:
    from broker.metadata.subscription_groups import SubscriptionGroupConfig

    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        ctrl.groups.update(SubscriptionGroupConfig(group_name="g", retry_queue_nums=0))
        offset = _original(store)
        before = store.max_physical_offset
        r = await client.post("/consumer/sendback", json=_body(offset))
        assert (r.status_code, r.json()) == (200, {})
        assert store.max_physical_offset == before

    run(tmp_path, scenario)


@pytest.mark.parametrize(("setup", "body", "code", "remark"), [
    ("none", {"group": "g", "offset": 123456}, 29, "offset 123456 is not the start of a message"),
    ("none", {"group": "g"}, 29, "'offset' is missing"),
    ("none", {"group": "g", "offset": -1}, 29, "'offset'=-1"),
    ("none", {"group": "bad group", "offset": 0}, 29, "group"),
    ("none", {"group": "g", "offset": 0, "delayLevel": "x"}, 29, "'delayLevel'"),
    ("no-autocreate", {"group": "g", "offset": 0}, 26, "subscription group not exist, g"),
    ("slave", {"group": "g", "offset": 0}, 14, "SLAVE"),
    ("read-only", {"group": "g", "offset": 0}, 16, "brokerPermission=4"),
    ("retry-read-only", {"group": "g", "offset": 0}, 16, "%RETRY%g"),
])
def test_send_back_errors(tmp_path: Path, setup: str, body: dict[str, Any], code: int, remark: str) -> None:
    from common.route import TopicConfig

    config: dict[str, Any] = {}
    role = BrokerRole.ASYNC_MASTER
    if setup == "no-autocreate":
        config["auto_create_subscription_group"] = False
    elif setup == "slave":
        role = BrokerRole.SLAVE
    elif setup == "read-only":
        config["broker_permission"] = int(Perm.READ)

    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        if setup == "retry-read-only":
            ctrl.topics.update(TopicConfig("%RETRY%g", 1, 1, int(Perm.READ)))
        r = await client.post("/consumer/sendback", json=body)
        err = r.json()
        assert err["code"] == code, err
        assert remark in err["remark"], err
        assert err["role"] == role.value

    run(tmp_path, scenario, role=role, **config)


def test_send_back_not_json(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        r = await client.post("/consumer/sendback", content=b"{nope")
        assert r.json()["code"] == 29

    run(tmp_path, scenario)


@pytest.mark.parametrize(("slave_ok", "ack", "flush", "code"), [
    (False, True, FlushDiskType.ASYNC_FLUSH, "SLAVE_NOT_AVAILABLE"),
    (True, False, FlushDiskType.ASYNC_FLUSH, "FLUSH_SLAVE_TIMEOUT"),
    (True, True, FlushDiskType.ASYNC_FLUSH, None),
    (True, True, FlushDiskType.SYNC_FLUSH, None),
])
def test_send_back_on_a_sync_master_waits_for_the_slave(tmp_path: Path, slave_ok: bool, ack: bool,
                                                        flush: FlushDiskType, code: str | None) -> None:
    ha = FakeHAService(slave_ok=slave_ok, ack=ack)

    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        r = await client.post("/consumer/sendback", json=_body(_original(store)))
        if code is None:
            assert r.status_code == 200, r.text
        else:
            assert r.json()["code"] == 1 and r.json()["remark"].startswith(code), r.text
        assert len(read_all(store, "SCHEDULE_TOPIC_XXXX", 2)) == 1  # stored either way, as in RocketMQ

    run(tmp_path, scenario, role=BrokerRole.SYNC_MASTER, ha_service=ha, flush_disk_type=flush)


def test_send_back_then_schedule_brings_it_back_to_the_group(tmp_path: Path) -> None:
    """The whole loop: fail, send back with level 1 (1 s), the scheduler puts it into %RETRY%g after 1 s."""
    clock = FakeClock()

    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        svc, _ = make_service(store, tmp_path / "store", clock)
        offset = _original(store)
        r = await client.post("/consumer/sendback", json=_body(offset, delayLevel=1))
        assert r.status_code == 200
        drain(store)  # the controller is not started here: no dispatch task
        assert svc.deliver_due() == 0
        clock.advance(1000)
        assert svc.deliver_due() == 1
        [m] = read_all(store, "%RETRY%g", 0)
        assert (m.body, m.reconsume_times, m.properties[RETRY_TOPIC]) == (b"payload", 1, "Orders")
        assert REAL_TOPIC not in m.properties and DELAY not in m.properties
        # consumed and failed again: the second send-back counts from the retry copy
        r = await client.post("/consumer/sendback", json=_body(m.commit_log_offset, maxReconsumeTimes=1))
        assert r.status_code == 200
        [dead] = read_all(store, "%DLQ%g", 0)
        assert dead.reconsume_times == 2 and dead.properties[ORIGIN_MESSAGE_ID] == "UID1"

    run(tmp_path, scenario, clock=clock)


# --- consumer ids ---------------------------------------------------------------------------------------------------

def test_consumer_ids_lists_live_clients_sorted(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        ctrl.clients._clock_ms = clock  # the table stamps heartbeats with the same clock
        for cid in ("c-2", "c-1"):
            ctrl.clients.heartbeat(cid, [], [{"group": "g", "subscriptions": [{"topic": "T"}]}])
        clock.advance(60_000)
        ctrl.clients.heartbeat("c-3", [], [{"group": "g"}])
        assert (await client.get("/consumer/ids", params={"group": "g"})).json() == {
            "clientIds": ["c-1", "c-2", "c-3"]}
        clock.advance(60_001)  # c-1 and c-2 silent for 120.001 s: gone even before the sweep
        assert (await client.get("/consumer/ids", params={"group": "g"})).json() == {"clientIds": ["c-3"]}
        assert (await client.get("/consumer/ids", params={"group": "other"})).json() == {"clientIds": []}
        r = await client.get("/consumer/ids")
        assert r.json()["code"] == 29 and "group" in r.json()["remark"]
        r = await client.get("/consumer/ids", params={"group": "a/b"})
        assert r.json()["code"] == 29

    run(tmp_path, scenario, clock=clock)


def test_live_client_ids_boundary(tmp_path: Path) -> None:
    from broker.clients import ClientInfo
    from broker.processor.consumer_manager import live_client_ids

    clients = {"a": ClientInfo("a", 1000), "b": ClientInfo("b", 999), "c": ClientInfo("c", 5000)}
    assert live_client_ids(clients, 121_000) == ["a", "c"]
    assert live_client_ids(clients, 5000, expire_ms=1) == ["c"]
    assert live_client_ids({}, 0) == []
    ctrl = make_controller(tmp_path, http_client=object())
    with pytest.raises(ValueError, match="expire_ms"):
        ConsumerManageProcessor(ctrl.config, addr=ctrl.addr, clients=ctrl.clients, offsets=ctrl.offsets,
                                last_pulls=ctrl.last_pulls, topics=ctrl.topics, groups=ctrl.groups,
                                request_registration=ctrl.request_registration, clock_ms=FakeClock(), expire_ms=0)


def test_protocol_doc_lists_the_new_endpoints() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    for needle in ("POST /consumer/sendback", "GET /consumer/ids", "delayDelivery.json"):
        assert needle in text


def test_send_back_at_an_offset_that_is_not_a_record_start_is_a_4xx(tmp_path: Path) -> None:
    """Every offset inside the first record, and past the log's end, is the client's mistake: a 4xx naming it."""
    async def scenario(ctrl: Any, client: httpx.AsyncClient, store: FileMessageStore) -> None:
        offset = _original(store)
        size = store.max_physical_offset - offset
        before = store.max_physical_offset
        statuses = {}
        for o in [*range(offset + 1, offset + size), before, before + 123456, 1 << 62]:
            r = await client.post("/consumer/sendback", json=_body(o))
            err = r.json()
            statuses[o] = r.status_code
            assert 400 <= r.status_code < 500 and err["code"] == 29, (o, r.status_code, err)
            assert f"offset {o}" in err["remark"] and "not the start of a message" in err["remark"], err
        assert store.max_physical_offset == before
        assert len(statuses) == size + 2

    run(tmp_path, scenario)
