"""The servers' routing: a request's handler by method and path, bounded bodies, and errors of one shape.

No sockets here: :mod:`remoting.http` reads each request and hands it to :meth:`Router.serve`, its one entry.
The broker, the nameserver and the dashboard route with it, so their error answers have one shape (see
:mod:`common.wire`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from common.codes import ResponseCode
from common.errors import AccessDeniedError, ClientError, NoPermissionError
from common.requests import ArgumentError, parse_query, query_arg, query_int
from common.wire import CONTENT_BINARY, CONTENT_JSON, encode_error, http_status_for_code

__all__ = ["ArgumentError", "Connection", "Request", "Response", "Router", "error_response", "json_response"]

log = logging.getLogger(__name__)


class Connection:
    """What outlives one request on an HTTP connection: who is at the other end, the address it arrived on,
    whether TLS protects it, and the account the ACL bound it to (:mod:`remoting.acl_gate`).

    Args:
        client: the peer's address and port.
        local: the connection's local address and port (the server address the peer dialled).
        tls: the connection is TLS (its bytes cannot be altered or injected on the path).
    """

    __slots__ = ("_names", "bound", "client", "local", "tls")

    def __init__(self, client: tuple[str, int], local: tuple[str, int], tls: bool) -> None:
        self.client = client
        self.local = local
        self.tls = tls
        self.bound: Any = None
        """Set by the ACL gate when a signed request authenticated this TLS connection (its account's principal
        and the accounts file it was checked against); None otherwise."""
        self._names: frozenset[str] | None = None

    @property
    def local_names(self) -> frozenset[str]:
        """The ``Host`` values that name this connection's server: its local ``ip:port`` (``[ip]:port`` and the
        bare form for IPv6), and ``localhost:port`` on loopback (computed once, on first use)."""
        names = self._names
        if names is None:
            names = self._names = host_names(*self.local)
        return names


def host_names(ip: str, port: int) -> frozenset[str]:
    """The ``Host`` spellings of ``ip:port`` (see :attr:`Connection.local_names`)."""
    if not ip:
        return frozenset()
    names = {f"{ip}:{port}"}
    if ":" in ip:
        names.add(f"[{ip}]:{port}")
    try:
        loopback = ipaddress.ip_address(ip).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        names.add(f"localhost:{port}")
    return frozenset(names)


class Request:
    """One HTTP request: method, path, query and a body read up to a bound."""

    __slots__ = ("_json", "_query", "body", "client", "conn", "host", "method", "path", "principal", "query_key",
                 "raw_query")

    def __init__(self, method: str, path: str, query: dict[str, str] | None, body: bytes, client: tuple[str, int],
                 raw_query: bytes = b"", *, host: str = "", conn: Connection | None = None) -> None:
        self.method = method
        self.path = path
        self._query = query
        self.raw_query = raw_query
        """The query string as received (the ACL gate tries it as the signed canonical query first)."""
        self.query_key: bytes | None = raw_query if query is None else None
        """``raw_query`` when :attr:`query` is read from it (``query`` None), else None: equal keys mean equal
        arguments, so a handler may cache what it derives from the arguments alone under this key."""
        self.body = body
        self.client = client
        self.host = host
        """The ``Host`` header as received ('' when absent): a signature covers it (:mod:`common.signing`)."""
        self.conn = conn
        """The connection it came on (None for a request built in process)."""
        self.principal: str | None = None
        """The access key of the account that signed the request (set by the ACL hook; None without ACL or for a
        white-listed unsigned peer)."""
        self._json: dict[str, Any] | None = None

    @property
    def query(self) -> dict[str, str]:
        """The query arguments (:func:`parse_query` of :attr:`raw_query`, read on first use, unless the request
        was built with them)."""
        query = self._query
        if query is None:
            query = self._query = parse_query(self.raw_query)
        return query

    def arg(self, name: str, default: str | None = None) -> str:
        """A required (or defaulted) query argument; raises ArgumentError naming it."""
        return query_arg(self.query, name, default)

    def int_arg(self, name: str, default: int | None = None, *, lo: int | None = None, hi: int | None = None) -> int:
        """A required (or defaulted) integer query argument in ``[lo, hi]``; raises ArgumentError naming it."""
        return query_int(self.query, name, default, lo=lo, hi=hi)

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (parsed once: the ACL hook and the handler share it); raises ArgumentError
        when it is not one."""
        if self._json is not None:
            return self._json
        try:
            obj = json.loads(self.body)
        except ValueError as e:
            raise ArgumentError(f"request body is not valid JSON: {e}") from None
        except RecursionError:  # json.loads recurses once per nesting level
            raise ArgumentError("request body is not valid JSON: nested too deeply") from None
        if not isinstance(obj, dict):
            raise ArgumentError("request body must be a JSON object")
        self._json = obj
        return obj


#: A body of this many bytes or more, in at most :data:`_MAX_PIECES` buffers, is sent piece by piece rather than
#: joined. Joining copies every byte into a fresh buffer, and two such large buffers alive at once (the pieces and
#: the joined copy) make glibc give the memory back to the kernel when they are freed, so each answer faults its
#: pages in again: a 1 MiB pull answer cost 0.6 page faults per message, about half the broker's CPU for it.
_PIECES_FROM_BYTES = 128 * 1024
#: Each piece is one more buffer of the answer's gathered write, so a body in many small pieces is joined.
_MAX_PIECES = 16


class Response:
    __slots__ = ("body", "content_type", "status", "tail")

    def __init__(self, body: bytes, status: int = 200, content_type: str = CONTENT_BINARY, *,
                 tail: Sequence[bytes] = ()) -> None:
        self.body = body
        self.status = status
        self.content_type = content_type
        self.tail = tail
        """Buffers that follow ``body`` in the answer, each sent as it is (gathered into the answer's one write)."""

    @classmethod
    def of_pieces(cls, pieces: Sequence[bytes]) -> Response:
        """A binary answer whose body is ``pieces`` back to back: a large one in few pieces is sent without
        copying them into one buffer, any other is joined."""
        size = sum(map(len, pieces))
        if size >= _PIECES_FROM_BYTES and len(pieces) <= _MAX_PIECES:
            return cls(pieces[0], tail=pieces[1:])
        return cls(b"".join(pieces))

    @property
    def length(self) -> int:
        """Bytes of the whole body."""
        return len(self.body) + sum(map(len, self.tail)) if self.tail else len(self.body)


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")).encode(), status, CONTENT_JSON)


def error_response(code: int, remark: str, *, broker: str | None = None, role: str | None = None,
                   acl: bool = False) -> Response:
    return Response(encode_error(code, remark, broker=broker, role=role, acl=acl), http_status_for_code(code),
                    CONTENT_JSON)


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Exact-path routing with per-path allowed methods, bounded bodies and uniform errors.

    Args:
        routes: ``{(method, path): handler}``.
        max_body_bytes: requests with a larger body are refused with MESSAGE_ILLEGAL (HTTP 413).
        max_inflight_body_bytes: bound on the bytes of all request bodies held at once (read so far or being
            handled); a request that would pass it is refused with SYSTEM_BUSY (HTTP 503) and its body dropped.
            Default: 4 x ``max_body_bytes``.
        identity: returns ``(addr, role)`` put into every error answer.
        observe: called with ``(path, status, seconds)`` after every routed request (RPC latency metrics);
            unknown paths are reported as ``"other"`` so the label set stays bounded.
        authorize: the ACL hook (:class:`remoting.acl_gate.AclGate`): called with the request and its
            ``Authorization`` header (None when absent) after the body is read and before the handler; it refuses
            by raising a ClientError (NO_PERMISSION). None (ACL off) costs nothing per request.
    """

    def __init__(
        self,
        routes: Mapping[tuple[str, str], Handler],
        *,
        max_body_bytes: int,
        max_inflight_body_bytes: int | None = None,
        identity: Callable[[], tuple[str | None, str | None]] = lambda: (None, None),
        observe: Callable[[str, int, float], None] | None = None,
        authorize: Callable[[Request, bytes | None], None] | None = None,
    ) -> None:
        self._routes = dict(routes)
        self._authorize = authorize
        self._observe = observe
        self._paths: dict[str, set[str]] = {}
        for method, path in self._routes:
            self._paths.setdefault(path, set()).add(method)
        self._max_body = max_body_bytes
        self._max_inflight = max_inflight_body_bytes if max_inflight_body_bytes is not None else 4 * max_body_bytes
        self._inflight = 0
        self._busy_logged = -1e9
        self._identity = identity

    @property
    def route_keys(self) -> frozenset[tuple[str, str]]:
        """Every ``(method, path)`` served (the ACL's rule table must cover each)."""
        return frozenset(self._routes)

    async def serve(self, method: str, path: str, query_string: bytes, body: bytes, client: tuple[str, int],
                    authorization: bytes | None, host: bytes | None = None, conn: Connection | None = None
                    ) -> Response:
        """The answer to one request whose body the caller has read and counted (:meth:`take_body_bytes`): the
        router's one entry, called by the HTTP protocol (:mod:`remoting.http`) with the request's ``Host`` and
        its connection. Latency is observed from here to the answer."""
        observe = self._observe
        started = time.perf_counter() if observe is not None else 0.0
        handler = self._routes.get((method, path))
        if handler is None:
            response = self._no_route(method, path)
        else:
            request = Request(method, path, None, body, client, query_string,
                              host=host.decode("latin-1") if host else "", conn=conn)
            response = await self._handle(handler, request, authorization)
        if observe is not None:
            observe(path if path in self._paths else "other", response.status, time.perf_counter() - started)
        return response

    @property
    def max_body_bytes(self) -> int:
        """The largest request body served (``maxRequestBodyBytes``)."""
        return self._max_body

    def take_body_bytes(self, held: int, more: int, method: str, path: str) -> Response | None:
        """Count ``more`` body bytes of a request that already holds ``held`` into the bytes in flight; None when
        they fit, else the refusal to answer (413 past the body limit, SYSTEM_BUSY past the in-flight bound),
        with nothing counted. The caller gives its ``held`` bytes back with :meth:`release_body_bytes`."""
        if held + more > self._max_body:
            return self._too_large()
        if self._inflight + more > self._max_inflight:
            return self._busy(method, path)
        self._inflight += more
        return None

    def observe_refusal(self, path: str, response: Response) -> None:
        """Count a request refused by :meth:`take_body_bytes` (answered with ``response``, its body dropped) as
        an answered one, at no latency: it never reached a handler."""
        observe = self._observe
        if observe is not None:
            observe(path if path in self._paths else "other", response.status, 0.0)

    @property
    def body_bytes_in_flight(self) -> int:
        """Body bytes of the requests being read or handled now (bounded by ``max_inflight_body_bytes``)."""
        return self._inflight

    def release_body_bytes(self, held: int) -> None:
        """Give back the body bytes a request held (it was answered, refused or abandoned)."""
        self._inflight -= held

    def _no_route(self, method: str, path: str) -> Response:
        broker, role = self._identity()
        allowed = self._paths.get(path)
        if allowed:
            r = error_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               f"method {method} not allowed on {path}; use {', '.join(sorted(allowed))}",
                               broker=broker, role=role)
            r.status = 405
            return r
        return error_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"no such endpoint: {method} {path}",
                              broker=broker, role=role)

    def _too_large(self) -> Response:
        broker, role = self._identity()
        r = error_response(ResponseCode.MESSAGE_ILLEGAL,
                           f"request body exceeds the limit of {self._max_body} bytes", broker=broker, role=role)
        r.status = 413
        return r

    def _busy(self, method: str, path: str) -> Response:
        broker, role = self._identity()
        now = time.monotonic()
        if now - self._busy_logged >= 1.0:  # one line a second at most: a flood must not flood the log
            self._busy_logged = now
            log.warning("%s %s refused with SYSTEM_BUSY: request bodies in flight would pass %d bytes",
                        method, path, self._max_inflight)
        return error_response(ResponseCode.SYSTEM_BUSY,
                              f"server busy: request bodies in flight would pass {self._max_inflight} bytes "
                              "(maxInflightRequestBodyBytes); try again shortly", broker=broker, role=role)

    async def _handle(self, handler: Handler, request: Request, authorization: bytes | None) -> Response:
        """The handler's answer, after the ACL hook; a ClientError becomes its coded error answer and any other
        exception SYSTEM_ERROR (logged)."""
        try:
            if self._authorize is not None:
                try:
                    self._authorize(request, authorization)
                except NoPermissionError as e:  # marked, so the SDK tells it from a topic's perm and won't retry
                    raise AccessDeniedError(e.message) from None
            return await handler(request)
        except ClientError as e:
            code = e.code if e.code >= 0 else int(ResponseCode.SYSTEM_ERROR)
            broker, role = self._identity()
            return error_response(code, e.message, broker=broker, role=role, acl=isinstance(e, AccessDeniedError))
        except Exception as e:  # a bug must not kill the connection; the client gets SYSTEM_ERROR and a log line
            log.exception("%s %s failed", request.method, request.path)
            broker, role = self._identity()
            return error_response(ResponseCode.SYSTEM_ERROR, f"internal error: {type(e).__name__}: {e}",
                                  broker=broker, role=role)
