"""``python -m benchmarks cli``: ``splitmq produce --count N --size 1024`` beside the SDK's ``send_batch``.

One one-group cluster (no slave, as ``python -m benchmarks client``), one topic of 4 queues. The CLI runs as a
user runs it, a subprocess (``python -m client.cli``); its own printed rate covers the sends only (from the
first batch to the last answer), and a second row gives the rate over the whole command, interpreter start and
the nameserver check included. The baseline is the SDK's ``send_batch`` of 64 from one thread, measured in the
same run on the same cluster (client_bench's figure). Issue 16 asks >= 20,000 msgs/s for ``--count 200000``
(``--quick``: 20,000 messages).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import Row
from benchmarks.client_bench import CpuMeter, _topic, bench_send_batch

__all__ = ["run", "run_cli_produce"]

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1024
_RATE = re.compile(r"^sent (\d+) msgs in ([\d.]+) s \(([\d.]+) msgs/s\)$", re.M)


def run_cli_produce(namesrv_addr: str, topic: str, count: int, *, size: int = SIZE,
                    timeout_s: float = 300.0) -> dict[str, float]:
    """``splitmq produce -t TOPIC --count COUNT --size SIZE`` as a subprocess.

    Returns:
        ``msgs_per_s`` (the command's own figure, sends only) and ``wall_msgs_per_s`` (the whole command).

    Raises:
        RuntimeError: the command failed or printed no rate line.
    """
    started = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "client.cli", "produce", "-n", namesrv_addr, "-t", topic,
                          "--count", str(count), "--size", str(size)], capture_output=True, text=True,
                         timeout=timeout_s, cwd=ROOT)
    wall = time.perf_counter() - started
    m = _RATE.search(res.stdout)
    if res.returncode != 0 or m is None or int(m.group(1)) != count:
        raise RuntimeError(f"splitmq produce exited {res.returncode}: {res.stdout.strip()} {res.stderr.strip()}")
    return {"msgs_per_s": float(m.group(3)), "wall_msgs_per_s": count / wall}


def run(quick: bool) -> list[Row]:
    """Runner entry: the CLI's ``produce --count`` rate and the SDK's ``send_batch`` rate, same cluster."""
    from client.cluster import LocalCluster

    count = 20_000 if quick else 200_000
    with tempfile.TemporaryDirectory() as d, LocalCluster(d, broker_groups=1, slaves_per_group=0) as cluster:
        ns = cluster.namesrv_addr
        meter = CpuMeter(cluster.broker("broker-a", 0).pid)
        bench_send_batch(ns, batches=20)  # the first commit-log file is created and pre-faulted outside the figures
        meter.settle()
        sdk = bench_send_batch(ns, batches=count // 64)
        meter.settle()
        cli = run_cli_produce(ns, _topic(ns, "BenchCli"), count)
    base = "SDK send_batch of 64, 1 thread"
    return [
        Row(f"splitmq produce --count {count} --size {SIZE} (sends)", cli["msgs_per_s"], "msgs/s", base,
            sdk["msgs_per_s"], ">= 20000"),
        Row(f"splitmq produce --count {count} --size {SIZE} (whole command)", cli["wall_msgs_per_s"], "msgs/s",
            base, sdk["msgs_per_s"]),
    ]
