"""An example pointed at a wrong nameserver ends with one line naming it and what to check, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listening socket nobody answers on (the kernel completes the handshakes; nothing is ever sent)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        yield srv.getsockname()[1]


def _refused_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as srv:  # bound, then closed: nothing listens there
        return int(srv.getsockname()[1])


@pytest.mark.parametrize(("example", "kind"), [("quickstart", "refused"), ("failover", "silent")])
def test_a_wrong_nameserver_is_one_line(example: str, kind: str, request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue("silent_port") if kind == "silent" else _refused_port()
    addr = f"127.0.0.1:{port}"
    res = subprocess.run([sys.executable, str(ROOT / "examples" / f"{example}.py"), "--namesrv", addr],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"{example}: error: no nameserver answered at {addr}: "), lines[0]
    assert "--namesrv" in lines[0] and lines[0].count(addr) <= 3, lines[0]
