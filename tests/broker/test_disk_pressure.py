"""Disk pressure on a real tmpfs (issue 13), short profile of ``python -m benchmarks disk``: the broker deletes
expired files past 75 %, the oldest past 85 %, refuses sends past 90 % with a clear message and takes them again
when space frees; it never crashes, and after a SIGKILL every acknowledged message not deleted by retention is
read back exactly once, intact."""

from __future__ import annotations

import pytest

from benchmarks.disk_bench import can_mount_tmpfs, run_pressure

pytestmark = [pytest.mark.integration]


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and a container that allows mounting a tmpfs "
                                                   "(CI runs as root)")
def test_a_producer_that_never_stops_meets_every_disk_guard() -> None:
    res = run_pressure(disk_mib=64, refused_phase_s=3.0)
    print(f"\ndisk pressure: {res}")
    assert res.expired_deletions_below_85 >= 1, res  # expired files went before the disk reached 85 %
    assert res.files_deleted > res.expired_deletions_below_85, res  # then the oldest went anyway
    assert res.refused >= 1, res
    # the guard refuses before the disk is full: the message says so and shows the three ratios
    assert any("disk full: commit log" in r and "above diskSpaceWarningLevelRatio 90%" in r
               for r in res.refusal_remarks), res.refusal_remarks
    assert res.accepted_after_refusal > 0, res  # writes resumed by themselves
    assert res.peak_used_ratio < 0.97, res
    assert res.broker_alive, res
    assert res.bytes_acked > 64 << 20, res  # more went through than the disk holds
    assert res.checked > 0 and (res.missing, res.duplicated, res.corrupt) == (0, 0, 0), res
