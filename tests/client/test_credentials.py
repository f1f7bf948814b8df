"""``credentials=``: every request of a client with an account is signed, on the raw data path and on httpx's;
shared instances are per account; an ACL refusal is AccessDeniedError and is not retried (issue 14, item 6).

A small recording HTTP server on loopback checks each request's ``Authorization`` header with the same
:func:`common.signing.verify` the servers use.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import pytest

from client import AsyncProducer, ClientConfig, ClientInstance, Credentials, Message, Producer
from client._instance import AsyncClientInstance, with_credentials
from client.errors import AccessDeniedError, NoPermissionError
from client.lowlevel import is_retriable
from common.codes import ResponseCode
from common.signing import parse_authorization, verify
from common.wire import decode_error, encode_error

ALICE = Credentials("alice", "alice-secret")
BOB = Credentials("bob", "bob-secret")
SECRETS = {c.access_key: c.secret_key for c in (ALICE, BOB)}


class Recorder(http.server.ThreadingHTTPServer):
    """Answers every request with ``status`` and ``body``; keeps ``(method, target, body, authorization)``."""

    daemon_threads = True

    def __init__(self, status: int = 200, body: bytes = b"{}") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status, self.body = status, body
        self.seen: list[tuple[str, str, bytes, str | None]] = []
        self.hosts: dict[str, str] = {}
        """The ``Host`` of each signed request, by its Authorization value (a signature covers it)."""
        self.addr = f"127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        authorization = self.headers.get("Authorization")
        if authorization is not None:
            self.server.hosts[authorization] = self.headers.get("Host", "")
        self.server.seen.append((self.command, self.path, body, authorization))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Recorder]:
    srv = Recorder()
    srv.hosts = _HOSTS
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


_HOSTS: dict[str, str] = {}


def _verified(method: str, target: str, body: bytes, header: str | None) -> str:
    """The access key of a request whose signature verifies, for the ``Host`` it was sent with (asserts it does)."""
    assert header is not None, f"{method} {target} was sent unsigned"
    auth = parse_authorization(header)
    path, _, qs = target.partition("?")
    query = dict(p.split("=", 1) for p in qs.split("&") if p) if qs else {}
    assert verify(auth, SECRETS[auth.access_key], method, path, query, body, host=_HOSTS[header]), \
        f"{method} {target}: bad signature"
    return auth.access_key


def test_raw_and_httpx_requests_are_signed_only_with_credentials(server: Recorder) -> None:
    signed = ClientInstance(server.addr, ClientConfig(credentials=ALICE))
    plain = ClientInstance(server.addr)
    try:
        signed.exchange("POST", server.addr, "/send?topic=T&queueId=1", b"body", timeout=2.0)  # raw transport
        signed.exchange("GET", server.addr, "/route?topic=T")  # httpx (control plane)
        plain.exchange("POST", server.addr, "/send?topic=T", b"x", timeout=2.0)
        plain.exchange("GET", server.addr, "/route?topic=T")
    finally:
        signed.close()
        plain.close()
    assert [_verified(*r) for r in server.seen[:2]] == ["alice", "alice"]
    assert [r[3] for r in server.seen[2:]] == [None, None]
    assert len({parse_authorization(r[3]).nonce for r in server.seen[:2] if r[3]}) == 2  # fresh per request


def test_async_raw_requests_are_signed(server: Recorder) -> None:
    async def main() -> None:
        inst = AsyncClientInstance(server.addr, ClientConfig(credentials=BOB))
        try:
            await inst.exchange("POST", server.addr, "/pull?group=g&topic=T", b"", timeout=2.0)
            await inst.exchange("GET", server.addr, "/cluster")
        finally:
            await inst.aclose()

    asyncio.run(main())
    assert [_verified(*r) for r in server.seen] == ["bob", "bob"]


def test_shared_instances_are_per_account() -> None:
    addr = "127.0.0.1:1"
    a1 = ClientInstance.acquire(addr, ClientConfig(credentials=ALICE))
    a2 = ClientInstance.acquire(addr, ClientConfig(credentials=Credentials("alice", "alice-secret")))
    b = ClientInstance.acquire(addr, ClientConfig(credentials=BOB))
    anon = ClientInstance.acquire(addr)
    try:
        assert a1 is a2
        assert len({id(a1), id(b), id(anon)}) == 3
    finally:
        for inst in (a1, a2, b, anon):
            inst.release()
    assert a1.state.value == "CLOSED" and b.state.value == "CLOSED"


def test_credentials_keyword_and_client_config_must_agree() -> None:
    assert with_credentials(None, None) is None
    cfg = with_credentials(ClientConfig(request_timeout_s=1.0), ALICE)
    assert cfg is not None and cfg.credentials == ALICE and cfg.request_timeout_s == 1.0
    assert with_credentials(cfg, ALICE) == cfg
    with pytest.raises(ValueError, match="conflicts"):
        with_credentials(cfg, BOB)
    with pytest.raises(TypeError, match="Credentials"):
        with_credentials(None, ("alice", "x"))  # type: ignore[arg-type]
    assert "alice-secret" not in repr(cfg)


def test_an_acl_refusal_is_access_denied_and_not_retried() -> None:
    acl = decode_error(403, encode_error(ResponseCode.NO_PERMISSION, "account alice has no PUB permission on "
                                         "topic T", acl=True), addr="h:1")
    perm = decode_error(403, encode_error(ResponseCode.NO_PERMISSION, "the topic[T] sending message is forbidden"))
    assert type(acl) is AccessDeniedError and isinstance(acl, NoPermissionError)
    assert acl.code == 16 and not acl.retriable and not is_retriable(acl)
    assert "no PUB permission on topic T" in str(acl)
    # A topic's or broker's perm stays what it was: retried on another broker group (docs/BEHAVIOUR.md 4.6).
    assert type(perm) is NoPermissionError and perm.retriable and is_retriable(perm)


REFUSAL = encode_error(ResponseCode.NO_PERMISSION, "request not signed / signature refused", acl=True)


def test_a_refused_producer_fails_at_once_with_one_request() -> None:
    srv = Recorder(403, REFUSAL)
    srv.hosts = _HOSTS
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with Producer("pg", srv.addr, credentials=BOB, send_timeout_s=5.0) as p, \
                pytest.raises(AccessDeniedError, match="not signed"):
            p.send(Message("T", b"x"))
        assert len(srv.seen) == 1 and _verified(*srv.seen[0]) == "bob"  # no retry, no other nameserver

        async def main() -> None:
            async with AsyncProducer("pg", srv.addr, credentials=ALICE) as ap:
                with pytest.raises(AccessDeniedError):
                    await ap.send(Message("T", b"x"))

        asyncio.run(main())
        assert len(srv.seen) == 2 and _verified(*srv.seen[1]) == "alice"
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_router_marks_refusals_of_its_acl_hook_only() -> None:
    """A refusal of the ``authorize`` hook is marked (AccessDeniedError at the client); a handler's own
    NO_PERMISSION (a topic's perm) is not."""
    from remoting.router import Request, Response, Router

    async def handler(request: Request) -> Response:
        raise NoPermissionError("the topic[T] sending message is forbidden")

    def authorize(request: Request, header: bytes | None) -> None:
        if header is None:
            raise NoPermissionError("request not signed / signature refused")

    async def call(authorization: bytes | None) -> tuple[int, bytes]:
        router = Router({("POST", "/send"): handler}, max_body_bytes=1024, authorize=authorize)
        answer = await router.serve("POST", "/send", b"", b"", ("127.0.0.1", 1), authorization)
        return answer.status, answer.body

    status, body = asyncio.run(call(None))
    assert status == 403 and type(decode_error(status, body)) is AccessDeniedError
    status, body = asyncio.run(call(b"anything"))
    assert status == 403 and type(decode_error(status, body)) is NoPermissionError
