"""``make demo`` as a stranger sees it: the full tour with Spark prints no expected-but-alarming noise.

No JVM ``WARN`` line or start-up banner, no connection-refused retry aimed at the master killed in step 4 (one
line says it is skipped instead), no Spark progress bar, and each figure says what it includes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180


@pytest.mark.integration
@pytest.mark.spark
def test_demo_with_spark_is_quiet() -> None:
    assert shutil.which("java") is not None, "no java on PATH: the demo's Spark step needs Java 17+ (install a JDK)"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--messages", "1000"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for noise in (" WARN ", "WARNING:", "log4j", "Connection refused", "ConnectError", "[Stage ", "Traceback"):
        assert noise not in out, f"{noise!r} in the demo's output:\n{out}"
    assert len(re.findall(r"broker-a's master at \S+ is down since step 4: Spark skips it", out)) == 1, out
    assert re.search(r"^   produce\s+1000 msgs in [\d.]+ s \([\d,]+ msgs/s\): one thread, .* after \d+ warm-up msgs$",
                     out, re.M), out
    assert re.search(r"^   spark\s+1250 rows in [\d.]+ s \(the first query took [\d.]+ s: it also starts Spark's "
                     r"Python workers\)$", out, re.M), out
