"""What the benchmarks share: polling a cluster with a deadline, letting a group settle between rounds, work on
several threads, and ``send_batch`` from one or several threads for a fixed time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from client import Message, Producer
from client.cluster import LocalCluster

__all__ = ["in_threads", "send_batch_rate", "settle_group", "wait_for"]


def wait_for(pred: Callable[[], object], timeout_s: float, what: str, *, interval_s: float = 0.02) -> None:
    """Until ``pred()`` is truthy, asked every ``interval_s``; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s} s")
        time.sleep(interval_s)  # polling servers with a deadline


def settle_group(cluster: LocalCluster, group: str, timeout_s: float) -> None:
    """Until every member of ``group`` holds the master's whole log and has dispatched it: a round must not leave
    work behind that the next one (of the other cluster) pays for -- an ASYNC_MASTER round ends with its slave
    behind."""
    cluster.wait_slave_caught_up(group, timeout_s=timeout_s)
    members = cluster.members(group)
    wait_for(lambda: all(int(b.runtime()["dispatchBehindBytes"]) == 0 for b in members), timeout_s,
             f"dispatch caught up on every member of {group}")


def in_threads(work: Callable[[int], object], threads: int) -> None:
    """Run ``work(0)`` .. ``work(threads - 1)`` on threads of their own and wait for all; the first exception any
    of them raised is raised here."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    workers = [threading.Thread(target=run, args=(i,), name=f"bench-work-{i}") for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]


def send_batch_rate(p: Producer, msgs: list[Message], seconds: float, threads: int = 1) -> float:
    """Messages a second of ``threads`` senders sharing ``p``, each calling ``send_batch(msgs)`` in a loop for
    ``seconds`` (with several, their requests overlap)."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        start.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            p.send_batch(msgs)
            counts[i] += len(msgs)

    workers = [threading.Thread(target=work, args=(i,), name=f"bench-send-{i}") for i in range(threads)]
    for t in workers:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in workers:
        t.join(seconds + 60)
    return sum(counts) / (time.perf_counter() - t0)
