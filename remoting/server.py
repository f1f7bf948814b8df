"""One HTTP server of the project: a :class:`~remoting.router.Router` served by :mod:`remoting.http` on a
listening socket the caller bound (so port 0 is race-free and the real port known before anything is printed).

The broker, the nameserver and the dashboard each run one in their event loop. Signals are the caller's: a server
starts when told and stops when told, gracefully (:meth:`HttpServer.shutdown`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl

from remoting.http import HttpLimits, HttpService
from remoting.router import Router

__all__ = ["DEFAULT_BACKLOG", "HttpServer", "inherited_listener"]

log = logging.getLogger(__name__)

#: Connections the kernel queues before they are accepted (``loop.create_server`` listens again with it).
DEFAULT_BACKLOG = 2048
#: Bound on the wait for connections to go once the graceful stop's own bound passed and they were aborted.
_ABORT_WAIT_S = 1.0


def inherited_listener(fd: int, flag: str, bind_host: str | None = None) -> socket.socket:
    """The listening TCP socket a supervisor passed as descriptor ``fd`` (``flag`` names the option that gave it,
    for the messages), non-blocking; when ``bind_host`` is given, it must be bound to that address (the one the
    configuration names and protected mode judged).

    Raises:
        OSError: ``fd`` is not open, not a listening TCP socket, or bound elsewhere.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise OSError(e.errno, f"{flag} {fd} is not an open socket: {e.strerror}") from e
    if (sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM
            or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
        sock.close()
        raise OSError(errno.EINVAL, f"{flag} {fd} is not a listening TCP socket")
    host = sock.getsockname()[0]
    if bind_host and host != bind_host:
        sock.close()
        raise OSError(errno.EINVAL, f"{flag} {fd} is bound to {host}, where the configuration says {bind_host}")
    sock.setblocking(False)
    return sock


class HttpServer:
    """Serves ``router`` over HTTP/1.1 (TLS with ``ssl``) within ``limits``.

    Args:
        router: answers every request.
        limits: deadlines, keep-alive and the caps on heads and connections (defaults: :class:`HttpLimits`).
        ssl: a server context: every connection is TLS (None: plain HTTP).
        backlog: the listening socket's accept queue.
    """

    def __init__(self, router: Router, limits: HttpLimits | None = None, *, ssl: ssl.SSLContext | None = None,
                 backlog: int = DEFAULT_BACKLOG) -> None:
        self.service = HttpService(router, limits)
        """The connections' shared state (open connections, answers going on)."""
        self.started = asyncio.Event()
        """Set once the server accepts connections."""
        self._ssl = ssl
        self._backlog = backlog
        self._server: asyncio.AbstractServer | None = None
        self._stopped = False

    async def start(self, sock: socket.socket) -> None:
        """Accept connections on ``sock``, a bound and listening TCP socket, from now on; the server owns it from
        here (the graceful stop closes it).

        Raises:
            RuntimeError: the server was started already, or stopped.
        """
        if self._server is not None or self._stopped:
            raise RuntimeError("an HttpServer starts once")
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.service.protocol, sock=sock, ssl=self._ssl,
                                                backlog=self._backlog)
        self.started.set()

    async def shutdown(self, timeout_s: float) -> None:
        """Stop gracefully: accept no more connections, close the idle ones now and the busy ones once their answer
        is out; after ``timeout_s`` seconds, cancel the answers still going on and abort what is left. Idempotent.
        """
        server, self._server = self._server, None
        self._stopped = True
        if server is None:
            return
        service = self.service
        service.stopping = True
        server.close()
        for connection in list(service.connections):
            connection.shutdown()
        try:
            await asyncio.wait_for(service.wait_idle(), timeout_s)
        except TimeoutError:
            log.warning("HTTP: %d connection(s) and %d answer(s) still open %.1f s into the stop; cancelling and "
                        "closing them", len(service.connections), len(service.tasks), timeout_s)
            for task in list(service.tasks):
                task.cancel()
            for connection in list(service.connections):
                connection.abort()
            try:
                await asyncio.wait_for(service.wait_idle(), _ABORT_WAIT_S)
            except TimeoutError:
                log.warning("HTTP: %d connection(s) still open after they were aborted", len(service.connections))
        try:  # a TLS handshake still under way is no connection of the service yet: bounded here
            await asyncio.wait_for(server.wait_closed(), _ABORT_WAIT_S)
        except TimeoutError:
            pass
