"""The servers' HTTP protocol (remoting/http.py): each request served straight from the parser, one write per
answer, and the connection rules (keep-alive, pipelining in order, flow control, bounded bodies, shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

from remoting.http import HttpLimits, HttpProtocol, HttpService
from remoting.router import Request, Response, Router


class _FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.gathered: list[int] = []
        """For each write, how many buffers it gathered (1: a plain write)."""
        self.closed = False
        self.reading = True

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
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def _echo(request: Request) -> Response:
    return Response(b"q=" + request.query.get("q", "").encode())


async def _post(request: Request) -> Response:
    return Response(b"%d bytes" % len(request.body))


async def _fail(request: Request) -> Response:
    raise RuntimeError("a bug")


def _pieces(n: int, size: int) -> list[bytes]:
    return [bytes([65 + i]) * size for i in range(n)]


async def _pieced(request: Request) -> Response:
    return Response.of_pieces(_pieces(request.int_arg("n"), request.int_arg("size")))


class _Server:
    """A protocol per connection over fake transports, all serving one router."""

    def __init__(self, *, max_body: int = 1024, max_inflight: int | None = None,
                 limits: HttpLimits | None = None, keep_alive_s: int = 5, clock: Any = None) -> None:
        self.gate = asyncio.Event()
        """``/held`` (GET or POST) answers ``held`` once this is set."""

        self.cancelled = 0

        async def held(request: Request) -> Response:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return Response(b"held")

        self.router = Router({("GET", "/echo"): _echo, ("GET", "/pieced"): _pieced, ("POST", "/post"): _post,
                              ("GET", "/fail"): _fail, ("GET", "/held"): held, ("POST", "/held"): held},
                             max_body_bytes=max_body, max_inflight_body_bytes=max_inflight)
        limits = attrs.evolve(limits or HttpLimits(), keep_alive_timeout_s=keep_alive_s)
        self.state = HttpService(self.router, limits, **({"clock": clock} if clock is not None else {}))

    def connect(self) -> tuple[HttpProtocol, _FakeTransport]:
        proto = self.state.protocol()
        transport = _FakeTransport()
        proto.connection_made(transport)
        return proto, transport


async def _writes(transport: _FakeTransport, n: int) -> list[bytes]:
    async with asyncio.timeout(5):
        while len(transport.writes) < n:
            await asyncio.sleep(0.001)  # polling the fake transport, bounded by the timeout above
    return transport.writes


async def _roundtrip(raw: bytes, *, expect_writes: int = 1, server: _Server | None = None
                     ) -> tuple[list[bytes], _FakeTransport]:
    proto, transport = (server or _Server()).connect()
    proto.data_received(raw)
    writes = await _writes(transport, expect_writes)
    proto.connection_lost(None)
    return writes, transport


def _body(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


def test_an_answer_leaves_in_one_write_with_its_head() -> None:
    async def main() -> None:
        server = _Server(clock=lambda: 1795701600.5)  # Thu, 26 Nov 2026 14:00:00 GMT
        proto, transport = server.connect()
        proto.data_received(b"GET /echo?q=hi HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await _writes(transport, 1) == [b"HTTP/1.1 200 OK\r\ndate: Thu, 26 Nov 2026 14:00:00 GMT\r\n"
                                               b"content-type: application/octet-stream\r\ncontent-length: 4\r\n"
                                               b"\r\nq=hi"]
        assert not transport.closed
        proto.connection_lost(None)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("n", "size", "gathered"),
    [
        (3, 100_000, 4),  # large, in few pieces: head and pieces in one gathered write, none copied into one
        (3, 1_000, 1),  # small: joined
        (40, 4_000, 2),  # large but in many pieces: joined, and gathered with the head rather than copied again
    ],
)
def test_an_answer_in_pieces_leaves_in_one_write(n: int, size: int, gathered: int) -> None:
    async def main() -> None:
        writes, transport = await _roundtrip(b"GET /pieced?n=%d&size=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (n, size))
        assert transport.gathered == [gathered]
        head, body = writes[0].split(b"\r\n\r\n", 1)
        assert b"content-length: %d" % (n * size) in head
        assert body == b"".join(_pieces(n, size))

    asyncio.run(main())


def test_requests_on_a_kept_connection_are_each_answered() -> None:
    async def main() -> None:
        proto, transport = _Server().connect()
        for q in (b"1", b"2"):
            proto.data_received(b"GET /echo?q=%s HTTP/1.1\r\nHost: x\r\n\r\n" % q)
            await _writes(transport, int(q))
        assert [_body(w) for w in transport.writes] == [b"q=1", b"q=2"]
        assert not transport.closed
        assert proto._due_at is not None and proto._due_what == "the next request"  # idle: the keep-alive deadline
        proto.connection_lost(None)

    asyncio.run(main())


def test_pipelined_requests_are_answered_in_order_with_reading_paused_meanwhile() -> None:
    async def main() -> None:
        server = _Server()
        proto, transport = server.connect()
        proto.data_received(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)
        assert transport.writes == [] and not transport.reading  # the second waits for the first
        server.gate.set()
        writes = await _writes(transport, 2)
        assert [_body(w) for w in writes] == [b"held", b"q=2"]
        assert transport.reading
        proto.connection_lost(None)

    asyncio.run(main())


def test_no_next_answer_while_the_socket_takes_no_writes() -> None:
    async def main() -> None:
        proto, transport = _Server().connect()
        proto.pause_writing()  # the transport's buffer is over its high-water mark
        proto.data_received(b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        await _writes(transport, 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(transport.writes) == 1
        proto.resume_writing()
        assert [_body(w) for w in await _writes(transport, 2)] == [b"q=1", b"q=2"]
        proto.connection_lost(None)

    asyncio.run(main())


@pytest.mark.parametrize("raw", [b"GET /echo?q=z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                 b"GET /echo?q=z HTTP/1.0\r\n\r\n"])
def test_a_connection_the_client_ends_is_closed_after_the_answer(raw: bytes) -> None:
    async def main() -> None:
        writes, transport = await _roundtrip(raw)
        assert b"\r\nconnection: close\r\n" in writes[0] and writes[0].endswith(b"q=z")
        assert transport.closed

    asyncio.run(main())


def test_errors_are_complete_coded_answers_on_a_kept_connection() -> None:
    async def main() -> None:
        proto, transport = _Server().connect()
        proto.data_received(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
        writes = await _writes(transport, 2)
        assert writes[0].startswith(b"HTTP/1.1 404 ") and b'"code":' in writes[0]
        assert writes[1].startswith(b"HTTP/1.1 500 ") and b"internal error: RuntimeError: a bug" in writes[1]
        assert not transport.closed
        proto.connection_lost(None)

    asyncio.run(main())


def test_a_head_request_gets_the_head_alone() -> None:
    async def main() -> None:
        writes, _ = await _roundtrip(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        assert writes[0].startswith(b"HTTP/1.1 405 ") and writes[0].endswith(b"\r\n\r\n")

    asyncio.run(main())


def test_expect_100_continue_is_answered_before_the_body() -> None:
    async def main() -> None:
        proto, transport = _Server().connect()
        proto.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        proto.data_received(b"hello")
        assert _body((await _writes(transport, 2))[1]) == b"5 bytes"
        proto.connection_lost(None)

    asyncio.run(main())


def test_a_body_past_the_limit_is_refused_with_413_and_the_connection_kept() -> None:
    async def main() -> None:
        server = _Server(max_body=1024)
        proto, transport = server.connect()
        proto.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + b"x" * 1500)
        assert server.router.body_bytes_in_flight == 0  # what was counted went back with the refusal
        proto.data_received(b"x" * 500 + b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        writes = await _writes(transport, 2)
        assert writes[0].startswith(b"HTTP/1.1 413 ") and b"exceeds the limit of 1024 bytes" in writes[0]
        assert _body(writes[1]) == b"3 bytes"
        assert server.router.body_bytes_in_flight == 0 and not transport.closed
        proto.connection_lost(None)

    asyncio.run(main())


def test_bodies_in_flight_are_bounded_across_connections_and_given_back() -> None:
    async def main() -> None:
        server = _Server(max_body=1024, max_inflight=1500)
        a, ta = server.connect()
        a.data_received(b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
        await asyncio.sleep(0)
        assert server.router.body_bytes_in_flight == 1000
        b, tb = server.connect()
        b.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
        assert (await _writes(tb, 1))[0].startswith(b"HTTP/1.1 503 ")  # SYSTEM_BUSY
        c, tc = server.connect()
        c.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 400)
        assert server.router.body_bytes_in_flight == 1400
        c.connection_lost(None)  # gone mid-body: its 400 bytes go back, and nothing is answered
        assert server.router.body_bytes_in_flight == 1000 and tc.writes == []
        server.gate.set()
        assert _body((await _writes(ta, 1))[0]) == b"held"
        assert server.router.body_bytes_in_flight == 0
        a.connection_lost(None)
        b.connection_lost(None)

    asyncio.run(main())


@pytest.mark.parametrize("raw", [b"NOT-HTTP\r\n\r\n",
                                 b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"])
def test_what_cannot_be_served_gets_a_coded_400_and_a_close(raw: bytes) -> None:
    async def main() -> None:
        writes, transport = await _roundtrip(raw)
        assert writes[-1].startswith(b"HTTP/1.1 400 ") and b'"code": 29' in writes[-1]
        assert transport.closed

    asyncio.run(main())


def test_graceful_shutdown_closes_an_idle_connection_and_a_busy_one_after_its_answer() -> None:
    async def main() -> None:
        server = _Server()
        idle, t_idle = server.connect()
        busy, t_busy = server.connect()
        busy.data_received(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)
        idle.shutdown()
        busy.shutdown()
        assert t_idle.closed and not t_busy.closed
        server.gate.set()
        writes = await _writes(t_busy, 1)
        assert _body(writes[0]) == b"held" and b"\r\nconnection: close\r\n" in writes[0]
        assert t_busy.closed
        idle.connection_lost(None)
        busy.connection_lost(None)

    asyncio.run(main())


def test_a_lost_connection_gives_back_the_body_of_a_request_waiting_its_turn() -> None:
    async def main() -> None:
        server = _Server()
        proto, transport = server.connect()
        proto.data_received(b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
                            + b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n" + b"y" * 300)
        await asyncio.sleep(0)
        assert server.router.body_bytes_in_flight == 400  # the second waits behind the first
        transport.closed = True  # as a real transport is once the peer reset it
        proto.connection_lost(ConnectionResetError())
        assert server.router.body_bytes_in_flight == 100  # the waiting one's went back; the first is still handled
        server.gate.set()
        async with asyncio.timeout(5):
            while server.router.body_bytes_in_flight:
                await asyncio.sleep(0.001)  # polling the counter, bounded by the timeout above
        assert transport.writes == []  # nothing is written to a lost connection

    asyncio.run(main())


@pytest.mark.parametrize("raw", [b"GET /echo?q=" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
                                 b"GET /echo HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 999)
                                                                      for i in range(70)) + b"\r\n"])
def test_a_request_head_past_its_bound_is_refused_with_a_coded_400(raw: bytes) -> None:
    async def main() -> None:
        proto, transport = _Server().connect()
        for at in range(0, len(raw), 4096):  # as the socket delivers it
            if transport.closed:
                break
            proto.data_received(raw[at : at + 4096])
        assert transport.writes[-1].startswith(b"HTTP/1.1 400 ")
        assert b"request head (target and headers) exceeds 65536 bytes" in transport.writes[-1]
        assert transport.closed
        proto.connection_lost(None)

    asyncio.run(main())


def test_garbage_after_a_request_is_refused_after_that_request_is_answered() -> None:
    async def main() -> None:
        server = _Server()
        proto, transport = server.connect()
        proto.data_received(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\nNOT-HTTP\r\n\r\n")
        await asyncio.sleep(0)
        assert transport.writes == [] and not transport.closed  # the 400 waits for the answer before it
        server.gate.set()
        writes = await _writes(transport, 2)
        assert _body(writes[0]) == b"held" and writes[1].startswith(b"HTTP/1.1 400 ")
        assert transport.closed
        proto.connection_lost(None)

    asyncio.run(main())


def test_a_failure_past_the_router_closes_the_connection_rather_than_leave_the_client_waiting(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = _Server()

        calls = []

        async def broken(*args: Any) -> Response:
            calls.append(args[2])
            raise RuntimeError("a bug below the router's catch-all")

        server.router.serve = broken  # type: ignore[method-assign,assignment]
        proto, transport = server.connect()
        proto.data_received(b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            while not transport.closed:
                await asyncio.sleep(0.001)  # polling the fake transport, bounded by the timeout above
        assert transport.writes == []  # no answer, and the second request's is not taken for the first's
        assert calls == [b"q=1"]  # nor is the second one handled on the connection closed meanwhile
        proto.connection_lost(None)

    asyncio.run(main())
    assert "GET /echo failed without an answer; closing the connection" in caplog.text


def test_an_answer_that_does_not_wait_is_written_at_once_without_a_task() -> None:
    async def main() -> None:
        server = _Server()
        proto, transport = server.connect()
        proto.data_received(b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=2 HTTP/1.1\r\nHost: x\r\n\r\n")
        # No loop turn yet: both were answered inside data_received, in order, and no task was made.
        assert [_body(w) for w in transport.writes] == [b"q=1", b"q=2"] and not server.state.tasks
        proto.connection_lost(None)

    asyncio.run(main())


def test_an_answer_that_waits_goes_on_in_a_task_that_a_cancel_reaches() -> None:
    async def main() -> None:
        server = _Server()
        proto, transport = server.connect()
        proto.data_received(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        assert transport.writes == [] and len(server.state.tasks) == 1
        server.gate.set()
        assert _body((await _writes(transport, 1))[0]) == b"held"
        async with asyncio.timeout(5):
            while server.state.tasks:
                await asyncio.sleep(0.001)  # polling for the task's end, bounded by the timeout above

        # The server cancels what is left at a forced stop: the handler gets the cancellation where it waits.
        server.gate.clear()
        proto.data_received(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        (task,) = server.state.tasks
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert server.cancelled == 1 and len(transport.writes) == 1
        proto.connection_lost(None)

    asyncio.run(main())


def test_nothing_after_a_request_that_closes_the_connection_is_served() -> None:
    async def main() -> None:
        server = _Server()
        serve, served = server.router.serve, []

        async def counted(*args: Any) -> Response:
            served.append(args[1])
            return await serve(*args)

        server.router.serve = counted  # type: ignore[method-assign]
        proto, transport = server.connect()
        proto.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nab"
                            b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        await asyncio.sleep(0)
        assert [_body(w) for w in transport.writes] == [b"2 bytes"] and transport.closed
        assert served == ["/post"]  # the second request was not handled (a send would have been stored)
        assert server.router.body_bytes_in_flight == 0  # the second request's body was given back
        proto.connection_lost(None)

    asyncio.run(main())


class _FakeTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it (timers fire by it)."""

    now = 1000.0

    def time(self) -> float:
        return self.now


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # loop turns at a frozen clock: due timers and ready callbacks run


def test_deadlines_move_with_the_connection_and_close_it_when_they_pass(caplog: pytest.LogCaptureFixture) -> None:
    """Head, body and idle (keep-alive) deadlines: each request moves its connection's one deadline, a timer
    that fires before the deadline it finds waits for it, and a deadline that passes closes the connection."""
    keep_alive, head_s, body_s = 5, 10.0, 30.0
    loop = _FakeTimeLoop()

    async def main() -> None:
        server = _Server(limits=HttpLimits(header_timeout_s=head_s, body_timeout_s=body_s),
                         keep_alive_s=keep_alive)
        proto, transport = server.connect()
        start = loop.now
        proto.data_received(b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        assert len(transport.writes) == 1
        # Idle: the keep-alive deadline; a request that begins before it moves the deadline to its head's.
        loop.now = start + keep_alive - 0.1
        await _turns()
        assert not transport.closed
        proto.data_received(b"POST /post HTTP/1.1\r\nHost: x\r\n")  # a head, not complete
        loop.now = start + keep_alive + 1  # past the idle deadline: the timer fires and waits for the head's
        await _turns()
        assert not transport.closed
        proto.data_received(b"Content-Length: 10\r\n\r\n12345")  # the head complete, half the body
        loop.now = start + keep_alive - 0.1 + head_s + 1  # past the head's deadline, within the body's
        await _turns()
        assert not transport.closed
        loop.now = start + keep_alive + 1 + body_s - 0.1  # the body's deadline counts from its head's end
        await _turns()
        assert not transport.closed
        loop.now = start + keep_alive + 1 + body_s + 0.1
        await _turns()
        assert transport.closed and transport.writes[1:] == []
        assert "request body not complete within 30.0 s" in caplog.text
        proto.connection_lost(None)

        # An idle connection closes at its keep-alive deadline, quietly.
        caplog.clear()
        proto, transport = server.connect()
        proto.data_received(b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        await _turns()
        answered = loop.now
        loop.now = answered + keep_alive - 0.1
        await _turns()
        assert not transport.closed
        loop.now = answered + keep_alive + 0.1
        await _turns()
        assert transport.closed and len(transport.writes) == 1
        assert "not complete within" not in caplog.text
        proto.connection_lost(None)

    with caplog.at_level("INFO", logger="remoting.http"):
        loop.run_until_complete(main())
    loop.close()


def test_a_request_that_asks_for_an_upgrade_is_refused_unserved() -> None:
    async def main() -> None:
        server = _Server()
        serve, served = server.router.serve, []

        async def counted(*args: Any) -> Response:
            served.append(args[1])
            return await serve(*args)

        server.router.serve = counted  # type: ignore[method-assign]
        writes, transport = await _roundtrip(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                             b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\nabc", server=server)
        assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 400 ") and b"upgrades" in writes[0]
        assert served == [] and transport.closed  # not served first (with its body skipped), then refused
        assert server.router.body_bytes_in_flight == 0

    asyncio.run(main())
