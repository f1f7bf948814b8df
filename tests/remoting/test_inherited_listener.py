"""``remoting.server.inherited_listener``: the listening socket a supervisor hands a server process (LocalCluster
binds every port first and starts its servers at once) is checked before it is served on."""

from __future__ import annotations

import os
import socket

import pytest

from remoting.server import inherited_listener


def _detached(sock: socket.socket) -> int:
    """The descriptor of ``sock``, given up by it (the listener takes it over, as a child process would)."""
    return sock.detach()


def test_a_listening_socket_on_the_configured_address_is_served_on() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with inherited_listener(_detached(sock), "--listen-fd", "127.0.0.1") as got:
        assert got.getsockname() == ("127.0.0.1", port) and got.getblocking() is False


def test_no_address_to_check_takes_any_listening_socket() -> None:
    with inherited_listener(_detached(socket.create_server(("127.0.0.1", 0))), "--ha-fd") as got:
        assert got.getsockname()[0] == "127.0.0.1"


def test_a_socket_bound_elsewhere_is_refused_naming_both_addresses() -> None:
    fd = _detached(socket.create_server(("127.0.0.1", 0)))
    with pytest.raises(OSError, match=r"--listen-fd \d+ is bound to 127.0.0.1, where the configuration says 127.0.0.2"):
        inherited_listener(fd, "--listen-fd", "127.0.0.2")
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, not leaked


def test_a_socket_that_does_not_listen_is_refused() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    with pytest.raises(OSError, match="is not a listening TCP socket"):
        inherited_listener(_detached(sock), "--ha-fd")


def test_a_descriptor_that_is_no_socket_is_refused() -> None:
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(OSError, match=f"--listen-fd {r} is not an open socket"):
        inherited_listener(r, "--listen-fd")
    os.close(r)
