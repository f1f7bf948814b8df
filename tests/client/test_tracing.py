"""OpenTelemetry trace context carried in message properties (issue 40 point 7), against a real nameserver and
broker: a producer span's context reaches the consumer's span as its parent through the W3C ``traceparent``
property; a message without one is consumed as before; without OpenTelemetry nothing of it is imported.

Spans are read with the SDK's ``InMemorySpanExporter`` on the global tracer provider (set once per process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from client import (
    AsyncProducer,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendResult,
)
from client.cluster import LocalCluster
from client.tracing import TRACEPARENT, process_span
from tests.ha.support import create_topic
from tests.waiting import poll_until

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "Traced"
FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
        "consume_from_where": "FIRST_OFFSET"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tracing"), broker_groups=1, slaves_per_group=0) as c:
        create_topic(c, TOPIC, queue_nums=1)
        yield c


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()  # stops exporting to this test's exporter


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _read_back(cluster: LocalCluster, r: SendResult) -> MessageExt:
    with PullConsumer("cg-trace-reader", cluster.namesrv_addr) as c:
        got = c.pull(r.message_queue, r.queue_offset, max_nums=1)
        assert got.pull_status is PullStatus.FOUND, got
        return got.msg_found_list[0]


@pytest.mark.integration
def test_the_producer_span_is_the_parent_of_the_consumer_span(cluster: LocalCluster,
                                                              spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    consumed: dict[bytes, MessageExt] = {}
    seen_in_listener: dict[bytes, int] = {}
    both = threading.Event()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            consumed[m.body] = m
            seen_in_listener[m.body] = trace.get_current_span().get_span_context().trace_id
        if {b"traced", b"plain"} <= consumed.keys():
            both.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("pg-trace", cluster.namesrv_addr) as p:
        with tracer.start_as_current_span("checkout") as app_span:
            traced = p.send(Message(TOPIC, b"traced", tags="t1", keys=["order-1"]))
        plain = p.send(Message(TOPIC, b"plain"))  # no span active: nothing added, no span made
        with PushConsumer("cg-trace", cluster.namesrv_addr, listener, **FAST) as c:  # type: ignore[arg-type]
            c.subscribe(TOPIC)
            assert both.wait(30), consumed.keys()
        poll_until(lambda: len(_named(spans, f"process {TOPIC}")) >= 2, 10, "both process spans ended")

    app = app_span.get_span_context()
    [send] = _named(spans, f"send {TOPIC}")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == app.span_id
    assert send.context.trace_id == app.trace_id
    attrs = dict(send.attributes or {})
    assert attrs["messaging.system"] == "rocketmq" and attrs["messaging.destination.name"] == TOPIC
    assert attrs["messaging.operation.type"] == "send" and attrs["messaging.message.id"] == traced.msg_id

    stored = _read_back(cluster, traced)
    assert stored.properties[TRACEPARENT] == (f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-"
                                              f"{int(send.context.trace_flags):02x}")
    assert TRACEPARENT not in _read_back(cluster, plain).properties

    process = {dict(s.attributes or {})["messaging.message.id"]: s for s in _named(spans, f"process {TOPIC}")}
    child = process[traced.msg_id]
    assert child.kind is SpanKind.CONSUMER
    assert child.parent is not None and child.parent.span_id == send.context.span_id  # across the broker
    assert child.context.trace_id == app.trace_id
    assert dict(child.attributes or {})["messaging.consumer.group.name"] == "cg-trace"
    assert seen_in_listener[b"traced"] == app.trace_id  # the listener runs inside it
    root = process[plain.msg_id]
    assert root.parent is None and root.context.trace_id != app.trace_id  # a trace of its own


@pytest.mark.integration
def test_batches_async_sends_and_failures_carry_the_context(cluster: LocalCluster,
                                                            spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    with Producer("pg-trace", cluster.namesrv_addr, send_timeout_s=2.0) as p:
        with tracer.start_as_current_span("batch"):
            batch = p.send_batch([Message(TOPIC, b"b%d" % i) for i in range(3)])
            future = p.send_async(Message(TOPIC, b"from a send thread"))  # the caller's context goes along
            with pytest.raises(Exception, match="no-such-group"):
                p.send(Message(TOPIC, b"nowhere"), MessageQueue(TOPIC, "no-such-group", 0))
        threaded = future.result(10)

    async def main() -> SendResult:
        async with AsyncProducer("pg-trace-aio", cluster.namesrv_addr) as ap:
            with tracer.start_as_current_span("aio"):
                return await ap.send_async(Message(TOPIC, b"from a task"))

    from_task = asyncio.run(main())

    sends = _named(spans, f"send {TOPIC}")
    assert len(sends) == 4, [s.name for s in spans.get_finished_spans()]
    by_parent_name = {s.parent.span_id if s.parent else None: s for s in sends}
    parents = {s.context.span_id: s.name for s in spans.get_finished_spans()}
    assert sorted(parents[k] for k in by_parent_name if k is not None) == ["aio", "batch"]
    batch_span = next(s for s in sends if dict(s.attributes or {}).get("messaging.batch.message_count") == 3)
    tp = _read_back(cluster, batch[2]).properties[TRACEPARENT]
    assert tp.split("-")[2] == f"{batch_span.context.span_id:016x}"
    failed = [s for s in sends if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1 and dict(failed[0].attributes or {})["error.type"] == "SendFailedError"
    for r in (threaded, from_task):
        tp = _read_back(cluster, r).properties[TRACEPARENT]
        assert int(tp.split("-")[1], 16) in {s.context.trace_id for s in sends}


def test_process_span_of_a_pulled_message_continues_its_trace(spans: InMemorySpanExporter) -> None:
    """The helper for pull-based consumers, on a MessageExt as a pull returns it (with and without a context)."""
    tid, sid = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331

    def ext(props: dict[str, str]) -> MessageExt:
        return MessageExt(topic=TOPIC, body=b"x", tags=None, keys=(), properties=props, broker_name="broker-a",
                          queue_id=0, queue_offset=7, commit_log_offset=0, msg_id="ID", offset_msg_id="OFF",
                          born_timestamp=0, store_timestamp=0, born_host="h", store_host="s", reconsume_times=0,
                          store_size=0)

    with process_span(ext({TRACEPARENT: f"00-{tid:032x}-{sid:016x}-01"}), "cg"):
        assert trace.get_current_span().get_span_context().trace_id == tid
    with process_span([ext({}), ext({TRACEPARENT: "garbage"})], "cg"):
        pass
    first, second = _named(spans, f"process {TOPIC}")
    assert first.parent is not None and first.parent.span_id == sid
    assert second.parent is None and dict(second.attributes or {})["messaging.batch.message_count"] == 2


@pytest.mark.integration
def test_without_opentelemetry_nothing_of_it_is_imported_and_sends_work(cluster: LocalCluster) -> None:
    """A fresh interpreter where ``opentelemetry`` cannot be imported (as if not installed): ``import client``
    did not import it, tracing is a no-op, and a send, a send_async and a push consumer work as before."""
    code = f"""
import sys, threading
import client, client.tracing
assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported at import time'
sys.modules['opentelemetry'] = None  # as if not installed: every import of it fails
from client import ConsumeStatus, Message, Producer, PushConsumer
from client.tracing import available, process_span, start_send
assert not available() and start_send([Message('T', b'x')], 'g') is None
got = []
done = threading.Event()
def listener(msgs):
    got.extend(m for m in msgs if m.body.startswith(b'untraced'))
    if len(got) >= 2:
        done.set()
    return ConsumeStatus.CONSUME_SUCCESS
with Producer('pg-no-otel', {cluster.namesrv_addr!r}) as p:
    p.send(Message({TOPIC!r}, b'untraced 1'))
    p.send_async(Message({TOPIC!r}, b'untraced 2')).result(10)
with PushConsumer('cg-no-otel', {cluster.namesrv_addr!r}, listener, consume_from_where='FIRST_OFFSET',
                  rebalance_interval_s=1.0, pull_suspend_s=1.0) as c:
    c.subscribe({TOPIC!r})
    assert done.wait(30), got
assert all('traceparent' not in m.properties for m in got)
assert not [m for m, mod in sys.modules.items() if m.startswith('opentelemetry') and mod is not None]
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=90,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
