"""The replication benchmark runs end to end with tiny sizes (so it does not rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import load_entry
from benchmarks.replication_bench import run_replication_bench

pytestmark = pytest.mark.ha


def test_replication_benchmark_runs_small(tmp_path: Path) -> None:
    r = run_replication_bench(str(tmp_path), 256 * 1024, batch=8, message_size=512)
    assert r["slave_max_offset"] == r["master_max_offset"] > 2 * 256 * 1024
    assert r["catchup_mb_per_s"] > 0 and r["live_mb_per_s"] > 0 and r["sync_rounds"] >= 10
    assert callable(load_entry("replication"))
