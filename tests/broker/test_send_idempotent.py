"""``POST /send`` of idempotent batches (``SysFlag.IDEMPOTENT``) against a fake store: a message whose key the
broker's duplicate window holds is answered with its first copy and not stored again, message by message; the
window is filled from the log when the broker starts; a duplicate waits for its first copy's durability.

Each test must be able to fail: every one stores twice with ``duplicateWindowMs=0`` or without the bit (the
first two tests show it).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from common.codec import encode_batch, encode_item
from common.codes import BrokerRole, ResponseCode, SysFlag
from common.message import Message
from common.wire import SendReply, decode_send_reply
from tests.broker.fakes import (
    STORE_HOST,
    FakeHAService,
    FakeStore,
    http_client,
    make_controller,
    run_with_broker,
)
from tests.waiting import wait_until

IDEM = int(SysFlag.IDEMPOTENT)


def body(*keys: str, topic: str = "T", idempotent: bool = True, **kw: Any) -> bytes:
    """A send batch of one message per key (body ``b"m-<key>"``), each with that ``UNIQ_KEY``."""
    return encode_batch([Message(topic, f"m-{k}".encode(), **kw) for k in keys], born_timestamp_ms=1,
                        uniq_keys=list(keys), sys_flag=IDEM if idempotent else 0)


async def send(client: Any, data: bytes, topic: str = "T", queue_id: int = 0) -> SendReply:
    r = await client.post("/send", params={"topic": topic, "queueId": queue_id, "group": "pg"}, content=data)
    assert r.status_code == 200, r.text
    return decode_send_reply(r.content)


def places(r: SendReply) -> list[tuple[int, int, int]]:
    """``(queue id, queue offset, commit-log offset)`` of each message of a reply, in either form."""
    n = len(r.commit_log_offsets)
    if not r.placements:
        return [(r.queue_id, r.queue_offset + i, r.commit_log_offsets[i]) for i in range(n)]
    return [(r.placements[2 * i], r.placements[2 * i + 1], r.commit_log_offsets[i]) for i in range(n)]


def fresh_store(role: BrokerRole = BrokerRole.ASYNC_MASTER) -> FakeStore:
    store = FakeStore(role)
    store.store_ts = time.time_ns() // 1_000_000  # the window counts from the broker's clock
    return store


def stored(store: FakeStore, topic: str = "T", queue_id: int = 0) -> int:
    return store.next_queue_offset.get((topic, queue_id), 0)


@pytest.mark.parametrize(("window_ms", "idempotent", "copies"), [
    ("120000", True, 1),   # the re-send is answered with the first copy
    ("0", True, 2),        # the window off: the bit is ignored
    ("120000", False, 2),  # no bit: a plain send, stored again
])
def test_a_batch_sent_again_is_stored_once(tmp_path: Path, window_ms: str, idempotent: bool, copies: int) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        first = await send(client, body("a", "b", "c", idempotent=idempotent))
        again = await send(client, body("a", "b", "c", idempotent=idempotent))
        assert first.code == again.code == 0
        assert stored(store) == 3 * copies
        if copies == 1:
            assert again == first  # same queue, same offsets, the plain reply form
        status = ctrl.runtime_info()["duplicateWindow"]
        assert status is None if window_ms == "0" else status["duplicates"] == 3 * (2 - copies)

    run_with_broker(tmp_path, scenario, store=store, duplicate_window_ms=int(window_ms))


def test_a_single_send_sent_again_is_answered_with_its_first_result(tmp_path: Path) -> None:
    store = fresh_store()
    item = encode_item(Message("T", b"one"), born_timestamp_ms=1, uniq_key="K1", sys_flag=IDEM)

    async def scenario(ctrl: Any, client: Any) -> None:
        await send(client, body("x", "y"))
        first = await send(client, item)
        assert (first.queue_offset, await send(client, item)) == (2, first)
        assert stored(store) == 3

    run_with_broker(tmp_path, scenario, store=store)


def test_each_message_of_a_partly_duplicate_batch_is_answered_on_its_own(tmp_path: Path) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        first = places(await send(client, body("a", "b")))           # offsets 0, 1
        other = places(await send(client, body("z"), queue_id=1))     # another queue of the topic
        mixed = await send(client, body("b", "c", "z", "a", "c"))
        assert mixed.placements  # not consecutive: each message's place is in the reply
        got = places(mixed)
        assert got[0] == first[1] and got[2] == other[0] and got[3] == first[0]
        assert got[1] == got[4] and got[1][:2] == (0, 2)  # "c" stored once, at the next offset of queue 0
        assert stored(store) == 3 and stored(store, queue_id=1) == 1

    run_with_broker(tmp_path, scenario, store=store)


def test_a_key_twice_in_one_batch_is_stored_once(tmp_path: Path) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        got = places(await send(client, body("a", "a", "b")))
        assert got[0] == got[1] and got[2][1] == 1 and stored(store) == 2

    run_with_broker(tmp_path, scenario, store=store)


def test_topics_are_apart(tmp_path: Path) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        await send(client, body("a"))
        await send(client, body("a", topic="U"), topic="U")
        assert stored(store) == stored(store, "U") == 1

    run_with_broker(tmp_path, scenario, store=store)


def test_a_key_older_than_the_window_is_stored_again(tmp_path: Path) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        store.store_ts -= 60_000  # stored a minute ago
        await send(client, body("a"))
        store.store_ts += 60_000
        await send(client, body("a"))
        assert stored(store) == 2

    run_with_broker(tmp_path, scenario, store=store, duplicate_window_ms=30_000)


def test_a_broker_started_on_a_log_answers_the_keys_stored_before(tmp_path: Path) -> None:
    """The window comes from the log at start: the retry of a send whose answer the crash lost is known."""
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> SendReply:
        return await send(client, body("a", "b"))

    first = run_with_broker(tmp_path / "1", scenario, store=store)
    store.shut = False

    async def after_restart(ctrl: Any, client: Any) -> None:
        assert ctrl.runtime_info()["duplicateWindow"]["rebuiltKeys"] == 2
        assert await send(client, body("a", "b")) == first
        assert stored(store) == 2

    run_with_broker(tmp_path / "2", after_restart, store=store)


class HeldAcks(FakeHAService):
    """A SYNC_MASTER's slave whose acks the test gives."""

    def __init__(self) -> None:
        super().__init__(slave_ok=True, ack=None)
        self.pending: list[tuple[int, asyncio.Future[bool]]] = []

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.pending.append((end_offset, fut))
        return fut

    def give(self, ok: bool) -> None:
        for _, fut in self.pending:
            if not fut.done():
                fut.set_result(ok)
        self.pending.clear()


def test_a_duplicate_waits_for_its_first_copy_like_a_new_send(tmp_path: Path) -> None:
    """SYNC_MASTER: a re-send that comes while the first send waits for the slave waits for the same end, and a
    re-send after a FLUSH_SLAVE_TIMEOUT waits again (it gets SEND_OK once the slave has the first copy)."""
    store = fresh_store(BrokerRole.SYNC_MASTER)
    ha = HeldAcks()

    async def main() -> None:
        ctrl = make_controller(tmp_path, role=BrokerRole.SYNC_MASTER, store=store, ha_service=ha)
        await ctrl.start()
        try:
            async with http_client(ctrl) as client:
                one = asyncio.create_task(send(client, body("a", "b")))
                await wait_until(lambda: len(ha.pending) == 1, 5, "the first send waiting for the slave")
                two = asyncio.create_task(send(client, body("a", "b")))
                await wait_until(lambda: len(ha.pending) == 2, 5, "the re-send waiting for the slave too")
                assert ha.pending[0][0] == ha.pending[1][0]  # the same end: the first copy's
                ha.give(False)
                first, again = await one, await two
                assert first.code == again.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
                assert places(first) == places(again) and stored(store) == 2
                three = asyncio.create_task(send(client, body("b", "a")))
                await wait_until(lambda: len(ha.pending) == 1, 5, "the later re-send waiting for the slave")
                ha.give(True)
                last = await three
                assert last.code == ResponseCode.SUCCESS and places(last) == places(first)[::-1]
                assert stored(store) == 2
        finally:
            await ctrl.stop()

    asyncio.run(main())


def test_a_delayed_and_a_transactional_message_are_stored_once(tmp_path: Path) -> None:
    store = fresh_store()
    delayed = body("d", delay_level=2)
    half = encode_batch([Message("T", b"txn", properties={"PGROUP": "pg", "TRAN_MSG": "true"})], born_timestamp_ms=1,
                        uniq_keys=["t"], sys_flag=IDEM | int(SysFlag.TRANSACTION_PREPARED))

    async def scenario(ctrl: Any, client: Any) -> None:
        for data in (delayed, half):
            first = await send(client, data, queue_id=1)
            assert await send(client, data, queue_id=1) == first and first.queue_id == 1
        assert sum(store.next_queue_offset.values()) == 2, store.next_queue_offset

    run_with_broker(tmp_path, scenario, store=store)


def test_the_reply_names_the_first_copys_store_host(tmp_path: Path) -> None:
    store = fresh_store()

    async def scenario(ctrl: Any, client: Any) -> None:
        first = await send(client, body("a"))
        assert first.store_host == STORE_HOST == (await send(client, body("a"))).store_host

    run_with_broker(tmp_path, scenario, store=store)
