"""``send_async`` with an ``on_delivery`` callback (issue 40 point 7), against a real nameserver and broker: each
send's outcome reaches its future and its callback once -- the result when stored, the error when not -- and
close waits for the sends under way."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from client import (
    AsyncProducer,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    SendResult,
    SendStatus,
)
from client.cluster import LocalCluster
from client.errors import InvalidParameterError, MessageIllegalError, SendFailedError
from tests.ha.support import create_topic

pytestmark = pytest.mark.integration

TOPIC = "Delivery"

Outcome = tuple[BaseException | None, SendResult | None]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("delivery"), broker_groups=1, slaves_per_group=0) as c:
        create_topic(c, TOPIC, queue_nums=2)
        yield c


def _nowhere() -> MessageQueue:
    """A queue of a broker group the route does not know: the send fails after it was queued."""
    return MessageQueue(TOPIC, "no-such-group", 0)


def _stored(cluster: LocalCluster, results: list[SendResult], bodies: list[bytes]) -> None:
    with PullConsumer("cg-delivery", cluster.namesrv_addr) as c:
        for r, body in zip(results, bodies, strict=True):
            assert r.send_status is SendStatus.SEND_OK, r
            got = c.pull(r.message_queue, r.queue_offset, max_nums=1)
            assert got.pull_status is PullStatus.FOUND, got
            assert (got.msg_found_list[0].body, got.msg_found_list[0].msg_id) == (body, r.msg_id)


def test_sync_send_async_reports_each_outcome_to_its_future_and_callback(cluster: LocalCluster) -> None:
    outcomes: dict[int, Outcome] = {}
    threads: set[str] = set()
    lock = threading.Lock()

    def on_delivery_of(i: int):  # type: ignore[no-untyped-def]
        def cb(err: BaseException | None, result: SendResult | None) -> None:
            with lock:
                assert i not in outcomes, "called twice"
                outcomes[i] = (err, result)
                threads.add(threading.current_thread().name)
        return cb

    bodies = [b"async-%d" % i for i in range(40)]
    with Producer("pg-delivery", cluster.namesrv_addr, send_timeout_s=5.0) as p:
        futures = [p.send_async(Message(TOPIC, body), on_delivery=on_delivery_of(i)) for i, body in enumerate(bodies)]
        failing = p.send_async(Message(TOPIC, b"lost?"), on_delivery_of(99), _nowhere())
        assert p.flush(10) == 0
        results = [f.result(0) for f in futures]
        with pytest.raises(SendFailedError, match="no-such-group"):
            failing.result(0)
    assert set(outcomes) == {*range(40), 99}
    assert [outcomes[i] for i in range(40)] == [(None, r) for r in results]
    err, res = outcomes[99]
    assert isinstance(err, SendFailedError) and res is None and err is failing.exception()
    assert all(t.startswith("splitmq-send-pg-delivery") for t in threads), threads
    _stored(cluster, results, bodies)


def test_bad_input_is_refused_at_the_call_and_close_waits_for_sends_under_way(cluster: LocalCluster) -> None:
    got: list[Outcome] = []
    with Producer("pg-delivery", cluster.namesrv_addr) as p:
        with pytest.raises(MessageIllegalError):
            p.send_async(Message(TOPIC, b""))
        with pytest.raises(InvalidParameterError, match="on_delivery"):
            p.send_async(Message(TOPIC, b"x"), on_delivery="print")  # type: ignore[arg-type]
        futures = [p.send_async(Message(TOPIC, b"closing-%d" % i), lambda e, r: got.append((e, r)))
                   for i in range(20)]
    # close returned: every send ended, each reported once
    assert all(f.done() for f in futures)
    assert len(got) == 20 and all(e is None and r is not None for e, r in got), got


def test_a_callback_that_raises_is_logged_and_a_failure_without_one_is_too(cluster: LocalCluster,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="client._delivery")

    def broken(err: BaseException | None, result: SendResult | None) -> None:
        raise RuntimeError("bug in the callback")

    with Producer("pg-delivery", cluster.namesrv_addr) as p:
        ok = p.send_async(Message(TOPIC, b"cb raises"), broken)
        lost = p.send_async(Message(TOPIC, b"nobody listens"), None, _nowhere())
        p.flush(10)
    assert ok.result(0).send_status is SendStatus.SEND_OK  # the send's outcome is not the callback's
    assert isinstance(lost.exception(0), SendFailedError)
    logged = [r.getMessage() for r in caplog.records]
    assert any("on_delivery callback of a send to Delivery raised" in m for m in logged), logged
    assert any("send_async to Delivery failed and no on_delivery callback was given" in m for m in logged), logged


def test_async_send_async_reports_each_outcome_on_the_loop(cluster: LocalCluster) -> None:
    bodies = [b"aio-%d" % i for i in range(40)]

    async def main() -> tuple[list[SendResult], dict[int, Outcome], BaseException | None]:
        outcomes: dict[int, Outcome] = {}
        loop = asyncio.get_running_loop()

        def on_delivery_of(i: int):  # type: ignore[no-untyped-def]
            def cb(err: BaseException | None, result: SendResult | None) -> None:
                assert asyncio.get_running_loop() is loop  # called on the loop
                assert i not in outcomes, "called twice"
                outcomes[i] = (err, result)
            return cb

        async with AsyncProducer("pg-delivery-aio", cluster.namesrv_addr, send_timeout_s=5.0) as p:
            tasks = [p.send_async(Message(TOPIC, body), on_delivery=on_delivery_of(i))
                     for i, body in enumerate(bodies)]
            failing = p.send_async(Message(TOPIC, b"lost?"), on_delivery_of(99), _nowhere())
            with pytest.raises(MessageIllegalError):
                p.send_async(Message(TOPIC, b""))
            assert await p.flush(10) == 0
            results = [await t for t in tasks]
        return results, outcomes, failing.exception()

    results, outcomes, failure = asyncio.run(main())
    assert set(outcomes) == {*range(40), 99}
    assert [outcomes[i] for i in range(40)] == [(None, r) for r in results]
    assert isinstance(outcomes[99][0], SendFailedError) and outcomes[99][0] is failure
    _stored(cluster, results, bodies)


def test_close_from_a_callback_does_not_wait_for_that_callback(cluster: LocalCluster) -> None:
    p = Producer("pg-delivery", cluster.namesrv_addr, close_timeout_s=20.0)
    closed = threading.Event()

    def close_when_delivered(err: BaseException | None, result: SendResult | None) -> None:
        p.close()
        closed.set()

    p.send_async(Message(TOPIC, b"close from here"), close_when_delivered)
    assert closed.wait(10), "close waited for the callback that called it"
