"""A real ``python -m nameserver`` subprocess on a kernel-chosen port, always killed at teardown."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
READY_PREFIX = "nameserver ready listen="


@attrs.define
class NamesrvProcess:
    """A running nameserver: its process, ``host:port`` and base URL; ``stderr_path`` holds its log."""

    proc: subprocess.Popen[bytes]
    addr: str
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def stop(self, sig_timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait up to ``sig_timeout_s``, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(sig_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(sig_timeout_s)


def _read_ready_line(proc: subprocess.Popen[bytes], stderr_path: Path) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    buf = b""
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no ready line within READY_TIMEOUT_S={READY_TIMEOUT_S}; stdout={buf!r}; "
                                     f"stderr: {stderr_path.read_text(errors='replace')[-2000:]}")
            if sel.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise AssertionError(f"nameserver exited (rc={proc.wait(STOP_TIMEOUT_S)}) before ready; "
                                         f"stderr: {stderr_path.read_text(errors='replace')[-2000:]}")
                buf += chunk
    line = buf.split(b"\n", 1)[0].decode()
    assert line.startswith(READY_PREFIX), f"unexpected first stdout line {line!r}"
    return line


@pytest.fixture
def start_nameserver(tmp_path: Path) -> Iterator[Callable[..., NamesrvProcess]]:
    """Factory: ``start_nameserver("--broker-expiry-ms", "1500")`` -> a ready NamesrvProcess."""
    started: list[NamesrvProcess] = []

    def start(*args: str) -> NamesrvProcess:
        stderr_path = tmp_path / f"nameserver-{len(started)}.log"
        with stderr_path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "nameserver", "--listen", "127.0.0.1:0", *args],
                stdout=subprocess.PIPE, stderr=err, cwd=Path(__file__).resolve().parents[2],
            )
        ns = NamesrvProcess(proc, "", stderr_path)
        started.append(ns)
        ns.addr = _read_ready_line(proc, stderr_path)[len(READY_PREFIX):]
        return ns

    yield start
    for ns in started:
        ns.stop()
        if ns.proc.stdout is not None:
            ns.proc.stdout.close()
