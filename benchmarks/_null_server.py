"""The loopback floor of the benchmarks: an HTTP/1.1 server that answers every request at once and does nothing
else, on the broker's own stack (uvloop's event loop, httptools' parser, one ``transport.write`` per answer).

A raw keep-alive socket timing requests against it measures what any request/response costs on this machine
before a line of SplitMQ runs: the system calls, the two processes' wake-ups on loopback, the parser and the
event loop. The broker's raw-socket figure over this one is the broker's own work on the path of a request; a
peer's figure over it is how much room a server of that speed leaves. ``python -m benchmarks client`` and
``python -m benchmarks peers`` report it next to the single send.

Run as ``python -m benchmarks._null_server``: it binds a free loopback port, prints ``port <n>`` on stdout and
serves until its standard input closes (the parent exiting ends it too). :func:`null_http_server` does that.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httptools
import uvloop

__all__ = ["ANSWER_BODY", "null_http_server"]

#: The answer's body: as long as a single send's reply.
ANSWER_BODY = b"\x00" * 40
_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n%s" % (
    len(ANSWER_BODY), ANSWER_BODY)
_START_TIMEOUT_S = 20.0


class _Answering(asyncio.Protocol):
    """Parses requests with httptools and answers each one as it completes."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP server's transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.write(_ANSWER)


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Answering, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    closed: asyncio.Future[None] = loop.create_future()

    def stdin_closed() -> None:  # the parent never writes: readable means it closed the pipe (or exited)
        loop.remove_reader(sys.stdin.fileno())
        closed.set_result(None)

    loop.add_reader(sys.stdin.fileno(), stdin_closed)
    async with server:
        await closed


@contextmanager
def null_http_server() -> Iterator[str]:
    """A null HTTP server in a child process for the ``with`` block; yields its ``host:port``.

    Raises:
        RuntimeError: it did not print its port within 20 s (its output is in the message).
    """
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks._null_server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = _first_line(proc, _START_TIMEOUT_S)
        if not line.startswith("port "):
            raise RuntimeError(f"the null HTTP server did not start: {line!r}")
        yield f"127.0.0.1:{int(line.split()[1])}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the server's signal to stop
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The child's first line of output, waited for at most ``timeout_s`` (a thread reads it: a pipe has no
    timeout of its own)."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else b""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not got:
        raise RuntimeError(f"the null HTTP server printed nothing within {timeout_s:.0f} s")
    return got[0].decode("utf-8", "replace").strip()


if __name__ == "__main__":
    uvloop.run(_serve())
