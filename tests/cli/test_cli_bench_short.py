"""``python -m benchmarks cli --quick``: the CLI's ``produce --count`` row beside the SDK's ``send_batch``.

The figure's floor here is relative, not absolute (2 shared cores make absolute rates swing): sending one
message per request, as ``produce --count`` once did, ran at about 7 % of ``send_batch``; batching keeps it
within a few tens of percent of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_cli_benchmark_quick_profile() -> None:
    res = subprocess.run([sys.executable, "-m", "benchmarks", "cli", "--quick"], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    row = re.search(r"^splitmq produce --count 20000 --size 1024 \(sends\)\s+([\d,]+)\s+msgs/s\s+SDK send_batch of "
                    r"64, 1 thread\s+([\d,]+)\s+([\d.]+)x\s+>= 20000", res.stdout, re.M)
    assert row is not None, res.stdout
    cli, sdk, ratio = int(row.group(1).replace(",", "")), int(row.group(2).replace(",", "")), float(row.group(3))
    assert cli > 0 and sdk > 0
    assert ratio >= 0.3, f"splitmq produce --count ran at {cli} msgs/s, {ratio:.2f}x the SDK's send_batch ({sdk})"
    assert "(whole command)" in res.stdout
