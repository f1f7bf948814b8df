"""DLedger failover, short profile of ``python -m benchmarks dledger``: a 3-member group under a steady produce of
single keyed messages, its leader SIGKILLed once (heartbeat 500 ms), the dead member restarted and caught up; then
every queue is read back from every member, and each must hold every message that got a SEND_OK."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.dledger_bench import run_failover

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_killed_leader_loses_no_acknowledged_message(tmp_path: Path) -> None:
    res = run_failover(tmp_path, kills=1, heartbeat_ms=500)
    summary = (f"kills {res.kills}, acked {res.acked} of {res.attempted}, lost {dict(res.lost)}, duplicates "
               f"{dict(res.duplicates)}, given up {res.gave_up}, attempt errors {dict(res.errors)}, problems "
               f"{res.problems}; logs under {tmp_path}")
    assert len(res.kills) == 1 and res.problems == (), summary
    assert res.acked > 0 and res.gave_up == 0, summary
    assert len(res.lost) == 3 and all(n == 0 for n in res.lost.values()), summary
