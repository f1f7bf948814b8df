"""docs/SPARK.md's commands run as written (issue 40): the install line, and the standalone-cluster walk-through
(a SplitMQ cluster, a Spark master and worker from the pyspark installation, the batch example submitted to them).

The ``bash`` blocks run as one script from the repository's root, with this interpreter's venv first on ``PATH``
(the doc's "venv active"); ``TMPDIR`` points into the test's directory so ``mktemp -d`` stays there. The install
line (a ``sh`` block) would build a venv and install into it; the test runs its ``pip install`` with
``--dry-run`` in this venv instead, which resolves the same requirement from the same directory without changing
anything.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import poll_until

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "SPARK.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_doc_installs_from_the_repository_not_from_an_index() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "pip install 'splitmq" not in text and "pip install splitmq" not in text
    assert "127.0.0.1:9876" not in text  # `splitmq cluster up` lets the OS pick the nameserver's port
    assert "](http" not in text  # no link outside the repository


def test_the_install_line_resolves_from_the_clone() -> None:
    lines = [ln for b in blocks("sh") for ln in b.splitlines() if "pip install" in ln]
    assert lines == ["python -m venv .venv && . .venv/bin/activate && pip install '.[spark]'"]
    pip = shlex.split(lines[0].split("&&")[-1])
    assert pip[:2] == ["pip", "install"]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", *pip[2:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "Would install splitmq" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_standalone_walk_through_runs_as_written(tmp_path: Path) -> None:
    script = "".join(blocks("bash"))
    assert "org.apache.spark.deploy.master.Master" in script and "spark_batch_read.py" in script
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("PYSPARK_PYTHON", None)
    env.pop("NAMESRV_ADDR", None)
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    stopped = False
    try:
        out, _ = proc.communicate(timeout=540)
        # the doc's last line sent SIGTERM to the cluster, the master and the worker: they stop on their own
        stopped = _wait_gone(proc.pid, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if not _gone(proc.pid):  # a failure, or servers that ignored the doc's kill: stop them here
            os.killpg(proc.pid, signal.SIGTERM)
            if not _wait_gone(proc.pid, 60):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-5000:]
    assert "100 messages in 1 partition(s)" in out, out[-3000:]
    assert "100 messages with tag TagB after the write" in out, out[-3000:]
    assert re.search(r"/worker/app-[^/]+/\d+/stderr", out), out[-3000:]  # the tasks ran in the worker's executor
    assert stopped, "the cluster, master or worker still ran 60 s after the doc's kill"


def _wait_gone(pgid: int, timeout_s: float) -> bool:
    try:
        poll_until(lambda: _gone(pgid), timeout_s, "the walk-through's servers to stop", interval_s=0.2)
    except AssertionError:
        return False
    return True
