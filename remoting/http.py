"""The servers' HTTP/1.1 protocol: httptools' parser under an :class:`asyncio.Protocol`, each request served
straight from the parser's callbacks by :meth:`remoting.router.Router.serve`. The broker, the nameserver and the
dashboard all serve with it, through :class:`remoting.server.HttpServer`.

There is no ASGI exchange. An ASGI server turns every request into a scope dict, a request-response cycle with
its ``asyncio.Event``, one message dict for the body and one per piece of the answer, header checks on the way
out, and two socket writes per answer unless something joins them. That was about a fifth of the broker's CPU
for a single send and a quarter for a pull of 32 (measured against serving from the parser: 118 -> 92 µs and
86 -> 64 µs a request). Here a request's method, path, query, body and ``Authorization`` header go to the router,
and the answer leaves in one write (head and body joined when small, gathered when large: a large pull answer
comes in a few pieces, :meth:`~remoting.router.Response.of_pieces`, that are not copied into one).

* **One request at a time per connection, in order.** A request that arrives complete while another is answered
  (pipelining) waits in a queue and reading pauses until the queue is empty; an answer goes out only once the
  socket takes writes again (flow control: ``pause_writing`` / ``resume_writing``).
* **Bodies are bounded.** Each piece of a body is counted into the router's bytes in flight as it arrives
  (:meth:`~remoting.router.Router.take_body_bytes`); a body past ``maxRequestBodyBytes``, or past the
  in-flight bound, is dropped as it arrives and the request answered with the refusal (413 / SYSTEM_BUSY) once it
  is complete, on a connection that stays open. The bytes are given back when the request is answered, or when
  the connection is lost before.
* **Deadlines.** From the connection's start, and from the first byte of each later request, the request head
  must be complete within ``header_timeout_s``; once the head is in, the body within ``body_timeout_s``. A
  deadline that passes closes the connection (no answer can be framed for a request that is not all there): an
  idle socket, a slowloris head or a body that stops short of its ``Content-Length`` holds no descriptor for ever.
* **Keep-alive**: HTTP/1.1 keeps the connection unless the client says ``Connection: close``; HTTP/1.0 closes it
  after the answer; an idle connection closes after ``keep_alive_timeout_s``, quietly.
* **Bounded heads and connections.** A request head (target and headers) of more than ``max_head_bytes`` is
  refused (httptools sets no bound); past ``max_connections`` open connections, or past
  ``max_connections_per_client`` from one peer address (so one client cannot take every slot and lock the others
  out), a new one is closed at once, with a warning at most once a second naming the limit.
* **Protected mode.** With ``loopback_only`` (a server with no credentials, docs/SECURITY.md) a connection from
  a peer that is not a loopback address is closed at once, before a byte is read.
* **Coded refusals.** A request the parser refuses is answered as every other error of these servers is: 400 with
  a JSON body carrying a RocketMQ code (``INVALID_PARAMETER``), after the answers of the requests before it, then
  a close (the parser cannot find the next request). A protocol upgrade (WebSocket) is refused the same way, and
  the request that asked for it is not served.
* **An answer's first step runs at once**, inside the parser's callback: a request whose handler does not wait
  (an ASYNC_MASTER send, a pull that finds messages) is answered without a task; one that waits (a SYNC_MASTER
  send, a held pull, a slow reader) is carried on by a task from where it waits, cancelled as a task of its own
  would be. A task per request was about a tenth of the broker's CPU for a single send (as Python 3.12's eager
  tasks found). So ``asyncio.current_task()`` is None until a handler first waits: use ``asyncio.wait_for``, not
  ``asyncio.timeout``, before that.
* ``Expect: 100-continue`` is answered at once when no other answer is due on the connection; ``HEAD`` gets the
  head alone; every answer carries a ``date`` header (formatted once a second) and no ``server`` header.
* **TLS close.** Over TLS a close sends ``close_notify`` and then waits for the client's, which an idle pooled
  client never reads (the SDK's sync transport reads only when it asks something): the connection would linger for
  the event loop's TLS shutdown timeout (30 s), holding a connection slot and the server's graceful stop. So once a
  TLS connection the server closed has flushed everything it had to send, it is aborted after
  :data:`TLS_CLOSE_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import http
import ipaddress
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Iterable
from email.utils import formatdate
from typing import Any, cast
from urllib.parse import unquote

import attrs
import httptools

from common.codes import ResponseCode
from common.tcp import tune_loopback
from common.wire import CONTENT_JSON, encode_error
from remoting.router import Connection, Response, Router

__all__ = ["TLS_CLOSE_GRACE_S", "HttpLimits", "HttpProtocol", "HttpService"]

log = logging.getLogger(__name__)

#: Seconds a closed TLS connection waits for the client's ``close_notify`` once its last bytes are out.
TLS_CLOSE_GRACE_S = 0.5
#: A head and a body smaller than this are joined into one buffer (cheaper than a gathered write of two).
_JOIN_BELOW_BYTES = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEAD = "request head"
_BODY = "request body"
#: What an idle kept-alive connection awaits (its deadline is the keep-alive timeout; the connection's one timer
#: covers it, as it covers a request's head and body).
_IDLE = "the next request"


@attrs.frozen
class HttpLimits:
    """Bounds of one HTTP server's connections."""

    header_timeout_s: float = 10.0
    """A request head must be complete this long after the connection opens or its first byte arrives."""
    body_timeout_s: float = 30.0
    """A request body must be complete this long after its head."""
    max_connections: int = 4096
    """Open connections; a new one past it is closed at once (``httpMaxConnections``)."""
    max_connections_per_client: int = 1024
    """Open connections from one peer address; a new one past it is closed at once
    (``httpMaxConnectionsPerClient``)."""
    loopback_only: bool = False
    """Protected mode: only loopback peers are served; any other is closed at once."""
    keep_alive_timeout_s: int = 5
    """An idle connection after an answer is closed after this many seconds."""
    max_head_bytes: int = 64 * 1024
    """Bytes of a request's target and headers: past them the request is refused (400) and the connection closed
    (httptools sets no bound: a slow stream of headers would grow without one)."""


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class _DateLine:
    """The ``date`` header line of an answer, formatted again only when the second changes (formatting it cost
    about 35 times what reading the clock and comparing the second does, measured with timeit)."""

    __slots__ = ("_clock", "_line", "_second")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        """``date: <IMF-fixdate>\\r\\n`` for the clock's second now."""
        second = int(self._clock())
        if second != self._second:
            self._line = b"date: %s\r\n" % formatdate(second, usegmt=True).encode("ascii")
            self._second = second
        return self._line


class _RefusalLog:
    """A warning at most once a second, with the count of refusals since the last one."""

    def __init__(self) -> None:
        self.last = -1e9
        self.count = 0

    def refused(self, why: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= 1.0:
            log.warning("HTTP: refused %d connection(s) in the last second or so; the last: %s", self.count, why)
            self.last, self.count = now, 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpService:
    """What the connections of one server share: the router they serve, the limits they keep, and the connections
    and answer tasks open now (a graceful stop waits for both).

    Args:
        router: answers every request.
        limits: deadlines, keep-alive and the caps on heads and connections.
        clock: wall-clock seconds for the ``date`` header.
    """

    def __init__(self, router: Router, limits: HttpLimits | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.router = router
        self.limits = limits if limits is not None else HttpLimits()
        self.connections: set[HttpProtocol] = set()
        """Connections open now (each from ``connection_made`` to ``connection_lost``)."""
        self.per_client: dict[str, int] = {}
        """Connections open now by peer address (those counted against ``max_connections_per_client``)."""
        self.tasks: set[asyncio.Task[None]] = set()
        """Answers carried on by a task (the ones whose handler waits), until they end."""
        self.stopping = False
        """A graceful stop has begun: a connection that opens now (a TLS handshake that ends late) is closed."""
        self.date_line = _DateLine(clock)
        self.refusals = _RefusalLog()
        self._idle: asyncio.Future[None] | None = None

    def protocol(self) -> HttpProtocol:
        """A protocol for a new connection (the factory to give ``loop.create_server``)."""
        return HttpProtocol(self)

    def track(self, task: asyncio.Task[None]) -> None:
        """Hold ``task`` (an answer going on) until it ends."""
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._check_idle()

    def admit(self, client: str) -> str | None:
        """Count a new connection from ``client``; None when it may stay, else why it must be closed (the limit's
        name in it). A refused one is not counted."""
        limits = self.limits
        if limits.loopback_only and not _is_loopback(client):
            return (f"{client} is not a loopback address: protected mode (no credentials configured) serves "
                    "loopback peers only; set aclEnable/aclFile (broker) or --acl-enable (nameserver), or "
                    "protectedMode=false")
        if len(self.connections) >= limits.max_connections:
            return f"{len(self.connections)} connections open, the cap is {limits.max_connections} (httpMaxConnections)"
        per = self.per_client.get(client, 0)
        if per >= limits.max_connections_per_client:
            return (f"{per} connections open from {client}, the cap per client is {limits.max_connections_per_client} "
                    "(httpMaxConnectionsPerClient)")
        self.per_client[client] = per + 1
        return None

    def gone(self, connection: HttpProtocol, counted: bool) -> None:
        """``connection`` was lost (``counted``: it was admitted and counted against its client)."""
        self.connections.discard(connection)
        if counted:
            client = connection.client[0]
            left = self.per_client.get(client, 0) - 1
            if left > 0:
                self.per_client[client] = left
            else:
                self.per_client.pop(client, None)
        self._check_idle()

    def _check_idle(self) -> None:
        idle = self._idle
        if idle is not None and not self.connections and not self.tasks and not idle.done():
            idle.set_result(None)

    async def wait_idle(self) -> None:
        """Return once no connection is open and no answer goes on."""
        while self.connections or self.tasks:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        self._idle = None


class _TlsClosingTransport(asyncio.Transport):
    """A TLS transport whose :meth:`close` starts the TLS close and aborts the connection once everything was sent
    and the client has not answered within :data:`TLS_CLOSE_GRACE_S` (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        super().__init__()
        self._loop = loop
        self._transport = transport
        self._timer: asyncio.TimerHandle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def abort(self) -> None:
        self.cancel()
        self._transport.abort()

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
        """Stop the grace timer (the connection is gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Incoming:
    """One request as the parser reads it, until it is answered."""

    __slots__ = ("auth", "chunks", "expect_continue", "held", "host", "keep_alive", "method", "path", "query",
                 "refusal", "upgrade", "url")

    def __init__(self) -> None:
        self.url = b""
        self.method = ""
        self.path = ""
        self.query = b""
        self.auth: bytes | None = None
        self.host: bytes | None = None
        self.expect_continue = False
        self.keep_alive = True
        self.upgrade = False
        """It asks for another protocol: not served (the parser raises HttpParserUpgrade right after it)."""
        self.chunks: list[bytes] = []
        self.held = 0
        """Body bytes counted into the router's bytes in flight."""
        self.refusal: Response | None = None
        """The answer once the body was refused (its bytes are dropped as they come)."""


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection of an :class:`HttpService` (see the module docstring)."""

    def __init__(self, service: HttpService) -> None:
        self._service = service
        self._router = service.router
        self._limits = service.limits
        self._date_line = service.date_line
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        # Bytes after a request that says ``Connection: close`` are parsed rather than refused: the requests in
        # them are dropped unserved (on_message_complete finds the connection closing), where a 400 would follow
        # the answer the client is reading.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport  # set by connection_made (wrapped over TLS)
        self.client: tuple[str, int] = ("", 0)
        """The peer's address and port."""
        self.conn: Connection | None = None
        """What the requests of this connection share (set once it is admitted)."""
        self._counted = False
        self._tls_closer: _TlsClosingTransport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        """The connection's one timer: fires no later than ``_due_at``; re-armed only when it fires early."""
        self._due_at: float | None = None
        """Loop time by which the awaited part (a request head or body, or the next request) must be in."""
        self._due_what = ""
        self._due_s = 0.0
        self._head_bytes = 0
        self._refused_why = ""
        """Why the parse was stopped (the 400's remark), when this protocol stopped it."""
        self._incoming: _Incoming | None = None
        self._waiting: deque[_Incoming] = deque()
        self._answering = False
        self._closing = False
        """Graceful shutdown: close once the answer being written is out."""
        self._refusal_due: str | None = None
        """What the parser refused while an answer was due: answered (400, then a close) after it."""
        self._stepping = False
        """An answer's first step is running (started from the parser or from the answer before it)."""
        self._read_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        """Resolved when the transport takes writes again (``resume_writing``) or the connection is lost."""

    # --- connection ---------------------------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # uvloop's transports are not asyncio.Transport subclasses
        service = self._service
        self.transport = transport
        tls = transport.get_extra_info("sslcontext") is not None
        if tls:
            self._tls_closer = _TlsClosingTransport(self.loop, transport)
            self.transport = self._tls_closer
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.client = (str(peer[0]), int(peer[1]))
        limits = self._limits
        refused = service.admit(self.client[0])
        service.connections.add(self)
        if refused is not None:
            service.refusals.refused(refused)
            self.transport.close()
            return
        self._counted = True
        if service.stopping:
            self.transport.close()
            return
        local = transport.get_extra_info("sockname")
        self.conn = Connection(self.client, (str(local[0]), int(local[1])) if isinstance(local, tuple) else ("", 0),
                               tls)
        tune_loopback(transport.get_extra_info("socket"))
        self._arm(limits.header_timeout_s, _HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._due_at = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._tls_closer is not None:
            self._tls_closer.cancel()
        # What was counted for requests that will never be answered goes back (the one being answered gives its
        # own back when its handler returns).
        router = self._router
        if self._incoming is not None:
            router.release_body_bytes(self._incoming.held)
            self._incoming = None
        while self._waiting:
            router.release_body_bytes(self._waiting.popleft().held)
        self._wake_writer()  # an answer waiting for the socket to drain ends (its writes go nowhere)
        self._service.gone(self, self._counted)

    def shutdown(self) -> None:
        """Graceful stop: close an idle connection now, a busy one once its answer is out."""
        if self._answering:
            self._closing = True
        else:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is not sent (the graceful stop's bound passed)."""
        self.transport.abort()

    # --- flow control ---------------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        drained = self._drained
        if drained is not None:
            self._drained = None
            if not drained.done():
                drained.set_result(None)

    async def _drain(self) -> None:
        """Return once the transport takes writes again (or the connection is lost)."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        await self._drained

    def _pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # --- parser callbacks (httptools calls them from feed_data) -------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse("protocol upgrades (WebSocket) are not served")
        except httptools.HttpParserError as e:
            self._refuse(str(e) or "invalid HTTP request")

    def _refuse(self, why: str) -> None:
        """Answer 400 and close -- after the answers of the requests that came before (answers go in order)."""
        if self.transport.is_closing():  # closed after an answer: nothing more goes out
            return
        if self._answering:
            self._refusal_due = why
            self._pause_reading()
        else:
            self._send_400(why)

    def on_message_begin(self) -> None:
        self._arm(self._limits.header_timeout_s, _HEAD)
        self._head_bytes = 0
        self._incoming = _Incoming()

    def _count_head(self, more: int) -> None:
        """Count ``more`` bytes of the request head; past ``max_head_bytes`` the parse stops (answered 400 with
        :attr:`_refused_why`)."""
        self._head_bytes += more
        if self._head_bytes > self._limits.max_head_bytes:
            self._refused_why = f"request head (target and headers) exceeds {self._limits.max_head_bytes} bytes"
            raise ValueError(self._refused_why)  # httptools raises it on as an HttpParserError

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        assert self._incoming is not None
        self._incoming.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        incoming = self._incoming
        assert incoming is not None
        name = name.lower()
        if name == b"authorization":
            if incoming.auth is None:  # the first one counts (a repeated header does not replace it)
                incoming.auth = value
        elif name == b"host":
            if incoming.host is None:
                incoming.host = value
        elif name == b"expect" and value.lower() == b"100-continue":
            incoming.expect_continue = True

    def on_headers_complete(self) -> None:
        self._arm(self._limits.body_timeout_s, _BODY)
        incoming = self._incoming
        assert incoming is not None
        parser = self.parser
        if parser.should_upgrade():
            incoming.upgrade = True
            return
        incoming.method = parser.get_method().decode("ascii")
        incoming.keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        url = httptools.parse_url(incoming.url)  # a malformed target raises: answered 400 by data_received
        path = url.path.decode("latin-1")
        incoming.path = unquote(path) if "%" in path else path
        incoming.query = url.query or b""
        if incoming.expect_continue and not self._answering and not self._waiting:
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        incoming = self._incoming
        assert incoming is not None
        if incoming.refusal is not None or incoming.upgrade:
            return
        router = self._router
        refusal = router.take_body_bytes(incoming.held, len(body), incoming.method, incoming.path)
        if refusal is None:
            incoming.held += len(body)
            incoming.chunks.append(body)
        else:
            router.release_body_bytes(incoming.held)
            incoming.held = 0
            incoming.chunks = []
            incoming.refusal = refusal

    def on_message_complete(self) -> None:
        self._due_at = None  # nothing is awaited until the answer is out (the timer finds nothing due and stops)
        incoming = self._incoming
        assert incoming is not None
        self._incoming = None
        if self.transport.is_closing() or incoming.upgrade:
            # An answer before it closed the connection (a failure), or it asks for an upgrade (refused by
            # data_received once the parser stops): not served.
            self._router.release_body_bytes(incoming.held)
        elif self._answering:
            self._waiting.append(incoming)
            self._pause_reading()
        else:
            self._start(incoming)

    # --- answering ----------------------------------------------------------------------------------------

    def _start(self, incoming: _Incoming) -> None:
        """Answer ``incoming``: its first step now, and a task for the rest only if it waits (see the module)."""
        self._answering = True
        coro = self._answer(incoming)
        self._stepping = True
        try:
            awaited = coro.send(None)
        except StopIteration:
            return
        finally:
            self._stepping = False
        self._service.track(self.loop.create_task(_carry_on(coro, awaited)))

    async def _answer(self, incoming: _Incoming) -> None:
        router = self._router
        try:
            response = incoming.refusal
            if response is None:
                chunks = incoming.chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                incoming.chunks = []
                try:
                    response = await router.serve(incoming.method, incoming.path, incoming.query, body,
                                                  self.client, incoming.auth, incoming.host, self.conn)
                finally:
                    router.release_body_bytes(incoming.held)
                    incoming.held = 0
            else:
                router.observe_refusal(incoming.path, response)
            if not self.transport.is_closing():
                self._write(response, incoming)
                if self._write_paused:
                    await self._drain()  # a slow reader: no next answer until this one is taken
        except Exception:
            # A bug past the router's own catch-all: no answer can be framed, and keeping the connection would leave
            # the client waiting for it (or reading the next request's answer as this one's). It is closed.
            log.exception("HTTP: %s %s failed without an answer; closing the connection", incoming.method,
                          incoming.path)
            incoming.keep_alive = False
        finally:
            self._answered(incoming)

    def _write(self, response: Response, incoming: _Incoming) -> None:
        length = response.length
        head = b"%s%scontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            _STATUS_LINES.get(response.status) or _status_line(response.status), self._date_line(),
            response.content_type.encode("latin-1"), length,
            b"" if incoming.keep_alive and not self._closing else b"connection: close\r\n")
        transport = self.transport
        if incoming.method == "HEAD":
            transport.write(head)
        elif response.tail:
            transport.writelines([head, response.body, *response.tail])
        elif length < _JOIN_BELOW_BYTES:
            transport.write(head + response.body)
        else:
            transport.writelines([head, response.body])

    def _answered(self, incoming: _Incoming) -> None:
        self._answering = False
        transport = self.transport
        if not incoming.keep_alive or self._closing:
            transport.close()
            return
        if transport.is_closing():
            return
        if self._waiting:
            if self._stepping:  # answered in its first step: the next one starts on the next turn, not nested
                self.loop.call_soon(self._start_waiting)
            else:
                self._start(self._waiting.popleft())
            return
        if self._refusal_due is not None:
            self._send_400(self._refusal_due)
            return
        self._resume_reading()
        self._arm(self._limits.keep_alive_timeout_s, _IDLE)

    def _start_waiting(self) -> None:
        if self._waiting and not self._answering and not self.transport.is_closing():
            self._start(self._waiting.popleft())

    def _send_400(self, why: str) -> None:
        """The answer to a request the parser refused, shaped as every other error of these servers: a JSON body
        with a RocketMQ code (``INVALID_PARAMETER``) and a remark naming the problem; the connection is closed after
        it (the parser cannot find the next request)."""
        if self._refused_why:
            why = self._refused_why
        body = encode_error(ResponseCode.INVALID_PARAMETER,
                            f"malformed HTTP/1.1 request: {why.rstrip('.')}; nothing was done")
        head = b"HTTP/1.1 400 Bad Request\r\n%scontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
            self._date_line(), CONTENT_JSON.encode("latin-1"), len(body))
        self.transport.write(head + body)
        self.transport.close()

    # --- deadlines ------------------------------------------------------------------------------------------
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

    def _on_timer(self) -> None:
        self._deadline = None
        due = self._due_at
        if due is None:
            return
        if self.loop.time() < due:  # moved on since the timer was armed
            self._deadline = self.loop.call_at(due, self._on_timer)
            return
        self._due_at = None
        if self.transport.is_closing():
            return
        if self._due_what is not _IDLE:  # an idle connection closes quietly; an incomplete request is logged
            log.info("HTTP: closing the connection from %s: %s not complete within %.1f s",
                     f"{self.client[0]}:{self.client[1]}" if self.client[0] else "?", self._due_what, self._due_s)
        self.transport.close()


class _Resume:
    """Awaits what a coroutine's step yielded, as the task driving that coroutine would have: the task sees the
    same object (a future still marked as awaited, or None for a bare yield) and waits for it the same way."""

    __slots__ = ("awaited",)

    def __init__(self, awaited: Any) -> None:
        self.awaited = awaited

    def __await__(self) -> Generator[Any, None, None]:
        yield self.awaited


async def _carry_on(coro: Coroutine[Any, Any, None], awaited: Any) -> None:
    """Drive ``coro`` on from its first step, which yielded ``awaited``, as a task of its own would (a cancellation
    reaches it where it waits)."""
    while True:
        try:
            await _Resume(awaited)
        except BaseException as exc:  # the task was cancelled: the answer gets it where it waits, as it would
            try:
                awaited = coro.throw(exc)
            except StopIteration:
                return
            continue
        try:
            awaited = coro.send(None)
        except StopIteration:
            return
