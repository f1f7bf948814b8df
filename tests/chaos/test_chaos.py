"""The chaos suite's short profile (issue 11 item 10): 30 faults or more -- masters, slaves and the nameserver
killed, paused and restarted, disks filled, HA links cut -- under producers and consumers of two SYNC_MASTER
groups; then every queue is read back from every member.

SYNC_MASTER promises: no acknowledged message lost, none missing on the slave when its master goes down, no
duplicate (the producers are idempotent, issue 38), no reordering within a queue, no consumer stuck, slaves identical
to their masters. The full profile (300 faults,
1,000,000 acknowledged messages) is ``python -m benchmarks chaos``; a failed run prints its seed and keeps its
logs: ``python -m benchmarks.chaos --seed N`` replays the same faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos import SHORT, run_chaos
from benchmarks.chaos.nemesis import FaultKind

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_short_profile_keeps_every_sync_master_promise(tmp_path: Path) -> None:
    report = run_chaos(SHORT, mode="sync", root=tmp_path)
    print("\n" + report.summary())
    assert report.failures() == [], report.summary()
    v = report.verdict
    assert len(report.faults) >= 30 and v.acknowledged >= SHORT.acknowledged
    assert (v.lost, report.exposed, v.duplicated_unexplained, v.out_of_order, len(report.stuck)) == (0, 0, 0, 0, 0)
    assert report.idempotent and v.duplicated_explained == 0  # idempotent producers: no duplicate at all
    by_kind = report.faults_by_kind
    assert all(by_kind[k] >= 2 for k in FaultKind), by_kind  # every kind of fault, more than once
    assert any(f.bit for f in report.faults), "no disk-full fault reached a broker"
    assert report.consumed_from_slaves > 0  # the consumers followed the read split to the slaves
