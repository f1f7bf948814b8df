"""PushConsumer: argument errors, and against real servers -- retries through the broker with growing reconsume
times (a wrong callback return type counts as a failure, loudly), the DLQ after ``max_reconsume_times``,
orderly consumption, and a bounded close with a callback still running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from client import Admin, Message, MessageExt, Producer, PullConsumer, PullResult, PullStatus
from client._group_consumer import GroupConsumer
from client._push_consumer import ConsumeStatus, InvalidConsumeStatusError, PushConsumer
from client.cluster import LocalCluster
from client.errors import InvalidParameterError
from common.message import MessageQueue
from tests.waiting import poll_until

FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
        "consume_from_where": "FIRST_OFFSET"}


def test_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="listener must be callable"):
        PushConsumer("g", "127.0.0.1:1", "not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="consume_thread_nums"):
        PushConsumer("g", "127.0.0.1:1", lambda m: ConsumeStatus.CONSUME_SUCCESS, consume_thread_nums=0)
    with pytest.raises(InvalidParameterError, match="max_reconsume_times"):
        PushConsumer("g", "127.0.0.1:1", lambda m: ConsumeStatus.CONSUME_SUCCESS, max_reconsume_times=-2)


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(broker_groups=1, slaves_per_group=0,
                           broker_config={"messageDelayLevel": " ".join(["1s"] * 18)})


def setup_topic(cluster: LocalCluster, topic: str, queues: int = 2) -> None:
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queues)


def send(cluster: LocalCluster, topic: str, bodies: list[bytes]) -> None:
    with Producer("p_" + topic, cluster.namesrv_addr) as p:
        for b in bodies:
            p.send(Message(topic, b), MessageQueue(topic, "broker-a", 0))


@pytest.mark.integration
def test_fail_twice_then_succeed_sees_reconsume_times_0_1_2(cluster: LocalCluster) -> None:
    setup_topic(cluster, "PcRetry")
    seen: list[tuple[str, int, bytes]] = []
    done = threading.Event()
    answers = iter([ConsumeStatus.RECONSUME_LATER, None, ConsumeStatus.CONSUME_SUCCESS])

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend((m.topic, m.reconsume_times, m.body) for m in msgs)
        answer = next(answers)
        if answer is ConsumeStatus.CONSUME_SUCCESS:
            done.set()
        return answer  # type: ignore[return-value]  # None on purpose: a wrong return type

    with PushConsumer("g_retry", cluster.namesrv_addr, on_messages, **FAST) as c:  # type: ignore[arg-type]
        c.subscribe("PcRetry")
        send(cluster, "PcRetry", [b"hello"])
        assert done.wait(30), f"seen {seen}"
        assert seen == [("PcRetry", 0, b"hello"), ("PcRetry", 1, b"hello"), ("PcRetry", 2, b"hello")]
        assert c.callback_errors == 1 and isinstance(c.last_callback_error, InvalidConsumeStatusError)


@pytest.mark.integration
@pytest.mark.parametrize("max_reconsume_times", [2, -1], ids=["max2", "default16"])
def test_always_failing_goes_to_dlq_after_max_reconsume_times(cluster: LocalCluster, max_reconsume_times: int
                                                               ) -> None:
    """-1 is RocketMQ's default: 16 retries (every delay level is 1 s in this cluster, so about 17 s)."""
    expected_retries = 16 if max_reconsume_times < 0 else max_reconsume_times
    topic, group = f"PcDlq{expected_retries}", f"g_dlq{expected_retries}"
    setup_topic(cluster, topic)
    seen: list[int] = []

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.reconsume_times for m in msgs)
        return ConsumeStatus.RECONSUME_LATER

    with PushConsumer(group, cluster.namesrv_addr, on_messages, max_reconsume_times=max_reconsume_times,
                      **FAST) as c:  # type: ignore[arg-type]
        c.subscribe(topic)
        send(cluster, topic, [b"poison"])
        dlq = MessageQueue(f"%DLQ%{group}", "broker-a", 0)
        with PullConsumer("g_dlq_reader", cluster.namesrv_addr) as reader:
            deadline = time.monotonic() + 15 + 3 * expected_retries
            while True:
                try:
                    r = reader.pull(dlq, 0, 32)
                    if r.pull_status is PullStatus.FOUND:
                        break
                except Exception:  # the DLQ topic does not exist until the first dead letter
                    pass
                assert time.monotonic() < deadline, f"nothing in {dlq}; callback saw reconsume times {seen}"
                time.sleep(0.1)  # polling the DLQ with a deadline
        assert [m.body for m in r.msg_found_list] == [b"poison"]
        assert r.msg_found_list[0].reconsume_times == expected_retries + 1
        assert seen == list(range(expected_retries + 1))


@pytest.mark.integration
def test_orderly_keeps_queue_order_and_close_is_bounded(cluster: LocalCluster) -> None:
    setup_topic(cluster, "PcOrder", queues=1)
    bodies = [f"{i:03d}".encode() for i in range(30)]
    seen: list[bytes] = []
    release = threading.Event()
    all_seen = threading.Event()

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.body for m in msgs)
        if len(seen) >= len(bodies):
            all_seen.set()
            release.wait(30)  # the last callback is still running when close() is called
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("g_order", cluster.namesrv_addr, on_messages, orderly=True, consume_message_batch_max_size=4,
                     **FAST)  # type: ignore[arg-type]
    c.subscribe("PcOrder")
    c.start()
    try:
        send(cluster, "PcOrder", bodies)
        assert all_seen.wait(30), f"seen {len(seen)}"
        assert seen == bodies
        began = time.monotonic()
        c.close(await_termination_s=0.5)
        assert time.monotonic() - began < 4.0
    finally:
        release.set()
        c.close()


@pytest.mark.integration
def test_retry_comes_back_after_its_delay_with_the_default_rebalance_interval(cluster: LocalCluster) -> None:
    """The retry topic's queue is held from the start (the heartbeat creates ``%RETRY%<group>``, the missing
    route is looked at again within a second), so a retry is consumed about one delay level (1 s here) after
    the failure -- not at the next 20 s rebalance."""
    setup_topic(cluster, "PcRetryFast")
    calls: list[tuple[float, int]] = []
    done = threading.Event()

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        calls.append((time.monotonic(), msgs[0].reconsume_times))
        if msgs[0].reconsume_times == 0:
            return ConsumeStatus.RECONSUME_LATER
        done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("g_retry_fast", cluster.namesrv_addr, on_messages, consume_from_where="FIRST_OFFSET")
    assert c.config.rebalance_interval_s == 20.0
    c.subscribe("PcRetryFast")
    began = time.monotonic()
    with c:
        deadline = began + 10
        while len({mq.topic for mq in c.assignment()}) < 2:
            assert time.monotonic() < deadline, f"held after 10 s: {c.assignment()}"
            time.sleep(0.05)  # polling the assignment with a deadline
        held_s = time.monotonic() - began
        send(cluster, "PcRetryFast", [b"again"])
        assert done.wait(15), f"calls {calls}"
    retry_s = calls[1][0] - calls[0][0]
    print(f"queues held {held_s:.2f} s after start; retry consumed {retry_s:.2f} s after the failure")
    assert [rt for _, rt in calls] == [0, 1]
    assert held_s < 5.0
    assert 1.0 <= retry_s < 2.5, f"retry after {retry_s:.2f} s (delay level 1 s)"


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["group", "push"])
def test_close_with_a_parked_long_poll_is_prompt(cluster: LocalCluster, kind: str) -> None:
    """Closing while every pull is parked on the broker (nothing to read, pull_suspend_s=5) returns within a
    second; the abandoned pull threads end when the broker answers and deliver nothing."""
    setup_topic(cluster, f"PcClose{kind}", queues=2)
    got: list[MessageExt] = []

    def record(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c: GroupConsumer | PushConsumer
    if kind == "group":
        c = GroupConsumer(f"g_close_{kind}", cluster.namesrv_addr, consume_from_where="FIRST_OFFSET",
                          rebalance_interval_s=1.0, pull_suspend_s=5.0)
    else:
        c = PushConsumer(f"g_close_{kind}", cluster.namesrv_addr, record, consume_from_where="FIRST_OFFSET",
                         rebalance_interval_s=1.0, pull_suspend_s=5.0)
    c.subscribe(f"PcClose{kind}")
    c.start()
    engine = c._engine
    answers: list[PullStatus] = []  # what the broker answered the pull threads, recorded before the engine sees it
    assert engine.puller is not None
    real_pull = engine.puller.pull

    def recorded(*args: Any, **kwargs: Any) -> PullResult:
        r = real_pull(*args, **kwargs)
        answers.append(r.pull_status)
        return r

    engine.puller.pull = recorded  # type: ignore[method-assign]
    broker = cluster.broker("broker-a", 0)

    def every_held_queue_parked() -> bool:
        held = len(c.assignment())
        return held >= 2 and broker.runtime()["parkedPulls"] >= held

    try:
        # The thing under test: the broker holds a pull of every held queue, seen from the broker itself.
        poll_until(every_held_queue_parked, 10, "a parked pull of each held queue")
    finally:
        began = time.monotonic()
        c.close()
        took = time.monotonic() - began
    print(f"{kind} close took {took:.3f} s")
    assert took < 1.0, f"close took {took:.2f} s with parked pulls"
    send(cluster, f"PcClose{kind}", [b"after close"])  # wakes a parked pull: its answer is dropped
    threads = [t for t in engine._threads if t.is_alive()]
    for t in threads:
        t.join(8.0)
    assert not any(t.is_alive() for t in threads), [t.name for t in threads if t.is_alive()]
    assert PullStatus.FOUND in answers, f"the message never reached an abandoned pull: {answers}"
    assert got == [] and engine.stats()["pulledMessages"] == 0, (got, engine.stats())
