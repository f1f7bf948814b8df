"""The probe that tells a plain client its server speaks TLS (client/_transport.py ``speaks_tls``) on connections a
dying or plain server leaves it: it answers False, and leaves no socket behind for the collector to warn about.

A broker killed while a plain client talked to it reset the probe's connection before the handshake began; the
probe then wrapped it with ``SSLContext.wrap_socket``, which in CPython 3.11 raised without closing the descriptor
it had taken over, and the collected socket's ResourceWarning failed an unrelated test of the same worker."""

from __future__ import annotations

import errno
import gc
import socket
import struct
import warnings
from collections.abc import Callable, Iterator

import pytest

from client._transport import completes_tls_handshake, speaks_tls
from tests.serving import plain_http_refuser
from tests.waiting import poll_until


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s


def _reset_by_peer(listener: socket.socket) -> socket.socket:
    """A client connection whose peer has reset it (RST, SO_LINGER 0), the reset already arrived."""
    client = socket.create_connection(listener.getsockname(), timeout=5)
    conn, _ = listener.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()

    def reset() -> bool:
        try:
            client.getpeername()
        except OSError as e:
            return e.errno == errno.ENOTCONN
        return False

    poll_until(reset, 5, "the reset to reach the client", interval_s=0.005)
    return client


def _unclosed_after(probe: Callable[[], bool]) -> tuple[bool, list[str]]:
    """``probe()``, and the ResourceWarnings of sockets collected after it."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        answer = probe()
        gc.collect()
    return answer, [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


def test_a_connection_reset_before_the_handshake_is_no_tls_and_leaves_no_socket(listener: socket.socket) -> None:
    client = _reset_by_peer(listener)
    with client:
        answer, unclosed = _unclosed_after(lambda: completes_tls_handshake(client, "127.0.0.1", 2.0))
    assert answer is False
    assert unclosed == []


def test_a_plain_http_server_is_no_tls() -> None:
    with plain_http_refuser() as origin:
        answer, unclosed = _unclosed_after(lambda: speaks_tls(origin))
    assert answer is False and unclosed == []


def test_a_server_that_never_answers_is_no_tls_within_the_bound(listener: socket.socket) -> None:
    client = socket.create_connection(listener.getsockname(), timeout=5)
    conn, _ = listener.accept()
    with client, conn:
        assert completes_tls_handshake(client, "127.0.0.1", 0.2) is False


def test_nothing_listening_is_no_tls() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert speaks_tls(("127.0.0.1", port)) is False
