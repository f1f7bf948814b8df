"""A minimal HTTP/1.1 transport for httpx: keep-alive, Content-Length bodies, bounded timeouts, small pools.

httpx's default transport (httpcore) costs several hundred microseconds of CPU per request; the data path needs
thousands of requests per second per client, so the SDK plugs this one in. It speaks exactly what SplitMQ's
servers speak and no more:

* requests: ``METHOD path HTTP/1.1`` with httpx's headers and a Content-Length body (never chunked);
* responses: a status line, headers and a Content-Length body (a body without a length is read until the
  server closes; chunked transfer is refused as a protocol error);
* one request at a time per connection (no pipelining), idle connections kept per ``host:port`` (LIFO, at most
  ``max_idle_per_host``), at most ``max_connections_per_host`` open; a caller waits for a free slot at most the
  request's ``pool`` timeout;
* an idle connection the server closed is noticed before reuse (it reads as readable: one ``select`` per reuse);
  a request on a reused connection that dies before any response byte is retried once on a new connection, and
  when that connection cannot be made the error says the request may have been received
  (:func:`~client._http11.lost_after_write`): a server that died with it in hand may have acted on it, which an
  idempotent send must know (``TransportError.request_sent``).

Failures map onto httpx's exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``WriteTimeout``,
``PoolTimeout``, ``RemoteProtocolError``, ``ReadError``), so the layers above see the same errors as with httpcore.

With an ``ssl_context`` every connection is TLS whatever the URL's scheme says (the SDK's addresses are
``host:port``; TLS is a property of the client, as Kafka's ``security.protocol``): the handshake runs once per
new connection, bounded by the connect timeout, and verifies the server against the context. A failed handshake
raises :class:`~client._http11.TlsHandshakeError` (an ``httpx.ConnectError``) with a sentence naming the CA
option. Without a context nothing here differs from a plain transport.

**Signing, once per TLS connection.** ``exchange`` may be given the account's
:class:`~common.signing.RequestSigner` instead of a ready header: it signs the request for the connection it
goes on (the signature names the server, ``host:port``). On a TLS connection the first request the server
accepted as signed binds the connection to that account at the server (docs/SECURITY.md); the connection
remembers it, and later requests on it go unsigned -- no HMAC, no body digest -- until the server refuses one
(403), after which the connection signs again. Plaintext connections sign every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from typing import cast

import httpx

from client._conditions import CountedCondition
from client._http11 import (
    HostPool,
    Incomplete,
    RawResponse,
    ResponseParser,
    Timeouts,
    TlsHandshakeError,
    check_target,
    closed_unanswered,
    encode_head,
    lost_after_write,
    origin_of,
    plain_to_tls_error,
    raw_head,
    retry_or_raise,
    timeouts_of,
)
from common.signing import RequestSigner
from common.tcp import tune_loopback
from common.tls import describe_tls_failure

__all__ = ["AsyncTransport", "RawResponse", "SyncTransport"]

#: The first size of a thread's receive buffer (:class:`_ReceiveBuffer`).
_RECV_SIZE = 256 * 1024
#: A receive buffer grown past this for one large answer is not kept for the next.
_KEEP_MAX = 16 << 20
#: An answer body of this many bytes or more is lent (left in the buffer, :class:`RawResponse`), a smaller one
#: copied out at once (a small copy costs less than reading the records through a view).
_LEND_FROM = 128 * 1024


class _ReceiveBuffer(threading.local):
    """Each thread's receive buffer: every answer the blocking transport reads on that thread is received into
    it, in place, and the buffer is kept for the thread's next request (grown to the largest answer, up to
    :data:`_KEEP_MAX`).

    Receiving each read into a fresh object (``recv(256 KiB)``), and then each large answer into fresh objects of
    its size, made glibc's heap give those pages back to the kernel between requests in about half of the
    processes measured, and fault them in again on the next: 0.35 page faults a message on a pull of 32 in 8 of
    18 ``benchmarks client`` processes (1.1 µs more client CPU a message), and 0.3 a message on every slave read
    of 1000. A large answer is lent from this buffer (``lease``: the last answer lent, which :meth:`reuse`
    makes copy its body out if it is still referenced when the next request comes).
    """

    def __init__(self) -> None:
        self.buf = bytearray(_RECV_SIZE)
        self.lease: weakref.ref[RawResponse] | None = None

    def reuse(self) -> bytearray:
        """The buffer, once nothing lent from it can change when it is overwritten."""
        lease = self.lease
        if lease is not None:
            self.lease = None
            lent = lease()
            if lent is not None:
                lent.keep()
        return self.buf

    def grow(self, parser: ResponseParser) -> None:
        """Give ``parser`` a larger buffer holding what it received (kept for later answers up to a bound)."""
        bigger = bytearray(parser.room())
        bigger[: parser.filled] = memoryview(parser.buf)[: parser.filled]
        parser.buf = bigger
        if len(bigger) <= _KEEP_MAX:
            self.buf = bigger

    def answer(self, parser: ResponseParser) -> RawResponse:
        """The answer ``parser`` read: a large body lent from the buffer, a small one copied."""
        if parser.body_len < _LEND_FROM:
            return parser.raw()
        answer = RawResponse(parser.status, None, parser.headers, view=parser.body_view())
        if parser.buf is self.buf:
            self.lease = weakref.ref(answer)
        return answer


_RECEIVE = _ReceiveBuffer()

# --- sync ------------------------------------------------------------------------------------------------


#: Before ``answered_at`` is first set.
_NEVER = -1.0


class _Signed:
    """A request to sign per connection (see the module docstring): its parts, and the head for a connection."""

    __slots__ = ("body_len", "host", "method", "port", "signer", "target", "unsigned")

    def __init__(self, signer: RequestSigner, method: str, host: str, port: int, target: str, body_len: int) -> None:
        self.signer = signer
        self.method = method
        self.host = host
        self.port = port
        self.target = target
        self.body_len = body_len
        self.unsigned = False
        """The head last built went without a signature (the connection was bound to the account)."""

    def head(self, bound_to: str | None, body: bytes) -> bytes:
        """The request head for a connection bound to ``bound_to`` (None: not bound): unsigned when that is this
        signer's account, else signed for ``host:port``."""
        signer = self.signer
        if bound_to is not None and bound_to == signer.access_key:
            self.unsigned = True
            return raw_head(self.method, self.host, self.port, self.target, self.body_len)
        self.unsigned = False
        target, authorization = signer.sign(self.method, self.target, body, f"{self.host}:{self.port}")
        return raw_head(self.method, self.host, self.port, target, self.body_len, authorization)

    def bound_after(self, tls: bool, status: int) -> str | None:
        """What the connection is bound to after an answer with ``status``: this account when TLS carried a
        request the server did not refuse, nothing after a refusal (sign again), else as it was (None)."""
        if status == 403:
            return None
        return self.signer.access_key if tls else None


class _SyncConnection:
    __slots__ = ("_timeout", "answered_at", "bound_to", "sock", "tls")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.bound_to: str | None = None
        """The account this TLS connection is bound to at the server (its requests then go unsigned)."""
        self._timeout = sock.gettimeout()
        """The socket's timeout as last set (``gettimeout`` reads it back through nanoseconds, and a float that
        does not survive the round trip compared unequal: every request set it twice)."""
        self.answered_at = _NEVER
        """``time.monotonic()`` of the last complete answer."""

    def is_stale(self) -> bool:
        """An idle connection that is readable was closed by the server (or sent junk): drop it. Asked before
        every reuse (one ``select``, about a microsecond): a request written on a connection the server had
        already closed was never received, and is then not sent at all, while one that fails after a live server
        took it may have been acted on (:func:`~client._http11.lost_after_write`)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _set_timeout(self, seconds: float | None) -> None:
        """``settimeout`` is a system call (``ioctl``): made only when the timeout changes. A timeout is rounded
        up to the millisecond, so that the time left of successive calls' deadlines (3 s less a few µs each) is
        one value rather than a system call each; a wait may end up to 1 ms after its deadline."""
        if seconds is not None:
            seconds = math.ceil(seconds * 1000) / 1000
        if seconds != self._timeout:
            self.sock.settimeout(seconds)
            self._timeout = seconds

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def roundtrip(self, head: bytes, body: bytes, timeouts: Timeouts, no_body: bool) -> ResponseParser:
        _, read_t, write_t, _ = timeouts
        sock = self.sock
        try:
            self._set_timeout(write_t)
            if len(body) > 65536:
                sock.sendall(head)
                sock.sendall(body)
            else:
                sock.sendall(head + body if body else head)
        except TimeoutError:
            raise httpx.WriteTimeout("timed out sending the request") from None
        except OSError:
            raise Incomplete(got_bytes=False) from None
        receive = _RECEIVE
        parser = ResponseParser(no_body=no_body, buf=receive.reuse())
        self._set_timeout(read_t)
        got = False
        while True:
            if parser.filled == len(parser.buf):
                receive.grow(parser)
            try:
                n = sock.recv_into(memoryview(parser.buf)[parser.filled :])
            except TimeoutError:
                raise httpx.ReadTimeout(f"no response within the read timeout ({read_t} s)") from None
            except OSError:
                raise Incomplete(got_bytes=got) from None
            if not n:
                if parser.finish_at_eof():
                    return parser
                raise Incomplete(got_bytes=got)
            got = True
            if parser.received(n):
                self.answered_at = time.monotonic()
                return parser


class _SyncHostPool(HostPool[_SyncConnection]):
    def __init__(self, max_connections: int, max_idle: int) -> None:
        super().__init__(max_connections, max_idle)
        self.cond = CountedCondition()


class SyncTransport(httpx.BaseTransport):
    """httpx transport over blocking sockets (see the module docstring).

    Args:
        max_connections_per_host: open connections to one ``host:port`` at most.
        max_idle_per_host: idle connections kept per ``host:port``.
        ssl_context: make every connection TLS with this context (None: plain TCP).
    """

    def __init__(self, *, max_connections_per_host: int = 64, max_idle_per_host: int = 16,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._pools: dict[tuple[str, int], _SyncHostPool] = {}
        self._lock = threading.Lock()
        self._max_conn = max_connections_per_host
        self._max_idle = max_idle_per_host
        self._closed = False

    def _pool(self, origin: tuple[str, int]) -> _SyncHostPool:
        pool = self._pools.get(origin)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(origin, _SyncHostPool(self._max_conn, self._max_idle))
        return pool

    def _acquire(self, pool: _SyncHostPool, origin: tuple[str, int], timeouts: Timeouts) -> tuple[_SyncConnection, bool]:
        connect_t, _, _, pool_t = timeouts
        with pool.cond:
            while True:
                if self._closed:
                    raise httpx.ConnectError("transport is closed")
                conn = pool.reuse()
                if conn is not None:
                    return conn, True
                if pool.reserve():
                    break
                if not pool.cond.wait(pool_t):
                    raise httpx.PoolTimeout(
                        f"no free connection to {origin[0]}:{origin[1]} within the pool timeout ({pool_t} s; "
                        f"max_connections_per_host={pool.max_connections})"
                    )
        try:
            sock = socket.create_connection(origin, timeout=connect_t)
        except TimeoutError:
            self._release_slot(pool)
            raise httpx.ConnectTimeout(f"connect to {origin[0]}:{origin[1]} timed out ({connect_t} s)") from None
        except OSError as e:
            self._release_slot(pool)
            raise httpx.ConnectError(f"connect to {origin[0]}:{origin[1]} failed: {e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tune_loopback(sock)
        if self._ssl is not None:
            try:  # the handshake runs under the connect timeout create_connection set on the socket
                sock = self._ssl.wrap_socket(sock, server_hostname=origin[0])
            except BaseException as e:
                sock.close()
                self._release_slot(pool)
                raise _connect_failure(e, origin, connect_t) from None
        return _SyncConnection(sock), False

    def _release_slot(self, pool: _SyncHostPool) -> None:
        with pool.cond:
            pool.release()
            pool.cond.notify()

    def _put_back(self, pool: _SyncHostPool, conn: _SyncConnection, reusable: bool) -> None:
        with pool.cond:
            pool.put_back(conn, reusable and not self._closed)
            pool.cond.notify()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read the whole response (httpx's transport interface)."""
        origin = origin_of(request)
        body = request.read()
        head = encode_head(request, len(body))
        return self._exchange(origin, head, body, timeouts_of(request), request.method == "HEAD").response(request)

    def exchange(self, method: str, host: str, port: int, target: str, body: bytes = b"", *,
                 timeout: float | None, authorization: str | None = None,
                 signer: RequestSigner | None = None) -> RawResponse:
        """One request without httpx's models: the data path's way in (about 100 µs of CPU cheaper per request).

        Args:
            method: ``GET`` or ``POST``.
            host: server host.
            port: server port.
            target: path and query string, already percent-encoded.
            body: request body (sent with a Content-Length).
            timeout: seconds for each of connect, pool wait, write and read (None: no bound).
            authorization: the ``Authorization`` header value of a signed request (None: no header).
            signer: sign as this account, once per TLS connection (see the module docstring); with it
                ``authorization`` is ignored.

        Raises:
            httpx.HTTPError: the same transport errors :meth:`handle_request` raises.
        """
        check_target(target)
        timeouts = (timeout, timeout, timeout, timeout)
        if signer is not None:
            signed = _Signed(signer, method, host, port, target, len(body))
            return _RECEIVE.answer(self._exchange((host, port), b"", body, timeouts, False, signed))
        head = raw_head(method, host, port, target, len(body), authorization)
        return _RECEIVE.answer(self._exchange((host, port), head, body, timeouts, False))

    def _exchange(self, origin: tuple[str, int], head: bytes, body: bytes, timeouts: Timeouts,
                  no_body: bool, signed: _Signed | None = None) -> ResponseParser:
        pool = self._pool(origin)
        for attempt in range(2):
            try:
                conn, reused = self._acquire(pool, origin, timeouts)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                if attempt:  # the first connection died with the request written
                    raise lost_after_write(origin, e) from None
                raise
            if signed is not None:
                head = signed.head(conn.bound_to, body)
            try:
                parser = conn.roundtrip(head, body, timeouts, no_body)
            except Incomplete as e:
                self._put_back(pool, conn, False)
                if self._ssl is None and closed_unanswered(e, reused) and speaks_tls(origin):
                    raise plain_to_tls_error(origin) from None
                retry_or_raise(e, reused, attempt, origin)
                continue
            except BaseException:
                self._put_back(pool, conn, False)
                raise
            if signed is not None:
                conn.bound_to = signed.bound_after(conn.tls, parser.status)
            self._put_back(pool, conn, parser.keep_alive)
            return parser
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close idle connections and refuse new requests; requests in flight finish."""
        self._closed = True
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            with pool.cond:
                pool.close_idle()
                pool.cond.notify_all()


#: Bound on the probe that tells a plain client its server speaks TLS (:func:`speaks_tls`).
TLS_PROBE_TIMEOUT_S = 2.0


def _probe_context() -> ssl.SSLContext:
    """A context that completes any handshake: the probe only asks whether the server speaks TLS, and sends
    nothing over the connection."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def speaks_tls(origin: tuple[str, int]) -> bool:
    """Whether ``origin`` completes a TLS handshake: asked only when a plain connection to it was closed before
    any answer, which is what a TLS server does to plain HTTP (and what little else does)."""
    try:
        raw = socket.create_connection(origin, timeout=TLS_PROBE_TIMEOUT_S)
    except OSError:
        return False
    with raw:
        return completes_tls_handshake(raw, origin[0], TLS_PROBE_TIMEOUT_S)


def completes_tls_handshake(sock: socket.socket, server_hostname: str, timeout_s: float) -> bool:
    """Whether a client TLS handshake over the connected ``sock`` completes within ``timeout_s``; ``sock`` stays
    the caller's to close. Driven through memory BIOs, not ``SSLContext.wrap_socket``: given a connection its peer
    had already reset, CPython 3.11's ``SSLSocket`` raised without closing the descriptor it had taken over from
    ``sock`` (an unclosed-socket warning when it was collected)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = _probe_context().wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            tls.do_handshake()
            return True
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLError, ValueError):
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            sock.settimeout(left)
            if outgoing.pending:
                sock.sendall(outgoing.read())
            data = sock.recv(65536)
        except OSError:  # TimeoutError included
            return False
        if not data:
            return False
        incoming.write(data)


async def speaks_tls_async(origin: tuple[str, int]) -> bool:
    """:func:`speaks_tls` on the running loop."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(origin[0], origin[1], ssl=_probe_context(), server_hostname=origin[0]),
            TLS_PROBE_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError):
        return False
    writer.transport.abort()  # nothing was sent: no TLS close to wait for (a close would outlive the call)
    return True


# --- async -----------------------------------------------------------------------------------------------


def _connect_failure(exc: BaseException, origin: tuple[str, int], connect_t: float | None) -> BaseException:
    """The httpx error for a TLS connection that could not be set up."""
    addr = f"{origin[0]}:{origin[1]}"
    if isinstance(exc, TimeoutError):
        return httpx.ConnectTimeout(f"TLS handshake with {addr} timed out ({connect_t} s)")
    if isinstance(exc, ssl.SSLError):
        return TlsHandshakeError(describe_tls_failure(exc, addr) or str(exc))
    if isinstance(exc, OSError):
        return httpx.ConnectError(f"TLS handshake with {addr} failed: {exc} (does the server speak TLS?)")
    return exc


class _AsyncConnection(asyncio.Protocol):
    """One connection as an asyncio Protocol: cheaper than StreamReader/StreamWriter on the hot path."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.got_bytes = False
        self.closed = False
        self.tls = False
        self.bound_to: str | None = None
        """The account this TLS connection is bound to at the server (its requests then go unsigned)."""
        self.fileno = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not registered as an asyncio.Transport subclass: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)
        self.tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        tune_loopback(sock)
        self.fileno = sock.fileno() if sock is not None else -1

    def data_received(self, data: bytes) -> None:
        parser, waiter = self.parser, self.waiter
        if parser is None or waiter is None or waiter.done():
            self.closed = True  # bytes nobody asked for: the connection can't be trusted any more
            if self.transport is not None:
                self.transport.close()
            return
        self.got_bytes = True
        try:
            if parser.feed(data):
                waiter.set_result(None)
        except httpx.RemoteProtocolError as e:
            waiter.set_exception(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, parser = self.waiter, self.parser
        if waiter is not None and not waiter.done():
            if parser is not None and parser.finish_at_eof():
                waiter.set_result(None)
            else:
                waiter.set_exception(Incomplete(self.got_bytes))

    def is_stale(self) -> bool:
        """Closed, or closed by the server in a way the loop has not handled yet (the socket reads as readable
        while idle): see :meth:`_SyncConnection.is_stale`."""
        if self.closed:
            return True
        if self.fileno < 0 or self.tls:  # a TLS socket may hold a record the loop has not read: trust the loop
            return False
        try:
            readable, _, _ = select.select([self.fileno], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            if self.tls:
                # A TLS close waits for the server's close_notify, which a loop about to stop never reads (the
                # socket would leak); an idle HTTP connection has nothing to flush and its bodies carry lengths.
                self.transport.abort()
            else:
                self.transport.close()

    async def roundtrip(self, head: bytes, body: bytes, timeouts: Timeouts, no_body: bool) -> ResponseParser:
        read_t = timeouts[1]
        assert self.transport is not None
        self.parser = parser = ResponseParser(no_body=no_body)
        self.got_bytes = False
        self.waiter = waiter = self.loop.create_future()
        self.transport.write(head + body if len(body) <= 65536 else head)
        if len(body) > 65536:
            self.transport.write(body)
        timer = None
        if read_t is not None:
            timer = self.loop.call_later(read_t, _expire, waiter, read_t)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self.waiter = None
            self.parser = None
        return parser


def _expire(waiter: asyncio.Future[None], read_t: float) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout(f"no response within the read timeout ({read_t} s)"))


class _AsyncHostPool(HostPool[_AsyncConnection]):
    def __init__(self, max_connections: int, max_idle: int) -> None:
        super().__init__(max_connections, max_idle)
        self.waiters: deque[asyncio.Future[None]] = deque()


class AsyncTransport(httpx.AsyncBaseTransport):
    """httpx async transport over asyncio Protocols (see the module docstring). Use it from one event loop."""

    def __init__(self, *, max_connections_per_host: int = 64, max_idle_per_host: int = 16,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._pools: dict[tuple[str, int], _AsyncHostPool] = {}
        self._max_conn = max_connections_per_host
        self._max_idle = max_idle_per_host
        self._closed = False

    def _pool(self, origin: tuple[str, int]) -> _AsyncHostPool:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _AsyncHostPool(self._max_conn, self._max_idle)
        return pool

    async def _acquire(self, pool: _AsyncHostPool, origin: tuple[str, int], timeouts: Timeouts
                       ) -> tuple[_AsyncConnection, bool]:
        connect_t, _, _, pool_t = timeouts
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise httpx.ConnectError("transport is closed")
            conn = pool.reuse()
            if conn is not None:
                return conn, True
            if pool.reserve():
                break
            fut: asyncio.Future[None] = loop.create_future()
            pool.waiters.append(fut)
            try:
                await asyncio.wait_for(fut, pool_t)
            except TimeoutError:
                raise httpx.PoolTimeout(
                    f"no free connection to {origin[0]}:{origin[1]} within the pool timeout ({pool_t} s; "
                    f"max_connections_per_host={pool.max_connections})"
                ) from None
            finally:
                with contextlib.suppress(ValueError):
                    pool.waiters.remove(fut)
        if self._ssl is None:
            opening = loop.create_connection(lambda: _AsyncConnection(loop), origin[0], origin[1])
        else:
            opening = loop.create_connection(lambda: _AsyncConnection(loop), origin[0], origin[1], ssl=self._ssl,
                                             server_hostname=origin[0], ssl_handshake_timeout=connect_t)
        try:
            _, new = await asyncio.wait_for(opening, connect_t)
        except ssl.SSLError as e:
            self._release_slot(pool)
            raise _connect_failure(e, origin, connect_t) from None
        except TimeoutError:
            self._release_slot(pool)
            raise httpx.ConnectTimeout(f"connect to {origin[0]}:{origin[1]} timed out ({connect_t} s)") from None
        except OSError as e:
            self._release_slot(pool)
            raise httpx.ConnectError(f"connect to {origin[0]}:{origin[1]} failed: {e}") from None
        except BaseException:
            self._release_slot(pool)
            raise
        return new, False

    @staticmethod
    def _wake_one(pool: _AsyncHostPool) -> None:
        while pool.waiters:
            fut = pool.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _release_slot(self, pool: _AsyncHostPool) -> None:
        pool.release()
        self._wake_one(pool)

    def _put_back(self, pool: _AsyncHostPool, conn: _AsyncConnection, reusable: bool) -> None:
        pool.put_back(conn, reusable and not conn.closed and not self._closed)
        self._wake_one(pool)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """See :meth:`SyncTransport.handle_request`."""
        origin = origin_of(request)
        body = await request.aread()
        head = encode_head(request, len(body))
        return (await self._exchange(origin, head, body, timeouts_of(request), request.method == "HEAD")
                ).response(request)

    async def exchange(self, method: str, host: str, port: int, target: str, body: bytes = b"", *,
                       timeout: float | None, authorization: str | None = None,
                       signer: RequestSigner | None = None) -> RawResponse:
        """See :meth:`SyncTransport.exchange`."""
        check_target(target)
        timeouts = (timeout, timeout, timeout, timeout)
        if signer is not None:
            signed = _Signed(signer, method, host, port, target, len(body))
            return (await self._exchange((host, port), b"", body, timeouts, False, signed)).raw()
        head = raw_head(method, host, port, target, len(body), authorization)
        return (await self._exchange((host, port), head, body, timeouts, False)).raw()

    async def _exchange(self, origin: tuple[str, int], head: bytes, body: bytes, timeouts: Timeouts,
                        no_body: bool, signed: _Signed | None = None) -> ResponseParser:
        pool = self._pool(origin)
        for attempt in range(2):
            try:
                conn, reused = await self._acquire(pool, origin, timeouts)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                if attempt:  # the first connection died with the request written
                    raise lost_after_write(origin, e) from None
                raise
            if signed is not None:
                head = signed.head(conn.bound_to, body)
            try:
                parser = await conn.roundtrip(head, body, timeouts, no_body)
            except Incomplete as e:
                self._put_back(pool, conn, False)
                if self._ssl is None and closed_unanswered(e, reused) and await speaks_tls_async(origin):
                    raise plain_to_tls_error(origin) from None
                retry_or_raise(e, reused, attempt, origin)
                continue
            except BaseException:
                self._put_back(pool, conn, False)
                raise
            if signed is not None:
                conn.bound_to = signed.bound_after(conn.tls, parser.status)
            self._put_back(pool, conn, parser.keep_alive)
            return parser
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """See :meth:`SyncTransport.close`."""
        self._closed = True
        for pool in self._pools.values():
            pool.close_idle()
            while pool.waiters:
                fut = pool.waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

