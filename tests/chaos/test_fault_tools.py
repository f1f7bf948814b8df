"""The nemesis's tools against real processes: the HA link relay cuts and heals, and the faulty-store broker
fills and frees its disk on a signal."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.chaos.cluster import LinkRelays
from benchmarks.chaos.faulty_broker import DISK_FULL, DISK_ROOM
from client import Admin, Message, Producer, SendStatus
from client.cluster import LocalCluster
from client.errors import BrokerError, SendFailedError
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration]


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A loopback server that echoes every byte, one thread per connection."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    srv.close()


def _connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.settimeout(5)
    return s


def _closed(s: socket.socket) -> bool:
    """The peer closed ``s`` (EOF or reset)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_link_relay_relays_cuts_and_heals(echo_server: str, tmp_path: Path) -> None:
    relays = LinkRelays([echo_server, echo_server], tmp_path / "relay.log")
    try:
        with _connect(relays.addrs[0]) as a, _connect(relays.addrs[1]) as b:
            a.sendall(b"x" * 300_000)  # more than a read at once
            got = b""
            while len(got) < 300_000:
                got += a.recv(65536)
            assert got == b"x" * 300_000
            relays.command("cut", 0)
            assert _closed(a)
            with _connect(relays.addrs[0]) as again:  # refused while cut: accepted, then closed at once
                assert _closed(again)
            b.sendall(b"other link")
            assert b.recv(100) == b"other link"  # a cut is per link
            relays.command("heal", 0)
            with _connect(relays.addrs[0]) as healed:
                healed.sendall(b"back")
                assert healed.recv(100) == b"back"
    finally:
        relays.close()
    assert relays.proc.returncode == 0  # stopped by itself at the end of its stdin


def test_the_faulty_store_broker_fills_and_frees_its_disk(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, slaves_per_group=0, commitlog_file_size_bytes=1 << 20,
                           broker_config={"messageIndexEnable": "false"})
    master = cluster.broker("broker-a", 0)
    master.entry_module = "benchmarks.chaos.faulty_broker"
    with cluster, Producer("p", cluster.namesrv_addr, retry_times_when_send_failed=0) as p:
        with Admin(cluster.namesrv_addr) as admin:
            admin.create_topic("Disk", queue_nums=1)
        assert p.send(Message("Disk", b"before")).send_status is SendStatus.SEND_OK
        assert master.pid is not None
        os.kill(master.pid, DISK_FULL)

        def refused() -> bool:
            try:
                p.send(Message("Disk", b"full"))
            except (BrokerError, SendFailedError) as e:
                return "disk full" in str(e) or "No space left" in str(e)
            return False

        poll_until(refused, 10, "a send refused for a full disk")
        os.kill(master.pid, DISK_ROOM)

        def stored() -> bool:
            try:
                return p.send(Message("Disk", b"after")).send_status is SendStatus.SEND_OK
            except (BrokerError, SendFailedError):
                return False

        poll_until(stored, 10, "a send stored once the disk has room")
