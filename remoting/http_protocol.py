"""The broker's HTTP/1.1 protocol: uvicorn's connection handling, each request served straight from the parser.

uvicorn's protocol turns every request into an ASGI exchange: a scope dict, a ``RequestResponseCycle`` with its
``asyncio.Event``, one message dict for the body and one per piece of the answer, header checks on the way out, and
two socket writes per answer unless something joins them. That was about a fifth of the broker's CPU for a single
send and a quarter for a pull of 32 (measured against this protocol in one run set: 118 -> 92 µs and 86 -> 64 µs
a request). :class:`DirectHttpProtocol` keeps everything of
:class:`~remoting.http_guard.LimitedHttpToolsProtocol` that concerns the connection -- the httptools
parser, the head and body deadlines, the connection cap, keep-alive, TLS closing, a coded 400 for what the parser
refuses, uvicorn's graceful shutdown and its write flow control -- and serves a request by handing its method,
path, query, body and ``Authorization`` header to :meth:`remoting.router.Router.serve`, then writing the
answer in one write (head and body joined when small, gathered when large: a large pull answer comes in a few
pieces, :meth:`~remoting.router.Response.of_pieces`, that are not copied into one).

* **One request at a time per connection, in order.** A request that arrives complete while another is answered
  (pipelining) waits in a queue and reading pauses until the queue is empty; an answer goes out only once the
  socket takes writes again (flow control).
* **Bodies are bounded.** Each piece of a body is counted into the router's bytes in flight as it arrives
  (:meth:`~remoting.router.Router.take_body_bytes`); a body past ``maxRequestBodyBytes``, or past the
  in-flight bound, is dropped as it arrives and the request answered with the refusal (413 / SYSTEM_BUSY) once it
  is complete, on a connection that stays open. The bytes are given back when the request is answered, or when
  the connection is lost before.
* **Keep-alive** as uvicorn does it: HTTP/1.1 keeps the connection unless the client says ``Connection: close``;
  HTTP/1.0 closes it after the answer; an idle connection closes after ``keep_alive_timeout_s`` (a deadline of
  the connection's one timer, like the head and body deadlines, rather than a timer armed per answer).
* **An answer's first step runs at once**, inside the parser's callback: a request whose handler does not wait
  (an ASYNC_MASTER send, a pull that finds messages) is answered without a task; one that waits (a SYNC_MASTER
  send, a held pull, a slow reader) is carried on by a task from where it waits, cancelled as a task of its own
  would be. A task per request was about a tenth of the broker's CPU for a single send (as Python 3.12's eager
  tasks found). So ``asyncio.current_task()`` is None until a handler first waits: use ``asyncio.wait_for``, not
  ``asyncio.timeout``, before that.
* ``Expect: 100-continue`` is answered at once when no other answer is due on the connection; ``HEAD`` gets the
  head alone; a protocol upgrade (WebSocket) is refused like a malformed request: a coded 400, after the answers
  of the requests before it, then a close.
"""

from __future__ import annotations

import http
import logging
from collections import deque
from collections.abc import Coroutine, Generator
from typing import Any, ClassVar, cast
from urllib.parse import unquote

import httptools

from remoting.http_guard import HttpLimits, LimitedHttpToolsProtocol, with_limits
from remoting.router import Response, Router

__all__ = ["DirectHttpProtocol", "serving"]

log = logging.getLogger(__name__)

#: A head and a body smaller than this are joined into one buffer (cheaper than a gathered write of two).
_JOIN_BELOW_BYTES = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: What an idle kept-alive connection awaits (its deadline is the keep-alive timeout; the connection's one timer
#: covers it, as it covers a request's head and body).
_IDLE = "the next request"


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class _Incoming:
    """One request as the parser reads it, until it is answered."""

    __slots__ = ("auth", "chunks", "expect_continue", "held", "keep_alive", "method", "path", "query", "refusal",
                 "url")

    def __init__(self) -> None:
        self.url = b""
        self.method = ""
        self.path = ""
        self.query = b""
        self.auth: bytes | None = None
        self.expect_continue = False
        self.keep_alive = True
        self.chunks: list[bytes] = []
        self.held = 0
        """Body bytes counted into the router's bytes in flight."""
        self.refusal: Response | None = None
        """The answer once the body was refused (its bytes are dropped as they come)."""


class DirectHttpProtocol(LimitedHttpToolsProtocol):
    """Serves :attr:`router` (set by :func:`serving`); pass the class as ``uvicorn.Config(http=...)``."""

    router: ClassVar[Router]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._incoming: _Incoming | None = None
        self._waiting: deque[_Incoming] = deque()
        self._answering = False
        self._closing = False
        """Graceful shutdown: close once the answer being written is out."""
        self._refusal_due: str | None = None
        """What the parser refused while an answer was due: answered (400, then a close) after it."""
        self._default_headers: list[tuple[bytes, bytes]] | None = None
        self._default_head = b""
        self._stepping = False
        """An answer's first step is running (started from the parser or from the answer before it)."""

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
        if self._answering:
            self._refusal_due = why
            self.flow.pause_reading()
        else:
            self.send_400_response(why)

    def on_message_begin(self) -> None:
        self._head_begins()  # not the base's on_message_begin: it goes on into uvicorn's per-request scope
        self._incoming = _Incoming()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        assert self._incoming is not None
        self._incoming.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        incoming = self._incoming
        assert incoming is not None
        name = name.lower()
        if name == b"authorization":
            if incoming.auth is None:  # the first one counts (a repeated header does not replace it)
                incoming.auth = value
        elif name == b"expect" and value.lower() == b"100-continue":
            incoming.expect_continue = True

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout_s, "request body")
        incoming = self._incoming
        assert incoming is not None
        parser = self.parser
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
        if incoming.refusal is not None:
            return
        router = self.router
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
        self._disarm()
        incoming = self._incoming
        assert incoming is not None
        self._incoming = None
        if self.transport.is_closing():  # an answer before it closed the connection (a failure): no more served
            self.router.release_body_bytes(incoming.held)
        elif self._answering:
            self._waiting.append(incoming)
            self.flow.pause_reading()
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
        task = self.loop.create_task(_carry_on(coro, awaited))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer(self, incoming: _Incoming) -> None:
        try:
            response = incoming.refusal
            if response is None:
                chunks = incoming.chunks
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                incoming.chunks = []
                try:
                    response = await self.router.serve(incoming.method, incoming.path, incoming.query, body,
                                                       self.client or ("", 0), incoming.auth)
                finally:
                    self.router.release_body_bytes(incoming.held)
                    incoming.held = 0
            if not self.transport.is_closing():
                self._write(response, incoming)
                if self.flow.write_paused:
                    await self.flow.drain()  # a slow reader: no next answer until this one is taken
        except Exception:
            # A bug past the router's own catch-all: no answer can be framed, and keeping the connection would leave
            # the client waiting for it (or reading the next request's answer as this one's). It is closed.
            log.exception("HTTP: %s %s failed without an answer; closing the connection", incoming.method,
                          incoming.path)
            incoming.keep_alive = False
        finally:
            self._answered(incoming)

    def _write(self, response: Response, incoming: _Incoming) -> None:
        defaults = self.server_state.default_headers
        if defaults is not self._default_headers:  # uvicorn replaces the list each second (the date)
            self._default_headers = defaults
            self._default_head = b"".join(b"%s: %s\r\n" % pair for pair in defaults)
        length = response.length
        head = b"%s%scontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            _STATUS_LINES.get(response.status) or _status_line(response.status), self._default_head,
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
        self.server_state.total_requests += 1
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
            self.send_400_response(self._refusal_due)
            return
        self.flow.resume_reading()
        self._arm(self.timeout_keep_alive, _IDLE)

    def _expired(self, what: str, seconds: float) -> None:
        if what is _IDLE:  # uvicorn's keep-alive close, without a log line
            if not self.transport.is_closing():
                self.transport.close()
            return
        super()._expired(what, seconds)

    def _start_waiting(self) -> None:
        if self._waiting and not self._answering and not self.transport.is_closing():
            self._start(self._waiting.popleft())

    # --- connection -----------------------------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        # What was counted for requests that will never be answered goes back (the one being answered gives its
        # own back when its handler returns).
        router = self.router
        if self._incoming is not None:
            router.release_body_bytes(self._incoming.held)
            self._incoming = None
        while self._waiting:
            router.release_body_bytes(self._waiting.popleft().held)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's graceful stop: close an idle connection now, a busy one once its answer is out."""
        if self._answering:
            self._closing = True
        else:
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


def serving(router: Router, limits: HttpLimits) -> type[DirectHttpProtocol]:
    """The protocol class that serves ``router`` with ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""
    bound = type(DirectHttpProtocol.__name__, (DirectHttpProtocol,), {"router": router})
    return cast(type[DirectHttpProtocol], with_limits(bound, limits))
