"""The chaos suite: a cluster of real processes, a workload through the SDK, a nemesis, and a checker.

A run (:func:`run_chaos`) starts one nameserver and two broker groups of a master and a slave each
(:mod:`~benchmarks.chaos.cluster`), keeps producers and consumers busy on every queue
(:mod:`~benchmarks.chaos.workload`), and meanwhile kills, pauses and restarts masters, slaves and the nameserver,
fills disks and cuts HA links, one fault at a time (:mod:`~benchmarks.chaos.nemesis`), until the profile's fault
and message counts are reached (:mod:`~benchmarks.chaos.profiles`). Then it reads every queue back from every
member and judges (:mod:`~benchmarks.chaos.checker`): acknowledged, lost, duplicated (explained by the client's
retries, which :mod:`~benchmarks.chaos.ledger` counts, or not), out of order, stuck consumers, replicas.

Entry points: ``python -m benchmarks chaos [--quick]`` (the table of a SYNC run: the full profile, or the short
one with ``--quick``), ``python -m benchmarks.chaos --profile short|full --mode sync|async --seed N`` (one run,
its failures, a reproducer's settings), and ``tests/chaos/`` (the short profile in CI). Loopback only; every
wait is bounded; the run stops by itself and leaves no process behind.
"""

from __future__ import annotations

import sys

from benchmarks import Row
from benchmarks.chaos.profiles import FULL, SHORT, Profile
from benchmarks.chaos.report import ChaosReport
from benchmarks.chaos.run import run_chaos

__all__ = ["FULL", "SHORT", "ChaosReport", "Profile", "run_chaos", "run_rows"]


def run_rows(quick: bool) -> list[Row]:
    """Runner entry (``python -m benchmarks chaos``): one SYNC run; its failures, if any, go to stderr."""
    report = run_chaos(SHORT if quick else FULL, mode="sync", progress=lambda line: print(line, file=sys.stderr,
                                                                                         flush=True))
    print(report.summary(), file=sys.stderr, flush=True)
    return report.rows()
