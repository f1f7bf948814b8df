"""The store benchmark runs end to end with tiny sizes (so it does not rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import ENTRIES, Row, format_table, load_entry
from benchmarks.store_bench import bench_append_read, bench_live_dispatch, bench_recovery


def test_store_benchmark_functions_run_small(tmp_path: Path) -> None:
    a = bench_append_read(str(tmp_path / "a"), n_msgs=640, file_size=256 * 1024, read_msgs=320)
    assert set(a) == {"append", "raw_write", "dispatch", "read", "raw_read"}
    assert all(v > 0 for v in a.values())
    live = bench_live_dispatch(str(tmp_path / "l"), n_msgs=640, file_size=256 * 1024)
    assert set(live) == {"append", "dispatch", "append_cpu_us", "dispatch_cpu_us"}
    assert all(v > 0 for v in live.values())
    r = bench_recovery(str(tmp_path / "r"), log_bytes=512 * 1024, file_size=256 * 1024)
    assert r["recover_replay"] > 0 and r["recover_rebuild"] > 0 and r["raw_crc"] > 0


def test_registry_and_table() -> None:
    assert callable(load_entry("store"))
    assert "store" in ENTRIES
    with pytest.raises(KeyError, match="known: "):
        load_entry("nope")
    text = format_table("t", [Row("x", 2000.0, "msgs/s", "raw", 4000.0, ">= 1"), Row("y", 1.5, "s")])
    assert "0.50x" in text and "msgs/s" in text
