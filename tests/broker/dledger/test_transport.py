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
from broker.dledger.transport import PeerClient, PeerError, PeerServer, serve_peers
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

    return await serve_peers("127.0.0.1", 0, group="g", self_id=self_id, peers=PEERS, handler=handler)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_one_tail_buffer_reaches_two_peers_whole_through_partial_writes(loop: str) -> None:
    """The same 16 MiB of entries (one bytes object) pushed to two peers at once, more than a socket takes in one
    write: each peer gets exactly head + entries, and the buffer is not changed by being sent."""
    tail = os.urandom(16 << 20)
    kept = bytes(tail)

    async def main() -> None:
        gate = asyncio.Event()
        servers = [await digest_server(p, gate) for p in ("n1", "n2")]
        clients = [PeerClient("g", "n0", p, f"127.0.0.1:{s.port}")
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


async def _fails_when_the_server_closes(client: PeerClient, server: PeerServer, waiting: Awaitable[object]) -> None:
    """Closing the server fails the request waiting on it, and the client forgets it."""
    await server.close()
    with pytest.raises(PeerError, match="connection to peer n1 lost"):
        await waiting
    assert not client._waiting


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_request_times_out_and_a_lost_connection_fails_the_waiting_ones(loop: str) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        server = await digest_server("n1", gate)
        client = PeerClient("g", "n0", "n1", f"127.0.0.1:{server.port}")
        try:
            with pytest.raises(PeerError, match=r"did not answer PUSH within 0\.1 s"):
                await client.request(MsgType.PUSH, b"h", 0.1, b"entries")
            assert not client._waiting
            waiting = asyncio.get_running_loop().create_task(client.request(MsgType.PUSH, b"h", 30.0, b"entries"))
            await wait_until(lambda: len(client._waiting) == 1, 5.0, "the request waiting")
            await _fails_when_the_server_closes(client, server, waiting)
        finally:
            await client.close()
            await server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_send_writes_at_once_and_its_future_ends_like_a_request(loop: str) -> None:
    """:meth:`PeerClient.send` (the leader's pushes, no task): None when it cannot go at once (not connected: the
    caller uses ``request``); else the answer, a timeout or a lost connection in its future, and the request
    forgotten in every case (cancelled too)."""
    async def main() -> None:
        gate = asyncio.Event()
        server = await digest_server("n1", gate)
        client = PeerClient("g", "n0", "n1", f"127.0.0.1:{server.port}")
        try:
            assert client.send(MsgType.PUSH, b"h", 5.0, b"e") is None  # not connected yet
            await client._connect()
            timing_out = client.send(MsgType.PUSH, b"h", 0.1, b"e")
            assert timing_out is not None
            with pytest.raises(PeerError, match=r"did not answer PUSH within 0\.1 s"):
                await timing_out
            cancelled = client.send(MsgType.PUSH, b"h", 30.0, b"e")
            assert cancelled is not None and len(client._waiting) == 1
            cancelled.cancel()
            await wait_until(lambda: not client._waiting, 5.0, "the cancelled request forgotten")
            gate.set()
            answered = client.send(MsgType.PUSH, b"head", 30.0, b"entries")
            assert answered is not None
            assert bytes((await answered).body) == hashlib.sha256(b"headentries").digest()
            assert not client._waiting
            gate.clear()
            lost = client.send(MsgType.PUSH, b"h", 30.0, b"e")
            assert lost is not None
            await wait_until(lambda: len(server.connections) == 1, 5.0, "the connection open")
            await _fails_when_the_server_closes(client, server, lost)
        finally:
            await client.close()
            await server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_handler_answers_at_once_later_or_by_raising_and_the_connection_serves_on(loop: str) -> None:
    """A handler may return its answer (written in the same read step, no task), an awaitable of it (answered when
    it completes, after later requests), or raise (logged; the request goes unanswered and the connection keeps
    serving)."""
    async def main() -> None:
        later: asyncio.Future[tuple[MsgType, bytes]] = asyncio.get_running_loop().create_future()
        seen: list[bytes] = []

        def handler(peer: str, f: Frame) -> tuple[MsgType, bytes] | Awaitable[tuple[MsgType, bytes]]:
            body = bytes(f.body)
            seen.append(body)
            if body == b"later":
                return later
            if body == b"boom":
                raise RuntimeError("handler bug")
            return MsgType.PUSH_REPLY, b"now:" + body

        server = await serve_peers("127.0.0.1", 0, group="g", self_id="n1", peers=PEERS, handler=handler)
        client = PeerClient("g", "n0", "n1", f"127.0.0.1:{server.port}")
        try:
            waiting = asyncio.get_running_loop().create_task(client.request(MsgType.PUSH, b"later", 5.0))
            assert bytes((await client.request(MsgType.PUSH, b"a", 5.0)).body) == b"now:a"
            assert not waiting.done()  # the at-once answer overtook the one still waiting
            with pytest.raises(PeerError, match="did not answer"):
                await client.request(MsgType.PUSH, b"boom", 0.2)
            later.set_result((MsgType.PUSH_REPLY, b"done later"))
            assert bytes((await waiting).body) == b"done later"
            assert bytes((await client.request(MsgType.PUSH, b"c", 5.0)).body) == b"now:c"
            assert sorted(seen) == [b"a", b"boom", b"c", b"later"]
        finally:
            await client.close()
            await server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize(("n1_at", "admitted"), [("127.0.0.1:9", True), ("10.9.9.9:9", False), ("x:9", True)])
def test_without_a_secret_a_member_is_known_by_its_address(n1_at: str, admitted: bool) -> None:
    """Issue 39: without haAuthSecret a HELLO naming n1 must come from n1's address in dLegerPeers (an IP entry;
    a name is not resolved); a stranger claiming to be n1 from elsewhere gets no request answered."""
    async def handler(peer: str, f: Frame) -> tuple[MsgType, bytes]:
        return MsgType.PUSH_REPLY, b"ok"

    async def main() -> None:
        peers = {"n0": "127.0.0.1:1", "n1": n1_at}
        server = await serve_peers("127.0.0.1", 0, group="g", self_id="n0", peers=peers, handler=handler)
        client = PeerClient("g", "n1", "n0", f"127.0.0.1:{server.port}")
        try:
            if admitted:
                assert (await client.request(MsgType.PUSH, b"x", 5.0)).body == b"ok"
            else:
                with pytest.raises(PeerError):
                    await client.request(MsgType.PUSH, b"x", 5.0)
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())
