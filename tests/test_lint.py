"""The tree stays lint-clean and the packages type-check (CI runs this with the rest of the suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_ruff_finds_nothing() -> None:
    r = _run(str(BIN / "ruff"), "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_packages_type_check() -> None:
    r = _run(str(BIN / "mypy"), "common", "remoting", "client", "broker", "nameserver", "spark_connector", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr
