"""The custom httpx transports against a tiny in-process HTTP/1.1 server that misbehaves on request."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from client import _http11
from client._http11 import ResponseParser
from client._transport import AsyncTransport, SyncTransport, _SyncConnection


class TinyServer:
    """Threaded HTTP/1.1 server on 127.0.0.1:0. Paths: /echo, /close (Connection: close), /hangup (closes
    after answering, without saying so), /block (answers only when ``release`` is set), /drop (closes mid-body),
    /vanish (stops listening and closes the connection without answering: a server that died with the request in
    hand)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.release = threading.Event()
        self.hung_up = threading.Event()
        self._stop = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].decode()
                length = 0
                for line in lines[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                try:
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    body, buf = buf[:length], buf[length:]
                    if not self._answer(conn, path, body):
                        return
                except OSError:  # close() shut the connection (a /block answer released by it, say)
                    return

    def _answer(self, conn: socket.socket, path: str, body: bytes) -> bool:
        if path.startswith("/block"):
            self.release.wait(10)
        if path.startswith("/drop"):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
            return False
        if path.startswith("/vanish"):
            self._stop = True
            self.sock.shutdown(socket.SHUT_RDWR)  # stops listening now (a close alone leaves accept() blocked on it)
            self.sock.close()
            return False
        extra = b"Connection: close\r\n" if path.startswith("/close") else b""
        payload = body if path.startswith("/echo") else path.encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(payload), extra) + payload)
        if path.startswith("/hangup"):
            conn.close()
            self.hung_up.set()  # the client's pooled connection is stale from here on
        return not (path.startswith("/close") or path.startswith("/hangup"))

    def close(self) -> None:
        self._stop = True
        self.release.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def server() -> Iterator[TinyServer]:
    s = TinyServer()
    yield s
    s.close()


@pytest.fixture
def refused_addr() -> Iterator[str]:
    """A bound, non-listening socket: connecting to it is refused, and nobody else can take the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


def sync_client() -> httpx.Client:
    return httpx.Client(transport=SyncTransport(max_connections_per_host=4), timeout=2.0)


def test_keep_alive_reuses_one_connection(server: TinyServer) -> None:
    with sync_client() as c:
        for i in range(20):
            r = c.post(f"http://{server.addr}/echo", content=b"x" * i)
            assert r.status_code == 200 and r.content == b"x" * i
    assert server.connections == 1


def test_large_bodies(server: TinyServer) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB
    with sync_client() as c:
        assert c.post(f"http://{server.addr}/echo", content=body).content == body


def test_connection_close_header_then_new_connection(server: TinyServer) -> None:
    with sync_client() as c:
        assert c.get(f"http://{server.addr}/close").content == b"/close"
        assert c.get(f"http://{server.addr}/x").content == b"/x"
    assert server.connections == 2


def test_server_hangs_up_idle_connection(server: TinyServer) -> None:
    with sync_client() as c:
        assert c.get(f"http://{server.addr}/hangup").content == b"/hangup"
        assert server.hung_up.wait(5), "the server did not hang up"
        for _ in range(3):  # the stale connection is detected or the request retried on a new one
            assert c.get(f"http://{server.addr}/y").content == b"/y"
    assert server.connections == 2, "the requests after the hang-up did not go over one new connection"


def test_an_idle_connection_the_server_closed_is_noticed_before_reuse(server: TinyServer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """However recently it answered: a request written on a connection the server had closed was never received,
    and must not be reported as one that may have been (see the next test)."""
    import client._transport as transport

    with sync_client() as c:
        assert c.get(f"http://{server.addr}/hangup").content == b"/hangup"
        assert server.hung_up.wait(5), "the server did not hang up"

        def no_retry(*args: object) -> None:
            raise AssertionError("the request went out on the closed connection")

        monkeypatch.setattr(transport, "retry_or_raise", no_retry)
        assert c.get(f"http://{server.addr}/y").content == b"/y"
    assert server.connections == 2


def test_a_reused_connection_costs_one_select(server: TinyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import client._transport as transport

    selects: list[object] = []
    real_select = transport.select.select

    def counting_select(*args: object) -> object:
        selects.append(args)
        return real_select(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(transport.select, "select", counting_select)
    with sync_client() as c:
        for _ in range(4):
            assert c.get(f"http://{server.addr}/a").content == b"/a"
    assert len(selects) == 3 and server.connections == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_server_that_dies_with_the_request_in_hand_is_not_a_refused_connection(server: TinyServer,
                                                                                 kind: str) -> None:
    """The request went out on a live keep-alive connection, which then closed without an answer; its retry on a
    new connection is refused. The server may have acted on it: the error is not a ConnectError (which says the
    request never left), and the SDK's error says ``request_sent``."""
    from client._requests import map_transport_error

    async def run_async() -> None:
        async with httpx.AsyncClient(transport=AsyncTransport(), timeout=2.0) as c:
            assert (await c.get(f"http://{server.addr}/a")).content == b"/a"
            await c.post(f"http://{server.addr}/vanish", content=b"order 42")

    with pytest.raises(httpx.HTTPError) as ei:
        if kind == "sync":
            with sync_client() as c:
                assert c.get(f"http://{server.addr}/a").content == b"/a"
                c.post(f"http://{server.addr}/vanish", content=b"order 42")
        else:
            asyncio.run(run_async())
    assert isinstance(ei.value, httpx.RemoteProtocolError) and "new connection failed" in str(ei.value)
    assert map_transport_error(ei.value, server.addr, "send").request_sent is True  # type: ignore[attr-defined]


def test_a_changed_timeout_applies_on_a_reused_connection(server: TinyServer) -> None:
    # The socket's timeout is set only when it changes: a short read timeout after long ones must still bite.
    with httpx.Client(transport=SyncTransport(max_connections_per_host=1)) as c:
        for _ in range(2):
            assert c.get(f"http://{server.addr}/x", timeout=5.0).content == b"/x"
        t = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.get(f"http://{server.addr}/block", timeout=httpx.Timeout(5.0, read=0.3))
        assert time.monotonic() - t < 2.0
        server.release.set()
        assert c.get(f"http://{server.addr}/after", timeout=5.0).content == b"/after"


def test_read_timeout_is_bounded(server: TinyServer) -> None:
    with sync_client() as c:
        t = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.get(f"http://{server.addr}/block", timeout=0.3)
        assert time.monotonic() - t < 2.0
        server.release.set()
        assert c.get(f"http://{server.addr}/after").content == b"/after"


def test_connection_refused(refused_addr: str) -> None:
    with sync_client() as c, pytest.raises(httpx.ConnectError):
        c.get(f"http://{refused_addr}/x")


def test_truncated_response(server: TinyServer) -> None:
    with sync_client() as c, pytest.raises(httpx.RemoteProtocolError):
        c.get(f"http://{server.addr}/drop")


def test_concurrent_threads_bounded_pool(server: TinyServer) -> None:
    errors: list[BaseException] = []
    with sync_client() as c:
        def work() -> None:
            try:
                for i in range(20):
                    assert c.post(f"http://{server.addr}/echo", content=str(i).encode()).content == str(i).encode()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors
    assert server.connections <= 4


def test_closed_transport_refuses() -> None:
    t = SyncTransport()
    t.close()
    with httpx.Client(transport=t) as c, pytest.raises(httpx.ConnectError):
        c.get("http://127.0.0.1:1/x")


def test_https_refused() -> None:
    with httpx.Client(transport=SyncTransport()) as c, pytest.raises(httpx.UnsupportedProtocol):
        c.get("https://127.0.0.1:1/x")


# --- async -------------------------------------------------------------------------------------------------


def test_async_keep_alive_and_concurrency(server: TinyServer) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(transport=AsyncTransport(max_connections_per_host=4), timeout=2.0) as c:
            for i in range(10):
                assert (await c.post(f"http://{server.addr}/echo", content=b"a" * i)).content == b"a" * i
            rs = await asyncio.gather(*(c.post(f"http://{server.addr}/echo", content=b"%d" % i) for i in range(40)))
            assert [r.content for r in rs] == [b"%d" % i for i in range(40)]

    asyncio.run(main())
    assert server.connections <= 4


def test_async_failures(server: TinyServer, refused_addr: str) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(transport=AsyncTransport(), timeout=2.0) as c:
            with pytest.raises(httpx.ConnectError):
                await c.get(f"http://{refused_addr}/x")
            t = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                await c.get(f"http://{server.addr}/block", timeout=0.3)
            assert time.monotonic() - t < 2.0
            server.release.set()
            with pytest.raises(httpx.RemoteProtocolError):
                await c.get(f"http://{server.addr}/drop")
            assert (await c.get(f"http://{server.addr}/close")).content == b"/close"
            assert (await c.get(f"http://{server.addr}/hangup")).content == b"/hangup"
            assert await asyncio.to_thread(server.hung_up.wait, 5), "the server did not hang up"
            for _ in range(3):
                assert (await c.get(f"http://{server.addr}/z")).content == b"/z"

    asyncio.run(main())


# --- exchange: the data path without httpx's models ---------------------------------------------------------


def test_exchange_keeps_alive_and_returns_status_and_body(server: TinyServer) -> None:
    t = SyncTransport()
    host, port = server.addr.split(":")
    for i in range(5):
        r = t.exchange("POST", host, int(port), "/echo?a=%2A", b"y" * i, timeout=2.0)
        assert (r.status_code, r.content) == (200, b"y" * i)
    assert t.exchange("GET", host, int(port), "/p?q=1", timeout=2.0).content == b"/p?q=1"
    assert server.connections == 1
    t.close()


def test_answers_do_not_share_the_connection_receive_buffer(server: TinyServer) -> None:
    """A thread receives every answer into one buffer of its own, reused for every answer: ``content`` must be
    a copy, unchanged by the next answer on the same connection (small, and larger than the buffer)."""
    t = SyncTransport()
    host, port = server.addr.split(":")
    try:
        kept = []
        for size in (100, 300_000, 50, 600_000):
            for fill in b"ab":
                body = bytes([fill]) * size
                r = t.exchange("POST", host, int(port), "/echo", body, timeout=5.0)
                assert type(r.content) is bytes and r.content == body
                kept.append((r.content, body))
        assert all(content == body for content, body in kept)
        assert server.connections == 1
    finally:
        t.close()


def test_a_lent_answer_keeps_its_body_when_the_buffer_is_reused(server: TinyServer) -> None:
    """A large answer is lent from the thread's receive buffer (read in place by body_view); an answer still held
    when the thread's next request reuses the buffer is copied out first, so content is always its own."""
    t = SyncTransport()
    host, port = server.addr.split(":")
    try:
        held = []
        for fill in b"abcd":
            body = bytes([fill]) * 400_000
            r = t.exchange("POST", host, int(port), "/echo", body, timeout=5.0)
            if fill == ord("a"):
                assert isinstance(r.body_view(), memoryview) and r.body_view() == body  # lent, read in place
            held.append((r, body))
        assert all(r.content == body for r, body in held)
        small = t.exchange("POST", host, int(port), "/echo", b"s" * 100, timeout=5.0)
        assert type(small.body_view()) is bytes  # a small answer is copied at once
    finally:
        t.close()


def test_threads_do_not_share_a_receive_buffer(server: TinyServer) -> None:
    t = SyncTransport()
    host, port = server.addr.split(":")
    errors: list[str] = []

    def work(fill: int) -> None:
        for size in (300_000, 1_000, 900_000):
            body = bytes([fill]) * size
            r = t.exchange("POST", host, int(port), "/echo", body, timeout=10.0)
            view = r.body_view()
            if bytes(view) != body:
                errors.append(f"thread {fill}: answer of {size} bytes is not its own")

    threads = [threading.Thread(target=work, args=(f,)) for f in range(4)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    finally:
        t.close()
    assert not errors


def test_exchange_failures_are_httpx_errors(server: TinyServer, refused_addr: str) -> None:
    t = SyncTransport()
    host, port = server.addr.split(":")
    with pytest.raises(httpx.ConnectError):
        refused_host, refused_port = refused_addr.split(":")
        t.exchange("GET", refused_host, int(refused_port), "/x", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        t.exchange("GET", host, int(port), "/block", timeout=0.3)
    assert time.monotonic() - started < 2.0
    server.release.set()
    with pytest.raises(httpx.RemoteProtocolError):
        t.exchange("GET", host, int(port), "/drop", timeout=2.0)
    with pytest.raises(httpx.UnsupportedProtocol, match="request target"):
        t.exchange("GET", host, int(port), "/a b", timeout=2.0)
    t.close()


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_async_exchange_on_both_loops(server: TinyServer, use_uvloop: bool) -> None:
    host, port = server.addr.split(":")

    async def main() -> None:
        t = AsyncTransport(max_connections_per_host=4)
        rs = await asyncio.gather(*(t.exchange("POST", host, int(port), "/echo", b"%d" % i, timeout=2.0)
                                    for i in range(20)))
        assert [r.content for r in rs] == [b"%d" % i for i in range(20)]
        async with httpx.AsyncClient(transport=t, timeout=2.0) as c:
            assert (await c.get(f"http://{server.addr}/z")).content == b"/z"

    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())
    assert server.connections <= 4


def test_split_addr() -> None:
    from client._requests import split_addr

    assert split_addr("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert split_addr("[::1]:80") == ("::1", 80)
    assert split_addr("localhost") == ("localhost", 80)
    with pytest.raises(httpx.ConnectError, match="not host:port"):
        split_addr("host:port")


class _Conn:
    def __init__(self, name: str, stale: bool = False) -> None:
        self.name, self.stale, self.closed = name, stale, False

    def is_stale(self) -> bool:
        return self.stale

    def close(self) -> None:
        self.closed = True


def test_host_pool_accounting() -> None:
    """The one place both transports count connections: slots up to the bound, newest idle reused first,
    stale idle ones closed on the way, at most max_idle kept, a failed open gives its slot back."""
    from client._http11 import HostPool

    pool: HostPool[_Conn] = HostPool(max_connections=2, max_idle=1)
    assert pool.reuse() is None
    assert pool.reserve() and pool.reserve() and not pool.reserve()  # the third caller waits
    a, b = _Conn("a"), _Conn("b")
    pool.put_back(a, reusable=True)
    pool.put_back(b, reusable=True)  # no room: max_idle=1
    assert b.closed and not a.closed and pool.open_count == 1
    assert pool.reuse() is a and pool.open_count == 1
    pool.put_back(a, reusable=False)  # Connection: close
    assert a.closed and pool.open_count == 0
    assert pool.reserve()
    pool.release()  # the connect failed
    assert pool.open_count == 0
    old, new = _Conn("old", stale=True), _Conn("new")
    assert pool.reserve() and pool.reserve()
    pool.max_idle = 2
    pool.put_back(old, reusable=True)
    pool.put_back(new, reusable=True)
    assert pool.reuse() is new  # newest first
    new.stale = True
    pool.put_back(new, reusable=True)
    assert pool.reuse() is None and old.closed and new.closed and pool.open_count == 0
    c = _Conn("c")
    assert pool.reserve()
    pool.put_back(c, reusable=True)
    pool.close_idle()
    assert c.closed and pool.open_count == 0 and not pool.idle


class _CountingSocket(socket.socket):
    settimeouts = 0

    def settimeout(self, value: float | None) -> None:
        self.settimeouts += 1
        super().settimeout(value)


def test_the_time_left_of_successive_deadlines_sets_the_socket_timeout_once() -> None:
    """``settimeout`` is a system call: the 3 s less a few µs left of each request's deadline is one value."""
    with _CountingSocket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        conn = _SyncConnection(sock)
        for left in (2.9999929790064925, 2.9999933399958536, 2.999992689001374, 2.9999999):
            conn._set_timeout(left)
        assert sock.settimeouts == 1 and sock.gettimeout() == 3.0  # never shorter, at most 1 ms longer
        conn._set_timeout(0.0004)
        conn._set_timeout(None)
        assert sock.settimeouts == 3 and sock.gettimeout() is None


def _parsed(head: bytes) -> ResponseParser:
    parser = ResponseParser()
    assert parser.feed(head) is True
    return parser


def test_a_response_head_read_again_comes_from_the_cache_each_answer_with_its_own_headers() -> None:
    _http11._HEADS.clear()
    head = b"HTTP/1.1 200 OK\r\nserver: x\r\ncontent-length: 0\r\n\r\n"
    first, second = _parsed(head), _parsed(head)
    assert list(_http11._HEADS) == [head[:-4]]
    assert (first.status, first.headers, first.body_len) == (second.status, second.headers, 0) == (
        200, [(b"server", b"x"), (b"content-length", b"0")], 0)
    assert first.headers is not second.headers
    first.headers.append((b"x", b"y"))  # an answer's headers are its own
    assert _parsed(head).headers == [(b"server", b"x"), (b"content-length", b"0")]
    closing = _parsed(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
    assert not closing.keep_alive and _parsed(head).keep_alive


def test_a_malformed_head_is_refused_every_time_and_the_cache_stays_bounded() -> None:
    _http11._HEADS.clear()
    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError, match="bad Content-Length"):
            _parsed(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n")
    assert not _http11._HEADS
    for n in range(3 * _http11._HEADS_MAX):
        assert _parsed(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n + b"z" * n).body_len == n
        assert len(_http11._HEADS) <= _http11._HEADS_MAX
