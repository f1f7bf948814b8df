"""uvicorn's httptools protocol with the bounds uvicorn lacks: a header and a body read deadline, a cap on a request
head's size, and a cap on open connections. Server-side glue, like :mod:`remoting.router`: the broker and the nameserver both serve with it.

uvicorn arms its keep-alive timer only after a response, so a connection that never sends a complete request
(an idle socket, a slowloris header, a body that stops short of its ``Content-Length``) stays open for ever, one
descriptor each. Here:

* from the connection's start, and from the first byte of each later request, the request head must be complete
  within ``header_timeout_s``;
* once the head is in, the body must be complete within ``body_timeout_s``;
* a request head (target and headers) of more than ``max_head_bytes`` is refused (httptools sets no bound);
* past ``max_connections`` open connections a new one is closed at once, with a warning at most once a second.

A deadline that passes closes the connection (no answer can be framed for a request that is not all there).

A request the HTTP parser refuses is answered as every other error of these servers is: 400 with a JSON body
carrying a RocketMQ code (``INVALID_PARAMETER``), where uvicorn answers in plain text; then the connection closes.

Over TLS a close sends ``close_notify`` and then waits for the client's, which an idle pooled client never reads
(the SDK's sync transport reads only when it asks something): the connection would linger for the event loop's
TLS shutdown timeout (30 s), holding a connection slot and the server's graceful stop. So once a TLS connection
the server closed has flushed everything it had to send, it is aborted after :data:`TLS_CLOSE_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

import attrs
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from common.codes import ResponseCode
from common.tcp import tune_loopback
from common.wire import CONTENT_JSON, encode_error

__all__ = ["TLS_CLOSE_GRACE_S", "HttpLimits", "LimitedHttpToolsProtocol", "with_limits"]

log = logging.getLogger(__name__)

#: Seconds a closed TLS connection waits for the client's ``close_notify`` once its last bytes are out.
TLS_CLOSE_GRACE_S = 0.5


@attrs.frozen
class HttpLimits:
    """Bounds of one HTTP server's connections."""

    header_timeout_s: float = 10.0
    """A request head must be complete this long after the connection opens or its first byte arrives."""
    body_timeout_s: float = 30.0
    """A request body must be complete this long after its head."""
    max_connections: int = 4096
    """Open connections; a new one past it is closed at once."""
    keep_alive_timeout_s: int = 5
    """An idle connection after a response is closed after this long (uvicorn's ``timeout_keep_alive``)."""
    max_head_bytes: int = 64 * 1024
    """Bytes of a request's target and headers: past them the request is refused (400) and the connection closed
    (httptools sets no bound, and uvicorn kept every header: a slow stream of them grew without one)."""


class _RefusalLog:
    """A warning at most once a second, with the count of refusals since the last one."""

    def __init__(self) -> None:
        self.last = -1e9
        self.count = 0

    def refused(self, open_now: int, cap: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= 1.0:
            log.warning("HTTP: refused %d connection(s): %d open, the cap is %d (httpMaxConnections)",
                        self.count, open_now, cap)
            self.last, self.count = now, 0


class _TlsClosingTransport:
    """Wraps a TLS transport: :meth:`close` starts the TLS close and aborts the connection once everything was
    sent and the client has not answered within :data:`TLS_CLOSE_GRACE_S` (see the module docstring)."""

    __slots__ = ("_loop", "_timer", "_transport", "write")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        self._loop = loop
        self._transport = transport
        self._timer: asyncio.TimerHandle | None = None
        self.write = transport.write

    def close(self) -> None:
        self._transport.close()
        if self._timer is None:
            self._timer = self._loop.call_later(TLS_CLOSE_GRACE_S, self._abort_when_flushed)

    def _abort_when_flushed(self) -> None:
        if self._transport.get_write_buffer_size() > 0:  # a slow reader still taking the answer: not yet
            self._timer = self._loop.call_later(TLS_CLOSE_GRACE_S, self._abort_when_flushed)
            return
        self._timer = None
        self._transport.abort()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HttpLimits` (set by :func:`with_limits`)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    _refusals: ClassVar[_RefusalLog] = _RefusalLog()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        """The connection's one timer: fires no later than ``_due_at``; re-armed only when it fires early."""
        self._due_at: float | None = None
        """Loop time by which the awaited part (a request head or body, or the next request) must be in."""
        self._due_what = ""
        self._due_s = 0.0
        self._tls_closer: _TlsClosingTransport | None = None
        self._head_bytes = 0
        self._refused_why = ""
        """Why the parse was stopped (the 400's remark), when this protocol stopped it."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if transport.get_extra_info("sslcontext") is not None:
            self._tls_closer = _TlsClosingTransport(self.loop, transport)
            self.transport = self._tls_closer  # type: ignore[assignment]
        limits = self.limits
        if len(self.connections) > limits.max_connections:
            self._refusals.refused(len(self.connections) - 1, limits.max_connections)
            transport.close()
            return
        tune_loopback(transport.get_extra_info("socket"))
        self._arm(limits.header_timeout_s, "request head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._tls_closer is not None:
            self._tls_closer.cancel()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._head_begins()
        super().on_message_begin()

    def _head_begins(self) -> None:
        """The first byte of a request: its head's deadline and byte count start."""
        self._arm(self.limits.header_timeout_s, "request head")
        self._head_bytes = 0

    def _count_head(self, more: int) -> None:
        """Count ``more`` bytes of the request head; past ``max_head_bytes`` the parse stops (the parser answers
        400 with :attr:`_refused_why`)."""
        self._head_bytes += more
        if self._head_bytes > self.limits.max_head_bytes:
            self._refused_why = f"request head (target and headers) exceeds {self.limits.max_head_bytes} bytes"
            raise ValueError(self._refused_why)  # httptools raises it on as an HttpParserError

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout_s, "request body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its HTTP parser refuses, shaped as every other error of these servers: a
        JSON body with a RocketMQ code (``INVALID_PARAMETER``) and a remark naming the problem, where uvicorn sent
        plain text; the connection is closed after it, as uvicorn does (the parser cannot find the next request)."""
        if self._refused_why:
            msg = self._refused_why
        body = encode_error(ResponseCode.INVALID_PARAMETER,
                            f"malformed HTTP/1.1 request: {msg.rstrip('.')}; nothing was done")
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % (CONTENT_JSON.encode(), len(body)))
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    # A request moves its connection's deadline three or four times (head, body, done, idle). Arming a loop timer
    # each time and cancelling it cost about 9 µs of the broker's 174 for a single send; here moving it is two
    # stores, and the one timer, when it fires before the deadline it finds, is armed again for that deadline.

    def _arm(self, seconds: float, what: str) -> None:
        """``what`` must be complete within ``seconds`` from now, or the connection is closed."""
        due = self.loop.time() + seconds
        self._due_at, self._due_what, self._due_s = due, what, seconds
        timer = self._deadline
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self._deadline = self.loop.call_at(due, self._on_timer)

    def _disarm(self) -> None:
        """Nothing is awaited (the timer, if armed, finds nothing due and stops)."""
        self._due_at = None

    def _on_timer(self) -> None:
        self._deadline = None
        due = self._due_at
        if due is None:
            return
        if self.loop.time() < due:  # moved on since the timer was armed
            self._deadline = self.loop.call_at(due, self._on_timer)
            return
        self._due_at = None
        self._expired(self._due_what, self._due_s)

    def _expired(self, what: str, seconds: float) -> None:
        if not self.transport.is_closing():
            log.info("HTTP: closing the connection from %s: %s not complete within %.1f s",
                     f"{self.client[0]}:{self.client[1]}" if self.client else "?", what, seconds)
            self.transport.close()


def with_limits(base: type[LimitedHttpToolsProtocol], limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """A subclass of ``base`` using ``limits`` (pass it as ``uvicorn.Config(http=...)``), with its own refusal
    log."""
    return type(base.__name__, (base,), {"limits": limits, "_refusals": _RefusalLog()})
