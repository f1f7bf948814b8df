"""A router served in process, the way the servers serve it: :class:`remoting.server.HttpServer` on
``127.0.0.1`` with a kernel-chosen port, in the test's own event loop, and an ``httpx.AsyncClient`` bound to it.

Tests that talk HTTP to a router use this rather than an in-memory transport, so every request goes through the
real protocol (parser, limits, keep-alive, the answer's one write) as it does in the broker and the nameserver.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import httpx

from remoting.http import HttpLimits
from remoting.router import Router
from remoting.server import HttpServer

__all__ = ["serving"]

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
