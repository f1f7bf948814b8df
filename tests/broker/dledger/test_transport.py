"""The peer transport's request path: a PUSH's entries go to the socket unjoined, one buffer to several peers, and
survive partial writes; timeouts and lost connections still end a request with a PeerError."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from broker.dledger.protocol import Frame, MsgType
from broker.dledger.transport import FaultLayer, PeerClient, PeerError, PeerServer, serve_peers
from tests.waiting import wait_until

PEERS = {"n0": "x:1", "n1": "x:2", "n2": "x:3"}

#: The broker runs uvloop (its ``writelines`` is one ``writev`` that keeps views of what the socket did not take);
#: the tests' default loop joins the buffers. Both must deliver the same bytes.
LOOPS: dict[str, Callable[[Awaitable[None]], None]] = {
    "asyncio": asyncio.run,  # type: ignore[dict-item]
    "uvloop": uvloop.run,  # type: ignore[dict-item]
}


async def digest_server(self_id: str, gate: asyncio.Event) -> PeerServer:
    """A peer that answers each request with the SHA-256 of its body, once ``gate`` is set (until then it does
    not answer, and the requests' bytes pile up in its socket)."""
    async def handler(peer: str, f: Frame) -> tuple[MsgType, bytes]:
        await gate.wait()
        return MsgType.PUSH_REPLY, hashlib.sha256(f.body).digest()

    return await serve_peers("127.0.0.1", 0, group="g", self_id=self_id, peers=PEERS, handler=handler,
                             faults=FaultLayer())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_one_tail_buffer_reaches_two_peers_whole_through_partial_writes(loop: str) -> None:
    """The same 16 MiB of entries (one bytes object) pushed to two peers at once, more than a socket takes in one
    write: each peer gets exactly head + entries, and the buffer is not changed by being sent."""
    tail = os.urandom(16 << 20)
    kept = bytes(tail)

    async def main() -> None:
        gate = asyncio.Event()
        servers = [await digest_server(p, gate) for p in ("n1", "n2")]
        clients = [PeerClient("g", "n0", p, f"127.0.0.1:{s.port}", FaultLayer())
                   for p, s in zip(("n1", "n2"), servers, strict=True)]
        try:
            for c in clients:  # connected first, so the write below is the request itself
                await c._connect()
            heads = [b"head for " + c.peer_id.encode() for c in clients]
            tasks = [asyncio.get_running_loop().create_task(c.request(MsgType.PUSH, h, 30.0, tail))
                     for c, h in zip(clients, heads, strict=True)]
            await asyncio.sleep(0)  # each request has written what its socket took, and holds the rest
            assert any(c._writer is not None and c._writer.transport.get_write_buffer_size() > 0 for c in clients), \
                "no write was partial: the test did not exercise the held remainder"
            gate.set()
            answers = await asyncio.gather(*tasks)
            for h, a in zip(heads, answers, strict=True):
                assert bytes(a.body) == hashlib.sha256(h + kept).digest()
            assert tail == kept
        finally:
            for c in clients:
                await c.close()
            for s in servers:
                await s.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_request_times_out_and_a_lost_connection_fails_the_waiting_ones(loop: str) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        server = await digest_server("n1", gate)
        client = PeerClient("g", "n0", "n1", f"127.0.0.1:{server.port}", FaultLayer())
        try:
            with pytest.raises(PeerError, match=r"did not answer PUSH within 0\.1 s"):
                await client.request(MsgType.PUSH, b"h", 0.1, b"entries")
            assert not client._waiting
            waiting = asyncio.get_running_loop().create_task(client.request(MsgType.PUSH, b"h", 30.0, b"entries"))
            await wait_until(lambda: len(client._waiting) == 1, 5.0, "the request waiting")
            await server.close()
            with pytest.raises(PeerError, match="connection to peer n1 lost"):
                await waiting
            assert not client._waiting
        finally:
            await client.close()
            await server.close()

    LOOPS[loop](main())


def test_a_blocked_peer_gets_nothing() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        gate.set()
        server = await digest_server("n1", gate)
        faults = FaultLayer()
        client = PeerClient("g", "n0", "n1", f"127.0.0.1:{server.port}", faults)
        try:
            assert bytes((await client.request(MsgType.PUSH, b"h", 5.0, b"e")).body) == hashlib.sha256(b"he").digest()
            faults.block("n1")
            with pytest.raises(PeerError, match="blocked"):
                await client.request(MsgType.PUSH, b"h", 5.0, b"e")
            faults.heal()
            faults.delay_s["n1"] = 0.01
            assert bytes((await client.request(MsgType.PUSH, b"h", 5.0, b"e")).body) == hashlib.sha256(b"he").digest()
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())
