"""The README's "Command line" section, run exactly as written.

The commands are parsed out of README.md (the two ``sh`` blocks of that section), so the README and this test
cannot drift: the first block (``splitmq cluster up ...``, terminal 1) runs in the background until it prints
``namesrv=``; the second (terminal 2) runs as one ``bash -e`` script in the same directory. ``splitmq`` is this
checkout's ``python -m client.cli`` (a shim first on PATH), whatever is installed.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
SCRIPT_TIMEOUT_S = 120.0


def readme_blocks() -> list[str]:
    """The ``sh`` code blocks of the README's "## Command line" section, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, re.S | re.M)


def _shim(bin_dir: Path) -> Path:
    bin_dir.mkdir()
    shim = bin_dir / "splitmq"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m client.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            lines.put(line)
    lines.put(None)


def test_readme_has_the_two_blocks() -> None:
    blocks = readme_blocks()
    assert len(blocks) == 2, blocks
    assert blocks[0].strip().startswith("splitmq cluster up ") and len(blocks[0].strip().splitlines()) == 1


def test_readme_command_sequence_runs_as_written(tmp_path: Path) -> None:
    up_block, session_block = readme_blocks()
    env = dict(os.environ, PATH=f"{_shim(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("NAMESRV_ADDR", None)
    work = tmp_path / "work"
    work.mkdir()
    up = subprocess.Popen(["bash", "-c", f"exec {up_block.strip()}"], cwd=work, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(up, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any(s.startswith("namesrv=") for s in seen):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"cluster up printed no namesrv= line within {START_TIMEOUT_S} s:\n{''.join(seen)}")
            if line is None:
                pytest.fail(f"cluster up exited before its namesrv= line:\n{''.join(seen)}")
            seen.append(line)
        res = subprocess.run(["bash", "-e", "-c", session_block], cwd=work, env=env, capture_output=True, text=True,
                             timeout=SCRIPT_TIMEOUT_S)
        assert res.returncode == 0, f"the README's commands failed (exit {res.returncode}):\nstdout:\n{res.stdout}\n" \
                                    f"stderr:\n{res.stderr}"
        assert "Traceback" not in res.stderr, res.stderr
        # What the README promises along the way.
        assert "topic Orders created on broker-a, broker-b" in res.stdout
        assert len(re.findall(r"^sent status=SEND_OK ", res.stdout, re.M)) == 2
        served = re.findall(r"^queue=\S+ offset=\d+ served-by=(\d+) .* body=(hello|world)$", res.stdout, re.M)
        assert sorted(body for _, body in served) == ["hello", "world"] and {s for s, _ in served} == {"1"}, res.stdout
        assert re.search(r"^sent 20000 msgs in ", res.stdout, re.M), res.stdout
        assert "\r" not in res.stderr  # not a terminal: no progress lines
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(timeout=10)
