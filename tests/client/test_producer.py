"""Producer behaviour against the scripted fake cluster: retries, statuses, batching, validation, lifecycle."""

from __future__ import annotations

import asyncio
import threading
import time
from urllib.parse import parse_qsl

import httpx
import pytest

from client import AsyncProducer, ClientInstance, ClientState, Message, MessageQueue, Producer, SendStatus
from client.errors import (
    ClientClosedError,
    MessageIllegalError,
    RouteNotFoundError,
    SendFailedError,
)
from common import codec
from common.properties import UNIQ_KEY, decode_properties
from tests.waiting import poll_until

A, B = "a0:1", "b0:1"
GROUPS = {"broker-a": {0: A}, "broker-b": {0: B}}


@pytest.fixture
def producer(fake):
    fake.add_topic("T", GROUPS)
    fake.instance()
    p = Producer("pg", fake.namesrv, start_index=0)
    yield p
    p.close()


def test_send_ok_and_unique_key(fake, producer) -> None:
    r = producer.send(Message("T", b"hello", tags="TagA", keys=["k1", "k2"]))
    assert r.send_status is SendStatus.SEND_OK
    assert r.queue_offset == 0 and r.message_queue.topic == "T"
    req = fake.sends()[0]
    items = codec.decode_batch(req.content)
    props = decode_properties(items[0].properties)
    assert props[UNIQ_KEY] == r.msg_id and len(r.msg_id) == 32
    assert props["TAGS"] == "TagA" and props["KEYS"] == "k1 k2"
    assert r.offset_msg_id == codec.create_offset_msg_id(codec.pack_host("127.0.0.1", 10911), 0)


@pytest.mark.parametrize("idempotent", [False, True])
def test_system_busy_then_success_on_another_broker(fake, idempotent: bool) -> None:
    """RocketMQ's rule: the retry avoids the broker that answered SYSTEM_BUSY. An idempotent send stays: that
    answer may come after the broker stored the message (DLedger's quorum wait), and only that group's duplicate
    window can tell a retry from a new message."""
    fake.add_topic("T", GROUPS)
    fake.instance()
    fake.script[A] = [2]  # start_index 0: the first pick is broker-a:1
    with Producer("pg", fake.namesrv, start_index=0, idempotent=idempotent) as p:
        r = p.send(Message("T", b"x"))
    sends = fake.sends()
    assert len(sends) == 2
    first, second = (f"{s.url.host}:{s.url.port}" for s in sends)
    assert (first != second) is not idempotent
    assert r.send_status is SendStatus.SEND_OK
    assert r.message_queue.broker_name == ("broker-a" if second == A else "broker-b")


@pytest.mark.parametrize(("code", "status"), [(10, SendStatus.FLUSH_DISK_TIMEOUT),
                                              (11, SendStatus.SLAVE_NOT_AVAILABLE),
                                              (12, SendStatus.FLUSH_SLAVE_TIMEOUT)])
def test_stored_but_not_durable_codes_are_results(fake, producer, code, status) -> None:
    fake.script[A] = [code]
    fake.script[B] = [code]
    r = producer.send(Message("T", b"x"))
    assert r.send_status is status
    assert len(fake.sends()) == 1  # not retried


def test_message_illegal_is_not_retried(fake, producer) -> None:
    fake.script[A] = [13]
    fake.script[B] = [13]
    with pytest.raises(MessageIllegalError) as ei:
        producer.send(Message("T", b"x"))
    assert ei.value.broker_addr in (A, B)
    assert len(fake.sends()) == 1


def test_every_attempt_fails(fake, producer) -> None:
    fake.script[A] = ["connect"] * 5
    fake.script[B] = ["timeout"] * 5
    with pytest.raises(SendFailedError) as ei:
        producer.send(Message("T", b"x"))
    assert len(ei.value.attempts) == 3  # 1 + retry_times_when_send_failed
    assert ei.value.retriable
    first = str(ei.value).splitlines()[0]
    assert first.startswith("send to topic T failed after 3 attempts") and "Send [3] times, still failed" in first


def test_explicit_queue_single_attempt(fake, producer) -> None:
    mq = MessageQueue("T", "broker-b", 1)
    r = producer.send(Message("T", b"x"), mq)
    assert r.message_queue == mq
    r2 = producer.send(Message("T", b"y"), message_queue=mq)
    assert r2.queue_offset == r.queue_offset + 1
    fake.script[B] = [2]
    with pytest.raises(SendFailedError):
        producer.send(Message("T", b"z"), mq)
    with pytest.raises(MessageIllegalError):
        producer.send(Message("T", b"z"), MessageQueue("OTHER", "broker-b", 1))


def test_send_batch_one_request_own_offsets(fake, producer) -> None:
    msgs = [Message("T", b"m%d" % i, keys=f"k{i}") for i in range(5)]
    rs = producer.send_batch(msgs)
    assert len(fake.sends()) == 1
    assert [r.queue_offset for r in rs] == [0, 1, 2, 3, 4]
    assert len({r.message_queue for r in rs}) == 1
    assert len({r.msg_id for r in rs}) == 5
    assert len({r.offset_msg_id for r in rs}) == 5


@pytest.mark.parametrize(
    "bad",
    [
        lambda: [Message("T", b"")],
        lambda: [Message("T", b"x" * (4 * 1024 * 1024 + 1))],
        lambda: [Message("TBW102", b"x")],
        lambda: [Message("T", b"x"), Message("U", b"y")],
        lambda: [],
        lambda: ["not a message"],
    ],
)
def test_validation_before_any_io(fake, producer, bad) -> None:
    msgs = bad()
    with pytest.raises(MessageIllegalError):
        if len(msgs) == 1:
            producer.send(msgs[0])
        else:
            producer.send_batch(msgs)
    assert fake.requests == []


def test_topic_name_checked_by_message() -> None:
    with pytest.raises(MessageIllegalError):
        Message("../etc", b"x")


def test_unknown_topic_uses_default_route(fake) -> None:
    fake.add_topic("TBW102", {"broker-a": {0: A}}, queues=8)
    fake.instance()
    with Producer("pg", fake.namesrv) as p:
        r = p.send(Message("NEWTOPIC", b"x"))
    assert r.message_queue.broker_name == "broker-a" and r.message_queue.queue_id < 4
    q = dict(parse_qsl(fake.sends()[0].url.query.decode()))
    assert q["topic"] == "NEWTOPIC" and q["defaultTopicQueueNums"] == "4"


def test_no_route_at_all(fake) -> None:
    fake.instance()
    with Producer("pg", fake.namesrv) as p, pytest.raises(RouteNotFoundError) as ei:
        p.send(Message("NOPE", b"x"))
    assert "No route info of this topic: NOPE" in str(ei.value)


def _hold_the_first_send(fake) -> tuple[threading.Event, threading.Event]:
    """Topic ``T`` with one queue on broker-a, whose first send request is held: ``(it arrived, let it go)``."""
    fake.add_topic("T", {"broker-a": {0: A}}, queues=1)
    fake.instance()
    first_in = threading.Event()
    release = threading.Event()

    def gate(request: httpx.Request) -> None:
        if not first_in.is_set():
            first_in.set()
            assert release.wait(10)

    fake.send_gate = gate
    return first_in, release


def test_concurrent_sends_are_batched_each_with_its_own_result(fake) -> None:
    first_in, release = _hold_the_first_send(fake)
    n = 24
    results: list = [None] * n
    with Producer("pg", fake.namesrv, max_in_flight_per_queue=1) as p:
        def send(i: int) -> None:
            results[i] = p.send(Message("T", b"%d" % i))

        threads = [threading.Thread(target=send, args=(0,))]
        threads[0].start()
        assert first_in.wait(10)
        threads += [threading.Thread(target=send, args=(i,)) for i in range(1, n)]
        for t in threads[1:]:
            t.start()
        poll_until(lambda: p._acc.pending_bytes >= (n - 1) * 40, 10,
                   "every other sender queued behind the in-flight request", interval_s=0.005)
        release.set()
        for t in threads:
            t.join(10)
    sends = fake.sends()
    assert len(sends) == 2, [len(codec.decode_batch(s.content)) for s in sends]
    assert len(codec.decode_batch(sends[1].content)) == n - 1
    offsets = sorted(r.queue_offset for r in results)
    assert offsets == list(range(n))
    # each caller's offset matches the position of its own message in the request
    for r in results[1:]:
        items = codec.decode_batch(sends[1].content)
        keys = [decode_properties(it.properties)[UNIQ_KEY] for it in items]
        assert keys.index(r.msg_id) == r.queue_offset - 1


def test_senders_waiting_for_room_in_the_accumulator_go_on_when_a_request_ends(fake) -> None:
    """With the accumulator full, senders wait for room; the end of the request in flight wakes them (they do
    not sit out their send timeout)."""
    first_in, release = _hold_the_first_send(fake)
    n = 8
    results: list = [None] * n
    errors: list[BaseException] = []
    # Room for about two waiting messages; the send timeout is far longer than the test may take.
    with Producer("pg", fake.namesrv, max_in_flight_per_queue=1, buffer_max_bytes=100,
                  send_timeout_s=30) as p:
        def send(i: int) -> None:
            try:
                results[i] = p.send(Message("T", b"%d" % i))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
        threads[0].start()
        assert first_in.wait(10)
        for t in threads[1:]:
            t.start()
        poll_until(lambda: p._room.waiting > 0, 10, "a sender waiting for room", interval_s=0.005)
        started = time.monotonic()
        release.set()
        for t in threads:
            t.join(20)
        assert time.monotonic() - started < 10, "the waiting senders sat out a timeout"
    assert not errors
    assert sorted(r.queue_offset for r in results) == list(range(n))


def test_lone_sender_does_not_linger(fake, producer) -> None:
    t = time.monotonic()
    for i in range(20):
        producer.send(Message("T", b"%d" % i))
    assert len(fake.sends()) == 20
    assert time.monotonic() - t < 2.0


def test_lifecycle(fake) -> None:
    fake.add_topic("T", GROUPS)
    p = Producer("pg", fake.namesrv)
    assert p.state is ClientState.UNOPENED
    with p as entered:
        assert entered is p and p.state is ClientState.OPENED
        inst = p.client
        assert isinstance(inst, ClientInstance)
        with Producer("pg2", fake.namesrv) as p2:
            assert p2.client is inst and inst.refcount == 2
    assert p.state is ClientState.CLOSED
    assert inst.state is ClientState.CLOSED  # the last user closed it
    t = time.monotonic()
    p.close()
    p.close()
    assert time.monotonic() - t < 1.0
    with pytest.raises(ClientClosedError):
        p.send(Message("T", b"x"))
    with pytest.raises(ClientClosedError), p:
        pass


def test_nameserver_failover_and_cached_route_when_all_down(fake) -> None:
    fake.add_topic("T", GROUPS)
    ns2 = "ns-second:9876"
    both = f"{fake.namesrv};{ns2}"
    fake.nameservers_down.add(fake.namesrv)
    inst = ClientInstance.acquire(both, transport=httpx.MockTransport(fake.handler))
    try:
        with Producer("pg", both) as p:
            assert p.send(Message("T", b"x")).send_status is SendStatus.SEND_OK
            assert inst.nameservers.current() == ns2
            fake.nameservers_down.add(ns2)
            assert inst.update_topic_route_from_nameserver("T") is False
            assert inst.topic_route("T") is not None  # kept
            assert p.send(Message("T", b"y")).send_status is SendStatus.SEND_OK
            del fake.routes["T"]
            fake.nameservers_down.clear()
            assert inst.update_topic_route_from_nameserver("T") is False  # TOPIC_NOT_EXIST keeps the cache
            assert inst.find_broker_address_in_publish("broker-a") == A
    finally:
        inst.release()


def test_heartbeat_targets(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A, 1: "a1:1"}})
    inst = fake.instance()
    with Producer("pg", fake.namesrv) as p:
        p.send(Message("T", b"x"))
        assert inst.heartbeat_targets() == [A]
        assert inst.send_heartbeat_to_all_brokers() == 1
        inst.register_consumer("cg")
        assert inst.heartbeat_targets() == [A, "a1:1"]
    hb = [r for r in fake.requests if r.url.path == "/heartbeat"]
    assert hb and b'"producerGroups":["pg"]' in hb[-1].content


# --- async ------------------------------------------------------------------------------------------------------


def test_async_producer_retry_batching_lifecycle(fake, async_fake_instance) -> None:
    fake.add_topic("T", GROUPS)

    async def main() -> None:
        inst = async_fake_instance(fake)
        fake.script[A] = [2]
        async with AsyncProducer("pg", fake.namesrv, start_index=0) as p:
            assert p.client is inst
            r = await p.send(Message("T", b"x"))
            assert r.send_status is SendStatus.SEND_OK and len(fake.sends()) == 2
            before = len(fake.sends())
            rs = await asyncio.gather(*(p.send(Message("T", b"%d" % i)) for i in range(64)))
            assert len({(r.message_queue, r.queue_offset) for r in rs}) == 64
            assert len(fake.sends()) - before < 64  # batched
            rb = await p.send_batch([Message("T", b"a"), Message("T", b"b")])
            assert rb[1].queue_offset == rb[0].queue_offset + 1
            await p.send_oneway(Message("T", b"o"))
        await p.close()
        with pytest.raises(ClientClosedError):
            await p.send(Message("T", b"x"))
        await inst.release()

    asyncio.run(main())
