"""Issue 39, hole 1: a signed request captured at one server must not replay at another.

Each server keeps its own replay guard, so before the fix a signature named no server and a request captured
at nameserver A (an admin call) was accepted byte for byte at nameserver B within the timestamp window. The
signed string now names the server the request was sent to (its ``Host``), and a server accepts only a
``Host`` that names itself. Failed before the fix: B answered 200."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx

from common.signing import Credentials, SigningAuth
from nameserver.routeinfo import RouteInfo
from nameserver.server import NamesrvConfig, build_gate, create_app
from remoting.server import HttpServer

ACCOUNTS = """
[[accounts]]
accessKey = "admin"
secretKey = "admin-secret"
admin = true
"""
ADMIN = SigningAuth(Credentials("admin", "admin-secret"))


def captured(port: int) -> bytes:
    """The bytes of a signed admin call to the nameserver on ``port``, as a passive observer records them."""
    body = json.dumps({"brokerName": "broker-a"}).encode()
    request = httpx.Request("POST", f"http://127.0.0.1:{port}/broker/wipe-write-perm", content=body)
    request = next(ADMIN.auth_flow(request))
    head = f"POST /broker/wipe-write-perm HTTP/1.1\r\nHost: {request.headers['Host']}\r\n" \
           f"Authorization: {request.headers['Authorization']}\r\nContent-Length: {len(body)}\r\n" \
           "Connection: close\r\n\r\n"
    return head.encode() + body


async def send_raw(port: int, data: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1])


def test_a_request_captured_at_one_nameserver_is_refused_by_another(tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text(ACCOUNTS)

    async def main() -> None:
        servers, ports = [], []
        for _ in range(2):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            ports.append(sock.getsockname()[1])
            gate = build_gate(NamesrvConfig(acl_enable=True, acl_file=str(acl)))
            server = HttpServer(create_app(RouteInfo(), addr=f"127.0.0.1:{ports[-1]}", acl=gate))
            await server.start(sock)
            servers.append(server)
        try:
            a, b = ports
            capture = captured(a)
            assert await send_raw(a, capture) == 200  # the request as meant, at the server it was meant for
            assert await send_raw(b, capture) == 403  # the same bytes at another server: refused
            assert await send_raw(a, capture) == 403  # and at the first again: a replay
        finally:
            for server in servers:
                await server.shutdown(5.0)

    asyncio.run(main())
