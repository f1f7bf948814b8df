"""The loopback floor's null HTTP server (``benchmarks._null_server``): it answers every request, in order, and
is gone once its ``with`` block ends."""

from __future__ import annotations

import socket

import pytest

from benchmarks._null_server import ANSWER_BODY, null_http_server
from benchmarks.client_bench import raw_connection, raw_exchange


def _read_answers(sock: socket.socket, count: int) -> bytes:
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 40\r\n\r\n" + ANSWER_BODY
    got = b""
    while len(got) < count * len(answer):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        got += chunk
    return got


@pytest.mark.integration
def test_every_request_is_answered_in_order_and_the_server_stops_with_its_block() -> None:
    post = b"POST /send?topic=T&queueId=0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n" + b"y" * 1024
    get = b"GET /pull?offset=0 HTTP/1.1\r\nHost: x\r\n\r\n"
    with null_http_server() as addr, raw_connection(addr) as sock:
        for _ in range(3):
            raw_exchange(sock, post)
        sock.sendall(post + get + post)  # pipelined: three answers, one per request
        answers = _read_answers(sock, 3)
        assert answers.count(b"HTTP/1.1 200 OK") == 3 and answers.endswith(ANSWER_BODY)
    host, _, port = addr.rpartition(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"], ids=["nothing", "half"])
def test_a_raw_exchange_on_a_connection_the_server_closed_raises_instead_of_spinning(sent: bytes) -> None:
    # A broker closes a keep-alive connection idle past its timeout; the raw loop read b"" from it for ever.
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=10)
        conn, _ = server.accept()
        conn.sendall(sent)
        conn.close()
        with client, pytest.raises(ConnectionError, match="closed the connection before the whole answer"):
            raw_exchange(client, b"POST /send HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
