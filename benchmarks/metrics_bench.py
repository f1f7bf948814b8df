"""What client metrics cost the data path: ``send_batch`` of 64 x 1 KiB with metrics on and off (issue 17).

``python -m benchmarks clientmetrics [--quick]``. One one-group LocalCluster (no slave); rounds alternate a
producer whose client instance collects metrics (``ClientConfig()``, the default; OpenTelemetry API installed but
no provider set, so its instruments are the API's no-op) with one that does not (``ClientConfig(metrics=False)``).
Both producers stay open (each on its own client instance: the switch belongs to the instance) and take turns
in short chunks, in ABBA order, so that the load of a shared machine falls on both sides alike.

Rows:

* throughput with metrics on, against metrics off as the baseline, and the cost: total wall time on / off - 1,
  and the median of the per-pair costs (a pair's chunks are adjacent in time). Target < 2 %;
* client CPU per message on and off (``time.process_time``, less noisy than wall time on a shared machine);
* the wall time of one request with metrics off. tests/client/test_metrics_bench.py runs the quick profile and
  holds the metrics code of one request (the ``perf_counter`` pair, the counters, the histogram, the
  OpenTelemetry no-op record), timed alone in a loop, under 2 % of it: a figure that stays steady on a busy
  machine, where the throughput ratio of two short runs swings by several percent either way.

``python -m benchmarks.metrics_bench`` prints the raw dict.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from typing import Any

from benchmarks import Row
from client import Admin, ClientConfig, Message, Producer

__all__ = ["bench_metrics_overhead", "rows", "run"]

BODY = b"x" * 1024
BATCH = 64


def _chunk(p: Producer, msgs: list[Message], batches: int) -> tuple[float, float]:
    """``batches`` sends: (wall seconds, process CPU seconds)."""
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        p.send_batch(msgs)
    return time.perf_counter() - w0, time.process_time() - c0


def bench_metrics_overhead(namesrv_addr: str, *, pairs: int = 200, batches: int = 15) -> dict[str, Any]:
    """``pairs`` ABBA-ordered pairs of chunks of ``batches`` sends, one chunk per producer in each pair."""
    topic = f"BenchMetrics_{uuid.uuid4().hex[:8]}"
    with Admin(namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=4)
    msgs = [Message(topic, BODY) for _ in range(BATCH)]
    # The switch belongs to the client instance, and there is one instance per nameserver list: naming the
    # nameserver twice gives the metrics-off producer an instance of its own.
    with Producer("bench_metrics_on", namesrv_addr, client_config=ClientConfig()) as on_p, \
            Producer("bench_metrics_off", f"{namesrv_addr};{namesrv_addr}",
                     client_config=ClientConfig(metrics=False)) as off_p:
        if not on_p.client.config.metrics or off_p.client.config.metrics or on_p.client is off_p.client:
            raise RuntimeError("the metrics switch did not apply: another client holds an instance")
        for p in (on_p, off_p):
            _chunk(p, msgs, 20)  # connections, the commit log's first pages
        on: list[tuple[float, float]] = []
        off: list[tuple[float, float]] = []
        for i in range(pairs):
            for metrics in ((True, False) if i % 2 == 0 else (False, True)):
                (on if metrics else off).append(_chunk(on_p if metrics else off_p, msgs, batches))
    n = BATCH * batches * pairs
    on_wall, off_wall = sum(w for w, _ in on), sum(w for w, _ in off)
    costs = sorted(a[0] / b[0] - 1.0 for a, b in zip(on, off, strict=True))
    return {
        "pairs": pairs, "batches": batches,
        "on_msgs_per_s": n / on_wall, "off_msgs_per_s": n / off_wall,
        "cost_pct": 100 * (on_wall / off_wall - 1.0),
        "pair_cost_pct_median": 100 * statistics.median(costs),
        "on_cpu_us": sum(c for _, c in on) / n * 1e6, "off_cpu_us": sum(c for _, c in off) / n * 1e6,
        "request_us": off_wall / (batches * pairs) * 1e6,
    }


def run(quick: bool) -> list[Row]:
    """Runner entry (``clientmetrics``): 200 pairs of 15-batch chunks; ``--quick``: 40 pairs of 10."""
    from client.cluster import LocalCluster

    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        r = bench_metrics_overhead(cluster.namesrv_addr, pairs=40 if quick else 200, batches=10 if quick else 15)
    return rows(r)


def rows(r: dict[str, Any]) -> list[Row]:
    chunks = f"{r['pairs']} pairs of {r['batches']}-batch chunks"
    return [
        Row(f"send_batch 64 x 1 KiB, metrics on, no OTel provider ({chunks})", r["on_msgs_per_s"], "msgs/s",
            "metrics=False, interleaved", r["off_msgs_per_s"], ">= 0.98x"),
        Row("metrics cost: wall time on / off - 1, all chunks", r["cost_pct"], "%", target="< 2"),
        Row("metrics cost: median of the per-pair costs", r["pair_cost_pct_median"], "%", target="< 2"),
        Row("send_batch client CPU per msg, metrics on", r["on_cpu_us"], "us", "metrics=False", r["off_cpu_us"],
            "<= 1.02x"),
        Row("send_batch request, metrics off (wall time per 64 msgs)", r["request_us"], "us"),
    ]


if __name__ == "__main__":
    from client.cluster import LocalCluster

    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        print(bench_metrics_overhead(cluster.namesrv_addr))
