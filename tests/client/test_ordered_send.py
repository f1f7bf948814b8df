"""Ordered sends (issue 17 item 3): ``sharding_key`` and queue selectors on both producers, against the scripted
fake cluster -- one queue per key (a stable hash, the same in every process), one attempt and no retry elsewhere,
one queue per batch, and clear errors for bad arguments."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import pytest

from client import AsyncProducer, Message, MessageQueue, Producer
from client._producer_core import select_by_hash, sharding_hash
from client.errors import BrokerConnectError, InvalidParameterError, MessageIllegalError, SendFailedError
from tests.client.conftest import FakeCluster

A, B = "a0:1", "b0:1"
GROUPS = {"broker-a": {0: A}, "broker-b": {0: B}}
QUEUES = [MessageQueue("T", g, i) for g in ("broker-a", "broker-b") for i in range(4)]


@pytest.fixture
def producer(fake: FakeCluster) -> Any:
    fake.add_topic("T", GROUPS, queues=4)
    fake.instance()  # type: ignore[attr-defined]
    p = Producer("pg", fake.namesrv, start_index=0)
    yield p
    p.close()


def sent_queue(req: Any) -> tuple[str, int]:
    return f"{req.url.host}:{req.url.port}", int(req.url.params["queueId"])


def test_hash_is_crc32_and_the_same_in_another_process() -> None:
    assert sharding_hash("order-42") == zlib.crc32(b"order-42")
    assert sharding_hash("ключ") == zlib.crc32("ключ".encode())
    # A salted hash() would differ between processes; the sharding hash must not.
    code = "from client._producer_core import sharding_hash; print(sharding_hash('order-42'))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert int(out.stdout) == sharding_hash("order-42")
    assert select_by_hash(QUEUES, Message("T", b"x"), "order-42") == QUEUES[sharding_hash("order-42") % 8]


def test_every_message_of_a_key_goes_to_its_queue(fake: FakeCluster, producer: Producer) -> None:
    keys = [f"order-{i}" for i in range(20)]
    for rnd in range(3):
        for k in keys:
            r = producer.send(Message("T", f"{k} {rnd}".encode()), sharding_key=k)
            assert r.message_queue == QUEUES[sharding_hash(k) % len(QUEUES)]
    by_key: dict[str, set[tuple[str, int]]] = {}
    for req in fake.sends():  # sequential sends: one message per request
        k = next(k for k in keys if f"{k} ".encode() in req.content)
        by_key.setdefault(k, set()).add(sent_queue(req))
    assert all(len(qs) == 1 for qs in by_key.values()), by_key
    assert len({q for qs in by_key.values() for q in qs}) > 1  # 20 keys spread over more than one queue


def test_ordered_send_is_not_retried_on_another_queue(fake: FakeCluster, producer: Producer) -> None:
    key = next(f"k{i}" for i in range(100) if QUEUES[sharding_hash(f"k{i}") % 8].broker_name == "broker-a")
    fake.script[A] = ["connect"] * 5
    with pytest.raises((SendFailedError, BrokerConnectError)):
        producer.send(Message("T", b"x"), sharding_key=key)
    assert len(fake.sends()) == 1 and sent_queue(fake.sends()[0])[0] == A  # one attempt, broker-b untouched
    # A plain send in the same situation moves on to the other group: the contrast that matters.
    fake.script[A] = ["connect"] * 5
    producer.send(Message("T", b"y"))
    assert sent_queue(fake.sends()[-1])[0] == B


def test_selector_gets_the_writable_queues_and_its_arg(fake: FakeCluster, producer: Producer) -> None:
    seen: list[tuple[list[MessageQueue], bytes, Any]] = []

    def last_queue(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        seen.append((list(queues), msg.body, arg))
        return queues[arg]

    r = producer.send(Message("T", b"m"), selector=last_queue, arg=7)
    assert r.message_queue == QUEUES[7]
    assert seen == [(QUEUES, b"m", 7)]


def test_batch_with_a_sharding_key_is_one_request_to_the_keys_queue(fake: FakeCluster, producer: Producer) -> None:
    msgs = [Message("T", f"b{i}".encode()) for i in range(5)]
    results = producer.send_batch(msgs, sharding_key="order-7")
    want = QUEUES[sharding_hash("order-7") % 8]
    assert [r.message_queue for r in results] == [want] * 5
    assert [r.queue_offset for r in results] == list(range(5))
    assert len(fake.sends()) == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"sharding_key": ""}, "sharding_key"),
    ({"sharding_key": 42}, "sharding_key"),
    ({"sharding_key": "k", "selector": select_by_hash}, "not both"),
    ({"selector": "not callable"}, "callable"),
    ({"selector": lambda qs, m, a: MessageQueue("T", "broker-z", 0)}, "not one of the 8 writable queues"),
    ({"selector": lambda qs, m, a: None}, "not one of"),
    ({"sharding_key": "k", "queue": QUEUES[0]}, "explicit queue"),
])
def test_bad_ordered_arguments(fake: FakeCluster, producer: Producer, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        producer.send(Message("T", b"x"), **kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        producer.send_batch([Message("T", b"x")], **kwargs)
    assert fake.sends() == []


def test_invalid_message_is_refused_before_the_selector_runs(fake: FakeCluster, producer: Producer) -> None:
    calls: list[int] = []

    def selector(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        calls.append(1)
        return queues[0]

    with pytest.raises(MessageIllegalError):
        producer.send(Message("T", b"x" * (5 << 20)), selector=selector)
    assert calls == []


def test_async_producer_sharding_key_and_batch(fake: FakeCluster, async_fake_instance: Any) -> None:
    fake.add_topic("T", GROUPS, queues=4)

    async def scenario() -> None:
        inst = async_fake_instance(fake)
        try:
            async with AsyncProducer("pg", fake.namesrv) as p:
                rs = await asyncio.gather(*(p.send(Message("T", f"{i}".encode()), sharding_key=f"k{i % 3}")
                                            for i in range(30)))
                for i, r in enumerate(rs):
                    assert r.message_queue == QUEUES[sharding_hash(f"k{i % 3}") % 8]
                batch = await p.send_batch([Message("T", b"a"), Message("T", b"b")],
                                           selector=lambda qs, m, a: qs[a], arg=2)
                assert [r.message_queue for r in batch] == [QUEUES[2]] * 2
                with pytest.raises(InvalidParameterError, match="sharding_key"):
                    await p.send(Message("T", b"x"), sharding_key="")
        finally:
            await inst.release()

    asyncio.run(scenario())
