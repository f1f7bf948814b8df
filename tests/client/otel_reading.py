"""Reading what an OpenTelemetry SDK ``InMemoryMetricReader`` collected, for the client metrics tests."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


def reader_and_provider() -> tuple[InMemoryMetricReader, MeterProvider]:
    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader])


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """``{metric name: [(attributes, data point)]}`` of one collection."""
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    out.setdefault(metric.name, []).append((dict(p.attributes or {}), p))
    return out


def total(pts: dict[str, list[tuple[dict[str, Any], Any]]], name: str, **attrs: Any) -> float:
    """The sum of ``name``'s counter values (a histogram's counts) over the points whose attributes match."""
    got = 0.0
    for a, p in pts.get(name, []):
        if all(a.get(k) == v for k, v in attrs.items()):
            got += p.count if hasattr(p, "bucket_counts") else p.value
    return got
