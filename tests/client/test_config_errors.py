"""Errors that point the right way (issue 40, point 4): a dead nameserver is named as one, not reported as a
topic without a route; a nameserver address without a port is refused when the client is made, not dialled at
port 80; a TLS file that cannot be used is a ClientError as well as a ValueError. (A plain client of a TLS
cluster is told so: tests/client/test_tls_e2e.py.)"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from client import Admin, AsyncProducer, Message, Producer, PullConsumer
from client.errors import (
    ClientError,
    ConfigError,
    NameServerUnavailableError,
    RouteNotFoundError,
    TransportError,
)
from common.tls import TlsConfigError, client_context


@pytest.fixture
def dead_addr() -> Iterator[str]:
    """A loopback address nothing listens on: a socket bound to it, never listening, refuses connections (the
    port stays taken until the test ends, so no other process can start listening there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _names_the_dead_nameserver(err: BaseException, addr: str) -> None:
    assert isinstance(err, NameServerUnavailableError), repr(err)
    assert isinstance(err, TransportError) and err.retriable  # a nameserver may come back
    assert not isinstance(err, RouteNotFoundError)
    first_line = str(err).splitlines()[0]
    assert first_line.startswith(f"no nameserver answered at {addr}"), first_line
    assert f"connect to {addr} failed" in first_line


def test_a_send_through_a_dead_nameserver_names_it(dead_addr: str) -> None:
    with Producer("pg_dead_ns", dead_addr, send_timeout_s=1.0) as p, pytest.raises(ClientError) as info:
        p.send(Message("TopicTest", b"x"))
    _names_the_dead_nameserver(info.value, dead_addr)


def test_an_async_send_and_a_consumer_through_a_dead_nameserver_name_it(dead_addr: str) -> None:
    async def send() -> None:
        async with AsyncProducer("apg_dead_ns", dead_addr, send_timeout_s=1.0) as p:
            await p.send(Message("TopicTest", b"x"))

    with pytest.raises(ClientError) as info:
        asyncio.run(send())
    _names_the_dead_nameserver(info.value, dead_addr)
    with PullConsumer("cg_dead_ns", dead_addr) as c, pytest.raises(ClientError) as info:
        c.fetch_subscribe_message_queues("TopicTest")
    _names_the_dead_nameserver(info.value, dead_addr)


def test_admin_through_dead_nameservers_names_each(dead_addr: str) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        second = f"127.0.0.1:{other.getsockname()[1]}"
        with Admin(f"{dead_addr};{second}") as adm, pytest.raises(ClientError) as info:
            adm.cluster_info()
    assert isinstance(info.value, NameServerUnavailableError), repr(info.value)
    assert dead_addr in str(info.value) and second in str(info.value)


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "localhost:", "localhost:0", "localhost:98765",
                                  "127.0.0.1:9876;other-host", ";", ""])
def test_a_nameserver_address_without_a_usable_port_is_refused_when_the_client_is_made(addr: str) -> None:
    for make in (lambda: Producer("pg_bad_addr", addr), lambda: Admin(addr), lambda: PullConsumer("cg", addr)):
        with pytest.raises(ConfigError) as info:
            make()
        assert isinstance(info.value, ValueError) and isinstance(info.value, ClientError)
        assert not info.value.retriable
        assert "host:port" in str(info.value) or "names no nameserver" in str(info.value), str(info.value)


def test_ipv6_and_several_nameservers_are_accepted() -> None:
    with Admin("[::1]:9876;127.0.0.1:9877") as adm:
        assert adm.client.nameservers.addrs == ["[::1]:9876", "127.0.0.1:9877"]


def test_a_tls_file_that_cannot_be_used_is_a_client_error(tmp_path: object) -> None:
    with pytest.raises(ClientError) as info:
        client_context("/nonexistent/ca.pem")
    assert isinstance(info.value, TlsConfigError) and isinstance(info.value, ValueError)
    assert "/nonexistent/ca.pem" in str(info.value)
