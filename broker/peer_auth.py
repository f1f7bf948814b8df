"""The cluster-secret handshake of the HA and DLedger peer ports (issue 14 item 4). The state machines and the
byte format are pure (no sockets, no clock); :func:`run_handshake` drives one over any read / write pair.

Without it, whoever reaches a master's HA port gets its whole commit log for eight zero bytes, and whoever
reaches a DLedger peer port can push entries or votes. With ``haAuthSecret`` set, both sides of every HA and
peer connection prove they know the secret before a byte of the log moves; the secret never crosses the wire.

The server (the side that accepted) speaks first; each side sends only after it has read the other's whole
message, so neither may send a byte past its last message before the handshake ends. Big-endian::

    server -> client  CHALLENGE  (22 bytes)
        MAGIC "SMQA" 4 | VERSION u8 = 1 | KIND u8 | Ns 16 random bytes
    client -> server  RESPONSE   (54 bytes)
        MAGIC "SMQA" 4 | VERSION u8 = 1 | KIND u8 | Nc 16 random bytes | MACc 32
    server -> client  PROOF      (32 bytes)
        MACs 32

    MACc = HMAC-SHA256(secret, "splitmq-ha client" 0x00 | KIND | Ns | Nc | SERVER)
    MACs = HMAC-SHA256(secret, "splitmq-ha server" 0x00 | KIND | Nc | Ns | SERVER)

    SERVER = len u16 | the server's address as the client dialled it (``ip:port`` of the connection's peer)

* Fresh nonces on both sides: a recorded exchange is worth nothing on the next connection, in either direction.
* Bound to the server dialled (version 2, issue 39): the client's proof names the address its connection goes to,
  and the server accepts it only for an address that is its own (the connection's local address, or one it
  advertises). An impostor that relays the handshake between a slave and the real master -- so that it could
  read the log, or inject frames once "authenticated" -- is refused: the slave's proof names the impostor.
* Different labels per side: a server never computes what a client must prove, so it cannot be used as an
  oracle against itself (reflection); ``KIND`` keeps an HA proof from opening a peer port and the reverse.
* Each MAC is compared in constant time (:func:`hmac.compare_digest`).
* A wrong magic fails at the first byte that differs, so junk (today's eight zero bytes) is refused at once
  rather than at the timeout; more bytes than the current message holds fail at once too (the size bound).

The handshake authenticates the two ends when the connection opens. It does not protect the stream after it
from someone on the path (that is TLS, issue 14 item 5), and it costs nothing after it: the data path is the
plain protocol of the channel.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import logging
import secrets
import struct
import time
from collections.abc import Awaitable, Callable

__all__ = [
    "CHALLENGE_SIZE",
    "MAGIC",
    "MIN_SECRET_BYTES",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "RESPONSE_SIZE",
    "VERSION",
    "ChannelKind",
    "ClientHandshake",
    "HandshakeError",
    "NonceSource",
    "RateLimitedLog",
    "ServerHandshake",
    "addr_name",
    "client_mac",
    "run_handshake",
    "server_mac",
    "startup_warnings",
]

MAGIC = b"SMQA"
VERSION = 2
NONCE_SIZE = 16
MAC_SIZE = 32
_HEAD = struct.Struct(">4sBB")  # magic, version, kind
CHALLENGE_SIZE = _HEAD.size + NONCE_SIZE  # 22
RESPONSE_SIZE = _HEAD.size + NONCE_SIZE + MAC_SIZE  # 54
PROOF_SIZE = MAC_SIZE  # 32
#: Shorter secrets are accepted with a warning at start: the secret is the only thing between the network and
#: the log.
MIN_SECRET_BYTES = 16

_CLIENT_LABEL = b"splitmq-ha client\x00"
_SERVER_LABEL = b"splitmq-ha server\x00"

#: ``n -> n random bytes`` (``secrets.token_bytes``; tests inject a fixed source).
NonceSource = Callable[[int], bytes]


class HandshakeError(ValueError):
    """The peer failed the handshake: wrong magic, version or kind, a wrong MAC, too many bytes, or it went away
    (the message says which, never anything about the secret)."""


class ChannelKind(enum.IntEnum):
    """Which port a handshake opens; part of both MACs."""

    HA = 1
    DLEDGER = 2


def _server_field(server: str) -> bytes:
    name = server.encode("utf-8")[:1024]
    return len(name).to_bytes(2, "big") + name


def client_mac(secret: bytes, kind: ChannelKind, server_nonce: bytes, client_nonce: bytes, server: str = "") -> bytes:
    """What the client proves: ``HMAC-SHA256(secret, "splitmq-ha client" 0 | kind | Ns | Nc | server)``."""
    return hmac.digest(secret, _CLIENT_LABEL + bytes([kind]) + server_nonce + client_nonce + _server_field(server),
                       hashlib.sha256)


def server_mac(secret: bytes, kind: ChannelKind, server_nonce: bytes, client_nonce: bytes, server: str = "") -> bytes:
    """What the server proves: ``HMAC-SHA256(secret, "splitmq-ha server" 0 | kind | Nc | Ns | server)``."""
    return hmac.digest(secret, _SERVER_LABEL + bytes([kind]) + client_nonce + server_nonce + _server_field(server),
                       hashlib.sha256)


def addr_name(addr: object) -> str:
    """``ip:port`` (``[ip]:port`` for IPv6) of a socket address tuple, as both ends of the handshake spell it."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr)


class _Handshake:
    """What both sides share: a receive buffer checked against the size and magic of the message expected."""

    __slots__ = ("_buf", "_failed", "_kind", "_secret", "_want", "done")

    def __init__(self, secret: bytes, kind: ChannelKind, want: int) -> None:
        if not secret:
            raise ValueError("the handshake needs a non-empty secret")
        self._secret = secret
        self._kind = kind
        self._want = want
        self._buf = bytearray()
        self._failed = ""
        self.done = False
        """True once the peer proved it knows the secret (and, on the server, the proof is returned)."""

    @property
    def want(self) -> int:
        """Bytes still missing from the message expected now (0 when done or failed)."""
        return 0 if self.done or self._failed else self._want - len(self._buf)

    def _fail(self, why: str) -> HandshakeError:
        self._failed = why
        return HandshakeError(why)

    def _take(self, data: bytes | bytearray | memoryview, what: str, has_head: bool) -> bytes | None:
        """Add ``data``; the whole message once complete, else None.

        Raises:
            HandshakeError: already ended, more bytes than the message, or a head that is not ours.
        """
        if self._failed:
            raise HandshakeError(f"the handshake already failed: {self._failed}")
        if self.done:
            raise self._fail(f"{len(data)} bytes after the handshake ended")
        self._buf += data
        if has_head:
            self._check_head(what)
        if len(self._buf) > self._want:
            raise self._fail(f"{len(self._buf)} bytes where the {what} has {self._want} (the peer may not send "
                             f"before it has read the other side's message)")
        if len(self._buf) < self._want:
            return None
        msg = bytes(self._buf)
        self._buf.clear()
        return msg

    def _check_head(self, what: str) -> None:
        got = bytes(self._buf[: _HEAD.size])
        magic = got[:4]
        if magic != MAGIC[: len(magic)]:
            raise self._fail(f"the {what} does not start with {MAGIC!r} (got {magic!r}): not a SplitMQ peer with "
                             f"haAuthSecret set")
        if len(got) > 4 and got[4] != VERSION:
            raise self._fail(f"{what} version {got[4]}, this side speaks {VERSION}")
        if len(got) > 5 and got[5] != self._kind:
            raise self._fail(f"{what} for channel kind {got[5]}, this is {self._kind.name} ({int(self._kind)})")


class ServerHandshake(_Handshake):
    """The accepting side: :meth:`start` gives the challenge to send; :meth:`feed` the client's bytes (any split)
    until it returns the proof to send, with :attr:`done` True.

    Args:
        secret: the cluster secret.
        kind: the port.
        nonces: random source of the server nonce.
        names: the addresses this server answers to (:func:`addr_name` of the connection's local address, and the
            address it advertises): the client's proof must name one of them.
    """

    __slots__ = ("_names", "_nonce", "server")

    def __init__(self, secret: bytes, kind: ChannelKind, *, nonces: NonceSource = secrets.token_bytes,
                 names: tuple[str, ...] = ("",)) -> None:
        super().__init__(secret, kind, RESPONSE_SIZE)
        self._names = names
        self.server = ""
        """The name the client's proof named (once done)."""
        self._nonce = nonces(NONCE_SIZE)
        if len(self._nonce) != NONCE_SIZE:
            raise ValueError(f"nonce source gave {len(self._nonce)} bytes, not {NONCE_SIZE}")

    def start(self) -> bytes:
        """The CHALLENGE: send it first."""
        return _HEAD.pack(MAGIC, VERSION, self._kind) + self._nonce

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """The client's bytes; returns what to send (the PROOF once the RESPONSE checked out, else ``b""``).

        Raises:
            HandshakeError: the client failed (the connection must be closed and sent nothing more).
        """
        msg = self._take(data, "response", has_head=True)
        if msg is None:
            return b""
        client_nonce = msg[_HEAD.size : _HEAD.size + NONCE_SIZE]
        proof = msg[_HEAD.size + NONCE_SIZE :]
        for name in self._names:
            if hmac.compare_digest(client_mac(self._secret, self._kind, self._nonce, client_nonce, name), proof):
                break
        else:
            raise self._fail(f"the client's proof is wrong: a different haAuthSecret, or it dialled another address "
                             f"than this server's {', '.join(self._names)} (a relay?)")
        self.done = True
        self.server = name
        return server_mac(self._secret, self._kind, self._nonce, client_nonce, name)


class ClientHandshake(_Handshake):
    """The connecting side: :meth:`feed` the server's bytes (any split); it returns the RESPONSE to send once the
    challenge is complete, and sets :attr:`done` once the server's proof checked out.

    Args:
        secret: the cluster secret.
        kind: the port.
        nonces: random source of the client nonce.
        server: :func:`addr_name` of the address the connection goes to (its socket's peer).
    """

    __slots__ = ("_nonce", "_server", "_server_nonce")

    def __init__(self, secret: bytes, kind: ChannelKind, *, nonces: NonceSource = secrets.token_bytes,
                 server: str = "") -> None:
        super().__init__(secret, kind, CHALLENGE_SIZE)
        self._server = server
        self._nonce = nonces(NONCE_SIZE)
        if len(self._nonce) != NONCE_SIZE:
            raise ValueError(f"nonce source gave {len(self._nonce)} bytes, not {NONCE_SIZE}")
        self._server_nonce = b""

    def start(self) -> bytes:
        """Nothing: the server speaks first."""
        return b""

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """The server's bytes; returns what to send (the RESPONSE after the challenge, else ``b""``).

        Raises:
            HandshakeError: the server failed; trust nothing it sends.
        """
        if not self._server_nonce:
            msg = self._take(data, "challenge", has_head=True)
            if msg is None:
                return b""
            self._server_nonce = msg[_HEAD.size :]
            self._want = PROOF_SIZE
            mac = client_mac(self._secret, self._kind, self._server_nonce, self._nonce, self._server)
            return _HEAD.pack(MAGIC, VERSION, self._kind) + self._nonce + mac
        msg = self._take(data, "proof", has_head=False)
        if msg is None:
            return b""
        if not hmac.compare_digest(server_mac(self._secret, self._kind, self._server_nonce, self._nonce,
                                              self._server), msg):
            raise self._fail("the server's proof is wrong (a different haAuthSecret?)")
        self.done = True
        return b""


async def run_handshake(hs: ServerHandshake | ClientHandshake, read: Callable[[int], Awaitable[bytes]],
                        write: Callable[[bytes], Awaitable[None]], timeout_s: float) -> None:
    """Drive ``hs`` to its end over a connection, never reading a byte of what follows the handshake.

    Args:
        hs: a fresh handshake.
        read: ``n -> 1..n bytes`` as they arrive, ``b""`` at EOF (what arrived is fed at once, so junk fails at
            its first wrong byte, not at the timeout).
        write: sends bytes.
        timeout_s: bound on the whole handshake.

    Raises:
        HandshakeError: the peer failed it, went away or did not finish within ``timeout_s``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            out = hs.start()
            if out:
                await write(out)
            while not hs.done:
                data = await read(hs.want)
                if not data:
                    raise HandshakeError("the peer closed the connection during the handshake (it refused this "
                                         "side's proof -- a different haAuthSecret? -- or it is not a SplitMQ peer "
                                         "with haAuthSecret set)")
                out = hs.feed(data)
                if out:
                    await write(out)
    except TimeoutError:
        raise HandshakeError(f"the handshake did not finish within {timeout_s:.1f} s (is haAuthSecret set on "
                             f"both sides?)") from None
    except (ConnectionError, OSError) as exc:
        raise HandshakeError(f"the connection failed during the handshake ({exc or type(exc).__name__})") from None


class RateLimitedLog:
    """Warnings at most once per ``period_s``, with the count of those left out: a flood must not flood the log.

    Args:
        logger: where to log.
        period_s: smallest gap between two lines.
        clock_s: monotonic clock in seconds (injected in tests).
    """

    def __init__(self, logger: logging.Logger, period_s: float = 1.0,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._period_s = period_s
        self._clock_s = clock_s
        self._last = -1e18
        self._skipped = 0

    def note(self, message: str) -> bool:
        """Log ``message`` unless a line went out less than ``period_s`` ago; True when logged."""
        now = self._clock_s()
        if now - self._last < self._period_s:
            self._skipped += 1
            return False
        more = f" (and {self._skipped} more since the last such line)" if self._skipped else ""
        self._log.warning("%s%s", message, more)
        self._last, self._skipped = now, 0
        return True


def startup_warnings(*, secret: str, acl_enable: bool, dledger: bool, protected: bool = False) -> list[str]:
    """What a broker says once at start about its HA / peer port (pure, so the rule is table-tested).

    Args:
        secret: ``haAuthSecret`` as configured.
        acl_enable: ``aclEnable``: clients must sign, so an open replication port would be the way around it.
        dledger: the port is the DLedger peer port rather than the HA port.
        protected: ``protectedMode``: without a secret the port serves loopback peers only.
    """
    port = "DLedger peer port" if dledger else "HA port"
    if not secret:
        if acl_enable and protected:
            return [f"SECURITY: aclEnable=true but haAuthSecret is empty: the {port} serves loopback peers only "
                    f"(protected mode), and any local process can read the whole commit log through it"
                    f"{' or push entries' if dledger else ''}. Set haAuthSecret (the same on every broker of the "
                    f"cluster)."]
        if acl_enable:
            return [f"SECURITY: aclEnable=true but haAuthSecret is empty: the {port} is OPEN -- anyone who reaches "
                    f"it can read the whole commit log{' or push entries' if dledger else ''}. Set haAuthSecret "
                    f"(the same on every broker of the cluster)."]
        return []
    if len(secret.encode()) < MIN_SECRET_BYTES:
        return [f"haAuthSecret is shorter than {MIN_SECRET_BYTES} bytes: use a long random value (e.g. "
                f"`openssl rand -hex 32`), it is all that guards the {port}."]
    return []
