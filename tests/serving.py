"""A router served in process, the way the servers serve it: :class:`remoting.server.HttpServer` on
``127.0.0.1`` with a kernel-chosen port, in the test's own event loop, and an ``httpx.AsyncClient`` bound to it.

Tests that talk HTTP to a router use this rather than an in-memory transport, so every request goes through the
real protocol (parser, limits, keep-alive, the answer's one write) as it does in the broker and the nameserver.

Also here: :func:`plain_http_refuser`, a plain (not TLS) HTTP port that answers one request with 400, for the
tests of what a TLS client is told about such a port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import httpx

from remoting.http import HttpLimits
from remoting.router import Router
from remoting.server import HttpServer

__all__ = ["plain_http_refuser", "serving"]

#: Bound on each request of the client (a long poll of a test waits within it).
CLIENT_TIMEOUT_S = 60.0
#: Bound on the server's graceful stop when the test is done.
STOP_TIMEOUT_S = 5.0


@contextlib.asynccontextmanager
async def serving(router: Router, limits: HttpLimits | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Serve ``router`` on loopback while the block runs; yields a client whose ``base_url`` is the server.

    The socket is bound to port 0 before the server starts, so the port is the kernel's choice: no race with
    another test. The server stops gracefully at the end of the block.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    server = HttpServer(router, limits)
    try:
        await server.start(sock)
    except BaseException:
        sock.close()
        raise
    try:
        # trust_env=False: a proxy from the environment must not sit between the test and its server.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=CLIENT_TIMEOUT_S,
                                     trust_env=False) as client:
            yield client
    finally:
        await server.shutdown(STOP_TIMEOUT_S)


@contextlib.contextmanager
def plain_http_refuser() -> Iterator[tuple[str, int]]:
    """A plain HTTP port on loopback that reads one request and answers 400 (as a plain HTTP server answers the
    bytes of a TLS handshake), on a thread; yields its address. The thread is joined when the block ends."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

        server = threading.Thread(target=answer, daemon=True)
        server.start()
        yield listener.getsockname()[:2]
        server.join(5.0)
