"""Client metrics against a real cluster (issue 17 item 5), read through an OpenTelemetry SDK in-memory reader
and through ``stats()``: sends by status, pulls by the member that served them (a consumer moved to the slave by
the read/write split), lag, messages consumed by a lite pull and a push consumer, and callback latency.

The brokers run with examples/read_write_splitting.py's settings, so every consumer counts as lagging and the
master sends its pulls to the slave. Each test gives its clients a ClientConfig with its own meter provider; it
closes them all, so the next test's clients start a new client instance with the next provider.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import (
    Admin,
    ClientConfig,
    ConsumeStatus,
    GroupConsumer,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
)
from client.cluster import LocalCluster
from client.errors import TopicNotExistError
from tests.client.otel_reading import points, reader_and_provider, total
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

SPLIT = {"accessMessageInMemoryMaxRatio": "0", "slaveReadEnable": "true", "slaveMetadataSyncInterval": "1000"}
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
        "consume_from_where": "FIRST_OFFSET"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("metrics")), broker_groups=1, slaves_per_group=1,
                     broker_config=SPLIT)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def fill(cluster: LocalCluster, topic: str, n: int, queues: int = 1) -> None:
    """``n`` messages in ``topic`` (created with ``queues`` queues), the slave caught up."""
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queues)
    with Producer("fill-" + topic, cluster.namesrv_addr) as p:
        for first in range(0, n, 50):
            p.send_batch([Message(topic, b"m-%d" % i) for i in range(first, min(n, first + 50))])
    cluster.wait_slave_caught_up("broker-a", timeout_s=30)


def test_sends_by_status_and_latency(cluster: LocalCluster) -> None:
    reader, provider = reader_and_provider()
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("MetricsSend", queue_nums=4)
    with Producer("metrics-pg", cluster.namesrv_addr, client_config=ClientConfig(meter_provider=provider)) as p:
        for _ in range(3):
            p.send_batch([Message("MetricsSend", b"x" * 1024) for _ in range(10)])
        p.send(Message("MetricsSend", b"one"))
        st = p.stats()
        client_id = p.client.client_id
    assert st["sends"] == {"MetricsSend": {"SEND_OK": {"requests": 4, "messages": 31}}}
    assert st["sendErrors"] == {}
    cost = st["sendCostMs"]["MetricsSend"]["success"]
    assert cost["count"] == 4 and sum(cost["buckets"].values()) == 4 and 0 < cost["sumMs"] <= 4 * cost["maxMs"]
    assert st["routeRefreshes"].get("MetricsSend", 0) >= 1
    pts = points(reader)
    assert total(pts, "splitmq_send_requests", topic="MetricsSend", client_id=client_id, send_status="SEND_OK") == 4
    assert total(pts, "splitmq_send_messages", topic="MetricsSend", producer_group="metrics-pg") == 31
    assert total(pts, "rocketmq_send_cost_time", topic="MetricsSend", client_id=client_id,
                 invocation_status="success") == 4
    provider.shutdown()


def test_pulls_by_served_by_broker_id_and_lag(cluster: LocalCluster) -> None:
    """A consumer the master finds lagging is moved to the slave: the metrics show who served each pull."""
    n = 120
    fill(cluster, "MetricsSplit", n)
    reader, provider = reader_and_provider()
    served: list[int] = []
    messages_by: dict[str, int] = {}
    with PullConsumer("metrics-cg", cluster.namesrv_addr, client_config=ClientConfig(meter_provider=provider)) as c:
        (mq,) = c.fetch_subscribe_message_queues("MetricsSplit")
        offset, lag_seen = 0, None

        def pull_once() -> bool:
            nonlocal offset, lag_seen
            try:
                r = c.pull(mq, offset, max_nums=16)
            except TopicNotExistError:  # the slave learns the topic with its next metadata sync
                return False
            served.append(r.served_by_broker_id)
            key = str(r.served_by_broker_id)
            messages_by[key] = messages_by.get(key, 0) + len(r.msg_found_list)
            if r.pull_status is PullStatus.FOUND:
                if lag_seen is None:
                    lag_seen = (r.max_offset - r.next_begin_offset, c.stats()["lag"])
                offset = r.next_begin_offset
            return offset >= n

        poll_until(pull_once, 30, f"{n} messages pulled (offset {offset}, served by {served})", interval_s=0)
        st = c.stats()
    assert served[0] == 0 and 1 in served, f"the first pull is the master's, then the slave serves: {served}"
    by = st["pullsServedBy"]["MetricsSplit"]["broker-a"]
    assert set(by) == {"0", "1"}
    assert by["1"]["requests"] == served.count(1) and by["0"]["requests"] == served.count(0)
    assert {k: v["messages"] for k, v in by.items()} == messages_by
    assert lag_seen is not None and lag_seen[1] == {"MetricsSplit": {"broker-a": {"0": lag_seen[0]}}}
    assert 0 < lag_seen[0] < n
    assert st["lag"] == {"MetricsSplit": {"broker-a": {"0": 0}}}
    pts = points(reader)
    assert total(pts, "splitmq_pulled_messages", topic="MetricsSplit", served_by_broker_id="1",
                 consumer_group="metrics-cg") == by["1"]["messages"]
    assert total(pts, "splitmq_pull_requests", topic="MetricsSplit", served_by_broker_id="1") == by["1"]["requests"]
    assert total(pts, "splitmq_consumer_lag", topic="MetricsSplit", queue_id="0") == 0
    provider.shutdown()


def test_lite_pull_consumer_counts_consumed_messages(cluster: LocalCluster) -> None:
    n = 60
    fill(cluster, "MetricsPoll", n, queues=2)
    reader, provider = reader_and_provider()
    got: list[MessageExt] = []
    with GroupConsumer("metrics-poll", cluster.namesrv_addr, client_config=ClientConfig(meter_provider=provider),
                       **FAST) as c:
        c.subscribe("MetricsPoll")
        poll_until(lambda: got.extend(c.poll(timeout_s=0.5)) or len(got) >= n, 30, f"{n} messages polled")
        st = c.stats()
    assert len(got) == n
    assert st["consumed"] == {"MetricsPoll": {"success": n}}
    pulled = st["pullsServedBy"]["MetricsPoll"]["broker-a"]
    assert sum(v["messages"] for v in pulled.values()) == st["pulledMessages"] >= n
    assert total(points(reader), "splitmq_consumed_messages", topic="MetricsPoll", consumer_group="metrics-poll",
                 invocation_status="success") == n
    provider.shutdown()


def test_push_consumer_counts_consumed_messages_and_callback_latency(cluster: LocalCluster) -> None:
    n = 40
    fill(cluster, "MetricsPush", n)
    reader, provider = reader_and_provider()
    seen: set[bytes] = set()
    lock = threading.Lock()
    failed_once = threading.Event()

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].body == b"m-7" and not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("the application failed on m-7 once")
        with lock:
            seen.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    with PushConsumer("metrics-push", cluster.namesrv_addr, on_messages,
                      client_config=ClientConfig(meter_provider=provider), **FAST) as c:
        c.subscribe("MetricsPush")
        poll_until(lambda: len(seen) >= n - 1 and failed_once.is_set(), 30, "every message consumed but m-7")
        st = poll_until(lambda: (s := c.stats())["consumed"]["MetricsPush"].get("success", 0) >= n - 1 and s,
                        10, "the counters caught up with the callbacks")
    consumed = st["consumed"]["MetricsPush"]
    assert consumed["failure"] == 1 and consumed["success"] == len(seen - {b"m-7"}) + (b"m-7" in seen)
    times = st["processTimeMs"]["MetricsPush"]
    assert times["failure"]["count"] == 1 and times["success"]["count"] == consumed["success"]
    pts = points(reader)
    assert total(pts, "rocketmq_process_time", topic="MetricsPush", consumer_group="metrics-push",
                 invocation_status="failure") == 1
    assert total(pts, "rocketmq_process_time", topic="MetricsPush", invocation_status="success") \
        == consumed["success"]
    assert total(pts, "splitmq_consumed_messages", topic="MetricsPush", invocation_status="success") \
        == consumed["success"]
    cached = {(a["topic"], a["consumer_group"]) for a, _ in pts.get("rocketmq_consumer_cached_messages", [])}
    assert ("MetricsPush", "metrics-push") in cached, cached
    provider.shutdown()
