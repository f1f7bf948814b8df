"""The sans-I/O half of the SDK's HTTP/1.1 transports (:mod:`client._transport`): request heads, the response
parser, the retry rule of a reused connection and the connection accounting of one host, shared by the blocking
and the asyncio transport.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

import httpx

__all__ = [
    "Conn", "HostPool", "Incomplete", "RawResponse", "ResponseParser", "Timeouts", "TlsHandshakeError", "check_target",
    "closed_unanswered", "encode_head", "origin_of", "plain_to_tls_error", "raw_head", "retry_or_raise", "timeouts_of",
]

_CRLF2 = b"\r\n\r\n"
_MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUS = frozenset({204, 304})


class RawResponse:
    """What the transports' ``exchange`` answers: the status and the whole body (no httpx objects).

    It has the two attributes of ``httpx.Response`` the SDK's data path reads, so one parser serves both.

    A large body may be *lent*: left in the blocking transport's receive buffer of the calling thread
    (``view``), which that thread's next request reuses. :attr:`content` copies it out on first use, and the
    transport copies it out before it reuses the buffer if this answer is still referenced then
    (:meth:`keep`), so ``content`` is always this answer's body. :meth:`body_view` reads it in place: valid only
    until the thread's next request, for a parser that copies what it keeps.
    """

    __slots__ = ("__weakref__", "_content", "_view", "headers", "status_code")

    def __init__(self, status_code: int, content: bytes | None, headers: list[tuple[bytes, bytes]],
                 view: memoryview | None = None) -> None:
        self.status_code = status_code
        self._content = content
        self._view = view
        self.headers = headers

    @property
    def content(self) -> bytes:
        """The body (a lent one is copied out on first use)."""
        content = self._content
        return content if content is not None else self.keep()

    def keep(self) -> bytes:
        """Copy a lent body out of the receive buffer (the buffer is about to be reused); returns the body."""
        if self._content is None:
            view, self._view = self._view, None
            self._content = bytes(view) if view is not None else b""
        return self._content

    def body_view(self) -> bytes | memoryview:
        """The body without a copy when it is lent: valid until the calling thread's next request through the
        blocking transport (copy what you keep); otherwise :attr:`content`."""
        view = self._view
        return view if view is not None and self._content is None else self.content


class Incomplete(Exception):
    """The connection ended before a full response (``got_bytes`` says whether any byte arrived)."""

    def __init__(self, got_bytes: bool) -> None:
        super().__init__("server disconnected without sending a complete response")
        self.got_bytes = got_bytes


#: Response heads already read, by their bytes: a server answers a client's requests with the same few heads (the
#: date changes once a second), and reading one cost a few µs of every request. Emptied when it reaches
#: :data:`_HEADS_MAX`, so heads that vary (a pull's length) cost one insert each and memory stays bounded.
_HEADS: dict[bytes, tuple[int, tuple[tuple[bytes, bytes], ...], int, bool]] = {}
_HEADS_MAX = 256


def _read_head(head: bytes) -> tuple[int, tuple[tuple[bytes, bytes], ...], int, bool]:
    """``(status, headers, Content-Length or -1, keep-alive)`` of a response head (without its blank line).

    Raises:
        httpx.RemoteProtocolError: a malformed status or header line, a bad Content-Length, or a
            Transfer-Encoding other than identity.
    """
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}") from None
    length = -1
    keep_alive = parts[0] != b"HTTP/1.0"
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
        value = value.strip()
        lname = name.strip().lower()
        if lname == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad Content-Length {value[:40]!r}") from None
        elif lname == b"transfer-encoding" and value.lower() != b"identity":
            raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {value[:40]!r}")
        elif lname == b"connection" and value.lower() == b"close":
            keep_alive = False
        headers.append((name.strip(), value))
    return status, tuple(headers), length, keep_alive


class ResponseParser:
    """Incremental parser of one HTTP/1.1 response; ``feed`` until it returns True."""

    __slots__ = ("body_len", "buf", "filled", "head_end", "headers", "keep_alive", "no_body", "status",
                 "until_close")

    def __init__(self, *, no_body: bool = False, buf: bytearray | None = None) -> None:
        self.buf = bytearray() if buf is None else buf
        """The bytes received so far are ``buf[:filled]``; a caller that passes ``buf`` receives into it directly
        (:meth:`received`), growing it as :meth:`room` says."""
        self.filled = 0
        self.head_end = -1
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_len = -1
        self.keep_alive = True
        self.no_body = no_body
        self.until_close = False

    def feed(self, data: bytes | memoryview) -> bool:
        """Append ``data`` (the parser's own buffer); True once the response is complete."""
        self.buf += data
        return self.received(len(data))

    def received(self, n: int) -> bool:
        """``n`` more bytes were written at ``buf[filled:]``; True once the response is complete."""
        self.filled += n
        if self.head_end < 0:
            end = self.buf.find(_CRLF2, max(0, self.filled - n - 3), self.filled)
            if end < 0:
                if self.filled > _MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError(f"response head longer than {_MAX_HEAD_BYTES} bytes")
                return False
            self._parse_head(end)
        if self.until_close:
            return False
        return self.filled - self.head_end >= self.body_len

    def room(self) -> int:
        """The size ``buf`` should grow to when it is full: the whole response when its length is known, else
        twice as much (growing with what arrived, never with what a head claims)."""
        size = len(self.buf)
        if self.head_end >= 0 and not self.until_close:
            return max(size, min(self.head_end + self.body_len, 2 * size))
        return 2 * size

    def _parse_head(self, end: int) -> None:
        head = bytes(self.buf[:end])
        known = _HEADS.get(head)
        if known is None:
            known = _read_head(head)
            if len(_HEADS) >= _HEADS_MAX:
                _HEADS.clear()
            _HEADS[head] = known
        self.status, headers, length, keep_alive = known
        self.headers = list(headers)
        if not keep_alive:
            self.keep_alive = False
        self.head_end = end + 4
        if self.no_body or self.status in _NO_BODY_STATUS or 100 <= self.status < 200:
            self.body_len = 0
        elif length >= 0:
            self.body_len = length
        else:
            self.until_close = True
            self.keep_alive = False

    def finish_at_eof(self) -> bool:
        """The server closed: complete only for a read-until-close body."""
        if self.until_close and self.head_end >= 0:
            self.body_len = self.filled - self.head_end
            self.until_close = False
            return True
        return False

    def body(self) -> bytes:
        return bytes(self.body_view())

    def body_view(self) -> memoryview:
        """The body where it was received (no copy)."""
        if self.filled - self.head_end > self.body_len:
            raise httpx.RemoteProtocolError("server sent more bytes than its Content-Length")
        return memoryview(self.buf)[self.head_end : self.head_end + self.body_len]

    def raw(self) -> RawResponse:
        return RawResponse(self.status, self.body(), self.headers)

    def response(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            self.status, headers=self.headers, content=self.body(), request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )


def encode_head(request: httpx.Request, body_len: int) -> bytes:
    url = request.url
    target = url.raw_path
    lines = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    has_length = False
    for name, value in request.headers.raw:
        if name.lower() == b"content-length":
            has_length = True
        elif name.lower() == b"transfer-encoding":
            continue
        lines += (name, b": ", value, b"\r\n")
    if not has_length and (body_len or request.method in ("POST", "PUT", "PATCH")):
        lines += (b"Content-Length: ", str(body_len).encode(), b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


Timeouts = tuple[float | None, float | None, float | None, float | None]
"""``(connect, read, write, pool)`` seconds; None waits without bound."""


def timeouts_of(request: httpx.Request) -> Timeouts:
    t = request.extensions.get("timeout") or {}
    return t.get("connect"), t.get("read"), t.get("write"), t.get("pool")


def raw_head(method: str, host: str, port: int, target: str, body_len: int, authorization: str | None = None
             ) -> bytes:
    """The request head of the transports' ``exchange``: what the servers read, nothing more (the
    ``Authorization`` line only on a signed request, so unsigned ones pay nothing for the ACL)."""
    length = f"Content-Length: {body_len}\r\n" if body_len or method == "POST" else ""
    if authorization is not None:
        length += f"Authorization: {authorization}\r\n"
    return f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\n{length}\r\n".encode("latin-1")


def check_target(target: str) -> None:
    if not target.startswith("/") or not target.isprintable() or " " in target or not target.isascii():
        raise httpx.UnsupportedProtocol(f"request target {target[:80]!r} must be an ASCII path without spaces")


def origin_of(request: httpx.Request) -> tuple[str, int]:
    url = request.url
    if url.scheme != "http":
        raise httpx.UnsupportedProtocol(f"the SplitMQ transport speaks plain http, not {url.scheme!r}")
    return url.host, url.port or 80


class TlsHandshakeError(httpx.ConnectError):
    """The TLS handshake with a server failed (its message says why and which option fixes it); the SDK maps it
    to :class:`client.errors.TlsError`, which is not retried."""


def closed_unanswered(e: Incomplete, reused: bool) -> bool:
    """A new connection the server closed before a byte of its answer: what a TLS server does with plain HTTP
    (the transport then asks whether it speaks TLS)."""
    return not reused and not e.got_bytes


def plain_to_tls_error(origin: tuple[str, int]) -> TlsHandshakeError:
    """The error of a plain client that dialled a server speaking TLS."""
    return TlsHandshakeError(
        f"{origin[0]}:{origin[1]} speaks TLS and this client connects without it: give the client the cluster's "
        "CA (ClientConfig(tls_ca_file=...), the CLI's --tls-ca or SPLITMQ_TLS_CA)")


def lost_after_write(origin: tuple[str, int], exc: httpx.HTTPError) -> httpx.RemoteProtocolError:
    """The error of a request whose first connection died after the request was written, and whose retry on a new
    connection could not connect (a server killed mid-request): the request may have been received and acted on,
    so it is not reported as a connection that never happened (``ConnectError``), which would say it never left."""
    return httpx.RemoteProtocolError(f"{origin[0]}:{origin[1]} closed the connection without a complete response, "
                                     f"and a new connection failed: {exc}")


def retry_or_raise(e: Incomplete, reused: bool, attempt: int, origin: tuple[str, int]) -> None:
    """Return when the request may go again on a new connection: the server closed an idle keep-alive
    connection under us before answering anything (first attempt only); else raise."""
    if reused and not e.got_bytes and attempt == 0:
        return
    hint = ("" if reused or e.got_bytes else
            " (a new connection closed before any answer: a server with TLS on does that to plain HTTP; "
            "set tls_ca_file if so)")
    raise httpx.RemoteProtocolError(
        f"{origin[0]}:{origin[1]} closed the connection without a complete response{hint}"
    ) from None


class Conn(Protocol):
    def is_stale(self) -> bool: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=Conn)


class HostPool(Generic[C]):
    """The connections of one ``host:port``: idle ones (newest reused first, at most ``max_idle``) and the count
    of open ones, at most ``max_connections``. Pure accounting; each transport adds its way of waiting for a
    free slot (a Condition, or futures on the loop)."""

    def __init__(self, max_connections: int, max_idle: int) -> None:
        self.idle: deque[C] = deque()
        self.open_count = 0
        self.max_connections = max_connections
        self.max_idle = max_idle

    def reuse(self) -> C | None:
        """An idle connection still usable, or None; stale ones are closed on the way."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.is_stale():
                return conn
            self.open_count -= 1
            conn.close()
        return None

    def reserve(self) -> bool:
        """Count a new connection in; False when ``max_connections`` are open (the caller waits)."""
        if self.open_count < self.max_connections:
            self.open_count += 1
            return True
        return False

    def release(self) -> None:
        """A reserved connection could not be opened."""
        self.open_count -= 1

    def put_back(self, conn: C, reusable: bool) -> None:
        """A request on ``conn`` ended: keep it idle when ``reusable`` and there is room, else close it."""
        if reusable and len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            self.open_count -= 1
            conn.close()

    def close_idle(self) -> None:
        """Close every idle connection (the transport is closing)."""
        while self.idle:
            self.idle.pop().close()
            self.open_count -= 1
