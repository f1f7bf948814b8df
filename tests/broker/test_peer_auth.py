"""The cluster-secret handshake of the HA and DLedger peer ports (broker/peer_auth.py): the state machines as
tables (every message split every way, every kind of bad byte), a known vector, the async driver's bounds, the
rate-limited log and the start-up warnings."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from collections.abc import Callable

import pytest

from broker.peer_auth import (
    CHALLENGE_SIZE,
    MAGIC,
    PROOF_SIZE,
    RESPONSE_SIZE,
    ChannelKind,
    ClientHandshake,
    HandshakeError,
    RateLimitedLog,
    ServerHandshake,
    run_handshake,
    startup_warnings,
)

SECRET = b"correct horse battery staple"
NS, NC = bytes(range(16)), bytes(range(100, 116))


def fixed(nonce: bytes) -> Callable[[int], bytes]:
    return lambda n: nonce[:n]


def pair(server_secret: bytes = SECRET, client_secret: bytes = SECRET, *, server_kind: ChannelKind = ChannelKind.HA,
         client_kind: ChannelKind = ChannelKind.HA) -> tuple[ServerHandshake, ClientHandshake]:
    return (ServerHandshake(server_secret, server_kind, nonces=fixed(NS)),
            ClientHandshake(client_secret, client_kind, nonces=fixed(NC)))


def exchange(server: ServerHandshake, client: ClientHandshake, chunk: int) -> tuple[bytes, bytes, bytes]:
    """Run both sides against each other, every message fed in pieces of ``chunk`` bytes."""
    def feed(side: ServerHandshake | ClientHandshake, data: bytes) -> bytes:
        out = b""
        for i in range(0, len(data), chunk):
            got = side.feed(data[i : i + chunk])
            assert not (out and got), "one output per message"
            out += got
        return out

    challenge = server.start()
    assert client.start() == b""
    response = feed(client, challenge)
    proof = feed(server, response)
    assert feed(client, proof) == b""
    return challenge, response, proof


@pytest.mark.parametrize("chunk", [1, 3, 7, 22, 54, 1000])
@pytest.mark.parametrize("kind", list(ChannelKind))
def test_same_secret_both_sides_done_whatever_the_split(chunk: int, kind: ChannelKind) -> None:
    server, client = pair(server_kind=kind, client_kind=kind)
    assert (server.want, client.want) == (RESPONSE_SIZE, CHALLENGE_SIZE)
    challenge, response, proof = exchange(server, client, chunk)
    assert (len(challenge), len(response), len(proof)) == (CHALLENGE_SIZE, RESPONSE_SIZE, PROOF_SIZE) == (22, 54, 32)
    assert server.done and client.done and server.want == client.want == 0
    # The bytes on the wire, computed here from the format in the module docstring (a known vector).
    assert challenge == MAGIC + bytes([2, kind]) + NS
    # Version 2 binds both proofs to the server's address (here the empty name both sides default to).
    mac_c = hmac.new(SECRET, b"splitmq-ha client\x00" + bytes([kind]) + NS + NC + b"\x00\x00", hashlib.sha256).digest()
    assert response == MAGIC + bytes([2, kind]) + NC + mac_c
    assert proof == hmac.new(SECRET, b"splitmq-ha server\x00" + bytes([kind]) + NC + NS + b"\x00\x00",
                             hashlib.sha256).digest()
    assert SECRET not in challenge + response + proof


def _response(secret: bytes = SECRET, ns: bytes = NS, kind: int = ChannelKind.HA, version: int = 2) -> bytes:
    mac = hmac.new(secret, b"splitmq-ha client\x00" + bytes([kind]) + ns + NC + b"\x00\x00", hashlib.sha256).digest()
    return MAGIC + bytes([version, kind]) + NC + mac


# What a server is fed -> the error it gives, and after how many bytes it gives it (fail fast on junk).
SERVER_CASES = [
    ("eight zero bytes (the old attack)", bytes(8), "does not start with b'SMQA'", 1),
    ("an old slave's first report", (12345).to_bytes(8, "big"), "does not start with", 1),
    ("HTTP", b"GET / HTTP/1.1\r\n\r\n", "does not start with", 1),
    ("a DLedger frame", b"\x00\x00\x00\x0c\x44\x4c\x01\x01" + bytes(8), "does not start with", 1),
    ("the magic's first bytes, then junk", b"SMQ!" + bytes(50), "got b'SMQ!'", 4),
    ("another version", _response(version=1), "version 1", 5),
    ("the other port's kind", _response(kind=ChannelKind.DLEDGER), "channel kind 2", 6),
    ("a wrong secret", _response(secret=b"wrong"), "client's proof is wrong", RESPONSE_SIZE),
    ("a replay (another connection's nonce)", _response(ns=bytes(16)), "client's proof is wrong", RESPONSE_SIZE),
    # In one read: the client spoke before it read the proof (one byte at a time these are a good response and
    # then the data path's bytes, which the caller no longer feeds to the handshake).
    ("the right response and one byte more", _response() + b"\x00", "55 bytes where the response has 54", None),
    ("the right response and a report", _response() + bytes(8), "62 bytes", None),
]


@pytest.mark.parametrize(("what", "data", "error", "fails_after"), SERVER_CASES, ids=[c[0] for c in SERVER_CASES])
def test_the_server_refuses(what: str, data: bytes, error: str, fails_after: int | None) -> None:
    # Fed whole: the error names the problem.
    server, _ = pair()
    server.start()
    with pytest.raises(HandshakeError, match=re.escape(error)):
        server.feed(data)
    assert not server.done and server.want == 0
    with pytest.raises(HandshakeError, match="already failed"):  # a failed handshake stays failed
        server.feed(_response())
    if fails_after is None:
        return
    # Fed a byte at a time: it fails at the first byte that proves the peer wrong, not at the timeout.
    server, _ = pair()
    server.start()
    for i in range(len(data)):
        try:
            server.feed(data[i : i + 1])
        except HandshakeError:
            assert i + 1 == fails_after, (what, i + 1)
            break
    else:
        raise AssertionError(f"{what}: accepted")
    assert not server.done


def _challenge(kind: int = ChannelKind.HA, magic: bytes = MAGIC, version: int = 2) -> bytes:
    return magic + bytes([version, kind]) + NS


CLIENT_CASES = [
    ("a master without a secret (a heartbeat frame)", [bytes(12)], "does not start with"),
    ("another version", [_challenge(version=9)], "version 9"),
    ("the other port's kind", [_challenge(kind=ChannelKind.DLEDGER)], "channel kind 2"),
    ("a challenge and frames before the proof", [_challenge() + bytes(12)], "34 bytes where the challenge has 22"),
    ("a wrong proof", [_challenge(), bytes(32)], "server's proof is wrong"),
    ("a proof from another secret", [_challenge(), hmac.new(b"wrong", b"splitmq-ha server\x00\x01" + NC + NS + b"\x00\x00",
                                                            hashlib.sha256).digest()], "server's proof is wrong"),
    ("the proof and log bytes", [_challenge(), bytes(40)], "40 bytes where the proof has 32"),
]


@pytest.mark.parametrize(("what", "messages", "error"), CLIENT_CASES, ids=[c[0] for c in CLIENT_CASES])
def test_the_client_refuses(what: str, messages: list[bytes], error: str) -> None:
    _, client = pair()
    with pytest.raises(HandshakeError, match=error):
        for m in messages:
            client.feed(m)
    assert not client.done


def test_the_client_sends_nothing_that_would_help_a_fake_server_with_another_kind() -> None:
    # A response is bound to the kind: an HA client's answer does not open a DLedger server and the reverse.
    for server_kind, client_kind in [(ChannelKind.HA, ChannelKind.DLEDGER), (ChannelKind.DLEDGER, ChannelKind.HA)]:
        server, client = pair(server_kind=server_kind, client_kind=client_kind)
        with pytest.raises(HandshakeError, match="channel kind"):
            client.feed(server.start())


def test_a_server_with_a_wrong_secret_fails_the_client_and_the_reverse() -> None:
    server, client = pair(server_secret=b"other secret")
    response = client.feed(server.start())
    with pytest.raises(HandshakeError, match="client's proof is wrong"):
        server.feed(response)
    # A fake server that answers anything (it cannot compute the proof) is refused by the client.
    _, client = pair()
    client.feed(ServerHandshake(b"other secret", ChannelKind.HA, nonces=fixed(NS)).start())
    with pytest.raises(HandshakeError, match="server's proof is wrong"):
        client.feed(bytes(32))


def test_bytes_after_the_handshake_are_refused() -> None:
    server, client = pair()
    exchange(server, client, 1000)
    with pytest.raises(HandshakeError, match="after the handshake ended"):
        server.feed(b"x")
    with pytest.raises(HandshakeError, match="after the handshake ended"):
        client.feed(b"x")


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="non-empty secret"):
        ServerHandshake(b"", ChannelKind.HA)
    with pytest.raises(ValueError, match="nonce source gave 3 bytes"):
        ClientHandshake(SECRET, ChannelKind.HA, nonces=lambda n: b"abc")
    # The default source gives fresh nonces: two challenges differ.
    assert ServerHandshake(SECRET, ChannelKind.HA).start() != ServerHandshake(SECRET, ChannelKind.HA).start()


# --- the async driver -------------------------------------------------------------------------------------


class Pipe:
    """One direction of an in-memory connection."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()

    async def write(self, data: bytes) -> None:
        self.reader.feed_data(data)


def test_run_handshake_between_two_tasks() -> None:
    async def main() -> None:
        to_server, to_client = Pipe(), Pipe()
        server, client = pair()
        await asyncio.gather(run_handshake(server, to_server.reader.read, to_client.write, 1.0),
                             run_handshake(client, to_client.reader.read, to_server.write, 1.0))
        assert server.done and client.done
        # Nothing read past the handshake: what the client sends next is still there for the data path.
        await to_server.write(b"report!!")
        assert await to_server.reader.readexactly(8) == b"report!!"

    asyncio.run(main())


def test_run_handshake_is_bounded_and_reports_eof() -> None:
    async def main() -> None:
        silent = Pipe()
        sent: list[bytes] = []

        async def keep(data: bytes) -> None:
            sent.append(data)

        with pytest.raises(HandshakeError, match=r"did not finish within 0\.1 s"):
            await run_handshake(ServerHandshake(SECRET, ChannelKind.HA), silent.reader.read, keep, 0.1)
        assert [len(b) for b in sent] == [CHALLENGE_SIZE]  # the challenge, and nothing else
        gone = Pipe()
        gone.reader.feed_data(b"SMQ")
        gone.reader.feed_eof()
        with pytest.raises(HandshakeError, match="closed the connection during the handshake"):
            await run_handshake(ClientHandshake(SECRET, ChannelKind.HA), gone.reader.read, keep, 1.0)

    asyncio.run(main())


def test_rate_limited_log(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    rl = RateLimitedLog(logging.getLogger("test.peer_auth"), 1.0, clock_s=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.peer_auth"):
        assert rl.note("a") is True
        assert [rl.note("b") for _ in range(5)] == [False] * 5
        now[0] += 0.99
        assert rl.note("c") is False
        now[0] += 0.01
        assert rl.note("d") is True
    assert [r.getMessage() for r in caplog.records] == ["a", "d (and 6 more since the last such line)"]


@pytest.mark.parametrize(("secret", "acl", "dledger", "expect"), [
    ("", False, False, []),  # a local cluster: today's behaviour, quietly
    ("", True, False, ["aclEnable=true but haAuthSecret is empty: the HA port is OPEN"]),
    ("", True, True, ["the DLedger peer port is OPEN", "or push entries"]),
    ("tiny-pw", False, False, ["shorter than 16 bytes"]),
    ("tiny-pw", True, True, ["shorter than 16 bytes", "DLedger peer port"]),
    ("0123456789abcdef", True, False, []),
])
def test_startup_warnings(secret: str, acl: bool, dledger: bool, expect: list[str]) -> None:
    got = startup_warnings(secret=secret, acl_enable=acl, dledger=dledger)
    assert len(got) == (1 if expect else 0)
    for needle in expect:
        assert needle in got[0]
    assert not secret or all(secret not in w for w in got)  # the secret itself is never logged
