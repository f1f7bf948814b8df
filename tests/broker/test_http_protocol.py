"""The broker's uvicorn protocol: one socket write per response, nothing else changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from broker.http_protocol import CoalescingHttpToolsProtocol, _is_bare_head
from client.protocol.asgi import Request, Response, Router


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _echo(request: Request) -> Response:
    return Response(b"q=" + request.query.get("q", "").encode())


async def _roundtrip(raw: bytes, *, expect_writes: int = 1) -> tuple[list[bytes], _FakeTransport]:
    app = Router({("GET", "/echo"): _echo}, max_body_bytes=1024)
    config = uvicorn.Config(app, http=CoalescingHttpToolsProtocol, lifespan="off", proxy_headers=False,
                            log_config=None)
    config.load()
    proto = CoalescingHttpToolsProtocol(config=config, server_state=ServerState(), app_state={},
                                        _loop=asyncio.get_running_loop())
    transport = _FakeTransport()
    proto.connection_made(transport)
    proto.data_received(raw)
    async with asyncio.timeout(5):
        while len(transport.writes) < expect_writes:
            await asyncio.sleep(0.001)  # polling the fake transport, bounded by the timeout above
    proto.connection_lost(None)
    return transport.writes, transport


def test_head_and_body_leave_in_one_write() -> None:
    asyncio.run(_test_head_and_body_leave_in_one_write())


async def _test_head_and_body_leave_in_one_write() -> None:
    writes, _ = await _roundtrip(b"GET /echo?q=hi HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 ")
    assert writes[0].endswith(b"\r\n\r\nq=hi")


def test_pipelined_requests_each_answered_in_order() -> None:
    asyncio.run(_test_pipelined_requests_each_answered_in_order())


async def _test_pipelined_requests_each_answered_in_order() -> None:
    raw = b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=2 HTTP/1.1\r\nHost: x\r\n\r\n"
    writes, _ = await _roundtrip(raw, expect_writes=2)
    assert [w.rsplit(b"\r\n\r\n", 1)[1] for w in writes] == [b"q=1", b"q=2"]


def test_error_answer_is_complete() -> None:
    asyncio.run(_test_error_answer_is_complete())


async def _test_error_answer_is_complete() -> None:
    writes, _ = await _roundtrip(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 404 ")
    assert b'"code"' in writes[0]


def test_head_request_is_not_held_back() -> None:
    asyncio.run(_test_head_request_is_not_held_back())


async def _test_head_request_is_not_held_back() -> None:
    # HEAD answers have a Content-Length but no body write: the head must still go out.
    writes, _ = await _roundtrip(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    assert writes and writes[0].startswith(b"HTTP/1.1 405 ")


def test_connection_close_flushes_before_closing() -> None:
    asyncio.run(_test_connection_close_flushes_before_closing())


async def _test_connection_close_flushes_before_closing() -> None:
    writes, transport = await _roundtrip(b"GET /echo?q=z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert writes[0].endswith(b"q=z")
    assert transport.closed


@pytest.mark.parametrize(
    ("data", "held"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 400 Bad\r\ncontent-length: 3\r\n\r\nbad", False),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", False),
        (b"some body bytes\r\n\r\n", False),
    ],
)
def test_only_bare_heads_with_a_body_to_come_are_held(data: bytes, held: bool) -> None:
    assert _is_bare_head(data) is held
