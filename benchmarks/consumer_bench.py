"""Consumer benchmarks against a local cluster: group consumer (lite pull) throughput with one and three
instances, push consumer throughput with a no-op callback, and the push consumer's memory with a large backlog
and a slow callback (flow control).

Entry ``consumer`` (``python -m benchmarks consumer [--quick]``): :func:`run`. Each throughput row's baseline is
the raw :class:`client.PullConsumer` pull rate of a topic of the same size in the same run (one thread pulling
queue after queue), so the ratio shows what the group machinery costs or gains. ``python -m
benchmarks.consumer_bench rss [GiB]`` runs only the backlog/RSS measurement and prints its figures.

The RSS measurement runs the push consumer in a child process (``python -m benchmarks.consumer_bench
rss-worker '<json>'``) so its resident set is its own; the parent samples it with psutil every 50 ms.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import Row
from benchmarks._load import in_threads
from client import (
    Admin,
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

__all__ = ["bench_group_consumer", "bench_pull_baseline", "bench_push_backlog_rss", "bench_push_consumer",
           "fill_topic", "measure_backlog_rss", "rss_allowance_bytes", "run"]

GIB = 1 << 30
MIB = 1 << 20
#: The backlog test wants this much free disk (1 GiB of records, index and consume queues, headroom).
RSS_DISK_NEEDED = 10 * GIB
_FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
         "consume_from_where": "FIRST_OFFSET"}


def fill_topic(namesrv_addr: str, prefix: str, messages: int, *, queue_nums: int = 8, body_bytes: int = 1024,
               batch: int = 64) -> str:
    """A new topic holding ``messages`` bodies of ``body_bytes``, sent in batches of ``batch`` spread over the
    queues (four sending threads, so the broker, not the client round trip, sets the pace)."""
    topic = f"{prefix}{uuid.uuid4().hex[:8]}"
    with Admin(namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queue_nums)
    body = b"x" * body_bytes
    batches = [min(batch, messages - i) for i in range(0, messages, batch)]
    with Producer(f"{prefix}_p", namesrv_addr) as p:
        def send(k: int) -> None:
            for n in batches[k::4]:
                p.send_batch([Message(topic, body) for _ in range(n)])

        in_threads(send, 4)
    return topic


# --- throughput -----------------------------------------------------------------------------------------------

def bench_pull_baseline(namesrv_addr: str, topic: str, messages: int) -> dict[str, float]:
    """Raw PullConsumer: one thread pulls every queue of ``topic`` from offset 0 to the end (batches of 32)."""
    count = 0
    with PullConsumer(f"bench_raw_{uuid.uuid4().hex[:6]}", namesrv_addr) as pc:
        queues = pc.fetch_subscribe_message_queues(topic)
        began = time.monotonic()
        for mq in queues:
            offset = 0
            while True:
                r = pc.pull(mq, offset, 32)
                if r.pull_status is not PullStatus.FOUND:
                    break
                count += len(r.msg_found_list)
                offset = r.next_begin_offset
        elapsed = time.monotonic() - began
    return {"messages": count, "seconds": elapsed, "msgs_per_s": count / elapsed if elapsed else 0.0}


def bench_group_consumer(namesrv_addr: str, topic: str, messages: int, *, instances: int = 1,
                         timeout_s: float = 120.0) -> dict[str, float]:
    """Messages per second polled by ``instances`` GroupConsumers (threads, one client instance each), from the
    first message to the last (``startup_s``: start to the first message, the rebalance)."""
    group = f"bench_gc_{uuid.uuid4().hex[:6]}"
    consumers = [GroupConsumer(group, namesrv_addr, instance_name=f"{group}_{i}", **_FAST)  # type: ignore[arg-type]
                 for i in range(instances)]
    counts = [0] * instances
    stop = threading.Event()

    first: list[float] = []

    def poll(i: int) -> None:
        while not stop.is_set():
            got = len(consumers[i].poll(0.2))
            if got and not first:
                first.append(time.monotonic())
            counts[i] += got

    for c in consumers:
        c.subscribe(topic)
    began = time.monotonic()
    for c in consumers:
        c.start()
    threads = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(instances)]
    for t in threads:
        t.start()
    deadline = began + timeout_s
    while sum(counts) < messages and time.monotonic() < deadline:
        time.sleep(0.02)  # sampling progress
    end = time.monotonic()
    stop.set()
    for t in threads:
        t.join(2)
    for c in consumers:
        c.close()
    start = first[0] if first else began
    return {"instances": instances, "messages": sum(counts), "seconds": end - start, "startup_s": start - began,
            "msgs_per_s": sum(counts) / max(end - start, 1e-9)}


def bench_push_consumer(namesrv_addr: str, topic: str, messages: int, *, batch_max: int = 32,
                        timeout_s: float = 120.0) -> dict[str, float]:
    """Messages per second through a PushConsumer whose callback does nothing (first message to last)."""
    count = 0
    first: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def noop(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal count
        with lock:
            if not first:
                first.append(time.monotonic())
            count += len(msgs)
            if count >= messages:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(f"bench_pc_{uuid.uuid4().hex[:6]}", namesrv_addr, noop, consume_message_batch_max_size=batch_max,
                     **_FAST)  # type: ignore[arg-type]
    c.subscribe(topic)
    began = time.monotonic()
    c.start()
    done.wait(timeout_s)
    end = time.monotonic()
    c.close()
    start = first[0] if first else began
    return {"messages": count, "seconds": end - start, "startup_s": start - began,
            "msgs_per_s": count / max(end - start, 1e-9)}


# --- memory under a backlog -------------------------------------------------------------------------------------

def bench_push_backlog_rss(namesrv_addr: str, topic: str, *, duration_s: float = 15.0,
                           callback_sleep_s: float = 0.001, consume_thread_nums: int = 4,
                           pull_threshold_for_queue: int = 1000, pull_threshold_size_for_queue_mib: int = 100,
                           sample_every_s: float = 0.05) -> dict[str, Any]:
    """Run a PushConsumer child process with a slow callback on ``topic`` for ``duration_s`` and sample its RSS.

    Returns:
        ``idle_rss`` (the child's RSS once started, before the first message), ``peak_rss``, ``consumed``, the
        consumer's :meth:`PushConsumer.stats` at the end, the largest ``cachedMessages`` / ``cachedBytes`` seen
        by the child, and ``queues``.
    """
    import psutil

    args = {"namesrv": namesrv_addr, "topic": topic, "duration_s": duration_s, "sleep_s": callback_sleep_s,
            "threads": consume_thread_nums, "count": pull_threshold_for_queue,
            "mib": pull_threshold_size_for_queue_mib}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.consumer_bench", "rss-worker", json.dumps(args)],
                            stdout=subprocess.PIPE, cwd=root, text=True)
    assert proc.stdout is not None
    child = psutil.Process(proc.pid)
    peak = 0
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            try:
                peak = max(peak, child.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(sample_every_s)  # the sampling period
        proc.wait(duration_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    proc.stdout.close()
    report = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or "idle_rss" not in report:
        raise RuntimeError(f"rss worker failed (exit {proc.returncode}): {lines[-5:]}")
    report["peak_rss"] = max(peak, report.get("peak_self_rss", 0))
    return report


def _rss_worker(args: dict[str, Any]) -> None:
    """Child side of :func:`bench_push_backlog_rss`: prints one JSON line with its figures."""
    import psutil

    me = psutil.Process()
    consumed = 0
    lock = threading.Lock()

    def slow(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal consumed
        time.sleep(args["sleep_s"] * len(msgs))
        with lock:
            consumed += len(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(f"rss_{uuid.uuid4().hex[:6]}", args["namesrv"], slow, consume_thread_nums=args["threads"],
                     pull_threshold_for_queue=args["count"], pull_threshold_size_for_queue_mib=args["mib"],
                     **_FAST)  # type: ignore[arg-type]
    c.subscribe(args["topic"])
    c.start()
    idle = me.memory_info().rss  # started, nothing pulled yet (the first rebalance takes a moment)
    peak = idle
    max_cached = max_cached_bytes = 0
    end = time.monotonic() + args["duration_s"]
    while time.monotonic() < end:
        st = c.stats()
        max_cached = max(max_cached, st["cachedMessages"])
        max_cached_bytes = max(max_cached_bytes, st["cachedBytes"])
        peak = max(peak, me.memory_info().rss)
        time.sleep(0.05)  # the sampling period
    stats = c.stats()
    c.close(await_termination_s=1.0)
    print(json.dumps({"idle_rss": idle, "peak_self_rss": peak, "consumed": consumed, "stats": stats,
                      "max_cached": max_cached, "max_cached_bytes": max_cached_bytes,
                      "queues": stats["queues"]}), flush=True)


#: Python's cost of one cached message beyond its body (MessageExt, properties, its queued consume task):
#: measured at 2-3 KiB; bounds allow 4 KiB.
PER_MESSAGE_OVERHEAD = 4096
#: Consume threads started on demand, connection buffers, allocator slack.
RUNTIME_SLACK = 8 * MIB


def rss_allowance_bytes(queues: int, threshold: int, pull_batch: int, body_bytes: int) -> int:
    """How much a push consumer's RSS may grow over its idle size with a backlog: a full cache on every queue
    (``threshold`` plus one pull's overshoot), each message its body plus :data:`PER_MESSAGE_OVERHEAD`, plus
    :data:`RUNTIME_SLACK`."""
    return queues * (threshold + pull_batch) * (body_bytes + PER_MESSAGE_OVERHEAD) + RUNTIME_SLACK


def rss_backlog_bytes(wanted: int = GIB, path: str = tempfile.gettempdir()) -> tuple[int, str]:
    """The backlog to build: ``wanted`` when the disk has ``RSS_DISK_NEEDED`` free, else a scaled-down size
    (an eighth of the free space, at least 64 MiB) and a note saying so."""
    free = shutil.disk_usage(path).free
    if free >= RSS_DISK_NEEDED:
        return wanted, ""
    scaled = max(64 * MIB, min(wanted, free // 8))
    return scaled, (f"only {free / GIB:.1f} GiB free on {path} (< {RSS_DISK_NEEDED // GIB} GiB): backlog scaled "
                    f"down to {scaled / MIB:.0f} MiB")


def measure_backlog_rss(backlog_bytes: int = GIB, *, duration_s: float = 15.0) -> dict[str, Any]:
    """Fill a fresh 1-master cluster with ``backlog_bytes`` of 1 KiB messages and run :func:`bench_push_backlog_rss`
    with the default thresholds (1000 messages / 100 MiB per queue, 8 queues)."""
    size, note = rss_backlog_bytes(backlog_bytes)
    with tempfile.TemporaryDirectory(prefix="splitmq-rss-") as root, \
            LocalCluster(root, broker_groups=1, slaves_per_group=0) as cluster:
        began = time.monotonic()
        topic = fill_topic(cluster.namesrv_addr, "BenchRss", size // 1024)
        fill_s = time.monotonic() - began
        out = bench_push_backlog_rss(cluster.namesrv_addr, topic, duration_s=duration_s)
    out.update(backlog_bytes=size, fill_s=fill_s, note=note)
    return out


# --- the entry ------------------------------------------------------------------------------------------------

def run(quick: bool) -> list[Row]:
    """Throughput rows (1 KiB messages; baseline: raw PullConsumer pulls of a same-size topic) and the backlog
    RSS rows (1 GiB backlog, or 128 MiB with ``quick``)."""
    n = 20_000 if quick else 100_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="splitmq-bench-") as root, \
            LocalCluster(root, broker_groups=1, slaves_per_group=0) as cluster:
        ns = cluster.namesrv_addr
        base_topic = fill_topic(ns, "BenchBase", n)
        base = bench_pull_baseline(ns, base_topic, n)["msgs_per_s"]
        raw = "raw PullConsumer pull, 1 thread"
        for instances in (1, 3):
            r = bench_group_consumer(ns, fill_topic(ns, "BenchGc", n), n, instances=instances)
            rows.append(Row(f"group consumer, {instances} instance{'s' if instances > 1 else ''}, 1 KiB",
                            r["msgs_per_s"], "msgs/s", raw, base))
        r = bench_push_consumer(ns, fill_topic(ns, "BenchPc", n), n)
        rows.append(Row("push consumer, no-op callback, 1 KiB", r["msgs_per_s"], "msgs/s", raw, base))
    rss = measure_backlog_rss(128 * MIB if quick else GIB, duration_s=8.0 if quick else 15.0)
    label = f"{rss['backlog_bytes'] / MIB:.0f} MiB backlog"
    allowed = rss_allowance_bytes(rss["queues"], 1000, 32, 1024) / MIB
    rows.append(Row(f"push consumer peak RSS, {label}, slow callback", rss["peak_rss"] / MIB, "MiB",
                    "idle RSS of the same process", rss["idle_rss"] / MIB,
                    f"<= idle + {allowed:.0f} MiB (cache bound)"))
    rows.append(Row(f"push consumer max cached messages, {label}", rss["max_cached"], "msgs",
                    "pull_threshold_for_queue x queues", rss["queues"] * 1000))
    rows.append(Row(f"push consumer messages pulled / consumed, {label}", rss["stats"]["pulledMessages"], "msgs",
                    "consumed by the callback", rss["consumed"], "<= consumed + cache bound"))
    return rows


def main(argv: list[str]) -> None:
    if argv[:1] == ["rss-worker"]:
        _rss_worker(json.loads(argv[1]))
        return
    if argv[:1] == ["rss"]:
        gib = float(argv[1]) if len(argv) > 1 else 1.0
        print(json.dumps(measure_backlog_rss(int(gib * GIB)), indent=1), flush=True)
        return
    from benchmarks import format_table

    print(format_table("consumer", run("--quick" in argv)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
