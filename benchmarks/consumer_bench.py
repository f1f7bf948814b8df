"""Consumer benchmarks against a running cluster: group consumer (lite pull) throughput with one and three
instances, push consumer throughput with a no-op callback.

``python -m benchmarks.consumer_bench`` starts a LocalCluster (1 master) and prints each figure; every function
also takes the address of an existing cluster's nameserver.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from typing import Any

from client import Admin, Message, MessageExt, Producer
from client._group_consumer import GroupConsumer
from client._push_consumer import ConsumeStatus, PushConsumer

__all__ = ["bench_group_consumer", "bench_push_consumer", "run_all"]


def _fill(namesrv_addr: str, prefix: str, messages: int, queue_nums: int = 8, body_bytes: int = 128) -> str:
    topic = f"{prefix}{uuid.uuid4().hex[:8]}"
    with Admin(namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queue_nums)
    body = b"x" * body_bytes
    with Producer(f"{prefix}_p", namesrv_addr) as p:
        batch = 64
        for i in range(0, messages, batch):
            p.send_batch([Message(topic, body) for _ in range(min(batch, messages - i))])
    return topic


def bench_group_consumer(namesrv_addr: str, *, instances: int = 1, messages: int = 40_000,
                         timeout_s: float = 120.0) -> dict[str, float]:
    """Messages per second polled by ``instances`` GroupConsumers (threads, one client instance each)."""
    topic = _fill(namesrv_addr, "BenchGc", messages)
    group = f"bench_gc_{uuid.uuid4().hex[:6]}"
    consumers = [GroupConsumer(group, namesrv_addr, instance_name=f"{group}_{i}", consume_from_where="FIRST_OFFSET",
                               rebalance_interval_s=1.0, heartbeat_interval_s=1.0, pull_suspend_s=1.0)
                 for i in range(instances)]
    counts = [0] * instances
    stop = threading.Event()

    def run(i: int) -> None:
        while not stop.is_set():
            counts[i] += len(consumers[i].poll(0.2))

    for c in consumers:
        c.subscribe(topic)
        c.start()
    began = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(instances)]
    for t in threads:
        t.start()
    deadline = began + timeout_s
    while sum(counts) < messages and time.monotonic() < deadline:
        time.sleep(0.05)  # sampling progress
    elapsed = time.monotonic() - began
    stop.set()
    for t in threads:
        t.join(2)
    for c in consumers:
        c.close()
    return {"instances": instances, "messages": sum(counts), "seconds": elapsed, "msgs_per_s": sum(counts) / elapsed}


def bench_push_consumer(namesrv_addr: str, *, messages: int = 40_000, batch_max: int = 32,
                        timeout_s: float = 120.0) -> dict[str, float]:
    """Messages per second through a PushConsumer whose callback does nothing."""
    topic = _fill(namesrv_addr, "BenchPc", messages)
    count = 0
    lock = threading.Lock()
    done = threading.Event()

    def noop(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal count
        with lock:
            count += len(msgs)
            if count >= messages:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(f"bench_pc_{uuid.uuid4().hex[:6]}", namesrv_addr, noop, consume_message_batch_max_size=batch_max,
                     consume_from_where="FIRST_OFFSET", rebalance_interval_s=1.0, heartbeat_interval_s=1.0,
                     pull_suspend_s=1.0)
    c.subscribe(topic)
    began = time.monotonic()
    c.start()
    done.wait(timeout_s)
    elapsed = time.monotonic() - began
    c.close()
    return {"messages": count, "seconds": elapsed, "msgs_per_s": count / elapsed}


def run_all(namesrv_addr: str, *, messages: int = 40_000) -> dict[str, dict[str, Any]]:
    return {
        "group_consumer_1": bench_group_consumer(namesrv_addr, instances=1, messages=messages),
        "group_consumer_3": bench_group_consumer(namesrv_addr, instances=3, messages=messages),
        "push_consumer_noop": bench_push_consumer(namesrv_addr, messages=messages),
    }


if __name__ == "__main__":
    import sys

    from client.cluster import LocalCluster

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
    with LocalCluster(tempfile.mkdtemp(prefix="splitmq-bench-"), broker_groups=1, slaves_per_group=0) as cluster:
        for name, row in run_all(cluster.namesrv_addr, messages=n).items():
            print(name, row, flush=True)
