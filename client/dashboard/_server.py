"""Serving the dashboard: a socket bound before the server starts (port 0 picks a free one, and the real port is
known before anything is printed), the servers' HTTP runtime (:class:`remoting.server.HttpServer`) on an event loop
of its own, and the sweep thread beside it."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Sequence

from client import Admin, ClientConfig, Credentials
from client.dashboard._app import build_app
from client.dashboard._collector import Collector
from remoting.server import HttpServer

__all__ = ["DashboardServer"]

log = logging.getLogger(__name__)

#: Bound in seconds on the graceful stop's wait for open connections (a browser keeps one or two alive).
STOP_TIMEOUT_S = 2.0


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT with a port in [0, 65535] (0 picks a free one), got {listen!r}")
    return host.strip("[]"), int(port)


class DashboardServer:
    """The dashboard of the cluster behind ``namesrv_addr``, listening on ``listen``.

    Args:
        namesrv_addr: nameservers, ``;``-separated.
        listen: ``HOST:PORT``; port 0 picks a free one (see :attr:`url`).
        interval_s: seconds between two sweeps of the cluster.
        request_timeout_s: bound on each request of a sweep (a paused broker costs at most this).
        credentials: with the ACL on, an admin account (the views read runtime, HA and metadata endpoints).
        tls_ca_file: with TLS on, the CA the cluster's servers are verified against (the page itself is served
            over plain HTTP on ``listen``).
        read_only: refuse every action (topic and group updates, offset resets): the page only shows.
        allowed_hosts: names the page may be addressed by besides IP addresses, ``localhost`` and the host of
            ``listen`` (the page and the actions are refused under any other name: a guard against DNS rebinding).

    Raises:
        ValueError: ``listen`` is malformed.
        OSError: the address cannot be bound.
    """

    def __init__(self, namesrv_addr: str, listen: str = "127.0.0.1:0", *, interval_s: float = 1.0,
                 request_timeout_s: float = 1.0, credentials: Credentials | None = None,
                 tls_ca_file: str | None = None, read_only: bool = False,
                 allowed_hosts: Sequence[str] = ()) -> None:
        host, port = _parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            # Listening before the URL is printed: a client that connects at once waits in the backlog until
            # the server accepts, instead of being refused.
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        bound_port = self._sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"http://{shown}:{bound_port}/"
        """Where the page is served."""
        config = ClientConfig(request_timeout_s=request_timeout_s, connect_timeout_s=min(request_timeout_s, 0.5),
                              close_timeout_s=1.0, tls_ca_file=tls_ca_file)
        self._admin = Admin(namesrv_addr, client_config=config, credentials=credentials)  # an admin account
        self.collector = Collector(self._admin, namesrv_addr, interval_s=interval_s)
        self.read_only = read_only
        # The page carries this token; an action must send it back (see client.dashboard._app.Guard).
        self._router = build_app(self.collector, namesrv_addr, token=secrets.token_urlsafe(24), read_only=read_only,
                                 hosts=[host, *allowed_hosts], client_config=config)
        self._lock = threading.Lock()
        self._stop_asked = False
        self._wake: Callable[[], None] | None = None
        """Sets the serving loop's stop event, from any thread (None until the loop serves)."""

    def serve_forever(self) -> None:
        """Sweep and serve until :meth:`shutdown`, SIGINT (Ctrl-C) or SIGTERM, then stop gracefully; releases
        everything on the way out. The signals are caught only when it runs on the main thread."""
        self.collector.start()
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:  # not everywhere (Windows): asyncio's loop serves too
            loop_factory = None
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(self._serve())
        finally:
            self.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)

        def wake() -> None:
            loop.call_soon_threadsafe(stop.set)

        with self._lock:
            self._wake = wake
            if self._stop_asked:
                stop.set()
        server = HttpServer(self._router)
        try:
            await server.start(self._sock)
            await stop.wait()
        finally:
            with self._lock:
                self._wake = None
            await server.shutdown(STOP_TIMEOUT_S)

    def shutdown(self) -> None:
        """Ask the server to stop (from another thread; before it serves, it stops as soon as it starts)."""
        with self._lock:
            self._stop_asked = True
            if self._wake is not None:
                self._wake()

    def close(self) -> None:
        """Stop the sweep and release the admin session and the socket. Idempotent."""
        self.collector.stop()
        self._admin.close()
        self._sock.close()
