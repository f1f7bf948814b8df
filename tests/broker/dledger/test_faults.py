"""The tests' fault wrapper around real peer connections (``tests/broker/dledger/faults.py``): a member's blocked or
delayed peer, the peer's faults holding its answers back, and the at-once ``send`` stepping aside while a fault
touches the pair -- what the member tests rely on when they cut a group apart."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from broker.dledger.protocol import Frame, MsgType
from broker.dledger.transport import PeerClient, PeerError, PeerServer, serve_peers
from tests.broker.dledger.faults import FaultyChannel, FaultyNetwork
from tests.broker.dledger.test_transport import PEERS, digest_server

DIGEST_HE = hashlib.sha256(b"he").digest()


def channel(net: FaultyNetwork, server: PeerServer, self_id: str = "n0", peer: str = "n1") -> FaultyChannel:
    inner = PeerClient("g", self_id, peer, f"127.0.0.1:{server.port}")
    return FaultyChannel(inner, net, self_id)


def test_a_blocked_peer_gets_nothing_and_a_delay_only_holds() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        gate.set()
        server = await digest_server("n1", gate)
        net = FaultyNetwork()
        c = channel(net, server)
        try:
            assert bytes((await c.request(MsgType.PUSH, b"h", 5.0, b"e")).body) == DIGEST_HE
            net["n0"].block("n1")
            with pytest.raises(PeerError, match="blocked"):
                await c.request(MsgType.PUSH, b"h", 5.0, b"e")
            net["n0"].heal()
            net["n0"].delay_s["n1"] = 0.01
            assert bytes((await c.request(MsgType.PUSH, b"h", 5.0, b"e")).body) == DIGEST_HE
        finally:
            await c.close()
            await server.close()

    asyncio.run(main())


def test_the_peers_faults_hold_its_answers_back_after_it_acted() -> None:
    """The peer blocks this member: it still gets the request (and acts on it) but its answer never comes, so the
    request waits out its timeout, as for an answer lost on the way; healed, it answers again."""
    async def main() -> None:
        seen: list[bytes] = []

        def handler(peer: str, f: Frame) -> tuple[MsgType, bytes]:
            seen.append(bytes(f.body))
            return MsgType.PUSH_REPLY, b"now:" + bytes(f.body)

        server = await serve_peers("127.0.0.1", 0, group="g", self_id="n1", peers=PEERS, handler=handler)
        net = FaultyNetwork()
        c = channel(net, server)
        try:
            net["n1"].block("n0")
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(PeerError, match="did not answer"):
                await c.request(MsgType.PUSH, b"b", 0.2)
            assert asyncio.get_running_loop().time() - t0 >= 0.19  # held for the whole timeout
            net["n1"].heal()
            assert bytes((await c.request(MsgType.PUSH, b"c", 5.0)).body) == b"now:c"
            assert seen == [b"b", b"c"]
        finally:
            await c.close()
            await server.close()

    asyncio.run(main())


def test_send_steps_aside_while_a_fault_touches_the_pair_and_a_late_answer_passes_the_faults() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        server = await digest_server("n1", gate)
        net = FaultyNetwork()
        c = channel(net, server)
        sent: list[tuple[str, str, MsgType, int]] = []
        net.tap = lambda *call: sent.append(call)
        try:
            assert c.send(MsgType.PUSH, b"h", 5.0, b"e") is None  # not connected yet
            gate.set()
            await c.request(MsgType.HEARTBEAT, b"", 5.0)  # connected
            gate.clear()
            for faults, peer in ((net["n0"], "n1"), (net["n1"], "n0")):  # either end's fault
                faults.delay_s[peer] = 0.01
                assert c.send(MsgType.PUSH, b"h", 5.0, b"e") is None  # the caller uses request
                faults.delay_s.clear()
            out = c.send(MsgType.PUSH, b"h", 5.0, b"e")
            assert out is not None
            net["n0"].block("n1")  # set while the push is out: its answer is dropped on the way back
            gate.set()
            with pytest.raises(PeerError, match="blocked"):
                await out
            net["n0"].heal()
            answered = c.send(MsgType.PUSH, b"h", 5.0, b"e")
            assert answered is not None and bytes((await answered).body) == DIGEST_HE
            assert [(s, t, m, n) for s, t, m, n in sent if m is MsgType.PUSH] == [("n0", "n1", MsgType.PUSH, 1)] * 2
        finally:
            await c.close()
            await server.close()

    asyncio.run(main())
