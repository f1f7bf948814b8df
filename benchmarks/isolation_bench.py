"""Issue 37: the claim SplitMQ exists for, measured. A reader replaying history on the master evicts the pages
its producers need and slows every write; sent to the slave, the same replay leaves the master alone.

``python -m benchmarks isolation [--quick]`` emulates two hosts on one machine. The master runs on one CPU in a
memory cgroup of its own (512 MiB; ``--quick`` 256 MiB), so its page cache is bounded as a host's RAM bounds it;
the slave runs on the other CPU in a cgroup of the same size (two equal hosts: the slave's own rule must see a
replay as cold too, or it would send the reader back). The producer, the master's only client, shares the
master's CPU; the nameserver, the replaying consumer group and the Spark job (its JVM and Python workers) share
the slave's, as if on hosts of their own that happened to be small. Each broker joins its cgroup before its
first instruction (``client.confine``), so every page it caches is charged there.

A history of 2.25 times the master's memory (8 KiB bodies, so RocketMQ's caps for cold reads, 8 messages and
64 KiB per pull, meet) is written first. Then one producer process sends 1 KiB messages one at a time, at half
the rate it reached alone, and records each send's latency, while the phases of :func:`plan_phases` run in
turn: no reader; a consumer group replaying the history from offset 0; a Spark batch job reading all of it. Each
replay runs once pinned to the master (the group's ``whichBrokerWhenConsumeSlowly=0``; Spark ``pullFrom=master``)
and once following the brokers' suggestions (``whichBrokerWhenConsumeSlowly=1``; ``pullFrom=auto``). A control
phase keeps the other CPU busy copying memory with no reader at all: two "hosts" on one machine still share
caches, memory and the hypervisor, and the control shows what that alone costs the producer. Per phase:
the producer's p50 / p99 / p99.9 (the ratio: p99 over the no-reader phases' p99, all no-reader phases pooled),
the bytes the master read from disk and its major page faults (``/proc/PID/io``, ``/proc/PID/stat``), the slave's
disk reads, the share of the replay's messages the slave served (the brokers' ``splitmq_pull_served_total``) and
the replay's rows/s.

Before each replay the master's commit log is checked page by page with ``mincore`` against the broker's rule
(cold when more than ``memoryForReadsBytes`` behind the log's end): how much of the history the rule calls warm
that is not cached (a read the master would serve from disk) and how much it calls cold that is cached (a read
sent away needlessly). The CPU a per-pull ``mincore`` would cost is set against the master's CPU per pull.

Making cgroups needs root (or a delegated hierarchy); without, the benchmark says so and runs with CPU pinning
only: the master's page cache is then the host's, every replay is a memory read, and the rule keeps it on the
master. With fewer than two CPUs there is no pinning either. Latency figures need a quiet machine.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import os
import tempfile
import threading
import time
import uuid
from array import array
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import attrs
import httpx

from benchmarks import Row
from benchmarks._load import in_threads, settle_group
from benchmarks._mincore import FileResidency, resident_map
from client import Admin, GroupConsumer, Message, MessageQueue, Producer
from client.cluster import BrokerHandle, LocalCluster
from client.confine import MemoryCgroup, cgroup_unavailable_reason, confine_prefix

__all__ = ["FULL", "QUICK", "LatencySummary", "Phase", "Profile", "percentile", "plan_phases", "run",
           "summarize"]

log = logging.getLogger(__name__)

MIB = 1 << 20
HISTORY = "IsoHistory"
LIVE = "IsoLive"
QUEUES = 4
#: Broker settings: faster registration only shortens the start.
_BROKER = {"registerNameServerPeriod": "1000", "registerNameServerPeriodMinMs": "500"}


@attrs.frozen
class Profile:
    """Sizes and durations of one run."""

    cgroup_bytes: int
    """Each broker's memory cgroup limit."""
    history_factor: float
    """History written before the phases, as a multiple of ``cgroup_bytes`` (at least 2: a replay from offset
    0 then starts on pages the master cannot still hold)."""
    body_bytes: int
    """History message body."""
    idle_s: float
    """Length of a no-reader phase."""
    probe_s: float
    """How long the producer sends flat out to find its capacity."""
    replay_timeout_s: float


FULL = Profile(cgroup_bytes=512 * MIB, history_factor=2.25, body_bytes=8192, idle_s=15.0, probe_s=3.0,
               replay_timeout_s=900.0)
QUICK = Profile(cgroup_bytes=256 * MIB, history_factor=2.0, body_bytes=8192, idle_s=4.0, probe_s=1.5,
                replay_timeout_s=300.0)

# --- pure parts -------------------------------------------------------------------------------------------------


@attrs.frozen
class Phase:
    """One phase: a reader (``none``; ``busy``, the control: no reader, the other CPU kept busy copying memory;
    ``group``, ``spark``) and, for a replay, whether it is pinned to the master (else it follows the brokers'
    suggestions)."""

    reader: str
    pinned: bool = False

    @property
    def is_replay(self) -> bool:
        return self.reader not in ("none", "busy")

    @property
    def label(self) -> str:
        if self.reader == "none":
            return "no reader"
        if self.reader == "busy":
            return "no reader, the other CPU busy"
        who = {"group": "consumer group", "spark": "Spark job"}.get(self.reader, self.reader)
        return f"{who}, {'pinned to the master' if self.pinned else 'following suggestions'}"


def plan_phases(readers: Sequence[str], *, control: bool = True) -> list[Phase]:
    """No reader first and again after each reader's pair; each reader once pinned to the master and once
    following the suggestions, the order flipping from one reader to the next (drift over the run then favours
    neither placement). With ``control``, the busy-CPU control follows the first no-reader phase."""
    out = [Phase("none"), *([Phase("busy")] if control else [])]
    for i, reader in enumerate(readers):
        pair = [Phase(reader, pinned=True), Phase(reader, pinned=False)]
        if i % 2:
            pair.reverse()
        out += [*pair, Phase("none")]
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of ascending values: the smallest value with at least ``q`` of
    them at or below it; 0.0 for no values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@attrs.frozen
class LatencySummary:
    """Send latencies of one phase, in ms."""

    count: int
    p50: float
    p99: float
    p999: float


def summarize(latencies_s: Sequence[float]) -> LatencySummary:
    s = sorted(latencies_s)
    return LatencySummary(len(s), percentile(s, 0.5) * 1e3, percentile(s, 0.99) * 1e3, percentile(s, 0.999) * 1e3)


def latencies_between(times: Sequence[float], latencies: Sequence[float], t0: float, t1: float) -> list[float]:
    """The latencies of the sends that started in ``[t0, t1)``."""
    return [lat for t, lat in zip(times, latencies, strict=True) if t0 <= t < t1]


def quiet_windows(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """The spans of ``[t0, t1)`` between two consecutive samples ``(time, messages the master served)`` in which
    the count did not move: the master served none of the replay then."""
    out = []
    for (a, na), (b, nb) in itertools.pairwise(samples):
        lo, hi = max(a, t0), min(b, t1)
        if nb == na and lo < hi:
            out.append((lo, hi))
    return out


def latencies_within(times: Sequence[float], latencies: Sequence[float], spans: Sequence[tuple[float, float]]
                     ) -> list[float]:
    """The latencies of the sends that started inside one of ``spans`` (ascending, not overlapping)."""
    out, i = [], 0
    for t, lat in zip(times, latencies, strict=True):
        while i < len(spans) and spans[i][1] <= t:
            i += 1
        if i < len(spans) and spans[i][0] <= t:
            out.append(lat)
    return out


def parse_proc_io(text: str) -> dict[str, int]:
    """``/proc/PID/io`` -> field -> value."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            out[key.strip()] = int(value)
    return out


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``/proc/PID/stat`` -> (major faults, user + system CPU in clock ticks); the command name may hold spaces
    and parentheses, so fields are counted after its last ``)``."""
    fields = text[text.rindex(")") + 2:].split()
    # After the name: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt(12) cmajflt utime(14)
    return int(fields[9]), int(fields[11]) + int(fields[12])


def prometheus_sum(text: str, name: str) -> float:
    """The sum of every sample of metric ``name`` (all label sets) in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- the measured processes --------------------------------------------------------------------------------------


@attrs.frozen
class Counters:
    """One broker's counters at one moment."""

    read_bytes: int
    major_faults: int
    cpu_s: float
    served_messages: float
    pull_requests: float

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.read_bytes - other.read_bytes, self.major_faults - other.major_faults,
                        self.cpu_s - other.cpu_s, self.served_messages - other.served_messages,
                        self.pull_requests - other.pull_requests)


def counters(b: BrokerHandle) -> Counters:
    pid = b.pid
    assert pid is not None
    with open(f"/proc/{pid}/io", encoding="ascii") as f:
        io = parse_proc_io(f.read())
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        majflt, ticks = parse_proc_stat(f.read())
    metrics = httpx.get(f"http://{b.addr}/metrics", timeout=10).text
    return Counters(io.get("read_bytes", 0), majflt, ticks / os.sysconf("SC_CLK_TCK"),
                    prometheus_sum(metrics, "splitmq_pull_served_total"),
                    prometheus_sum(metrics, "splitmq_pull_requests_total"))


def _producer_main(namesrv: str, topic: str, cpu: int | None, probe_s: float, conn: Connection,
                   stop: Event) -> None:
    """The steady producer (a process of its own, on the master's CPU): warm up, send flat out for ``probe_s``
    to find the capacity, report it, then send at half of it until ``stop``, timing each send; the send start
    times and latencies (and the start times of failed sends) go back as three arrays of doubles."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    logging.basicConfig(level=logging.ERROR)
    body = b"p" * 1024
    times, lats, errors = array("d"), array("d"), array("d")
    with Producer("iso-steady-producer", namesrv) as p:
        for _ in range(100):
            p.send(Message(topic, body))
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < probe_s:
            p.send(Message(topic, body))
            n += 1
        capacity = n / (time.monotonic() - t0)
        conn.send(capacity)
        period = 2.0 / capacity
        due = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)  # pacing the load
            elif now - due > 0.1:
                due = now  # fell behind by more than 100 ms (a stall): resume the pace, no burst to catch up
            t = time.monotonic()
            try:
                p.send(Message(topic, body))
            except Exception:  # counted, and the pace goes on
                errors.append(t)
            else:
                times.append(t)
                lats.append(time.monotonic() - t)
            due += period
    for a in (times, lats, errors):
        conn.send_bytes(a.tobytes())


@attrs.frozen
class PhaseResult:
    phase: Phase
    t0: float
    t1: float
    master: Counters
    slave: Counters
    rows: int = 0
    replay_s: float = 0.0
    residency: dict[str, float] = attrs.field(factory=dict)
    quiet: list[tuple[float, float]] = attrs.field(factory=list)
    """Spans in which the master served none of the replay (:func:`quiet_windows`)."""


def _fill_history(namesrv: str, total_bytes: int, body_bytes: int) -> int:
    """Write about ``total_bytes`` of history (batches of 32, four sending threads); returns the message count."""
    per_batch = 32
    batches = max(1, total_bytes // (per_batch * body_bytes))
    body = b"h" * body_bytes
    with Producer("iso-history-writer", namesrv) as p:
        def send(k: int) -> None:
            for i in range(k, batches, 4):
                p.send_batch([Message(HISTORY, body) for _ in range(per_batch)],
                             queue=MessageQueue(HISTORY, "broker-a", i % QUEUES))

        in_threads(send, 4)
    return batches * per_batch


def _replay_group(namesrv: str, rows: int, pinned: bool, timeout_s: float) -> tuple[int, float]:
    """A new consumer group reads the history from offset 0; returns (rows, seconds from first to last)."""
    group = f"iso_{'pinned' if pinned else 'follow'}_{uuid.uuid4().hex[:6]}"
    with Admin(namesrv) as admin:
        admin.update_subscription_group(group, which_broker_when_consume_slowly=0 if pinned else 1)
    c = GroupConsumer(group, namesrv, consume_from_where="FIRST_OFFSET", rebalance_interval_s=1.0,
                      heartbeat_interval_s=1.0, pull_suspend_s=1.0, pull_threshold_size_for_queue_mib=16)
    c.subscribe(HISTORY)
    got = 0
    first = last = 0.0
    deadline = time.monotonic() + timeout_s
    with c:  # starts it
        while got < rows and time.monotonic() < deadline:
            n = len(c.poll(0.2))
            if n:
                last = time.monotonic()
                first = first or last
                got += n
    if got < rows:
        raise TimeoutError(f"the consumer group read {got} of {rows} history messages in {timeout_s} s")
    return got, last - first


def _replay_spark(spark: Any, namesrv: str, rows: int, body_bytes: int, pinned: bool) -> tuple[int, float]:
    """A Spark batch job reads every history message and sums the body lengths (checked against the count)."""
    df = (spark.read.format("rocketmq").option("nameserver", namesrv).option("topic", HISTORY)
          .option("pullFrom", "master" if pinned else "auto").load())
    t0 = time.monotonic()
    total = df.selectExpr("sum(length(body)) as n").collect()[0]["n"]
    seconds = time.monotonic() - t0
    if total != rows * body_bytes:
        raise RuntimeError(f"the Spark job read {total} body bytes, expected {rows * body_bytes}")
    return rows, seconds


def _sample_served(master: BrokerHandle, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Every 0.5 s, the messages the master has served by pulls (one small HTTP request to it each time)."""
    url = f"http://{master.addr}/metrics"
    with httpx.Client(timeout=10) as http:
        while not stop.is_set():
            t = time.monotonic()
            out.append((t, prometheus_sum(http.get(url).text, "splitmq_pull_served_total")))
            stop.wait(0.5)


def _spark_session() -> Any:
    from benchmarks.spark_bench import _session

    return _session()


def _residency(master: BrokerHandle, history_end: int) -> dict[str, float]:
    """The broker's rule against the page cache, over the history's bytes (MiB)."""
    rt = master.runtime()
    memory, max_py = int(rt["memoryForReadsBytes"]), int(rt["commitLogMaxOffset"])
    files = sorted((int(p.name), str(p)) for p in (master.store_dir / "commitlog").iterdir() if p.name.isdigit())
    cached = resident_map(files, 0, history_end)
    page = os.sysconf("SC_PAGE_SIZE")
    warm_from = max_py - memory  # the rule: a read at offset o is warm when max_py - o <= memory
    warm_missing = sum(1 for i, c in enumerate(cached) if not c and i * page >= warm_from)
    cold_cached = sum(1 for i, c in enumerate(cached) if c and i * page < warm_from)
    return {"history": history_end / MIB, "cached": sum(cached) * page / MIB,
            "warm_not_cached": warm_missing * page / MIB, "cold_cached": cold_cached * page / MIB,
            "memory_for_reads": memory / MIB}


def _mincore_cost_us(master: BrokerHandle, span: int, rounds: int = 20_000) -> float:
    """Microseconds of one ``mincore`` of ``span`` bytes on a master commit-log file (ctypes call included)."""
    path = min(p for p in (master.store_dir / "commitlog").iterdir() if p.name.isdigit())
    with FileResidency(str(path)) as res:
        limit = max(1, res.size - span)
        t0 = time.perf_counter()
        for i in range(rounds):
            res.all_resident((i * 4096 * 17) % limit, span)
        return (time.perf_counter() - t0) / rounds * 1e6


def _cgroup_memory_lines(cg: MemoryCgroup | None) -> str:
    if cg is None:
        return ""
    try:
        with open(os.path.join(cg.path, "memory.stat"), encoding="ascii") as f:
            stat = dict(line.split() for line in f if line.strip())
    except OSError:
        return ""
    return f"anon {int(stat.get('rss', stat.get('anon', 0))) / MIB:.0f} MiB, " \
           f"page cache {int(stat.get('cache', stat.get('file', 0))) / MIB:.0f} MiB"


def _busy_main(cpu: int | None, seconds: float) -> None:
    """The control's load: copy a 32 MiB buffer over and over for ``seconds`` on ``cpu``, as a replay keeps
    the slave's CPU and the memory it shares with the master's busy, without any reader."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    src, dst = bytearray(32 * MIB), bytearray(32 * MIB)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        dst[:] = src


def _stop_process(proc: multiprocessing.process.BaseProcess, stop: Event) -> None:
    stop.set()
    proc.join(30)
    if proc.is_alive():  # its results were never read (the run failed): it may be stuck writing them
        proc.terminate()
        proc.join(10)


@contextlib.contextmanager
def _pinned_self(cpu: int | None) -> Iterator[None]:
    """This process (and every process it starts from now on) on ``cpu``, restored after."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# --- the run ------------------------------------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    """The ``isolation`` entry; prints the per-phase table, then returns its rows."""
    prof = QUICK if quick else FULL
    cpus = sorted(os.sched_getaffinity(0))
    master_cpu, other_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    reason = cgroup_unavailable_reason()
    notes: list[str] = []
    if reason is not None:
        notes.append(f"NO MEMORY CGROUP ({reason}): CPU pinning only; the master's page cache is the host's, so "
                     f"replays read memory and the rule keeps them on the master")
    if master_cpu is None:
        notes.append("fewer than 2 CPUs: no pinning")
    try:
        import pyspark  # noqa: F401

        readers = ["group", "spark"]
    except ImportError:
        readers = ["group"]
        notes.append("pyspark not installed: no Spark phases")
    for note in notes:
        print(f"isolation: {note}", flush=True)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="splitmq-bench-iso-")))
        tag = uuid.uuid4().hex[:8]
        cg_m = cg_s = None
        if reason is None:
            cg_m = stack.enter_context(MemoryCgroup.create(f"splitmq-iso-{tag}-master", prof.cgroup_bytes))
            cg_s = stack.enter_context(MemoryCgroup.create(f"splitmq-iso-{tag}-slave", prof.cgroup_bytes))
        stack.enter_context(_pinned_self(other_cpu))
        cluster = LocalCluster(root / "cluster", slaves_per_group=1, broker_config=_BROKER)
        master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
        master.command_prefix = confine_prefix(cg_m, None if master_cpu is None else [master_cpu])
        slave.command_prefix = confine_prefix(cg_s, None if other_cpu is None else [other_cpu])
        stack.enter_context(cluster)  # stopped before the cgroups are removed (the stack unwinds in reverse)
        ns = cluster.namesrv_addr
        with Admin(ns) as admin:
            admin.create_topic(HISTORY, queue_nums=QUEUES)
            admin.create_topic(LIVE, queue_nums=QUEUES)
        t_fill = time.monotonic()
        rows = _fill_history(ns, int(prof.cgroup_bytes * prof.history_factor), prof.body_bytes)
        history_end = int(master.runtime()["commitLogMaxOffset"])
        settle_group(cluster, "broker-a", 600)
        held = _cgroup_memory_lines(cg_m)
        print(f"isolation: history {rows:,} x {prof.body_bytes} B = {history_end / MIB:,.0f} MiB written and "
              f"replicated in {time.monotonic() - t_fill:.1f} s" + (f"; master cgroup {held}" if held else ""),
              flush=True)
        spark = None
        if "spark" in readers:
            spark = _spark_session()
            stack.callback(spark.stop)
            (spark.read.format("rocketmq").option("nameserver", ns).option("topic", LIVE)
             .option("endingOffsets", "{}").load().write.format("noop").mode("overwrite").save())  # warm-up
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        stop = ctx.Event()
        producer = ctx.Process(target=_producer_main, args=(ns, LIVE, master_cpu, prof.probe_s, child, stop),
                               daemon=True)
        producer.start()
        stack.callback(_stop_process, producer, stop)
        deadline = time.monotonic() + 120
        while not parent.poll(0.2):
            if not producer.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the steady producer reported no capacity (exit code {producer.exitcode})")
        capacity = float(parent.recv())
        print(f"isolation: producer capacity {capacity:,.0f} sends/s alone; steady load {capacity / 2:,.0f}/s",
              flush=True)
        results: list[PhaseResult] = []
        served: list[tuple[float, float]] = []
        sampling = threading.Event()
        sampler = threading.Thread(target=_sample_served, args=(master, sampling, served), daemon=True)
        sampler.start()
        stack.callback(sampler.join, 10)
        stack.callback(sampling.set)
        for phase in plan_phases(readers):
            residency = _residency(master, history_end) if phase.is_replay else {}
            m0, s0, t0 = counters(master), counters(slave), time.monotonic()
            n, seconds = 0, 0.0
            if phase.reader == "none":
                time.sleep(prof.idle_s)  # the phase's length: the producer's load runs on its own
            elif phase.reader == "busy":
                busy = ctx.Process(target=_busy_main, args=(other_cpu, prof.idle_s), daemon=True)
                busy.start()
                busy.join(prof.idle_s + 60)
            elif phase.reader == "group":
                n, seconds = _replay_group(ns, rows, phase.pinned, prof.replay_timeout_s)
            else:
                n, seconds = _replay_spark(spark, ns, rows, prof.body_bytes, phase.pinned)
            t1 = time.monotonic()
            results.append(PhaseResult(phase, t0, t1, counters(master) - m0, counters(slave) - s0, n, seconds,
                                       residency))
            print(f"isolation: {phase.label}: {t1 - t0:.1f} s", flush=True)
        sampling.set()
        sampler.join(10)
        results = [attrs.evolve(r, quiet=quiet_windows(served, r.t0, r.t1)) if r.phase.is_replay else r
                   for r in results]
        stop.set()
        times, lats, errors = (array("d", parent.recv_bytes()) for _ in range(3))
        mincore_us = {span: _mincore_cost_us(master, span) for span in (64 * 1024, 256 * 1024)}
        cache_note = _cgroup_memory_lines(cg_m)
    return _report(prof, results, times, lats, errors, capacity, mincore_us, reason is None, cache_note)


def _report(prof: Profile, results: list[PhaseResult], times: array[float], lats: array[float],
            errors: array[float], capacity: float, mincore_us: dict[int, float], cgroups: bool,
            cache_note: str) -> list[Row]:
    idle = [lat for r in results if r.phase.reader == "none"
            for lat in latencies_between(times, lats, r.t0, r.t1)]
    base = summarize(idle)
    where = (f"master cgroup {prof.cgroup_bytes // MIB} MiB, history {prof.history_factor}x" if cgroups
             else "no cgroup (CPU pinning only)")
    head = ("phase", "sends", "p50 ms", "p99 ms", "p99.9 ms", "p99 vs none", "p99 vs none, replay off the master",
            "master disk MB", "master majflt", "slave disk MB", "slave served", "replay rows/s", "errors")
    table = [head]
    rows: list[Row] = []
    for r in results:
        s = summarize(latencies_between(times, lats, r.t0, r.t1))
        errs = sum(1 for t in errors if r.t0 <= t < r.t1)
        served = r.master.served_messages + r.slave.served_messages
        share = f"{r.slave.served_messages / served:.0%}" if r.phase.is_replay and served else ""
        rate = r.rows / r.replay_s if r.replay_s else 0.0
        off = summarize(latencies_within(times, lats, r.quiet))
        off_text = f"{off.p99 / base.p99:.2f}x ({sum(b - a for a, b in r.quiet):.0f} s)" if off.count and base.p99 else ""
        table.append((r.phase.label, f"{s.count:,}", f"{s.p50:.2f}", f"{s.p99:.2f}", f"{s.p999:.2f}",
                      f"{s.p99 / base.p99:.2f}x" if base.p99 else "", off_text, f"{r.master.read_bytes / 1e6:,.0f}",
                      f"{r.master.major_faults:,}", f"{r.slave.read_bytes / 1e6:,.0f}", share,
                      f"{rate:,.0f}" if rate else "", str(errs)))
        target = "<= 1.2x" if r.phase.is_replay and not r.phase.pinned else ""
        rows.append(Row(f"{r.phase.label}: producer send p99 ({where})", s.p99, "ms", "no reader", base.p99,
                        target))
        rows.append(Row("  p99.9", s.p999, "ms", "no reader", base.p999))
        if off.count:
            rows.append(Row(f"  p99 while the master served none of the replay ({off.count:,} sends)", off.p99,
                            "ms", "no reader", base.p99))
        rows.append(Row("  master disk reads", r.master.read_bytes / 1e6, "MB"))
        rows.append(Row("  master major faults", float(r.master.major_faults), "faults"))
        if r.phase.is_replay:
            rows.append(Row(f"  replay rate ({r.rows:,} rows)", rate, "rows/s"))
    print("\n".join("| " + " | ".join(line) + " |" for line in [table[0], tuple("---" for _ in head), *table[1:]]))
    print(f"producer: 1 KiB sends one at a time at {capacity / 2:,.0f}/s (half its {capacity:,.0f}/s alone); "
          f"baseline = the no-reader phases pooled ({base.count:,} sends). {where}"
          + (f"; at the end the master's cgroup held {cache_note}." if cache_note else "."), flush=True)
    replays = [r for r in results if r.phase.is_replay]
    if replays:
        print("| replay | history MiB | cached MiB | rule's memory MiB | warm by the rule, not cached MiB | "
              "cold by the rule, cached MiB |\n|---|---|---|---|---|---|")
        for r in replays:
            d = r.residency
            print(f"| {r.phase.label} | {d['history']:,.0f} | {d['cached']:,.0f} | {d['memory_for_reads']:,.0f} | "
                  f"{d['warm_not_cached']:,.0f} | {d['cold_cached']:,.0f} |")
            rows.append(Row("  before it: history the rule calls warm that is not cached", d["warm_not_cached"],
                            "MiB"))
    pinned = [r for r in replays if r.phase.pinned and r.master.pull_requests]
    if pinned:
        cpu_us = sum(r.master.cpu_s for r in pinned) / sum(r.master.pull_requests for r in pinned) * 1e6
        for span, us in mincore_us.items():
            rows.append(Row(f"mincore of a pull's range ({span // 1024} KiB), per pull", us, "us",
                            "master CPU per pull (pinned replays, all of it)", cpu_us))
        print(f"cost of asking the kernel on every pull: mincore of 64 KiB {mincore_us[64 * 1024]:.1f} us, "
              f"256 KiB {mincore_us[256 * 1024]:.1f} us, against {cpu_us:.0f} us of master CPU per pull served "
              f"in the pinned replays", flush=True)
    return rows
