"""SDK benchmarks against a one-group LocalCluster (no slave), 1 KiB messages.

Every figure comes with the CPU it cost on both sides, per message: the client's ``time.process_time`` and the
broker process's CPU time around the run (its threads' run time from ``/proc/<pid>/task/*/schedstat`` in
nanoseconds where the kernel offers it, else psutil's user+system time in 10 ms ticks), so a busy machine still
shows what the data path costs even when wall-clock rates are noisy. Figures:

* ``send_latency``     -- Producer.send from one thread: p50 / p99 latency (µs) and msgs/s;
* ``send_batch``       -- Producer.send_batch of 64 from one thread: msgs/s;
* ``async_concurrent`` -- AsyncProducer with 64 concurrent senders (automatic batching), on asyncio's default
  loop and on uvloop (the SDK works on both; the user picks the loop);
* ``pull``             -- PullConsumer.pull of 32 per request, every message decoded, as a consumer runs it: one
  thread per queue over 4 queues (pulls overlap, as in a real consumer); the one-thread figure is reported too.

Baselines, measured in the same run, are the floor the broker allows: prebuilt requests over a raw keep-alive
socket (no SDK, nothing decoded). Below that, the same 1-message POST to a null HTTP server on the broker's stack
(:mod:`benchmarks._null_server`) is the loopback floor: what a request costs on this machine before any SplitMQ
code runs. ``python -m benchmarks client`` runs them all; ``python -m
benchmarks.client_bench [name ...]`` prints the raw dicts.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import Row
from benchmarks._null_server import null_http_server
from client import Admin, AsyncProducer, Message, Producer, PullConsumer, PullStatus
from common.message import MessageQueue

__all__ = [
    "bench_async_concurrent", "bench_default_transport_batch", "bench_pull", "bench_raw_pull", "bench_raw_send",
    "bench_send_batch", "bench_send_latency", "httpx_share", "raw_connection", "raw_exchange", "raw_send_request",
    "run", "run_all",
]

BODY = b"x" * 1024
PULL_QUEUES = 4


class CpuMeter:
    """Client and broker CPU seconds spent inside ``with meter.measure():`` blocks.

    Args:
        broker_pid: the broker process (None: broker CPU reads as 0).
    """

    def __init__(self, broker_pid: int | None) -> None:
        self._proc: Any = None
        self._tasks: str | None = None
        if broker_pid is not None:
            import psutil

            self._proc = psutil.Process(broker_pid)
            self._tasks = f"/proc/{broker_pid}/task"
            if self._schedstat_s() is None:
                self._tasks = None

    def _schedstat_s(self) -> float | None:
        """The broker's threads' run time in ``/proc/<pid>/task/*/schedstat`` (nanoseconds, where psutil's
        ``cpu_times`` counts 10 ms ticks: a 5 s run of single sends read 80.0, 106.7 or 146.7 µs a send); None
        where the kernel does not offer it."""
        assert self._tasks is not None
        total = 0
        try:
            tasks = os.listdir(self._tasks)
        except OSError:
            return None
        for task in tasks:
            try:
                with open(f"{self._tasks}/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
        return total / 1e9

    def broker_cpu_s(self) -> float:
        if self._proc is None:
            return 0.0
        if self._tasks is not None:
            s = self._schedstat_s()
            if s is not None:
                return s
        t = self._proc.cpu_times()
        return float(t.user + t.system)

    @contextmanager
    def measure(self, out: dict[str, float], messages: int) -> Iterator[None]:
        """Fill ``out`` with ``msgs_per_s``, ``client_us`` and ``broker_us`` (CPU µs per message)."""
        b0, c0, w0 = self.broker_cpu_s(), time.process_time(), time.perf_counter()
        yield
        wall, client, broker = time.perf_counter() - w0, time.process_time() - c0, self.broker_cpu_s() - b0
        out.update(msgs_per_s=messages / wall, client_us=client / messages * 1e6, broker_us=broker / messages * 1e6)

    def settle(self, *, quiet_cpu_share: float = 0.1, timeout_s: float = 30.0) -> None:
        """Wait (bounded) until the broker is quiet: a fresh commit-log file is pre-faulted in the background,
        which must not be billed to the first figure."""
        deadline = time.monotonic() + timeout_s
        while self._proc is not None and time.monotonic() < deadline:
            before = self.broker_cpu_s()
            time.sleep(0.25)  # a measurement window, not a synchronisation
            if self.broker_cpu_s() - before < 0.25 * quiet_cpu_share:
                return


_NO_METER = CpuMeter(None)


def _topic(namesrv_addr: str, prefix: str, queue_nums: int = 4) -> str:
    topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with Admin(namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queue_nums)
    return topic


def bench_send_latency(namesrv_addr: str, *, messages: int = 3000, meter: CpuMeter = _NO_METER) -> dict[str, float]:
    """One thread, one message per send."""
    topic = _topic(namesrv_addr, "BenchSend")
    lat: list[float] = []
    out: dict[str, float] = {}
    with Producer("bench_send", namesrv_addr) as p:
        for _ in range(50):
            p.send(Message(topic, BODY))
        with meter.measure(out, messages):
            for _ in range(messages):
                t = time.perf_counter()
                p.send(Message(topic, BODY))
                lat.append(time.perf_counter() - t)
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6, **out}


def bench_send_batch(namesrv_addr: str, *, batch: int = 64, batches: int = 600,
                     meter: CpuMeter = _NO_METER) -> dict[str, float]:
    """One thread, ``batch`` messages per request (the same Message objects every time)."""
    topic = _topic(namesrv_addr, "BenchBatch")
    msgs = [Message(topic, BODY) for _ in range(batch)]
    out: dict[str, float] = {}
    with Producer("bench_batch", namesrv_addr) as p:
        p.send_batch(msgs)
        with meter.measure(out, batch * batches):
            for _ in range(batches):
                p.send_batch(msgs)
    return out


def bench_async_concurrent(namesrv_addr: str, *, senders: int = 64, messages: int = 40_000, loop: str = "asyncio",
                           meter: CpuMeter = _NO_METER) -> dict[str, float]:
    """``senders`` coroutines each awaiting ``send`` of a new Message in a loop; the producer batches them.

    ``loop``: ``asyncio`` (the default loop) or ``uvloop``.
    """
    topic = _topic(namesrv_addr, "BenchAsync")
    per = messages // senders
    out: dict[str, float] = {}

    async def main() -> None:
        async with AsyncProducer("bench_async", namesrv_addr) as p:
            await p.send(Message(topic, BODY))

            async def sender() -> None:
                for _ in range(per):
                    await p.send(Message(topic, BODY))

            with meter.measure(out, per * senders):
                await asyncio.gather(*(sender() for _ in range(senders)))

    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())
    return out


def fill_pull_topic(namesrv_addr: str, *, messages: int, queues: int = PULL_QUEUES) -> str:
    """A topic of ``queues`` queues holding ``messages`` 1 KiB messages spread evenly over them."""
    topic = _topic(namesrv_addr, "BenchPull", queue_nums=queues)
    per_queue = messages // queues
    with Producer("bench_pull_p", namesrv_addr) as p:
        for mq in p.client.try_to_find_topic_publish_info(topic).message_queues:
            msgs = [Message(topic, BODY) for _ in range(min(256, per_queue))]
            for _ in range(per_queue // len(msgs)):
                p.send_batch(msgs, mq)
    return topic


def _drain_queue(c: PullConsumer, mq: MessageQueue, max_nums: int, sizes: list[int]) -> int:
    got = offset = 0
    while True:
        r = c.pull(mq, offset, max_nums=max_nums)
        if r.pull_status is not PullStatus.FOUND:
            return got
        got += len(r.msg_found_list)
        sizes.append(len(r.msg_found_list))
        offset = r.next_begin_offset


def bench_pull(namesrv_addr: str, topic: str, *, threads: int = PULL_QUEUES, max_nums: int = 32,
               meter: CpuMeter = _NO_METER) -> dict[str, float]:
    """Pull every queue of ``topic`` from its start, ``max_nums`` per request, decoding every message.

    ``threads`` threads share the queues (one queue each when equal to the queue count); 1 pulls them in turn.
    """
    out: dict[str, float] = {}
    with PullConsumer(f"bench_pull_{uuid.uuid4().hex[:6]}", namesrv_addr) as c:
        mqs = sorted(c.fetch_subscribe_message_queues(topic))
        sizes: list[int] = []
        counts: list[int] = []
        total = sum(c.max_offset(mq) for mq in mqs)

        def worker(mine: list[MessageQueue]) -> None:
            counts.append(sum(_drain_queue(c, mq, max_nums, sizes) for mq in mine))

        with meter.measure(out, total):
            pool = [threading.Thread(target=worker, args=(mqs[i::threads],)) for i in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
    if sum(counts) != total:
        raise RuntimeError(f"pulled {sum(counts)} messages, expected {total}")
    return {**out, "messages": float(total), "mean_per_pull": statistics.fmean(sizes) if sizes else 0.0}


# --- baselines: raw keep-alive sockets, prebuilt requests ------------------------------------------------


def raw_connection(addr: str) -> socket.socket:
    """A keep-alive connection to ``host:port`` for :func:`raw_exchange` (Nagle off, as the SDK's)."""
    host, _, port = addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def raw_exchange(s: socket.socket, request: bytes) -> None:
    """Send a prebuilt request and read its whole answer (a 200 with a Content-Length), decoding nothing.

    Raises:
        ConnectionError: the server closed the connection before the whole answer (an idle keep-alive
            connection it timed out, say).
    """
    s.sendall(request)
    buf = b""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += _received(s)
    head = buf[:end].lower()
    at = head.find(b"content-length:")
    length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None])
    if not head.startswith(b"http/1.1 200"):
        raise RuntimeError(f"baseline request failed: {head[:80]!r}")
    while len(buf) - end - 4 < length:
        buf += _received(s)


def _received(s: socket.socket) -> bytes:
    data = s.recv(262144)
    if not data:
        raise ConnectionError("the server closed the connection before the whole answer")
    return data


def _raw_loop(addr: str, request: bytes, count: int) -> float:
    """Send ``request`` ``count`` times on one keep-alive connection, reading each whole answer; seconds."""
    with raw_connection(addr) as s:
        raw_exchange(s, request)
        t0 = time.perf_counter()
        for _ in range(count):
            raw_exchange(s, request)
        return time.perf_counter() - t0


def _master(namesrv_addr: str, topic: str) -> str:
    with Admin(namesrv_addr) as admin:
        return admin.topic_route(topic).broker_datas[0].broker_addrs[0]


def raw_send_request(topic: str, addr: str, *, batch: int = 64) -> bytes:
    """A prebuilt ``POST /send`` of ``batch`` 1 KiB messages to queue 0 of ``topic`` at ``addr``."""
    from common.codec import encode_batch

    body = encode_batch([Message(topic, BODY) for _ in range(batch)], born_timestamp_ms=int(time.time() * 1000),
                        uniq_keys=[uuid.uuid4().hex.upper() for _ in range(batch)])
    head = (f"POST /send?topic={topic}&queueId=0&group=bench_raw HTTP/1.1\r\nHost: {addr}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


def bench_raw_send(namesrv_addr: str, *, batch: int = 64, requests: int = 300, to: str | None = None) -> float:
    """Baseline: prebuilt ``batch``-message send bodies POSTed over a raw socket to the master (or to the server
    at ``to``, such as the null HTTP server of :mod:`benchmarks._null_server`); msgs/s."""
    topic = _topic(namesrv_addr, "BenchRaw")
    addr = to or _master(namesrv_addr, topic)
    return batch * requests / _raw_loop(addr, raw_send_request(topic, addr, batch=batch), requests)


def bench_raw_pull(namesrv_addr: str, topic: str, *, max_nums: int = 32, requests: int = 500) -> float:
    """Baseline: the same pull (first ``max_nums`` messages of queue 0) over a raw socket, nothing decoded."""
    addr = _master(namesrv_addr, topic)
    req = (f"GET /pull?group=bench_raw&topic={topic}&queueId=0&offset=0&maxNums={max_nums}&sysFlag=2"
           f"&subExpression=%2A HTTP/1.1\r\nHost: {addr}\r\n\r\n").encode()
    return max_nums * requests / _raw_loop(addr, req, requests)


def bench_default_transport_batch(namesrv_addr: str, *, batch: int = 64, batches: int = 300) -> float:
    """The same 64-message bodies POSTed with a plain ``httpx.Client`` (httpx's own transport); msgs/s."""
    import httpx

    from common.codec import encode_batch

    topic = _topic(namesrv_addr, "BenchBase")
    addr = _master(namesrv_addr, topic)
    body = encode_batch([Message(topic, BODY) for _ in range(batch)], born_timestamp_ms=int(time.time() * 1000))
    url = f"http://{addr}/send?topic={topic}&queueId=0&group=bench_base"
    with httpx.Client(timeout=10.0) as http:
        http.post(url, content=body).raise_for_status()
        t0 = time.perf_counter()
        for _ in range(batches):
            http.post(url, content=body).raise_for_status()
        total = time.perf_counter() - t0
    return batch * batches / total


def httpx_share(fn: Callable[[], object]) -> float:
    """Share (0..1) of ``fn``'s profiled client time spent in httpx's own code."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    stats: Any = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # {(file, line, name): (.., tottime, ..)}
    total = sum(v[2] for v in stats.values())
    in_httpx = sum(v[2] for k, v in stats.items() if "/httpx/" in k[0])
    return in_httpx / total if total else 0.0


def _median_of(runs: int, fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run ``fn`` ``runs`` times and return the run with the median ``msgs_per_s`` (two cores shared with the
    broker make single runs swing by tens of percent; a best run would flatter the figure)."""
    results = sorted((fn() for _ in range(runs)), key=lambda r: r["msgs_per_s"])
    return dict(results[len(results) // 2])


def run(quick: bool) -> list[Row]:
    """Runner entry: a one-group cluster (no slave), the SDK figures with CPU per message and raw baselines.

    Throughput rows are the median of three runs (one in quick mode), never the best run.
    """
    from client.cluster import LocalCluster

    scale = 4 if quick else 1
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        ns = cluster.namesrv_addr
        meter = CpuMeter(cluster.broker("broker-a", 0).pid)
        bench_send_batch(ns, batches=20)  # creates the commit-log file; its pre-faulting runs in the background
        meter.settle()
        runs = 1 if quick else 3
        raw_send = statistics.median(bench_raw_send(ns, requests=300 // scale) for _ in range(runs))
        raw_one = bench_raw_send(ns, batch=1, requests=3000 // scale)
        with null_http_server() as null_addr:
            raw_null = bench_raw_send(ns, batch=1, requests=3000 // scale, to=null_addr)
        lat = bench_send_latency(ns, messages=3000 // scale, meter=meter)
        share = httpx_share(lambda: bench_send_latency(ns, messages=300 // scale))
        batch = _median_of(runs, lambda: bench_send_batch(ns, batches=600 // scale, meter=meter))
        conc = _median_of(runs, lambda: bench_async_concurrent(ns, messages=40_000 // scale, meter=meter))
        conc_uv = _median_of(runs, lambda: bench_async_concurrent(ns, messages=40_000 // scale, loop="uvloop",
                                                                  meter=meter))
        topic = fill_pull_topic(ns, messages=64_000 // scale)
        meter.settle()
        raw_pull = bench_raw_pull(ns, topic, requests=1000 // scale)
        pull = _median_of(runs, lambda: bench_pull(ns, topic, meter=meter))
        pull1 = bench_pull(ns, topic, threads=1, meter=meter)
    raw = "raw socket, prebuilt 64-msg POST"
    rawp = "raw socket GET of a 32-msg pull, undecoded"
    return [
        Row("send, 1 thread: p50 latency", lat["p50_us"], "us"),
        Row("send, 1 thread: p99 latency", lat["p99_us"], "us"),
        Row("send, 1 thread", lat["msgs_per_s"], "msgs/s", "raw socket, prebuilt 1-msg POST", raw_one),
        Row("raw socket, prebuilt 1-msg POST", raw_one, "msgs/s", "the same to a null HTTP server (loopback floor)",
            raw_null),
        *_cpu_rows("send, 1 thread", lat),
        Row("send, 1 thread: httpx share of client CPU", share * 100, "%"),
        Row("send_batch of 64 (median of runs)", batch["msgs_per_s"], "msgs/s", raw, raw_send, ">= 60000"),
        *_cpu_rows("send_batch of 64", batch),
        Row("AsyncProducer, 64 senders, asyncio loop (median)", conc["msgs_per_s"], "msgs/s", raw, raw_send,
            ">= 50000"),
        *_cpu_rows("AsyncProducer, asyncio loop", conc),
        Row("AsyncProducer, 64 senders, uvloop (median)", conc_uv["msgs_per_s"], "msgs/s", raw, raw_send,
            ">= 50000"),
        *_cpu_rows("AsyncProducer, uvloop", conc_uv),
        Row(f"pull 32/request, decoded, {PULL_QUEUES} queues x 1 thread (median)", pull["msgs_per_s"], "msgs/s",
            rawp, raw_pull, ">= 100000"),
        *_cpu_rows("pull, 4 threads", pull),
        Row("pull 32/request, decoded, 1 thread", pull1["msgs_per_s"], "msgs/s", rawp, raw_pull),
        *_cpu_rows("pull, 1 thread", pull1),
    ]


def _cpu_rows(name: str, figures: dict[str, float]) -> list[Row]:
    return [Row(f"{name}: client CPU per msg", figures["client_us"], "us"),
            Row(f"{name}: broker CPU per msg", figures["broker_us"], "us")]


def run_all(namesrv_addr: str) -> dict[str, dict[str, Any]]:
    topic = fill_pull_topic(namesrv_addr, messages=64_000)
    return {
        "send_latency": bench_send_latency(namesrv_addr),
        "send_batch": bench_send_batch(namesrv_addr),
        "async_concurrent": bench_async_concurrent(namesrv_addr),
        "pull": bench_pull(namesrv_addr, topic),
    }


if __name__ == "__main__":
    from client.cluster import LocalCluster

    which = sys.argv[1:] or ["send_latency", "send_batch", "async_concurrent", "pull"]
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        ns = cluster.namesrv_addr
        m = CpuMeter(cluster.broker("broker-a", 0).pid)
        for name in which:
            if name == "pull":
                print(name, bench_pull(ns, fill_pull_topic(ns, messages=64_000), meter=m), flush=True)
            else:
                print(name, globals()[f"bench_{name}"](ns, meter=m), flush=True)
