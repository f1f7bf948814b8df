"""``GET /pull`` against a fake store: pre-checks in order, tag filters, read/write split on slaves, offset
commits, long polling (woken by dispatch, bounded by its deadline and by ``maxParkedPulls``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from common.codec import decode_records, encode_batch
from common.codes import BrokerRole, PullSysFlag, ResponseCode
from common.message import Message
from common.wire import PULL_HEAD, PullHeader, decode_pull_header
from tests.broker.fakes import FakeHAClient, FakeStore, run_with_broker
from tests.waiting import wait_until

C = ResponseCode


async def put(ctrl: Any, client: Any, topic: str = "T", n: int = 1, queue_id: int = 0, tags: str | None = None
              ) -> None:
    body = encode_batch([Message(topic, f"m{i}".encode(), tags=tags) for i in range(n)], born_timestamp_ms=1)
    r = await client.post("/send", params={"topic": topic, "queueId": queue_id}, content=body)
    assert r.status_code == 200, r.text
    ctrl.store.dispatch_available()


async def pull(client: Any, offset: int = 0, topic: str = "T", queue_id: int = 0, group: str = "cg",
               **params: Any) -> tuple[PullHeader, list[Any]]:
    r = await client.get("/pull", params={"group": group, "topic": topic, "queueId": queue_id, "offset": offset,
                                          **params})
    assert r.status_code == 200, r.text
    head = decode_pull_header(r.content)
    return head, decode_records(r.content[PULL_HEAD.size:])


def error(r: Any) -> tuple[int, int, str]:
    return r.status_code, r.json()["code"], r.json()["remark"]


def test_pull_found_and_next_offsets(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=5)
        head, msgs = await pull(client, 0, maxNums=3)
        assert (head.code, head.next_begin_offset, head.min_offset, head.max_offset, head.count) == (0, 3, 0, 5, 3)
        assert (head.suggest_which_broker_id, head.served_by_broker_id) == (0, 0)
        assert [m.body for m in msgs] == [b"m0", b"m1", b"m2"]
        head, _ = await pull(client, 5)
        assert (head.code, head.next_begin_offset) == (C.PULL_NOT_FOUND, 5)
        head, _ = await pull(client, 9)
        assert head.code == C.PULL_OFFSET_MOVED
        head, _ = await pull(client, 0, queue_id=1)
        assert (head.code, head.count) == (C.PULL_NOT_FOUND, 0)
        head, _ = await pull(client, 3, queue_id=1)
        assert head.code == C.PULL_OFFSET_MOVED
        text = (await client.get("/metrics")).text
        assert 'splitmq_pull_served_total{role="ASYNC_MASTER"} 3.0' in text
        assert 'rocketmq_messages_out_total{cluster="DefaultCluster",node_id="broker-a-0",node_type="broker",topic="T"} 3.0' in text

    run_with_broker(tmp_path, scenario)


def test_tag_filter(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=2, tags="A")
        await put(ctrl, client, n=1, tags="B")
        _, msgs = await pull(client, 0, subExpression="B")
        assert [m.tags for m in msgs] == ["B"]
        _, msgs = await pull(client, 0, subExpression=" A || B ")
        assert len(msgs) == 3
        head, msgs = await pull(client, 0, subExpression="C")
        assert (head.code, msgs) == (C.PULL_RETRY_IMMEDIATELY, [])
        for bad in ("||", " || ", "A\x01B"):
            r = await client.get("/pull", params={"group": "cg", "topic": "T", "queueId": 0, "offset": 0,
                                                  "subExpression": bad})
            assert (r.status_code, r.json()["code"]) == (400, 23)

    run_with_broker(tmp_path, scenario)


@pytest.mark.parametrize(
    ("params", "http", "code", "needle"),
    [
        ({"topic": "Missing"}, 404, 17, "topic[Missing] not exist"),
        ({"queueId": 4}, 400, 29, "queueId 4"),
        ({"queueId": -1}, 400, 29, "queueId -1"),
        ({"offset": -1}, 400, 29, "'offset'"),
        ({"offset": "abc"}, 400, 29, "'offset'"),
        ({"offset": str(2**70)}, 400, 29, "'offset'"),
        ({"maxNums": 0}, 400, 29, "'maxNums'"),
        ({"group": "bad group"}, 400, 29, "'group'"),
        ({"topic": "bad/topic"}, 400, 29, "'topic'"),
        ({"sysFlag": "-3"}, 400, 29, "'sysFlag'"),
    ],
)
def test_pull_bad_input(tmp_path: Path, params: dict[str, Any], http: int, code: int, needle: str) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client)
        q = {"group": "cg", "topic": "T", "queueId": 0, "offset": 0, **params}
        status, got, remark = error(await client.get("/pull", params=q))
        assert (status, got) == (http, code), remark
        assert needle in remark

    run_with_broker(tmp_path, scenario)


def test_pull_group_and_permission_checks(tmp_path: Path) -> None:
    async def no_auto_group(ctrl: Any, client: Any) -> None:
        await put(ctrl, client)
        status, code, remark = error(await client.get("/pull", params={"group": "g1", "topic": "T", "queueId": 0,
                                                                        "offset": 0}))
        assert (status, code) == (404, 26) and "g1" in remark
        r = await client.post("/subscription-group", json={"groupName": "g1", "consumeEnable": False})
        assert r.status_code == 200
        status, code, remark = error(await client.get("/pull", params={"group": "g1", "topic": "T", "queueId": 0,
                                                                        "offset": 0}))
        assert (status, code) == (403, 16) and "consumeEnable=false" in remark

    run_with_broker(tmp_path, no_auto_group, auto_create_subscription_group=False)

    async def unreadable(ctrl: Any, client: Any) -> None:
        status, code, _ = error(await client.get("/pull", params={"group": "g", "topic": "T", "queueId": 0,
                                                                   "offset": 0}))
        assert (status, code) == (403, 16)

    run_with_broker(tmp_path / "b", unreadable, broker_permission=2)

    async def topic_not_readable(ctrl: Any, client: Any) -> None:
        await client.post("/topic", json={"topicName": "WO", "readQueueNums": 1, "writeQueueNums": 1, "perm": 2})
        status, code, remark = error(await client.get("/pull", params={"group": "g", "topic": "WO", "queueId": 0,
                                                                        "offset": 0}))
        assert (status, code) == (403, 16) and "WO" in remark

    run_with_broker(tmp_path / "c", topic_not_readable)


def test_commit_offset_flag_on_master(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=2)
        await pull(client, 0, sysFlag=int(PullSysFlag.COMMIT_OFFSET), commitOffset=1)
        assert ctrl.offsets.query("cg", "T", 0) == 1
        await pull(client, 0, commitOffset=2)  # no flag: not stored
        assert ctrl.offsets.query("cg", "T", 0) == 1
        await pull(client, 0, sysFlag=int(PullSysFlag.COMMIT_OFFSET), commitOffset=2)
        assert ctrl.offsets.query("cg", "T", 0) == 2
        # A stale piggy-back (the previous owner's pull, in flight during its hand-over commit) never moves the
        # offset back; an explicit commit still may (a seek, an admin reset).
        await pull(client, 0, sysFlag=int(PullSysFlag.COMMIT_OFFSET), commitOffset=1)
        assert ctrl.offsets.query("cg", "T", 0) == 2
        r = await client.post("/offset/consumer", json={"group": "cg", "offsets": [
            {"topic": "T", "queueId": 0, "offset": 0}]})
        assert r.status_code == 200 and ctrl.offsets.query("cg", "T", 0) == 0

    run_with_broker(tmp_path, scenario)


def _slave_store_with_messages(n: int, suggest_slave: bool = False) -> FakeStore:
    """A slave's store that already holds replicated messages (written as if by a master)."""
    store = FakeStore(BrokerRole.ASYNC_MASTER, suggest_slave=suggest_slave)
    items = encode_batch([Message("T", f"m{i}".encode()) for i in range(n)], born_timestamp_ms=1)
    from common.codec import decode_batch

    store.append_batch("T", 0, decode_batch(items), born_host=b"\x7f\x00\x00\x01\x00\x00\x00\x01")
    store.dispatch_available()
    store.role = BrokerRole.SLAVE
    return store


def _slave_topic(ctrl: Any) -> None:
    from common.route import TopicConfig

    ctrl.topics.update(TopicConfig("T", 4, 4))


def test_slave_without_read_enable_redirects_while_master_link_up(tmp_path: Path) -> None:
    link = FakeHAClient(connected=True)

    async def scenario(ctrl: Any, client: Any) -> None:
        _slave_topic(ctrl)
        head, msgs = await pull(client, 0)
        assert (head.code, head.suggest_which_broker_id, head.served_by_broker_id, msgs) == (
            C.PULL_RETRY_IMMEDIATELY, 0, 1, [])
        assert (head.next_begin_offset, head.max_offset) == (0, 3)
        link.connected = False  # master unreachable: the slave serves
        head, msgs = await pull(client, 0)
        assert (head.code, head.suggest_which_broker_id, head.served_by_broker_id, len(msgs)) == (C.SUCCESS, 0, 1, 3)
        # commit offsets piggy-backed on a pull are ignored on a slave
        await pull(client, 0, sysFlag=1, commitOffset=2)
        assert ctrl.offsets.query("cg", "T", 0) is None
        assert 'splitmq_pull_served_total{role="SLAVE"} 6.0' in (await client.get("/metrics")).text

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE, store=_slave_store_with_messages(3), ha_client=link)


def test_slave_with_read_enable_serves_and_suggests(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        _slave_topic(ctrl)
        head, msgs = await pull(client, 0)
        assert (head.code, head.suggest_which_broker_id, len(msgs)) == (C.SUCCESS, 0, 3)

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE, store=_slave_store_with_messages(3),
                    slave_read_enable=True)


def test_slave_serves_a_replicated_queue_before_the_topic_config_is_synced(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        assert ctrl.topics.get("T") is None  # the metadata sync has not run yet
        head, msgs = await pull(client, 0)
        assert (head.code, len(msgs)) == (C.SUCCESS, 3)
        r = await client.get("/pull", params={"group": "cg", "topic": "T", "queueId": 1, "offset": 0})
        assert error(r)[:2] == (404, C.TOPIC_NOT_EXIST)  # no replicated data in that queue: still unknown

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE, store=_slave_store_with_messages(3),
                    slave_read_enable=True)


def test_master_suggests_slave_for_lagging_consumer(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=2)
        head, _ = await pull(client, 0)
        assert (head.code, head.suggest_which_broker_id) == (C.SUCCESS, 1)
        await client.post("/subscription-group", json={"groupName": "cg2", "whichBrokerWhenConsumeSlowly": 2})
        head, _ = await pull(client, 0, group="cg2")
        assert head.suggest_which_broker_id == 2

    run_with_broker(tmp_path, scenario, store=FakeStore(suggest_slave=True), slave_read_enable=True)


def test_offset_moved_on_slave_becomes_retry(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        _slave_topic(ctrl)
        await client.post("/subscription-group", json={"groupName": "cg", "brokerId": 0})
        head, _ = await pull(client, 10)
        assert (head.code, head.suggest_which_broker_id) == (C.PULL_RETRY_IMMEDIATELY, 0)

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE, store=_slave_store_with_messages(3),
                    ha_client=FakeHAClient(connected=False))


# --- long polling -----------------------------------------------------------------------------------------


SUSPEND = int(PullSysFlag.SUSPEND)


def test_a_stored_but_undispatched_message_is_pulled_not_reported_missing(tmp_path: Path) -> None:
    """Read-your-writes: the pull path dispatches what is pending before it answers "no message"."""

    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=1)
        ctrl.store.append_listeners.clear()  # the dispatch task is never woken again: dispatch is left to pulls
        for i in range(3):
            body = encode_batch([Message("T", b"fresh%d" % i)], born_timestamp_ms=1)
            r = await client.post("/send", params={"topic": "T", "queueId": 0 if i < 2 else 3}, content=body)
            assert r.status_code == 200, r.text
        assert ctrl.store.dispatch_behind_bytes > 0
        r = await client.get("/offset/max", params={"topic": "T", "queueId": 0})
        assert r.json() == {"offset": 3}  # /offset/max dispatched what was pending
        body = encode_batch([Message("T", b"fresh-q1")], born_timestamp_ms=1)
        assert (await client.post("/send", params={"topic": "T", "queueId": 1}, content=body)).status_code == 200
        head, msgs = await pull(client, 1)
        assert (head.code, head.next_begin_offset, [m.body for m in msgs]) == (C.SUCCESS, 3, [b"fresh0", b"fresh1"])
        head, msgs = await pull(client, 0, queue_id=3)  # a queue that did not exist before the send
        assert (head.code, [m.body for m in msgs]) == (C.SUCCESS, [b"fresh2"])
        head, msgs = await pull(client, 0, queue_id=1)
        assert [m.body for m in msgs] == [b"fresh-q1"]
        assert ctrl.store.dispatch_behind_bytes == 0

    run_with_broker(tmp_path, scenario)


def test_long_poll_woken_by_new_message(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=1)
        t0 = time.monotonic()
        waiter = asyncio.create_task(pull(client, 1, sysFlag=SUSPEND, suspendTimeoutMs=20_000))
        await wait_until(lambda: ctrl.hold.parked_count, 5, "the pull to park")
        assert ctrl.hold.parked_count == 1
        body = encode_batch([Message("T", b"late")], born_timestamp_ms=1)
        await client.post("/send", params={"topic": "T", "queueId": 0}, content=body)  # dispatch task wakes it
        head, msgs = await asyncio.wait_for(waiter, 5)
        assert (head.code, [m.body for m in msgs]) == (C.SUCCESS, [b"late"])
        assert time.monotonic() - t0 < 5
        assert ctrl.hold.parked_count == 0

    run_with_broker(tmp_path, scenario)


def test_long_poll_deadline_bounded_by_broker(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=1)
        t0 = time.monotonic()
        head, _ = await pull(client, 1, sysFlag=SUSPEND, suspendTimeoutMs=60_000)
        elapsed = time.monotonic() - t0
        assert head.code == C.PULL_NOT_FOUND
        assert 0.15 <= elapsed < 3, elapsed
        t0 = time.monotonic()
        head, _ = await pull(client, 1)  # no suspend flag: answered at once
        assert head.code == C.PULL_NOT_FOUND and time.monotonic() - t0 < 1

    run_with_broker(tmp_path, scenario, max_suspend_timeout_ms=200)


def test_parked_pull_bound(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=1)
        first = asyncio.create_task(pull(client, 1, sysFlag=SUSPEND, suspendTimeoutMs=2000))
        await wait_until(lambda: ctrl.hold.parked_count, 5, "the first pull to park")
        t0 = time.monotonic()
        head, _ = await pull(client, 1, sysFlag=SUSPEND, suspendTimeoutMs=2000)
        assert head.code == C.PULL_NOT_FOUND and time.monotonic() - t0 < 1
        ctrl.hold.close()  # shutdown wakes the parked one at once
        head, _ = await asyncio.wait_for(first, 2)
        assert head.code == C.PULL_NOT_FOUND

    run_with_broker(tmp_path, scenario, max_parked_pulls=1)


def test_short_polling_when_long_polling_disabled(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        await put(ctrl, client, n=1)
        t0 = time.monotonic()
        head, _ = await pull(client, 1, sysFlag=SUSPEND, suspendTimeoutMs=30_000)
        assert head.code == C.PULL_NOT_FOUND
        assert 0.08 <= time.monotonic() - t0 < 2

    run_with_broker(tmp_path, scenario, long_polling_enable=False, short_polling_time_ms=100)
