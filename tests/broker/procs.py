"""Real ``python -m broker`` / ``python -m nameserver`` subprocesses for integration tests: start, wait for the
ready line with a deadline, learn the bound ports from it, stop (SIGTERM, then SIGKILL) at teardown."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
BROKER_READY = re.compile(r"^broker ready name=(\S+) id=(-?\d+) role=(\S+) listen=(\S+) ha=(\S+)$")
NAMESRV_READY = re.compile(r"^nameserver ready listen=(\S+)$")


@attrs.define
class ServerProcess:
    """A started server: its process, the ready line's fields and its stderr log."""

    proc: subprocess.Popen[bytes]
    ready_line: str
    stderr_path: Path
    fields: tuple[str, ...] = ()

    @property
    def addr(self) -> str:
        return self.fields[-2] if len(self.fields) == 5 else self.fields[0]

    @property
    def ha_addr(self) -> str:
        return self.fields[4]

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` and wait; SIGKILL if it outlives ``timeout_s``. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout_s)


def read_first_line(proc: subprocess.Popen[bytes], stderr_path: Path, timeout_s: float = READY_TIMEOUT_S) -> str:
    """The first stdout line, or AssertionError (with the log tail) at the deadline or on early exit."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no ready line within {timeout_s} s; stdout={buf!r}; "
                                     f"stderr tail: {stderr_path.read_text(errors='replace')[-3000:]}")
            if sel.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = proc.wait(STOP_TIMEOUT_S)
                    raise ProcessExited(rc, stderr_path.read_text(errors="replace"))
                buf += chunk
    return buf.split(b"\n", 1)[0].decode()


class ProcessExited(AssertionError):
    def __init__(self, rc: int, stderr: str) -> None:
        super().__init__(f"process exited with {rc} before its ready line; stderr tail: {stderr[-3000:]}")
        self.rc = rc
        self.stderr = stderr


def write_properties(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
    return path


class Servers:
    """Starts servers into ``workdir`` and stops every one of them at :meth:`close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[ServerProcess] = []

    def _spawn(self, args: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        stderr_path = self.workdir / f"{name}-{len(self.started)}.log"
        with stderr_path.open("w") as err:
            proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        return proc, stderr_path

    def nameserver(self, extra_args: tuple[str, ...] = ()) -> ServerProcess:
        proc, err = self._spawn(["-m", "nameserver", "--listen", "127.0.0.1:0", *extra_args], "nameserver")
        sp = ServerProcess(proc, "", err)
        self.started.append(sp)
        sp.ready_line = read_first_line(proc, err)
        m = NAMESRV_READY.match(sp.ready_line)
        assert m, f"unexpected nameserver ready line {sp.ready_line!r}"
        sp.fields = m.groups()
        return sp

    def broker(self, props: dict[str, str], *, name: str = "broker", extra_args: tuple[str, ...] = ()
               ) -> ServerProcess:
        """Start ``python -m broker -c <file>``; ``props`` are written to the file (port 0 unless given)."""
        props = {"listenPort": "0", "storePathRootDir": str(self.workdir / f"store-{name}"),
                 "mappedFileSizeCommitLog": str(1 << 20), **props}
        path = write_properties(self.workdir / f"{name}.properties", props)
        proc, err = self._spawn(["-m", "broker", "-c", str(path), *extra_args], name)
        sp = ServerProcess(proc, "", err)
        self.started.append(sp)
        sp.ready_line = read_first_line(proc, err)
        m = BROKER_READY.match(sp.ready_line)
        assert m, f"unexpected broker ready line {sp.ready_line!r}"
        sp.fields = m.groups()
        return sp

    def run_to_exit(self, args: list[str], timeout_s: float = READY_TIMEOUT_S) -> tuple[int, str, str]:
        """Run a command that should exit by itself; returns ``(rc, stdout, stderr)``."""
        r = subprocess.run([sys.executable, *args], capture_output=True, cwd=ROOT, timeout=timeout_s, check=False)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def close(self) -> None:
        for sp in reversed(self.started):
            sp.stop()
            if sp.proc.stdout is not None:
                sp.proc.stdout.close()


