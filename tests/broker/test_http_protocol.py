"""The broker's uvicorn protocol: one socket write per response, nothing else changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from broker.http_protocol import CoalescingHttpToolsProtocol, _held_body_bytes
from client.protocol.asgi import Request, Response, Router


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.gathered: list[int] = []
        """For each write, how many buffers it gathered (1: a plain write)."""
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.gathered.append(1)

    def writelines(self, list_of_data: Any) -> None:
        pieces = list(list_of_data)
        self.writes.append(b"".join(pieces))
        self.gathered.append(len(pieces))

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


def _pieces(n: int, size: int) -> list[bytes]:
    return [bytes([65 + i]) * size for i in range(n)]


async def _pieced(request: Request) -> Response:
    return Response.of_pieces(_pieces(request.int_arg("n"), request.int_arg("size")))


async def _roundtrip(raw: bytes, *, expect_writes: int = 1) -> tuple[list[bytes], _FakeTransport]:
    app = Router({("GET", "/echo"): _echo, ("GET", "/pieced"): _pieced}, max_body_bytes=1024)
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


@pytest.mark.parametrize(
    ("n", "size", "gathered"),
    [
        (3, 100_000, 4),  # large, in few pieces: head and pieces in one gathered write, none copied into one
        (3, 1_000, 1),  # small: joined
        (40, 4_000, 2),  # large but in many pieces: joined, and gathered with the head rather than copied again
    ],
)
def test_an_answer_in_pieces_leaves_in_one_write(n: int, size: int, gathered: int) -> None:
    asyncio.run(_test_an_answer_in_pieces_leaves_in_one_write(n, size, gathered))


async def _test_an_answer_in_pieces_leaves_in_one_write(n: int, size: int, gathered: int) -> None:
    writes, transport = await _roundtrip(b"GET /pieced?n=%d&size=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (n, size))
    assert transport.gathered == [gathered]
    head, body = writes[0].split(b"\r\n\r\n", 1)
    assert b"content-length: %d" % (n * size) in head.lower()
    assert body == b"".join(_pieces(n, size))


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
    ("data", "due"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", 5),
        (b"HTTP/1.1 200 OK\r\nContent-Type: x\r\nContent-Length: 1048576\r\n\r\n", 1048576),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0),
        (b"HTTP/1.1 400 Bad\r\ncontent-length: 3\r\n\r\nbad", 0),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", 0),
        (b"some body bytes\r\n\r\n", 0),
    ],
)
def test_only_bare_heads_with_a_body_to_come_are_held(data: bytes, due: int) -> None:
    assert _held_body_bytes(data) == due
