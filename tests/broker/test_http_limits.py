"""A real broker closes connections that do not finish a request in time and caps open connections
(remoting/http.py): idle sockets, a slowloris head and a body short of its Content-Length are
closed by the deadlines; connections past the cap are closed at once with a log line; complete requests are served as before."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.broker.procs import Servers
from tests.waiting import poll_until

pytestmark = pytest.mark.integration


def _connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_peer(s: socket.socket, within_s: float) -> float:
    """Seconds until the peer closes ``s`` (recv returns b"" or the connection is reset); fails past ``within_s``."""
    start = time.monotonic()
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {within_s} s") from None
    return time.monotonic() - start


def test_deadlines_close_incomplete_requests(servers: Servers) -> None:
    b = servers.broker({"brokerName": "lim", "httpHeaderTimeoutMs": "600", "httpBodyTimeoutMs": "600"}, name="lim")
    idle = _connect(b.addr)
    slow_head = _connect(b.addr)
    slow_head.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    short_body = _connect(b.addr)
    short_body.sendall(b"POST /topic HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
    for s in (idle, slow_head, short_body):
        took = _closed_by_peer(s, within_s=10)
        assert took < 5, took
        s.close()
    # Requests that complete in time are served, also several on one kept-alive connection.
    with httpx.Client(timeout=5) as c:
        for _ in range(3):
            assert c.get(f"{b.url}/metrics").status_code == 200


def test_connections_past_the_cap_are_closed_with_a_log_line(servers: Servers) -> None:
    b = servers.broker({"brokerName": "cap", "httpMaxConnections": "20"}, name="cap")
    held = [_connect(b.addr) for _ in range(20)]
    try:
        extra = [_connect(b.addr) for _ in range(10)]
        for s in extra:
            _closed_by_peer(s, within_s=10)
            s.close()
        poll_until(lambda: "refused" in b.log() and "httpMaxConnections" in b.log(), 10, "the refusal log line")
    finally:
        for s in held:
            s.close()
    # Once the held ones are gone, requests are served again.
    poll_until(lambda: httpx.get(f"{b.url}/metrics", timeout=5).status_code == 200, 10, "the broker to serve",
               ignore=(httpx.HTTPError,))


def _raw_answer(addr: str, request: bytes) -> tuple[bytes, bytes]:
    """The head and body of the one answer to ``request``, read until the server closes."""
    with _connect(addr) as s:
        s.sendall(request)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:  # closed with request bytes unread, the server's kernel resets after the answer
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("request_bytes", [
    b"GET /ha?\t[[[ HTTP/1.1\r\nHost: x\r\n\r\n",  # a control character in the target
    b"POST /send HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP at all\r\n\r\n",  # TLS to a plain port
    b"GET /cluster HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 70_000 + b"\r\n\r\n",  # a head past 64 KiB
])
def test_a_request_the_http_parser_refuses_gets_a_coded_json_error(servers: Servers, request_bytes: bytes) -> None:
    """Every error of the servers carries a RocketMQ code, also the ones the HTTP layer answers before routing."""
    ns = servers.nameserver()
    b = servers.broker({"brokerName": "bad-http"}, name="bad-http")
    for addr in (b.addr, ns.addr):
        head, body = _raw_answer(addr, request_bytes)
        assert head.startswith(b"HTTP/1.1 400 "), head
        assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower()
        answer = json.loads(body)
        assert answer["code"] == 29  # INVALID_PARAMETER
        assert answer["remark"].startswith("malformed HTTP/1.1 request: ")
