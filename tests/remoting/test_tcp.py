"""Loopback connections use Reno congestion control (common/tcp.py), on both ends, whatever the system's
default; other peers keep it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import client._transport as transport_module
from client._transport import AsyncTransport, SyncTransport
from common.tcp import LOOPBACK_CONGESTION_CONTROL, tune_loopback
from remoting.http import HttpProtocol
from remoting.router import Request, Response, Router
from remoting.server import HttpServer

TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", None)
needs_tcp_congestion = pytest.mark.skipif(TCP_CONGESTION is None, reason="no TCP_CONGESTION on this platform")


def _congestion(sock: Any) -> bytes:
    assert TCP_CONGESTION is not None
    raw: bytes = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
    return raw.rstrip(b"\0")


@contextlib.contextmanager
def _pair(family: socket.AddressFamily, host: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()[:2], timeout=5) as client:
            server, _ = listener.accept()
            with server:
                yield client, server


@needs_tcp_congestion
@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_both_ends_of_a_loopback_connection_get_reno(family: socket.AddressFamily, host: str) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with contextlib.ExitStack() as stack:
        try:
            client, server = stack.enter_context(_pair(family, host))
        except OSError as e:
            pytest.skip(f"no {host} here: {e}")
        for sock in (client, server):
            assert tune_loopback(sock) is True
            assert _congestion(sock) == LOOPBACK_CONGESTION_CONTROL


class _FakeSocket:
    def __init__(self, peer: Any, fail: bool = False) -> None:
        self.peer = peer
        self.fail = fail
        self.set: list[bytes] = []

    def getpeername(self) -> Any:
        if isinstance(self.peer, OSError):
            raise self.peer
        return self.peer

    def setsockopt(self, level: int, option: int, value: bytes) -> None:
        if self.fail:
            raise PermissionError(1, "Operation not permitted")
        self.set.append(value)


@needs_tcp_congestion
@pytest.mark.parametrize(
    ("peer", "tuned"),
    [
        (("127.0.0.1", 80), True),
        (("127.5.6.7", 80), True),  # all of 127/8
        (("::1", 80, 0, 0), True),
        (("::ffff:127.0.0.1", 80, 0, 0), True),  # an IPv4 loopback peer on a dual-stack socket
        (("10.1.2.3", 80), False),
        (("192.168.0.1", 80), False),
        (("::ffff:10.0.0.1", 80, 0, 0), False),
        (("fe80::1%eth0", 80, 0, 2), False),
        (("2001:db8::1", 80, 0, 0), False),
        ("/run/x.sock", False),  # a Unix socket's peer
        ("", False),
        (("not-an-ip", 80), False),
        (OSError(107, "Transport endpoint is not connected"), False),
    ],
)
def test_only_loopback_peers_are_tuned(peer: Any, tuned: bool) -> None:
    sock = _FakeSocket(peer)
    assert tune_loopback(sock) is tuned
    assert sock.set == ([LOOPBACK_CONGESTION_CONTROL] if tuned else [])


def test_a_refused_option_or_no_socket_is_not_an_error() -> None:
    assert tune_loopback(_FakeSocket(("127.0.0.1", 1), fail=True)) is False
    assert tune_loopback(None) is False
    assert tune_loopback(object()) is False
    a, b = socket.socketpair()
    with a, b:
        assert tune_loopback(a) is False  # a Unix socket pair: not TCP


async def _ok(request: Request) -> Response:
    return Response(b"ok")


class _Recording(HttpProtocol):
    seen: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.seen.append(_congestion(transport.get_extra_info("socket")))


@needs_tcp_congestion
def test_the_sdk_and_the_broker_tune_their_loopback_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real broker HTTP stack on loopback and both SDK transports: each end of each connection uses Reno."""
    client_ends: list[bytes] = []

    def recording(sock: Any) -> bool:
        done = tune_loopback(sock)
        client_ends.append(_congestion(sock))
        return done

    monkeypatch.setattr(transport_module, "tune_loopback", recording)
    _Recording.seen = []
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    server = HttpServer(Router({("GET", "/ok"): _ok}, max_body_bytes=1024))
    server.service.protocol = lambda: _Recording(server.service)  # type: ignore[method-assign]
    serving = threading.Event()
    stop_from_here: list[Any] = []

    async def serve() -> None:
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        await server.start(listener)
        stop_from_here.append(lambda: loop.call_soon_threadsafe(stop.set))
        serving.set()
        await stop.wait()
        await server.shutdown(5)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert serving.wait(10), "the server did not start"
        sync = SyncTransport()
        try:
            assert sync.exchange("GET", "127.0.0.1", port, "/ok", timeout=5).content == b"ok"
        finally:
            sync.close()

        async def one_async() -> bytes:
            t = AsyncTransport()
            try:
                return (await t.exchange("GET", "127.0.0.1", port, "/ok", timeout=5)).content
            finally:
                await t.aclose()

        assert asyncio.run(one_async()) == b"ok"
    finally:
        for stop in stop_from_here:
            stop()
        thread.join(10)
        listener.close()
    assert client_ends == [LOOPBACK_CONGESTION_CONTROL] * 2
    assert _Recording.seen == [LOOPBACK_CONGESTION_CONTROL] * 2
