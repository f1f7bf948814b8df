"""SYNC_MASTER vs ASYNC_MASTER: the same batch workload on each kind of cluster, with figures.

    python examples/sync_vs_async_master.py --messages 2000

An ASYNC_MASTER answers a send once the batch is in its own commit log; the slave copies it a moment later,
so a master that dies in that moment takes the newest messages with it. A SYNC_MASTER answers only after a
slave acknowledged the bytes (or says ``FLUSH_SLAVE_TIMEOUT`` / ``SLAVE_NOT_AVAILABLE``): no acknowledged
message is lost with the master, at the price of one more network round trip per send.

Each run starts its own one-group cluster (a master and a slave). With ``--namesrv`` the workload runs once,
against that cluster, whatever its mode.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from typing import Literal

import _common

from client import Admin, Message, Producer

TOPIC = "SyncAsyncTopic"
BATCH = 32
BODY = b"y" * 512


def workload(namesrv: str, n: int) -> tuple[float, list[float], Counter[str]]:
    """Send ``n`` messages in batches of BATCH, one batch at a time; returns (seconds, latencies ms, statuses)."""
    with Admin(namesrv) as admin:
        admin.create_topic(TOPIC, queue_nums=4)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    with Producer("sync-async-producer", namesrv) as producer:
        producer.send_batch([Message(TOPIC, BODY)])  # warm up: route lookup, connection
        start = time.perf_counter()
        for first in range(0, n, BATCH):
            batch = [Message(TOPIC, BODY) for _ in range(min(BATCH, n - first))]
            t = time.perf_counter()
            results = producer.send_batch(batch)
            latencies.append((time.perf_counter() - t) * 1000)
            statuses.update(r.send_status.name for r in results)
        return time.perf_counter() - start, latencies, statuses


def role_of(namesrv: str) -> str:
    with Admin(namesrv) as admin:
        addr = next(iter(admin.cluster_info().master_addrs().values()))
        return str(admin.broker_runtime(addr)["role"])


def main() -> int:
    args = _common.parser(__doc__, messages=1000).parse_args()
    modes: list[Literal["async", "sync"]] = ["async", "sync"]
    rows = []
    for mode in modes if not args.namesrv else modes[:1]:
        with _common.cluster(args.namesrv, mode=mode) as (namesrv, _):
            role = role_of(namesrv)
            secs, lat, statuses = workload(namesrv, args.messages)
            rows.append((role, secs, lat, statuses))
    print(f"\n{'master role':<14}{'messages':>9}{'msgs/s':>9}{'batch p50 ms':>14}{'batch p99 ms':>14}  statuses")
    for role, secs, lat, statuses in rows:
        p99 = statistics.quantiles(lat, n=100)[98] if len(lat) >= 2 else lat[0]
        print(f"{role:<14}{args.messages:>9}{args.messages / secs:>9,.0f}{statistics.median(lat):>14.2f}"
              f"{p99:>14.2f}  {dict(statuses)}")
    if len(rows) == 2:
        slower = rows[1][1] / rows[0][1]
        acked = rows[1][3]["SEND_OK"]  # on a SYNC_MASTER, SEND_OK means a slave has the bytes too
        print(f"sync_vs_async_master: the SYNC_MASTER took {slower:.1f}x the time of the ASYNC_MASTER "
              f"for {args.messages} messages; {acked} of them were acknowledged by the slave before the answer")
    else:
        print(f"sync_vs_async_master: {rows[0][0]} sent {args.messages} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
