"""Client metrics: counters and latency histograms of producers and consumers (issue 17 item 5).

Two ways to read them, both fed by the same plain counters:

* ``stats()`` on each producer and consumer: a snapshot as plain dicts (see :meth:`ClientMetrics.snapshot`);
* OpenTelemetry, when the optional ``opentelemetry-api`` package is installed (``pip install splitmq[otel]``):
  the instruments of docs/METRICS.md, created on the meter provider of ``ClientConfig(meter_provider=...)`` or
  else the global one (``opentelemetry.metrics.set_meter_provider``), which is the API's own no-op until the
  application installs an SDK provider. Without the package nothing OpenTelemetry is imported.

Why it costs almost nothing on the data path:

* counters are ints in ``__slots__`` cells, one cell per label set (topic and status, say), created on first
  use and kept; an increment is a dict lookup and an ``+=``. No lock: with CPython's GIL a thread switch happens
  only at a call or a backward jump, so the few bytecodes of an increment are not interleaved (a free-threaded
  build may lose an increment now and then -- fine for monitoring);
* a latency is one ``perf_counter`` pair per request (not per message) and one ``bisect`` into fixed buckets;
* OpenTelemetry counters and gauges are *observable*: the SDK reads the cells when it collects, so sends never
  call into it. Only the two histograms (``rocketmq_send_cost_time``, ``rocketmq_process_time``) are recorded
  synchronously, with an attribute dict built once per cell;
* ``ClientConfig(metrics=False)`` turns all of it off (one attribute test per request): the baseline of the
  ``clientmetrics`` benchmark.

The pure pieces (:class:`Histogram`, :func:`error_type`, :func:`lag_of`, the cells) are table-tested in
tests/client/test_metrics_unit.py.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from common.errors import BrokerError

__all__ = [
    "PROCESS_TIME_BOUNDS_MS",
    "SEND_COST_BOUNDS_MS",
    "ClientMetrics",
    "Histogram",
    "error_type",
    "lag_of",
]

log = logging.getLogger(__name__)

#: Bucket bounds (ms) of the send cost histogram: RocketMQ 5 clients' ``rocketmq_send_cost_time``.
SEND_COST_BOUNDS_MS = (1.0, 5.0, 10.0, 20.0, 50.0, 200.0, 500.0)
#: Bucket bounds (ms) of the consume callback histogram: RocketMQ 5 clients' ``rocketmq_process_time``.
PROCESS_TIME_BOUNDS_MS = (1.0, 5.0, 10.0, 100.0, 1000.0, 10_000.0, 60_000.0)

#: The meter (instrumentation scope) name of every instrument.
METER_NAME = "splitmq.client"

SUCCESS = "success"
FAILURE = "failure"


class Histogram:
    """Counts of observations per bucket ``(bounds[i-1], bounds[i]]`` (the last bucket is ``> bounds[-1]``),
    with their count, sum and maximum -- OpenTelemetry's explicit-bucket histogram, kept as plain ints."""

    __slots__ = ("bounds", "buckets", "count", "max_ms", "sum_ms")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum_ms = 0.0
        self.max_ms = 0.0

    def observe(self, ms: float) -> None:
        self.buckets[bisect_left(self.bounds, ms)] += 1
        self.count += 1
        self.sum_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def snapshot(self) -> dict[str, Any]:
        """``{"count", "sumMs", "maxMs", "buckets": {"<=1": n, ..., ">500": n}}`` (counts per bucket, not
        cumulative)."""
        labels = [f"<={b:g}" for b in self.bounds] + [f">{self.bounds[-1]:g}"]
        return {"count": self.count, "sumMs": round(self.sum_ms, 3), "maxMs": round(self.max_ms, 3),
                "buckets": dict(zip(labels, list(self.buckets), strict=True))}


def error_type(err: BaseException) -> str:
    """The label of a failed send: the exception's class name (``SendFailedError``, ``RequestTimeoutError``...),
    plus the RocketMQ response code of a broker's refusal (``BrokerError:14``)."""
    name = type(err).__name__
    return f"{name}:{int(err.code)}" if isinstance(err, BrokerError) else name


def lag_of(max_offset: int, next_begin_offset: int) -> int:
    """Messages of a queue the consumer has not pulled yet, as the last pull answer saw them (never < 0: a
    slave's max offset may trail the offset a master gave)."""
    return max(0, max_offset - next_begin_offset)


class _SendCell:
    __slots__ = ("attrs", "cost", "messages", "requests")

    def __init__(self, attrs: dict[str, str]) -> None:
        self.requests = 0
        self.messages = 0
        self.attrs = attrs
        self.cost: _CostCell | None = None
        """The send-cost cell this cell's requests are timed in (found on first use, then kept)."""


class _CostCell:
    __slots__ = ("attrs", "hist")

    def __init__(self, bounds: tuple[float, ...], attrs: dict[str, str]) -> None:
        self.hist = Histogram(bounds)
        self.attrs = attrs


class ClientMetrics:
    """The counters of one producer or consumer.

    A client creates it at construction (off), and :meth:`bind` switches it on when the client attaches to its
    client instance, whose ``ClientConfig`` says whether metrics are collected (``metrics``) and where
    OpenTelemetry instruments live (``meter_provider``). Hot-path callers test :attr:`on` first.

    Args:
        kind: ``producer`` or ``consumer``.
        group: the client's group.
    """

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        self.on = False
        """Collect (set by :meth:`bind` from ``ClientConfig.metrics``)."""
        self.client_id = ""
        self._instance: Any = None
        self._otel: _OtelExport | None = None
        self._group_attr = "consumer_group" if kind == "consumer" else "producer_group"
        self.sends: dict[tuple[str, str], _SendCell] = {}
        """(topic, send status or ``error``) -> requests and messages."""
        self.send_errors: dict[tuple[str, str], _SendCell] = {}
        """(topic, :func:`error_type`) -> failed requests and their messages."""
        self.send_cost: dict[tuple[str, str], _CostCell] = {}
        """(topic, success / failure) -> latency of send requests (all attempts of one request)."""
        self.pulls: dict[tuple[str, str, int], _SendCell] = {}
        """(topic, broker name, id of the member that served) -> pull requests and messages found."""
        self.lag: dict[tuple[str, str, int], int] = {}
        """(topic, broker name, queue id) -> :func:`lag_of` the last pull answer."""
        self.consumed: dict[tuple[str, str], _SendCell] = {}
        """(topic, success / failure) -> messages handed to the application (``messages``)."""
        self.process_time: dict[tuple[str, str], _CostCell] = {}
        """(topic, success / failure) -> latency of push consume callbacks."""
        self.fault: Any = None
        """The producer's latency fault table (its isolations are the producer's broker-down marks)."""
        self.cached: Callable[[], dict[str, tuple[int, int]]] | None = None
        """Topic -> (messages, body bytes) pulled and not consumed yet (set by group and push consumers)."""

    # --- setup ---

    def bind(self, instance: Any) -> None:
        """Attach to the client instance: its id, its shared counters, its config's switch and meter."""
        cfg = instance.config
        self.client_id = instance.client_id
        self._instance = instance
        self.on = bool(getattr(cfg, "metrics", True))
        if self.on:
            try:
                self._otel = _OtelExport.of(getattr(cfg, "meter_provider", None))
            except Exception as e:  # a broken or too old OpenTelemetry must not stop the client
                log.warning("client metrics are not exported to OpenTelemetry: %s", e)
                self._otel = None
            if self._otel is not None:
                self._otel.add(self)

    def _attrs(self, topic: str, **more: str) -> dict[str, str]:
        return {"topic": topic, "client_id": self.client_id, self._group_attr: self.group, **more}

    # --- recording (callers test ``on`` first) ---

    def sent(self, topic: str, status: str, count: int, began: float) -> None:
        """A send request of ``count`` messages stored with ``status``; ``began`` is its ``perf_counter``."""
        ms = (time.perf_counter() - began) * 1000.0
        key = (topic, status)
        cell = self.sends.get(key)
        if cell is None:
            cell = self.sends.setdefault(key, _SendCell(self._attrs(topic, send_status=status)))
        cell.requests += 1
        cell.messages += count
        cost = cell.cost
        if cost is None:
            cost = cell.cost = self._cost_cell(topic, SUCCESS)
        self._observe_cost(cost, ms)

    def send_failed(self, topic: str, err: BaseException, count: int, began: float) -> None:
        """A send request of ``count`` messages failed with ``err`` (after its retries)."""
        ms = (time.perf_counter() - began) * 1000.0
        key = (topic, error_type(err))
        cell = self.send_errors.get(key)
        if cell is None:
            cell = self.send_errors.setdefault(key, _SendCell(self._attrs(topic, error_type=key[1])))
        cell.requests += 1
        cell.messages += count
        self._cost(topic, FAILURE, ms)

    def _cost_cell(self, topic: str, status: str) -> _CostCell:
        key = (topic, status)
        cell = self.send_cost.get(key)
        if cell is None:
            # RocketMQ's attributes exactly (no group), so dashboards built for its clients work.
            attrs = {"topic": topic, "client_id": self.client_id, "invocation_status": status}
            cell = self.send_cost.setdefault(key, _CostCell(SEND_COST_BOUNDS_MS, attrs))
        return cell

    def _cost(self, topic: str, status: str, ms: float) -> None:
        self._observe_cost(self._cost_cell(topic, status), ms)

    def _observe_cost(self, cell: _CostCell, ms: float) -> None:
        cell.hist.observe(ms)
        otel = self._otel
        if otel is not None:
            otel.send_cost.record(ms, cell.attrs)

    def pulled(self, topic: str, broker_name: str, queue_id: int, served_by: int, found: int, max_offset: int,
               next_begin_offset: int) -> None:
        """A pull answer: who served it, how many messages it found, and the queue's lag it shows."""
        key = (topic, broker_name, served_by)
        cell = self.pulls.get(key)
        if cell is None:
            cell = self.pulls.setdefault(key, _SendCell(self._attrs(
                topic, broker_name=broker_name, served_by_broker_id=str(served_by))))
        cell.requests += 1
        cell.messages += found
        self.lag[(topic, broker_name, queue_id)] = lag_of(max_offset, next_begin_offset)

    def consumed_messages(self, topic: str, count: int, ok: bool = True) -> None:
        """``count`` messages of ``topic`` handed to the application (a poll, or a callback's outcome)."""
        status = SUCCESS if ok else FAILURE
        key = (topic, status)
        cell = self.consumed.get(key)
        if cell is None:
            cell = self.consumed.setdefault(key, _SendCell(self._attrs(topic, invocation_status=status)))
        cell.requests += 1
        cell.messages += count

    def processed(self, topic: str, count: int, ok: bool, began: float) -> None:
        """A push consume callback of ``count`` messages returned (``ok``: CONSUME_SUCCESS)."""
        ms = (time.perf_counter() - began) * 1000.0
        self.consumed_messages(topic, count, ok)
        key = (topic, SUCCESS if ok else FAILURE)
        cell = self.process_time.get(key)
        if cell is None:
            attrs = {"topic": topic, "client_id": self.client_id, "consumer_group": self.group,
                     "invocation_status": key[1]}
            cell = self.process_time.setdefault(key, _CostCell(PROCESS_TIME_BOUNDS_MS, attrs))
        cell.hist.observe(ms)
        otel = self._otel
        if otel is not None:
            otel.process_time.record(ms, cell.attrs)

    # --- reading ---

    def route_refreshes(self) -> dict[str, int]:
        """Route reads of the client instance per topic (shared by every client of the instance)."""
        inst = self._instance
        return dict(getattr(inst, "route_refreshes", None) or {}) if inst is not None else {}

    def broker_down_marks(self) -> dict[str, int]:
        """Members marked down: ``broker[id]`` the consumers found unreachable (the instance's table, shared),
        and for a producer ``broker`` its latency fault tolerance isolated."""
        out: dict[str, int] = {}
        inst = self._instance
        table = getattr(inst, "broker_down", None) if self.kind == "consumer" else None
        if table is not None:
            for (name, bid), n in list(table.down_marks.items()):
                out[f"{name}[{bid}]"] = n
        fault = self.fault
        if fault is not None:
            for name, n in list(fault.isolations.items()):
                out[name] = n
        return out

    def snapshot(self) -> dict[str, Any]:
        """Everything as plain dicts (JSON-serialisable; docs/GUIDE.md "Metrics" shows one)."""
        out: dict[str, Any] = {"clientId": self.client_id, "group": self.group, "metrics": self.on}
        if self.kind == "producer":
            out["sends"] = _nest(((t, s), {"requests": c.requests, "messages": c.messages})
                                 for (t, s), c in list(self.sends.items()))
            out["sendErrors"] = _nest(((t, e), {"requests": c.requests, "messages": c.messages})
                                      for (t, e), c in list(self.send_errors.items()))
            out["sendCostMs"] = _nest(((t, s), c.hist.snapshot()) for (t, s), c in list(self.send_cost.items()))
        else:
            out["pullsServedBy"] = _nest(((t, b, str(i)), {"requests": c.requests, "messages": c.messages})
                                         for (t, b, i), c in list(self.pulls.items()))
            out["lag"] = _nest(((t, b, str(q)), n) for (t, b, q), n in list(self.lag.items()))
            out["consumed"] = _nest(((t, s), c.messages) for (t, s), c in list(self.consumed.items()))
            out["processTimeMs"] = _nest(((t, s), c.hist.snapshot())
                                         for (t, s), c in list(self.process_time.items()))
        out["routeRefreshes"] = self.route_refreshes()
        out["brokerDownMarks"] = self.broker_down_marks()
        return out


def _nest(items: Iterable[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """``[((a, b, c), v)]`` -> ``{a: {b: {c: v}}}``, keys sorted."""
    out: dict[str, Any] = {}
    for keys, value in sorted(items, key=lambda kv: kv[0]):
        d = out
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return out


# --- OpenTelemetry -------------------------------------------------------------------------------------------

#: What an observable instrument reports of one client: (attributes, value) rows.
_Rows = Callable[[ClientMetrics], Iterable[tuple[dict[str, str], int]]]


class _OtelExport:
    """The instruments on one meter provider, shared by every client reporting to it.

    One set per provider because an SDK meter refuses a second instrument of the same name (it hands back the
    first, without the new callbacks): the observable instruments' callbacks walk every live client instead, and
    add up the cells of clients with the same attributes (two producers of a group on one client instance).
    """

    _by_provider: dict[int, _OtelExport] = {}
    _lock = threading.Lock()
    _create_lock = threading.Lock()

    def __init__(self, provider: Any) -> None:
        from opentelemetry.metrics import Observation

        self.provider = provider  # held: the dict key is its id
        self._observation = Observation
        self.clients: weakref.WeakSet[ClientMetrics] = weakref.WeakSet()
        meter = provider.get_meter(METER_NAME)
        self.send_cost = meter.create_histogram(
            "rocketmq_send_cost_time", unit="ms", description="Cost of send requests, all attempts included",
            explicit_bucket_boundaries_advisory=SEND_COST_BOUNDS_MS)
        self.process_time = meter.create_histogram(
            "rocketmq_process_time", unit="ms", description="Time in push consume callbacks",
            explicit_bucket_boundaries_advisory=PROCESS_TIME_BOUNDS_MS)
        counters: list[tuple[str, str, str, _Rows]] = [
            ("splitmq_send_requests", "{request}", "Send requests stored, by send status",
             lambda m: ((c.attrs, c.requests) for c in list(m.sends.values()))),
            ("splitmq_send_messages", "{message}", "Messages stored by send requests, by send status",
             lambda m: ((c.attrs, c.messages) for c in list(m.sends.values()))),
            ("splitmq_send_errors", "{request}", "Send requests failed after their retries, by error type",
             lambda m: ((c.attrs, c.requests) for c in list(m.send_errors.values()))),
            ("splitmq_pull_requests", "{request}", "Pull answers, by the member that served them",
             lambda m: ((c.attrs, c.requests) for c in list(m.pulls.values()))),
            ("splitmq_pulled_messages", "{message}", "Messages found by pulls, by the member that served them",
             lambda m: ((c.attrs, c.messages) for c in list(m.pulls.values()))),
            ("splitmq_consumed_messages", "{message}", "Messages handed to the application",
             lambda m: ((c.attrs, c.messages) for c in list(m.consumed.values()))),
            ("splitmq_route_refreshes", "{request}", "Route reads of the client instance, by topic",
             _route_rows),
            ("splitmq_broker_down_marks", "{mark}", "Brokers isolated by producers or members marked down by "
                                                    "consumers",
             _down_rows),
        ]
        for name, unit, desc, rows in counters:
            meter.create_observable_counter(name, callbacks=[self._callback(rows)], unit=unit, description=desc)
        meter.create_observable_gauge(
            "rocketmq_consumer_cached_messages", callbacks=[self._callback(_cached_rows(0))], unit="1",
            description="Messages pulled and not consumed yet, per topic")
        meter.create_observable_gauge(
            "rocketmq_consumer_cached_bytes", callbacks=[self._callback(_cached_rows(1))], unit="By",
            description="Body bytes of the messages pulled and not consumed yet, per topic")
        meter.create_observable_gauge(
            "splitmq_consumer_lag", callbacks=[self._callback(_lag_rows)], unit="{message}",
            description="Messages not pulled yet per queue, as the last pull answer saw them")

    @classmethod
    def of(cls, provider: Any) -> _OtelExport | None:
        """The export to ``provider`` (None: the global one); None when ``opentelemetry-api`` is missing."""
        try:
            from opentelemetry import metrics as otel_metrics
        except ImportError:
            return None
        if provider is None:
            provider = otel_metrics.get_meter_provider()
        # Two locks: making instruments takes the SDK's lock, which a collection holds while it calls our
        # callbacks, and those take ``_lock``; holding ``_lock`` here could deadlock with a collection.
        with cls._create_lock:
            with cls._lock:
                export = cls._by_provider.get(id(provider))
                if export is not None and export.provider is provider:
                    return export
            export = cls(provider)
            with cls._lock:  # kept with its provider: an application has one or two providers
                cls._by_provider[id(provider)] = export
            return export

    def add(self, metrics: ClientMetrics) -> None:
        with self._lock:
            self.clients.add(metrics)

    def live(self) -> list[ClientMetrics]:
        """The clients reporting here (copied under the lock: a client may open while the SDK collects)."""
        with self._lock:
            return list(self.clients)

    def _callback(self, rows: Callable[[ClientMetrics], Iterable[tuple[dict[str, str], int]]]
                  ) -> Callable[[Any], list[Any]]:
        def collect(_options: Any) -> list[Any]:
            sums: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], int]] = {}
            for m in self.live():
                for attrs, value in rows(m):
                    key = tuple(sorted(attrs.items()))
                    prev = sums.get(key)
                    sums[key] = (attrs, value + (prev[1] if prev else 0))
            return [self._observation(v, a) for a, v in sums.values()]
        return collect


def _route_rows(m: ClientMetrics) -> Iterable[tuple[dict[str, str], int]]:
    """The client instance's route reads, reported by the first of its clients only (the callback sums equal
    attributes, and every client of the instance sees the same counts)."""
    inst = m._instance
    if inst is None or _first_of(inst) is not m:
        return
    for topic, n in m.route_refreshes().items():
        yield {"topic": topic, "client_id": m.client_id}, n


def _first_of(instance: Any) -> ClientMetrics | None:
    with _OtelExport._lock:
        exports = list(_OtelExport._by_provider.values())
    for export in exports:
        for m in export.live():
            if m._instance is instance:
                return m
    return None


def _down_rows(m: ClientMetrics) -> Iterable[tuple[dict[str, str], int]]:
    """The instance's marks once (as :func:`_instance_rows`), each producer's isolations with its group."""
    inst = m._instance
    if m.kind == "producer" and m.fault is not None:
        for name, n in list(m.fault.isolations.items()):
            yield ({"client_id": m.client_id, "producer_group": m.group, "broker_name": name,
                    "reason": "latency_fault"}, n)
    if inst is not None and _first_of(inst) is m:
        for (name, bid), n in list(inst.broker_down.down_marks.items()):
            yield ({"client_id": m.client_id, "broker_name": name, "broker_id": str(bid), "reason": "unreachable"},
                   n)


def _cached_rows(field: int) -> _Rows:
    def rows(m: ClientMetrics) -> Iterable[tuple[dict[str, str], int]]:
        cached = m.cached
        for topic, figures in (cached() if cached is not None else {}).items():
            yield {"topic": topic, "client_id": m.client_id, "consumer_group": m.group}, figures[field]
    return rows


def _lag_rows(m: ClientMetrics) -> Iterable[tuple[dict[str, str], int]]:
    for (topic, broker, qid), n in list(m.lag.items()):
        yield ({"topic": topic, "client_id": m.client_id, "consumer_group": m.group, "broker_name": broker,
                "queue_id": str(qid)}, n)
