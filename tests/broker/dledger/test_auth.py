"""The DLedger peer port with a cluster secret (issue 14 item 4), three members in one loop on loopback: with the
secret they elect and replicate; a member with a wrong secret gets no entry and moves no vote; a raw socket that
sends zeros, garbage or a well-formed HELLO and PUSH without the handshake is closed having changed nothing; a
flood of connections that never finish the handshake does not keep a restarted member out."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.dledger.member import Role
from broker.dledger.protocol import Frame, Hello, MsgType, encode_frame, encode_hello
from broker.dledger.server import DLedgerServer
from broker.dledger.transport import PeerClient, serve_peers
from broker.peer_auth import CHALLENGE_SIZE, MAGIC, VERSION, ChannelKind
from tests.broker.dledger.test_server import Group, entries
from tests.waiting import wait_until

SECRET = b"the group's cluster secret 0123"


class AuthGroup(Group):
    """A :class:`Group` whose members get ``SECRET``, except those in ``wrong`` (another secret)."""

    def __init__(self, root: Path, wrong: tuple[str, ...] = ()) -> None:
        super().__init__(root)
        self.wrong = set(wrong)

    async def start(self, peer: str) -> DLedgerServer:
        self.cfg = {"auth_secret": b"a guess" if peer in self.wrong else SECRET}
        return await super().start(peer)


def run_group(root: Path, scenario: Callable[[AuthGroup], Awaitable[None]], wrong: tuple[str, ...] = ()) -> None:
    async def main() -> None:
        g = AuthGroup(root, wrong)
        try:
            await g.start_all()
            await asyncio.wait_for(scenario(g), 60)
        finally:
            await g.stop_all()
            for s in g.socks:
                s.close()
    asyncio.run(main())


async def raw_exchange(addr: str, send: bytes, timeout_s: float = 5.0) -> bytes:
    """Connect to a peer port, send ``send``, read until the member closes the connection."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(send)
        got = bytearray()
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    chunk = await reader.read(65536)
                except ConnectionError:
                    break
                if not chunk:
                    break
                got += chunk
        return bytes(got)
    finally:
        writer.close()


def test_members_with_the_secret_elect_and_replicate(tmp_path: Path) -> None:
    async def scenario(g: AuthGroup) -> None:
        lead = await g.wait_leader()
        results = await asyncio.gather(*(lead.append(b"m%d" % i) for i in range(30)))
        last = results[-1][0]
        for n in g.nodes.values():
            await wait_until(lambda n=n: n.store.committed_index >= last, 5, f"{n.state.self_id} committing {last}")
            assert entries(n, last) == entries(lead, last)

    run_group(tmp_path, scenario)


def test_a_member_with_a_wrong_secret_gets_no_entry_and_the_others_go_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(g: AuthGroup) -> None:
        intruder = g.nodes["n2"]

        def good_leader() -> DLedgerServer | None:  # n0 and n1 are a majority of three; n2 follows nobody
            a, b = g.nodes["n0"], g.nodes["n1"]
            for lead, other in ((a, b), (b, a)):
                if lead.state.role is Role.LEADER and other.state.leader_id == lead.state.self_id:
                    return lead
            return None

        lead = await wait_until(good_leader, 10, "n0 or n1 leading the other")
        for i in range(20):
            index, _ = await lead.append(b"secret entry %d" % i)
        other = next(n for n in g.nodes.values() if n is not lead and n is not intruder)
        await wait_until(lambda: other.store.committed_index >= index, 5, "the good follower committing")
        # The leader keeps trying n2 (pushes, heartbeats); n2 never gets past the handshake.
        await wait_until(lambda: any("n2" in r.getMessage() and "failed the handshake" in r.getMessage()
                                     for r in caplog.records), 5, "the leader refusing n2")
        assert intruder.store.end_index == -1 and intruder.state.role is not Role.LEADER
        assert intruder.state.leader_id is None  # no heartbeat reached it either
        assert lead.state.role is Role.LEADER and lead.state.term == other.state.term  # n2 moved no vote

    with caplog.at_level(logging.WARNING, logger="broker.dledger"):
        run_group(tmp_path, scenario, wrong=("n2",))


BAD = {
    "eight zero bytes": bytes(8),
    "garbage": b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)),
    "a member without the secret: HELLO and a PUSH": (
        encode_frame(MsgType.HELLO, 0, encode_hello(Hello("g", "n0", "n1")))
        + encode_frame(MsgType.PUSH, 1, bytes(40))),
    "an HA client's response": MAGIC + bytes([VERSION, ChannelKind.HA]) + bytes(48),
    "the right kind and a made-up proof": MAGIC + bytes([VERSION, ChannelKind.DLEDGER]) + bytes(48),
}


@pytest.mark.parametrize("what", list(BAD))
def test_a_connection_without_the_secret_changes_nothing_and_is_closed(
        tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(g: AuthGroup) -> None:
        lead = await g.wait_leader()
        await lead.append(b"before")
        target = next(n for n in g.nodes.values() if n is not lead)
        end, term = target.store.end_pos, target.state.term
        got = await raw_exchange(g.peers[target.state.self_id], BAD[what])
        assert len(got) == CHALLENGE_SIZE and got.startswith(MAGIC + bytes([VERSION, ChannelKind.DLEDGER])), got
        assert target.store.end_pos == end and target.state.term == term  # nothing reached the member
        await lead.append(b"after")  # the group is fine

    with caplog.at_level(logging.WARNING, logger="broker.dledger"):
        run_group(tmp_path, scenario)
    assert any("failed the handshake" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("secret", [SECRET, b""], ids=["with a secret", "without (issue 11 item 3)"])
@pytest.mark.parametrize("junk", [b"", MAGIC[:3]], ids=["silent", "a few bytes"])
def test_a_flood_of_unfinished_handshakes_does_not_keep_a_peer_out(junk: bytes, secret: bytes) -> None:
    """Connections that have not passed HELLO (and the handshake) are pending: at most ``max_pending`` (the oldest
    closed first) and none past ``pending_timeout_s``. 100 of them, held open, more than ``max_connections``: a
    real peer still gets in and is answered, and the port holds no more than the pending cap of them."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async def handler(peer: str, f: Frame) -> tuple[MsgType, bytes]:
            return MsgType.HB_REPLY, b"ok " + peer.encode()

        server = await serve_peers("127.0.0.1", 0, group="g", self_id="n0", peers={"n0": "x:1", "n1": "x:2"},
                                   handler=handler, max_connections=64, max_pending=16,
                                   pending_timeout_s=3.0, secret=secret)
        flood: list[socket.socket] = []
        client = PeerClient("g", "n1", "n0", f"127.0.0.1:{server.port}", secret=secret)
        try:
            for _ in range(100):
                s = socket.socket()
                s.setblocking(False)
                flood.append(s)
                await loop.sock_connect(s, ("127.0.0.1", server.port))
                if junk:
                    await loop.sock_sendall(s, junk)
            # Well before the 3 s deadline: the cap does it, not the timeout.
            await wait_until(lambda: len(server.connections) <= 16, 1.0, "the flood cut to the pending cap")
            answer = await client.request(MsgType.HEARTBEAT, b"", 1.0)
            assert bytes(answer.body) == b"ok n1"
            assert len(server.connections) <= 16 + 1
        finally:
            await client.close()
            for s in flood:
                s.close()
            await server.close()

    asyncio.run(main())
