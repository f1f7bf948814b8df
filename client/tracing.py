"""OpenTelemetry trace context carried in message properties (W3C ``traceparent`` / ``tracestate``).

Optional: with the ``otel`` extra (``pip install 'splitmq[otel]'``, which brings ``opentelemetry-api``):

* a producer send made while a span is active (the application traces) runs in a ``send <topic>`` span
  (kind PRODUCER, a child of the active one) and carries that span's context in the message's properties
  ``traceparent`` and ``tracestate``, as the W3C Trace Context format says (the propagator is W3C's whatever the
  global one is, so that any consumer reads it); the span ends with the send, its status an error when the
  send failed. Without an active span nothing is added to the message and no span is made.
* ``PushConsumer`` runs each listener call in a ``process <topic>`` span (kind CONSUMER) whose parent is the
  context the first message carries (the others are links); a message without ``traceparent`` gets a span of
  its own trace. Pull-based consumers hand messages to the application: wrap their processing in
  :func:`process_span` to get the same span.

The attributes follow OpenTelemetry's messaging semantic conventions (``messaging.system`` = ``rocketmq``,
``messaging.destination.name``, ``messaging.operation.type``, ``messaging.message.id``, ...). Without
``opentelemetry-api`` installed nothing here imports it, and every function is a no-op.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from common.message import Message, MessageExt

__all__ = ["TRACEPARENT", "TRACESTATE", "ProducerSpan", "available", "process_span", "start_send"]

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
"""The message property holding the W3C trace context (``00-<trace id>-<span id>-<flags>``)."""
TRACESTATE = "tracestate"
"""The message property holding the W3C vendor trace state, when there is one."""

_SYSTEM = "rocketmq"
_TRACER = "splitmq"

_api: Any = None
"""``(trace module, W3C propagator, get_current)`` once imported; False when ``opentelemetry-api`` is not
installed."""


def _otel() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _api = False
        else:
            _api = (trace, TraceContextTextMapPropagator(), context.get_current)
    return _api


def available() -> bool:
    """True when ``opentelemetry-api`` can be imported (the ``otel`` extra is installed)."""
    return bool(_otel())


class ProducerSpan:
    """The ``send <topic>`` span of one send, and the properties that carry its context."""

    __slots__ = ("carrier", "span")

    def __init__(self, span: Any, carrier: dict[str, str]) -> None:
        self.span = span
        self.carrier = carrier
        """``traceparent`` (and ``tracestate``) to add to each message of the send."""

    def stamp(self, msg: Message) -> Message:
        """A copy of ``msg`` carrying the span's context (the caller's object is left as it is)."""
        return attrs.evolve(msg, properties={**msg.properties, **self.carrier})

    def succeeded(self, results: Sequence[Any]) -> None:
        """End the span after the send stored its messages (``results``: their SendResults)."""
        span = self.span
        if results and span.is_recording():
            first = results[0]
            span.set_attribute("messaging.message.id", first.msg_id)
            span.set_attribute("messaging.destination.partition.id", str(first.message_queue.queue_id))
            span.set_attribute("messaging.rocketmq.broker_name", first.message_queue.broker_name)
            span.set_attribute("splitmq.send_status", first.send_status.name)
        span.end()

    def failed(self, error: BaseException) -> None:
        """End the span of a send that failed."""
        trace = _otel()[0]
        span = self.span
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
        span.set_attribute("error.type", type(error).__name__)
        span.end()


def start_send(msgs: Sequence[object], group: str) -> ProducerSpan | None:
    """The span of a send of ``msgs`` (one topic) when OpenTelemetry is installed and a span is active, else None
    (also when ``msgs`` are not messages: the send then refuses them as it would anyway)."""
    api = _otel()
    if not api or not msgs or not isinstance(msgs[0], Message):
        return None
    trace, propagator, current = api
    # An empty context (the common case: the application traces nothing here) is told by one contextvar read.
    if not current() or not trace.get_current_span().get_span_context().is_valid:
        return None
    first = msgs[0]
    attributes: dict[str, Any] = {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": first.topic,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.rocketmq.client_group": group,
    }
    if len(msgs) > 1:
        attributes["messaging.batch.message_count"] = len(msgs)
    else:
        if first.tags:
            attributes["messaging.rocketmq.message.tag"] = first.tags
        if first.keys:
            attributes["messaging.rocketmq.message.keys"] = list(first.keys)
    span = trace.get_tracer(_TRACER).start_span(f"send {first.topic}", kind=trace.SpanKind.PRODUCER,
                                                attributes=attributes)
    carrier: dict[str, str] = {}
    propagator.inject(carrier, context=trace.set_span_in_context(span))
    return ProducerSpan(span, carrier)


def _context_of(properties: Mapping[str, str]) -> Any:
    """The context a message's properties carry (an empty one when they carry none, or a malformed one)."""
    return _otel()[1].extract(properties)


@contextlib.contextmanager
def process_span(msgs: MessageExt | Sequence[MessageExt], group: str | None = None) -> Iterator[Any]:
    """A ``process <topic>`` span (kind CONSUMER) around the processing of ``msgs``, its parent the context the
    first message carries (``traceparent``), the others' contexts as links; the span is current inside the
    block and yielded (None without OpenTelemetry). An exception leaving the block marks it as an error.

    ::

        for msg in consumer:
            with process_span(msg, consumer.group):
                handle(msg)
    """
    api = _otel()
    batch = [msgs] if isinstance(msgs, MessageExt) else list(msgs)
    if not api or not batch:
        yield None
        return
    trace = api[0]
    first = batch[0]
    parent = _context_of(first.properties)
    links = []
    for m in batch[1:]:
        sc = trace.get_current_span(_context_of(m.properties)).get_span_context()
        if sc.is_valid:
            links.append(trace.Link(sc))
    attributes: dict[str, Any] = {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": first.topic,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": first.msg_id,
        "messaging.destination.partition.id": str(first.queue_id),
    }
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
        attributes["messaging.rocketmq.client_group"] = group
    if len(batch) > 1:
        attributes["messaging.batch.message_count"] = len(batch)
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(f"process {first.topic}", context=parent, kind=trace.SpanKind.CONSUMER,
                                      links=links, attributes=attributes) as span:
        yield span
