"""``haAuthSecret`` against real processes (issue 14 item 4 acceptance): a SYNC_MASTER group and a DLedger group
started with the secret replicate as before; a socket that sends eight zero bytes (the attack that used to get
the whole commit log) or garbage to the HA or peer port gets the 22-byte challenge and nothing else, and is
closed; a slave or a member with a wrong secret gets no byte of the log while the real ones keep replicating and
SYNC sends keep succeeding."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from client import Message, Producer, SendStatus
from client.cluster import LocalCluster
from tests.broker.dledger.test_group import QUICK, make_topic, status
from tests.broker.procs import Servers
from tests.ha.support import (
    SMALL_FILES,
    create_topic,
    get_json,
    ha_cluster,
    ha_of,
    max_offset,
    poll_until,
    wait_slave_linked,
)

pytestmark = [pytest.mark.integration, pytest.mark.ha]

SECRET = "cluster-secret-for-the-tests-0123456789"
SECRET_BODY = b"TOP-SECRET-BODY-"
CHALLENGE_SIZE = 22


def raw_exchange(addr: str, send: bytes, timeout_s: float = 5.0) -> bytes:
    """Connect to ``addr``, send ``send`` and read until the server closes the connection."""
    host, _, port = addr.rpartition(":")
    got = bytearray()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(send)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionError:
                break
            if not chunk:
                break
            got += chunk
        else:
            raise AssertionError(f"{addr} did not close the connection within {timeout_s} s (got {len(got)} bytes)")
    return bytes(got)


ATTACKS = {"eight zero bytes": bytes(8), "garbage": b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 8}


def assert_refused(addr: str) -> None:
    for what, send in ATTACKS.items():
        got = raw_exchange(addr, send)
        assert len(got) == CHALLENGE_SIZE and got.startswith(b"SMQA"), (what, got[:64])
        assert SECRET_BODY not in got


def test_a_short_secret_is_warned_about_at_start(tmp_path: Path) -> None:
    servers = Servers(tmp_path)
    try:
        broker = servers.broker({"haAuthSecret": "tiny", "brokerName": "short"})
        assert "haAuthSecret is shorter than 16 bytes" in broker.log() and "tiny" not in broker.log()
    finally:
        servers.close()


def send_ok(p: Producer, topic: str, n: int, tag: str) -> None:
    for i in range(n):
        r = p.send(Message(topic, SECRET_BODY + f"{tag}-{i}".encode()))
        assert r.send_status is SendStatus.SEND_OK, (tag, i, r)


def test_a_sync_master_group_with_the_secret(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync", config={"haAuthSecret": SECRET})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Auth")
    wait_slave_linked(cluster)
    servers = Servers(tmp_path)
    try:
        with Producer("pg", cluster.namesrv_addr) as p:
            send_ok(p, "Auth", 20, "before")  # SYNC_MASTER: each SEND_OK is an ack of the slave
            assert_refused(master.ha_addr)
            intruder = servers.broker({
                "brokerClusterName": cluster.cluster_name, "brokerName": "broker-a", "brokerRole": "SLAVE",
                "brokerId": "2", "haMasterAddress": master.ha_addr, "haAuthSecret": "a guess at the secret",
                "mappedFileSizeCommitLog": str(SMALL_FILES), "messageIndexEnable": "false"}, name="intruder")
            refused = f"handshake with {master.ha_addr} failed"
            poll_until(lambda: refused in intruder.log(), 10, "the intruder refused")
            send_ok(p, "Auth", 20, "during")  # the real slave keeps acking while the intruder keeps trying
            poll_until(lambda: intruder.log().count(refused) >= 2, 10, "the intruder retried and was refused again")
        assert get_json(intruder.addr, "/runtime")["commitLogMaxOffset"] == 0
        # Only the real slave counts (polled: an intruder's attempt is a connection for the instant it is refused).
        poll_until(lambda: (ha := ha_of(master))["connectionCount"] == 1
                   and [s["ackOffset"] for s in ha["slaves"]] == [ha["masterMaxOffset"]], 10, "only the real slave")
        assert max_offset(slave) == max_offset(master)
        master_log = master.log_path.read_text(errors="replace")
        assert "failed the handshake" in master_log and "passed the handshake" in master_log
    finally:
        servers.close()


def test_a_dledger_group_with_the_secret(cluster_factory: Any) -> None:
    cluster: LocalCluster = cluster_factory(mode="dledger", broker_config={**QUICK, "haAuthSecret": SECRET},
                                            commitlog_file_size_bytes=4 << 20)
    leader = cluster.leader("broker-a")
    make_topic(cluster, 2)
    with Producer("pg", cluster.namesrv_addr) as p:
        send_ok(p, "Raft", 10, "before")
        end = status(leader)["ledgerEndIndex"]
        for b in cluster.members("broker-a"):  # every member replicates
            poll_until(lambda b=b: status(b)["committedIndex"] >= end, 10, f"{b} committing {end}")
        member = next(b for b in cluster.members("broker-a") if b is not leader)
        assert member.peer_sock is not None
        assert_refused(f"127.0.0.1:{member.peer_sock.getsockname()[1]}")
        # The member comes back with a wrong secret: the other two go on, it gets no entry.
        member.stop()
        text = member.config_path.read_text()
        assert f"haAuthSecret={SECRET}\n" in text
        member.config_path.write_text(text.replace(f"haAuthSecret={SECRET}\n", "haAuthSecret=a guess\n"))
        member.start()
        held = status(member)["ledgerEndIndex"]
        send_ok(p, "Raft", 10, "during")
        poll_until(lambda: "failed the handshake" in member.log_path.read_text(errors="replace"), 10,
                   "the member refused")
        now = cluster.leader("broker-a")  # (a loaded machine may move the leadership between the other two)
        assert now is not member and status(now)["ledgerEndIndex"] > held
        assert status(member)["ledgerEndIndex"] == held and status(member)["role"] != "LEADER"
        assert status(member)["leaderId"] is None  # not even a heartbeat reached it
