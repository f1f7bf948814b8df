"""Client metrics without servers: the pure pieces as tables, then each counter against the scripted fake
cluster (send statuses and errors, isolations, members marked down, route reads, the off switch), read both
through ``stats()`` and through an OpenTelemetry SDK reader. The real-cluster acceptance is test_metrics.py."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from client import (
    AsyncProducer,
    AsyncPullConsumer,
    ClientConfig,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
)
from client._instance import ClientInstance
from client._metrics import ClientMetrics, Histogram, _nest, error_type, lag_of
from client.errors import BrokerError, MessageIllegalError, RequestTimeoutError, SendFailedError
from tests.client.otel_reading import points, reader_and_provider, total

A0, A1, B0 = "a0:1", "a1:1", "b0:1"


@pytest.mark.parametrize(("values", "buckets"), [
    ([], [0, 0, 0, 0]),
    ([0.0, 0.5, 1.0], [3, 0, 0, 0]),  # a bound belongs to the bucket it closes: (prev, bound]
    ([1.0001, 5.0], [0, 2, 0, 0]),
    ([5.5, 10.0, 10.5, 1e9], [0, 0, 2, 2]),
])
def test_histogram_buckets_are_upper_inclusive(values: list[float], buckets: list[int]) -> None:
    h = Histogram((1.0, 5.0, 10.0))
    for v in values:
        h.observe(v)
    snap = h.snapshot()
    assert list(snap["buckets"].values()) == buckets
    assert list(snap["buckets"]) == ["<=1", "<=5", "<=10", ">10"]
    assert (snap["count"], snap["sumMs"], snap["maxMs"]) == (len(values), round(sum(values), 3),
                                                             round(max(values, default=0.0), 3))


@pytest.mark.parametrize(("err", "label"), [
    (SendFailedError("all attempts failed"), "SendFailedError"),
    (RequestTimeoutError("slow"), "RequestTimeoutError"),
    (BrokerError.for_code(13, "bad"), "MessageIllegalError:13"),
    (BrokerError.for_code(14, "not writeable"), "ServiceNotAvailableError:14"),
    (BrokerError.for_code(999, "unknown"), "BrokerError:999"),
    (ValueError("x"), "ValueError"),
])
def test_error_type_names_the_class_and_a_broker_code(err: BaseException, label: str) -> None:
    assert error_type(err) == label


@pytest.mark.parametrize(("max_offset", "next_offset", "lag"), [(10, 4, 6), (10, 10, 0), (3, 7, 0), (0, 0, 0)])
def test_lag_is_what_the_answer_holds_beyond_the_next_offset(max_offset: int, next_offset: int, lag: int) -> None:
    assert lag_of(max_offset, next_offset) == lag


def test_nest_builds_sorted_nested_dicts() -> None:
    assert _nest([(("t2", "a"), 1), (("t1", "b", "1"), 2), (("t1", "b", "0"), 3)]) == {
        "t1": {"b": {"0": 3, "1": 2}}, "t2": {"a": 1}}
    assert list(_nest([(("b",), 1), (("a",), 2)])) == ["a", "b"]


def test_unbound_metrics_record_nothing() -> None:
    m = ClientMetrics("producer", "g")
    assert not m.on  # the data path tests this before recording: nothing before the client is opened
    assert m.snapshot()["sends"] == {} and m.snapshot()["routeRefreshes"] == {}


# --- against the scripted fake cluster ---


@pytest.fixture
def otel(fake) -> Iterator[tuple[object, ClientInstance]]:
    """A reader, and the fake's shared instance reporting to its provider."""
    reader, provider = reader_and_provider()
    inst = ClientInstance.acquire(fake.namesrv, ClientConfig(meter_provider=provider),
                                  transport=httpx.MockTransport(fake.handler))
    yield reader, inst
    inst.release()
    provider.shutdown()


def test_sends_are_counted_by_status_and_errors_by_type(fake, otel) -> None:
    reader, _ = otel
    fake.add_topic("T", {"broker-a": {0: A0}})
    with Producer("pg", fake.namesrv, start_index=0) as p:
        p.send(Message("T", b"a"))
        p.send_batch([Message("T", b"b"), Message("T", b"c")])
        fake.script[A0] = [10]  # stored, flush timed out
        p.send(Message("T", b"d"))
        fake.script[A0] = [13]  # refused, not retried
        with pytest.raises(MessageIllegalError):
            p.send(Message("T", b"e"))
        st = p.stats()
    assert st["sends"] == {"T": {"FLUSH_DISK_TIMEOUT": {"requests": 1, "messages": 1},
                                 "SEND_OK": {"requests": 2, "messages": 3}}}
    assert st["sendErrors"] == {"T": {"MessageIllegalError:13": {"requests": 1, "messages": 1}}}
    assert st["sendCostMs"]["T"]["success"]["count"] == 3 and st["sendCostMs"]["T"]["failure"]["count"] == 1
    assert st["routeRefreshes"] == {"T": 1}
    pts = points(reader)
    assert total(pts, "splitmq_send_requests", topic="T", send_status="SEND_OK", producer_group="pg") == 2
    assert total(pts, "splitmq_send_messages", topic="T", send_status="SEND_OK") == 3
    assert total(pts, "splitmq_send_requests", send_status="FLUSH_DISK_TIMEOUT") == 1
    assert total(pts, "splitmq_send_errors", error_type="MessageIllegalError:13") == 1
    assert total(pts, "rocketmq_send_cost_time", topic="T", invocation_status="success") == 3
    assert total(pts, "rocketmq_send_cost_time", invocation_status="failure") == 1
    assert total(pts, "splitmq_route_refreshes", topic="T") == 1


def test_latency_fault_isolation_is_a_producer_broker_down_mark(fake, otel) -> None:
    reader, _ = otel
    fake.add_topic("T", {"broker-a": {0: A0}, "broker-b": {0: B0}})
    with Producer("pg", fake.namesrv, latency_fault_enable=True, start_index=0) as p:
        fake.script[A0] = ["connect"]
        fake.script[B0] = ["connect"]
        p.send(Message("T", b"x"))  # a failed attempt on each group, then stored by the third
        marks = p.stats()["brokerDownMarks"]
    assert len(fake.sends()) == 3
    assert marks == {"broker-a": 1, "broker-b": 1}
    pts = points(reader)
    assert total(pts, "splitmq_broker_down_marks", reason="latency_fault", producer_group="pg") == 2
    assert total(pts, "splitmq_broker_down_marks", reason="latency_fault", broker_name="broker-b") == 1


def test_an_unreachable_member_is_a_consumer_broker_down_mark(fake, otel) -> None:
    reader, _ = otel
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    with PullConsumer("cg", fake.namesrv) as c:
        fake.script[A0] = ["connect"]
        r = c.pull(MessageQueue("T", "broker-a", 0), 0)  # the master is down: the slave serves
        st = c.stats()
    assert r.served_by_broker_id == 1
    assert st["brokerDownMarks"] == {"broker-a[0]": 1}
    assert st["pullsServedBy"] == {"T": {"broker-a": {"1": {"requests": 1, "messages": 0}}}}
    assert st["lag"] == {"T": {"broker-a": {"0": 0}}}
    pts = points(reader)
    assert total(pts, "splitmq_broker_down_marks", reason="unreachable", broker_name="broker-a", broker_id="0") == 1
    assert total(pts, "splitmq_pull_requests", served_by_broker_id="1", consumer_group="cg") == 1


def test_metrics_off_records_nothing(fake) -> None:
    reader, provider = reader_and_provider()
    inst = ClientInstance.acquire(fake.namesrv, ClientConfig(metrics=False, meter_provider=provider),
                                  transport=httpx.MockTransport(fake.handler))
    try:
        fake.add_topic("T", {"broker-a": {0: A0}})
        with Producer("pg", fake.namesrv) as p:
            p.send(Message("T", b"x"))
            st = p.stats()
        assert (st["metrics"], st["sends"], st["sendCostMs"]) == (False, {}, {})
        assert points(reader) == {}
    finally:
        inst.release()
        provider.shutdown()


def test_async_twins_count_as_the_sync_ones(fake, async_fake_instance) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.pull_suggest[A0] = 1  # the master sends the next pull to the slave

    async def main() -> tuple[dict, dict]:
        async_fake_instance(fake)
        async with AsyncProducer("pg", fake.namesrv) as p, AsyncPullConsumer("cg", fake.namesrv) as c:
            await p.send_batch([Message("T", b"a"), Message("T", b"b")])
            fake.script[A0] = [11]  # stored, no slave available
            await p.send(Message("T", b"c"))
            mq = MessageQueue("T", "broker-a", 0)
            first, second = await c.pull(mq, 0), await c.pull(mq, 0)
            assert (first.served_by_broker_id, second.served_by_broker_id) == (0, 1)
            return p.stats(), c.stats()

    produced, consumed = asyncio.run(main())
    assert produced["sends"] == {"T": {"SEND_OK": {"requests": 1, "messages": 2},
                                       "SLAVE_NOT_AVAILABLE": {"requests": 1, "messages": 1}}}
    assert consumed["pullsServedBy"] == {"T": {"broker-a": {"0": {"requests": 1, "messages": 0},
                                                           "1": {"requests": 1, "messages": 0}}}}


class _Instance:
    client_id = "x"
    config = ClientConfig()


def test_without_opentelemetry_installed_stats_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # "import opentelemetry" now raises ImportError
    m = ClientMetrics("producer", "g")
    m.bind(_Instance())
    assert m.on and m._otel is None
    m.sent("T", "SEND_OK", 3, time.perf_counter())
    assert m.snapshot()["sends"] == {"T": {"SEND_OK": {"requests": 1, "messages": 3}}}


def test_a_broken_meter_provider_does_not_stop_the_client(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def get_meter(self, *_: object, **__: object) -> object:
            raise RuntimeError("no meter today")

    class Inst(_Instance):
        config = ClientConfig(meter_provider=Broken())

    m = ClientMetrics("consumer", "g")
    m.bind(Inst())
    assert m.on and m._otel is None
    assert "not exported to OpenTelemetry" in caplog.text
    m.consumed_messages("T", 2)
    assert m.snapshot()["consumed"] == {"T": {"success": 2}}
