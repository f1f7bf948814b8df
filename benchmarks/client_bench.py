"""SDK benchmarks: each function takes a nameserver address (a running cluster) and returns its figures.

The runner wires them in; for a quick look: ``python -m benchmarks.client_bench`` starts a LocalCluster and
prints all four. Messages are 1 KiB. Figures:

* ``send_latency``     -- Producer.send from one thread: p50 / p99 latency (µs) and msgs/s;
* ``send_batch``       -- Producer.send_batch of 64 from one thread: msgs/s;
* ``async_concurrent`` -- AsyncProducer with 64 concurrent senders: msgs/s (automatic batching);
* ``pull``             -- PullConsumer.pull of 32 per request, decoded, one thread: msgs/s.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from benchmarks import Row
from client import Admin, AsyncProducer, Message, Producer, PullConsumer, PullStatus

__all__ = [
    "bench_async_concurrent", "bench_default_transport_batch", "bench_pull", "bench_send_batch",
    "bench_send_latency", "run", "run_all",
]

BODY = b"x" * 1024


def _topic(namesrv_addr: str, prefix: str, queue_nums: int = 4) -> str:
    topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with Admin(namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queue_nums)
    return topic


def bench_send_latency(namesrv_addr: str, *, messages: int = 3000) -> dict[str, float]:
    """One thread, one message per send."""
    topic = _topic(namesrv_addr, "BenchSend")
    lat: list[float] = []
    with Producer("bench_send", namesrv_addr) as p:
        for _ in range(50):
            p.send(Message(topic, BODY))
        t0 = time.perf_counter()
        for _ in range(messages):
            t = time.perf_counter()
            p.send(Message(topic, BODY))
            lat.append(time.perf_counter() - t)
        total = time.perf_counter() - t0
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "msgs_per_s": messages / total}


def bench_send_batch(namesrv_addr: str, *, batch: int = 64, batches: int = 600) -> dict[str, float]:
    """One thread, ``batch`` messages per request."""
    topic = _topic(namesrv_addr, "BenchBatch")
    msgs = [Message(topic, BODY) for _ in range(batch)]
    with Producer("bench_batch", namesrv_addr) as p:
        p.send_batch(msgs)
        t0 = time.perf_counter()
        for _ in range(batches):
            p.send_batch(msgs)
        total = time.perf_counter() - t0
    return {"msgs_per_s": batch * batches / total, "requests_per_s": batches / total}


def bench_async_concurrent(namesrv_addr: str, *, senders: int = 64, messages: int = 40_000) -> dict[str, float]:
    """``senders`` coroutines each awaiting ``send`` in a loop; the producer batches them."""
    topic = _topic(namesrv_addr, "BenchAsync")

    async def main() -> dict[str, float]:
        async with AsyncProducer("bench_async", namesrv_addr) as p:
            await p.send(Message(topic, BODY))
            per = messages // senders

            async def sender() -> None:
                for _ in range(per):
                    await p.send(Message(topic, BODY))

            t0 = time.perf_counter()
            await asyncio.gather(*(sender() for _ in range(senders)))
            total = time.perf_counter() - t0
        return {"msgs_per_s": per * senders / total}

    return asyncio.run(main())


def bench_pull(namesrv_addr: str, *, messages: int = 64_000, max_nums: int = 32) -> dict[str, float]:
    """Fill one queue, then pull it from the start, ``max_nums`` per request, decoding every message."""
    topic = _topic(namesrv_addr, "BenchPull", queue_nums=1)
    with Producer("bench_pull_p", namesrv_addr) as p:
        msgs = [Message(topic, BODY) for _ in range(256)]
        for _ in range(messages // 256):
            p.send_batch(msgs)
    with PullConsumer("bench_pull_c", namesrv_addr) as c:
        mq = c.fetch_subscribe_message_queues(topic)[0]
        got = 0
        offset = 0
        sizes: list[int] = []
        t0 = time.perf_counter()
        while True:
            r = c.pull(mq, offset, max_nums=max_nums)
            if r.pull_status is not PullStatus.FOUND:
                break
            got += len(r.msg_found_list)
            sizes.append(len(r.msg_found_list))
            offset = r.next_begin_offset
        total = time.perf_counter() - t0
    return {"msgs_per_s": got / total, "messages": got, "mean_per_pull": statistics.fmean(sizes) if sizes else 0.0}


def bench_default_transport_batch(namesrv_addr: str, *, batch: int = 64, batches: int = 300) -> float:
    """Baseline: the same 64-message send bodies POSTed with a plain ``httpx.Client`` (httpx's default
    transport) to the master, skipping the SDK; msgs/s."""
    import httpx

    from client.protocol.codec import encode_batch

    topic = _topic(namesrv_addr, "BenchBase")
    with Admin(namesrv_addr) as admin:
        route = admin.topic_route(topic)
    addr = route.broker_datas[0].broker_addrs[0]
    body = encode_batch([Message(topic, BODY) for _ in range(batch)], born_timestamp_ms=int(time.time() * 1000))
    url = f"http://{addr}/send?topic={topic}&queueId=0&group=bench_base"
    with httpx.Client(timeout=10.0) as http:
        http.post(url, content=body).raise_for_status()
        t0 = time.perf_counter()
        for _ in range(batches):
            http.post(url, content=body).raise_for_status()
        total = time.perf_counter() - t0
    return batch * batches / total


def run(quick: bool) -> list[Row]:
    """Runner entry: a one-group cluster (no slave), the four SDK figures and their same-run baselines."""
    from client.cluster import LocalCluster

    scale = 4 if quick else 1
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        ns = cluster.namesrv_addr
        base = bench_default_transport_batch(ns, batches=300 // scale)
        lat = bench_send_latency(ns, messages=3000 // scale)
        batch = bench_send_batch(ns, batches=600 // scale)
        conc = bench_async_concurrent(ns, messages=40_000 // scale)
        pull = bench_pull(ns, messages=64_000 // scale)
    plain = "plain httpx POST of the same 64-msg body"
    return [
        Row("send, 1 thread: p50 latency", lat["p50_us"], "us"),
        Row("send, 1 thread: p99 latency", lat["p99_us"], "us"),
        Row("send, 1 thread", lat["msgs_per_s"], "msgs/s"),
        Row("send_batch of 64", batch["msgs_per_s"], "msgs/s", plain, base, ">= 60000"),
        Row("AsyncProducer, 64 concurrent senders", conc["msgs_per_s"], "msgs/s", plain, base, ">= 50000"),
        Row("pull 32/request, decoded", pull["msgs_per_s"], "msgs/s", plain, base, ">= 100000"),
    ]


def run_all(namesrv_addr: str) -> dict[str, dict[str, Any]]:
    return {
        "send_latency": bench_send_latency(namesrv_addr),
        "send_batch": bench_send_batch(namesrv_addr),
        "async_concurrent": bench_async_concurrent(namesrv_addr),
        "pull": bench_pull(namesrv_addr),
    }


if __name__ == "__main__":
    from client.cluster import LocalCluster

    which = sys.argv[1:] or ["send_latency", "send_batch", "async_concurrent", "pull"]
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        for name in which:
            print(name, globals()[f"bench_{name}"](cluster.namesrv_addr), flush=True)
