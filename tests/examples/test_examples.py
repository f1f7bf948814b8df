"""Every example in ``examples/`` runs to completion with a small message count, so none rots.

Each runs as a subprocess (``python examples/NAME.py --messages N``) that starts and stops its own local
cluster; the test checks exit code 0 and the example's summary line. A new example file fails
:func:`test_every_example_is_covered` until it gets an entry here.
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
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 60
#: Spark examples start a JVM and a local Spark session (about 50 s on a busy 2-core machine).
SPARK_TIMEOUT_S = 110

#: example -> (arguments, regex the output must contain).
CASES: dict[str, tuple[list[str], str]] = {
    "quickstart": (["--messages", "20"], r"quickstart: sent 20, received 20"),
    "batch_and_async_producer": (["--messages", "200"], r"batch_and_async: produced 600 messages"),
    "read_write_splitting": (["--messages", "64"], r"read_write_splitting: read 64 messages, \d+ from the master, "
                                                   r"[1-9]\d* from the slave"),
    "failover": (["--messages", "40"], r"failover: read [1-9]\d* messages before the kill and [1-9]\d* after "
                                       r"it from the slave, 40 of 40"),
    "sync_vs_async_master": (["--messages", "128"], r"sync_vs_async_master: the SYNC_MASTER took"),
    "delayed_message": (["--messages", "3"], r"delayed_message: 3 of 3 delayed messages arrived"),
    "timed_delivery": (["--messages", "4"], r"timed_delivery: 4 of 4 timed messages arrived within 1 s"),
    "transaction": (["--messages", "6"], r"transaction: 4 of 4 committed messages consumed, 2 rolled back never "
                                         r"seen, 2 answered check"),
    "admin_and_ha_status": (["--messages", "12"], r"admin_and_ha_status: 2 broker groups, 4 queues"),
    "group_consumer": (["--messages", "40"], r"group_consumer: 80 of 80 messages consumed"),
    "push_consumer": (["--messages", "20"], r"push_consumer: 20 of 20 messages consumed, 2 after a retry"),
    "ordered": (["--messages", "100"], r"ordered: 100 of 100 messages consumed, 10 of 10 keys in send order"),
    "sql_filter": (["--messages", "30"], r"sql_filter: 6 of 6 matching messages consumed, 0 others"),
    "dledger_failover": (["--messages", "100"], r"dledger_failover: the new leader took writes \d+\.\d+ s after the "
                                                r"kill; (\d+) of \1 messages acknowledged and read back, 0 missing; "
                                                r"n\d rejoined as a follower"),
}
#: Examples with a test of their own: spark_streaming below; spark_batch_read as docs/SPARK.md's walk-through
#: submits it to a standalone cluster (tests/docs/test_spark_doc_commands.py, which checks its output lines).
OWN_TESTS = {"spark_streaming", "spark_batch_read"}
DEMO = (["--no-spark", "--messages", "500"], r"read/write split\s+\d+ of \d+ messages served by slaves")


def run_example(name: str, args: list[str], timeout_s: float = TIMEOUT_S, *, exit_code: int = 0) -> str:
    """Run ``examples/<name>.py``; returns its output, or fails the test with it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"examples/{name}.py {' '.join(args)} ran over {timeout_s} s; output so far:\n{out}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == exit_code, f"examples/{name}.py {' '.join(args)} exited {proc.returncode}:\n{output}"
    return output


def check(name: str, case: tuple[list[str], str], timeout_s: float = TIMEOUT_S) -> None:
    args, pattern = case
    output = run_example(name, args, timeout_s)
    assert re.search(pattern, output), f"examples/{name}.py: no line matching {pattern!r} in:\n{output}"


def test_every_example_is_covered() -> None:
    found = {p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    covered = set(CASES) | OWN_TESTS | {"demo"}
    assert found == covered, f"examples without a test case: {sorted(found - covered)}; " \
                             f"cases without an example: {sorted(covered - found)}"


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CASES))
def test_example(name: str) -> None:
    check(name, CASES[name])


@pytest.mark.integration
def test_demo_without_spark() -> None:
    check("demo", DEMO)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.timeout(2 * SPARK_TIMEOUT_S + 30)
def test_spark_streaming_run_twice_goes_on(tmp_path: Path) -> None:
    """Issue 36's story: ``examples/spark_streaming.py --out X`` run twice reads only what came since (its local
    cluster's stores are kept under X), where it used to skip 500 of 600 new messages without a word. The same
    checkpoint against another cluster's stores stops the query with one line naming failOnDataLoss:
    tests/spark/test_spark_offsets.py (a third Spark start here cost 35 s of the suite)."""
    assert shutil.which("java") is not None, "no java on PATH: the Spark examples need Java 17+ (install a JDK)"
    out = str(tmp_path / "out")
    args = ["--messages", "50", "--out", out]
    first = run_example("spark_streaming", args, SPARK_TIMEOUT_S)
    assert re.search(r"round 0: micro-batches of \[\d+(, \d+)*\] rows", first), first
    assert re.search(rf"100 rows in {re.escape(out)}/data \(100 produced", first), first
    second = run_example("spark_streaming", args, SPARK_TIMEOUT_S)
    rounds = [sum(int(n) for n in re.findall(r"\d+", m)) for m in re.findall(r"round \d: micro-batches of (\[.*\])",
                                                                               second)]
    assert rounds == [50, 50], second  # only the new messages, each once
    assert re.search(rf"200 rows in {re.escape(out)}/data \(200 produced; restarts added no duplicates\)", second)
