"""A TLS nameserver stops promptly although a client holds an idle keep-alive connection it never reads: the
server's close waits for the client's ``close_notify`` only briefly (``TLS_CLOSE_GRACE_S``) once its own bytes
are out, instead of the event loop's 30 s TLS shutdown timeout or the graceful-stop bound."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.tls import generate_local_tls_files
from common.tls import client_context

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: Well under the nameserver's graceful-stop bound, which an unaborted TLS close would wait out.
STOPS_WITHIN_S = 3.0


def test_an_idle_tls_client_does_not_hold_the_stop(tmp_path: Path) -> None:
    files = generate_local_tls_files(tmp_path / "tls")
    with subprocess.Popen([sys.executable, "-m", "nameserver", "--listen", "127.0.0.1:0", "--tls-cert",
                           files.cert_file, "--tls-key", files.key_file], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, cwd=REPO) as proc:
        try:
            assert proc.stdout is not None
            ready = re.search(r"listen=(\S+)", proc.stdout.readline())
            assert ready, "the nameserver did not print its ready line"
            host, _, port = ready.group(1).rpartition(":")
            raw = socket.create_connection((host, int(port)), timeout=5.0)
            with client_context(files.ca_file).wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(b"GET /cluster HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(65536).startswith(b"HTTP/1.1 200")
                started = time.monotonic()
                proc.send_signal(signal.SIGTERM)  # the TLS connection stays open and unread meanwhile
                proc.wait(timeout=30)
                took = time.monotonic() - started
            assert proc.returncode == 0
            assert took < STOPS_WITHIN_S, f"the nameserver took {took:.1f} s to stop with an idle TLS client"
        finally:
            if proc.poll() is None:
                proc.kill()
