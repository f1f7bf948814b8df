"""The servers' HTTP server (remoting/server.py) on loopback: it serves from its started event on, stops
gracefully (an idle connection at once, a busy one after its answer, a handler that never ends within the bound),
and every answer carries a ``date`` header formatted once a second and no ``server`` header."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time

import pytest

from remoting.http import _DateLine
from remoting.router import Request, Response, Router
from remoting.server import HttpServer


def _listening() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


async def _ok(request: Request) -> Response:
    return Response(b"ok")


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The head and body of one answer (its content-length read)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    return head, await asyncio.wait_for(reader.readexactly(length), 5)


class _Held:
    """A handler that waits for :attr:`gate`; :attr:`entered` is set once a request reached it."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, request: Request) -> Response:
        self.entered.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Response(b"held")


def test_the_started_event_is_set_once_it_accepts_and_a_second_start_is_refused() -> None:
    async def main() -> None:
        sock, port = _listening()
        server = HttpServer(Router({("GET", "/ok"): _ok}, max_body_bytes=1024))
        waiter = asyncio.create_task(server.started.wait())
        await asyncio.sleep(0)
        assert not server.started.is_set() and not waiter.done()
        await server.start(sock)
        await asyncio.wait_for(waiter, 5)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"ok"
        with pytest.raises(RuntimeError, match="starts once"):
            await server.start(sock)
        writer.close()
        await server.shutdown(5)

    asyncio.run(main())


def test_shutdown_closes_an_idle_connection_now_and_a_busy_one_after_its_answer() -> None:
    async def main() -> None:
        sock, port = _listening()
        held = _Held()
        server = HttpServer(Router({("GET", "/ok"): _ok, ("GET", "/held"): held}, max_body_bytes=1024))
        await server.start(sock)
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        await _read_answer(idle_r)  # answered, kept alive: idle now
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
        busy_w.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(held.entered.wait(), 5)

        stopping = asyncio.create_task(server.shutdown(10))
        assert await asyncio.wait_for(idle_r.read(), 5) == b""  # the idle one is closed at once
        assert not stopping.done()  # the busy one is still answering
        with pytest.raises(OSError):  # no new connection is accepted
            await asyncio.open_connection("127.0.0.1", port)
        held.gate.set()
        answer = await asyncio.wait_for(busy_r.read(), 5)  # the answer, then the close
        assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\nconnection: close\r\n" in answer
        assert answer.endswith(b"held")
        await asyncio.wait_for(stopping, 5)
        assert not server.service.connections and not server.service.tasks
        idle_w.close()
        busy_w.close()

    asyncio.run(main())


def test_shutdown_cancels_an_answer_that_outlives_its_bound() -> None:
    async def main() -> None:
        sock, port = _listening()
        held = _Held()  # never let go
        server = HttpServer(Router({("GET", "/held"): held}, max_body_bytes=1024))
        await server.start(sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(held.entered.wait(), 5)
        started = time.monotonic()
        await asyncio.wait_for(server.shutdown(0.3), 5)
        assert 0.3 <= time.monotonic() - started < 3
        assert held.cancelled == 1  # the handler got the cancellation where it waited
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed without an answer
        assert not server.service.connections and not server.service.tasks
        writer.close()

    asyncio.run(main())


def test_an_answer_carries_the_date_and_no_server_header() -> None:
    async def main() -> None:
        sock, port = _listening()
        server = HttpServer(Router({("GET", "/ok"): _ok}, max_body_bytes=1024))
        await server.start(sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _ = await _read_answer(reader)
        headers = dict(line.split(b": ", 1) for line in head.strip().split(b"\r\n")[1:])
        assert b"server" not in {name.lower() for name in headers}
        date = email.utils.parsedate_to_datetime(headers[b"date"].decode())
        assert abs(date.timestamp() - time.time()) < 5
        writer.close()
        await server.shutdown(5)

    asyncio.run(main())


def test_the_date_line_is_formatted_once_a_second() -> None:
    now = [1795701600.2]
    line = _DateLine(lambda: now[0])
    first = line()
    assert first == b"date: Thu, 26 Nov 2026 14:00:00 GMT\r\n"
    now[0] = 1795701600.9
    assert line() is first  # the same second: the line formatted before
    now[0] = 1795701601.0
    assert line() == b"date: Thu, 26 Nov 2026 14:00:01 GMT\r\n"
