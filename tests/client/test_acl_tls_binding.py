"""Issue 39 item 3 over real connections: on TLS the first signed request binds the connection to its account
and the SDK sends the rest unsigned by itself; the abuses of a bound connection fail on the wire too; plaintext
keeps signing every request."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from client._transport import AsyncTransport
from client.tls import generate_local_tls_files
from common.signing import Credentials, RequestSigner, authorization_header, fresh_authorization
from common.tls import client_context, server_context
from remoting.acl import Action, parse_acl
from remoting.acl_gate import AclGate, topic_arg
from remoting.router import Request, Response, Router
from remoting.server import HttpServer

FILE = """
[[accounts]]
accessKey = "app"
secretKey = "app-secret"
topicPerms = ["T=PUB"]
[[accounts]]
accessKey = "other"
secretKey = "other-secret"
topicPerms = ["V=PUB"]
"""
APP, OTHER = Credentials("app", "app-secret"), Credentials("other", "other-secret")


class Recording:
    """The gate, counting the requests that came signed and unsigned."""

    def __init__(self) -> None:
        self.gate = AclGate(parse_acl(FILE), {("POST", "/send"): topic_arg("topic", Action.PUB)})
        self.signed = self.unsigned = 0

    def __call__(self, request: Request, header: bytes | None) -> None:
        if header is None:
            self.unsigned += 1
        else:
            self.signed += 1
        self.gate(request, header)


async def _ok(request: Request) -> Response:
    return Response(b"ok")


async def start(tls: ssl.SSLContext | None) -> tuple[HttpServer, Recording, int]:
    recording = Recording()
    router = Router({("POST", "/send"): _ok}, max_body_bytes=1 << 20, authorize=recording)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = HttpServer(router, ssl=tls)
    await server.start(sock)
    return server, recording, sock.getsockname()[1]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    files = generate_local_tls_files(tmp_path_factory.mktemp("tls"))
    return server_context(files.cert_file, files.key_file), client_context(files.ca_file)


def test_the_sdk_signs_once_per_tls_connection(tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, client_tls = tls_files

    async def main() -> None:
        server, recording, port = await start(server_tls)
        transport = AsyncTransport(ssl_context=client_tls)
        try:
            signer = RequestSigner(APP)
            answers = [await transport.exchange("POST", "127.0.0.1", port, "/send?topic=T", b"m", timeout=5,
                                                signer=signer) for _ in range(20)]
            assert [a.status_code for a in answers] == [200] * 20
            assert (recording.signed, recording.unsigned) == (1, 19)  # one connection: signed once
            refused = await transport.exchange("POST", "127.0.0.1", port, "/send?topic=V", b"m", timeout=5,
                                               signer=signer)
            assert refused.status_code == 403  # the bound account's permissions still apply, per request
            again = await transport.exchange("POST", "127.0.0.1", port, "/send?topic=T", b"m", timeout=5,
                                             signer=signer)
            assert again.status_code == 200 and recording.signed == 2  # after a refusal the SDK signs again
        finally:
            await transport.aclose()
            await server.shutdown(5.0)

    asyncio.run(main())


def test_plaintext_signs_every_request() -> None:
    async def main() -> None:
        server, recording, port = await start(None)
        transport = AsyncTransport()
        try:
            for _ in range(5):
                r = await transport.exchange("POST", "127.0.0.1", port, "/send?topic=T", b"m", timeout=5,
                                             signer=RequestSigner(APP))
                assert r.status_code == 200
            assert (recording.signed, recording.unsigned) == (5, 0)
        finally:
            await transport.aclose()
            await server.shutdown(5.0)

    asyncio.run(main())


def _request(port: int, topic: str, creds: Credentials | None) -> bytes:
    target = f"/send?topic={topic}"
    auth = (f"Authorization: {fresh_authorization(creds, 'POST', target, b'm', f'127.0.0.1:{port}')}\r\n"
            if creds is not None else "")
    return f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Length: 1\r\n\r\nm".encode()


async def _status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> int:
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


def test_on_the_wire_a_bound_connection_is_one_accounts(tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, client_tls = tls_files

    async def main() -> None:
        server, _, port = await start(server_tls)
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
            assert await _status(r1, w1, _request(port, "T", None)) == 403  # not bound yet
            assert await _status(r1, w1, _request(port, "T", APP)) == 200  # binds the connection to app
            assert await _status(r1, w1, _request(port, "T", None)) == 200
            assert await _status(r1, w1, _request(port, "V", OTHER)) == 403  # a second account: refused
            assert await _status(r1, w1, _request(port, "V", None)) == 403  # and it did not become OTHER
            assert await _status(r2, w2, _request(port, "T", None)) == 403  # another connection: not bound
            stale = authorization_header(APP, "POST", "/send?topic=T", b"m", host=f"127.0.0.1:{port + 1}",
                                         timestamp_ms=0, nonce="1")
            bad = _request(port, "T", None).replace(b"Content-Length", f"Authorization: {stale}\r\nContent-Length"
                                                    .encode(), 1)
            assert await _status(r2, w2, bad) == 403
            for w in (w1, w2):
                w.close()
        finally:
            await server.shutdown(5.0)

    asyncio.run(main())


def test_a_reused_connection_sees_a_reload(tls_files: tuple[ssl.SSLContext, ssl.SSLContext], tmp_path: Path) -> None:
    server_tls, client_tls = tls_files

    async def main() -> None:
        server, recording, port = await start(server_tls)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls)
            assert await _status(r, w, _request(port, "T", APP)) == 200
            assert await _status(r, w, _request(port, "T", None)) == 200
            recording.gate.update(parse_acl(FILE.replace('topicPerms = ["T=PUB"]', 'topicPerms = ["T=DENY"]')))
            assert await _status(r, w, _request(port, "T", None)) == 403  # the new permissions, at once
            w.close()
        finally:
            await server.shutdown(5.0)

    asyncio.run(main())
