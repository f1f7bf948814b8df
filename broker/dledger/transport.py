"""The DLedger peer transport: one TCP connection per ordered pair of peers, frames of
:mod:`broker.dledger.protocol`, requests answered in any order by request id. Runs in the owner's event loop.

* :class:`PeerClient` -- this member's requests to one peer: connects (bounded), passes the handshake (with a
  cluster secret), sends HELLO, then multiplexes requests; each waits at most its timeout; at most
  ``max_in_flight`` wait at once. A broken connection fails every waiting request and is re-made by the next
  request.
* :func:`serve_peers` -- accepts connections from peers; with a cluster secret the peer must first pass the
  handshake of :mod:`broker.peer_auth` (else it is closed having read nothing but the challenge); the first frame
  must be a HELLO naming this group, this member and a known peer (without a secret, one that connects from the
  address its ``dLegerPeers`` entry names), else the connection is logged and closed; then
  every request goes to the handler and its answer back. Garbage, truncated frames, absurd sizes: a log line and
  a closed connection. Connections that have not passed HELLO yet are *pending*: at most ``max_pending`` at once
  (a newcomer closes the oldest) and each closed after ``pending_timeout_s``, so junk cannot lock a peer out.
* :class:`PeerChannel` -- what a member's roles use of a :class:`PeerClient`; the member is handed a factory of
  them, so whoever builds it decides what carries its requests (the tests wrap a client to drop or delay traffic,
  in ``tests/broker/dledger/faults.py``; nothing here knows of faults).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import logging
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from broker.dledger.protocol import (
    Frame,
    FrameDecoder,
    Hello,
    MsgType,
    PeerProtocolError,
    decode_hello,
    encode_frame,
    encode_frame_parts,
    encode_hello,
)
from broker.ha.admission import is_loopback_peer, pending_to_evict_by_source
from broker.peer_auth import (
    ChannelKind,
    ClientHandshake,
    HandshakeError,
    NonceSource,
    RateLimitedLog,
    ServerHandshake,
    addr_name,
    run_handshake,
)
from common.tcp import tune_loopback
from common.tls import describe_tls_failure

__all__ = ["ChannelFactory", "PeerChannel", "PeerClient", "PeerError", "PeerServer", "RequestHandler", "serve_peers"]

log = logging.getLogger(__name__)

#: Bytes asked of the stream per read: a batch of entries (tens of KB, up to ``max_batch_bytes``) usually comes in
#: one read, and then reaches the handler without a copy (see :meth:`FrameDecoder.feed`).
_READ_BYTES = 1 << 18

#: ``(peer id, frame) -> (answer type, answer body)``, or an awaitable of it when the answer is not known yet: a
#: handler that answers at once spares the peer port a task and a loop turn per request (a follower answers most
#: PUSHes so); a coroutine function is a handler too.
RequestHandler = Callable[[str, Frame], tuple[MsgType, bytes] | Awaitable[tuple[MsgType, bytes]]]


class PeerError(ConnectionError):
    """A request to a peer failed: not connected, timed out, dropped, or the connection broke."""


class PeerChannel(Protocol):
    """This member's requests to one peer, as the roles use them (:class:`PeerClient` is the real one)."""

    @property
    def peer_id(self) -> str: ...

    async def request(self, msg_type: MsgType, body: bytes, timeout_s: float,
                      tail: bytes | memoryview = b"") -> Frame:
        """Send one request and wait for its answer (see :meth:`PeerClient.request`)."""
        ...

    def send(self, msg_type: MsgType, body: bytes, timeout_s: float,
             tail: bytes | memoryview = b"") -> asyncio.Future[Frame] | None:
        """Write one request now and return the future of its answer, or None when it cannot go at once (see
        :meth:`PeerClient.send`)."""
        ...

    async def close(self) -> None: ...


#: ``peer id -> channel`` to that peer: how a member gets its connections (made once per peer, at construction).
ChannelFactory = Callable[[str], PeerChannel]


class PeerClient:
    """Requests from this member to one peer.

    Args:
        group, self_id, peer_id, addr: who talks to whom (``addr`` is ``host:port``).
        connect_timeout_s: bound of a connection attempt.
        max_in_flight: requests waiting at once at most.
        max_frame_bytes: largest answer accepted.
        secret: the cluster secret (``haAuthSecret``); empty: no handshake.
        auth_timeout_s: bound on the handshake.
        nonces: random source of the handshake's nonce.
        tls: ``tlsEnable``: connect with TLS, verifying the peer's certificate with this context (None: plain
            TCP). The TLS handshake counts against ``connect_timeout_s``.
    """

    def __init__(self, group: str, self_id: str, peer_id: str, addr: str, *,
                 connect_timeout_s: float = 1.0, max_in_flight: int = 1024, max_frame_bytes: int = 32 << 20,
                 secret: bytes = b"", auth_timeout_s: float = 3.0, nonces: NonceSource = secrets.token_bytes,
                 tls: ssl.SSLContext | None = None) -> None:
        self.group, self.self_id, self.peer_id, self.addr = group, self_id, peer_id, addr
        self._tls = tls
        self._secret, self._auth_timeout_s, self._nonces = secret, auth_timeout_s, nonces
        self._auth_failures = RateLimitedLog(log)
        self._connect_timeout_s = connect_timeout_s
        self._max_in_flight = max_in_flight
        self._max_frame_bytes = max_frame_bytes
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            host, _, port = self.addr.rpartition(":")
            try:
                opening = (asyncio.open_connection(host, int(port)) if self._tls is None else
                           asyncio.open_connection(host, int(port), ssl=self._tls, server_hostname=host.strip("[]"),
                                                   ssl_handshake_timeout=self._connect_timeout_s))
                reader, writer = await asyncio.wait_for(opening, self._connect_timeout_s)
                tune_loopback(writer.get_extra_info("socket"))
            except ssl.SSLError as e:  # an OSError too: say it is TLS, the usual cause is the CA or the name
                why = describe_tls_failure(e, self.addr, "tlsCaFile") or str(e)
                self._auth_failures.note(f"peer {self.peer_id}: {why}; nothing sent to it")
                raise PeerError(f"peer {self.peer_id}: {why}") from None
            except (TimeoutError, OSError) as e:
                raise PeerError(f"cannot connect to peer {self.peer_id} at {self.addr}: {e or 'timeout'}") from None
            if self._secret:
                await self._authenticate(reader, writer)
            writer.write(encode_frame(MsgType.HELLO, 0, encode_hello(Hello(self.group, self.self_id, self.peer_id))))
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
            return writer

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The handshake before HELLO: a peer that cannot prove the secret gets no request (no entry, no vote).

        Raises:
            PeerError: the peer failed it (the connection is closed).
        """
        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            server = addr_name(writer.get_extra_info("peername"))  # the proof names the address dialled
            await run_handshake(ClientHandshake(self._secret, ChannelKind.DLEDGER, nonces=self._nonces, server=server),
                                reader.read, write, self._auth_timeout_s)
        except HandshakeError as e:
            writer.close()
            self._auth_failures.note(f"peer {self.peer_id} ({self.addr}) failed the handshake, nothing sent to it: "
                                     f"{e}")
            raise PeerError(f"peer {self.peer_id} at {self.addr} failed the handshake: {e}") from None
        except BaseException:
            writer.close()
            raise

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = FrameDecoder(self._max_frame_bytes)
        why = "closed by the peer"
        try:
            while True:
                data = await reader.read(_READ_BYTES)
                if not data:
                    break
                for f in dec.feed(data):
                    fut = self._waiting.pop(f.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(f)
        except PeerProtocolError as e:
            why = f"protocol error: {e}"
            log.warning("peer %s (%s) sent a bad frame, closing: %s", self.peer_id, self.addr, e)
        except (OSError, asyncio.IncompleteReadError) as e:
            why = str(e)
        finally:
            self._fail_all(why)
            writer.close()
            if self._writer is writer:
                self._writer = None

    def _fail_all(self, why: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(PeerError(f"connection to peer {self.peer_id} lost: {why}"))

    async def request(self, msg_type: MsgType, body: bytes, timeout_s: float,
                      tail: bytes | memoryview = b"") -> Frame:
        """Send one request (its body ``body + tail``: a PUSH head and its entries) and wait for its answer.

        ``tail`` is not copied: it goes to the socket after the frame header and ``body`` in one ``writelines``
        (one ``writev`` under uvloop; the transport keeps a view of what the socket did not take yet), so one
        buffer of entries can be pushed to every follower. It must not change until the answer (bytes do not).

        Connected, this awaits nothing but the answer: the leader makes two of these per batch of entries, and
        each await, lock and ``wait_for`` was CPU on the leader's one loop.

        Raises:
            PeerError: not connected, too many in flight, timed out, or lost.
        """
        if len(self._waiting) >= self._max_in_flight:
            raise PeerError(f"{len(self._waiting)} requests to peer {self.peer_id} already wait (max_in_flight)")
        writer = self._writer
        if writer is None or writer.is_closing():
            writer = await self._connect()
        return await self._write(writer, msg_type, body, timeout_s, tail)

    def send(self, msg_type: MsgType, body: bytes, timeout_s: float,
             tail: bytes | memoryview = b"") -> asyncio.Future[Frame] | None:
        """:meth:`request` without a coroutine (the leader's pushes: no task, no await per push): the request is
        written now and its answer arrives in the returned future -- a :class:`PeerError` in it when the peer does
        not answer within ``timeout_s`` or the connection is lost; cancelling it forgets the request.

        None when it cannot go at once: not connected, or ``max_in_flight`` requests wait (the caller then uses
        :meth:`request`, which connects or fails).
        """
        writer = self._writer
        if writer is None or writer.is_closing() or len(self._waiting) >= self._max_in_flight:
            return None
        return self._write(writer, msg_type, body, timeout_s, tail)

    def _write(self, writer: asyncio.StreamWriter, msg_type: MsgType, body: bytes, timeout_s: float,
               tail: bytes | memoryview) -> asyncio.Future[Frame]:
        """Write one request and return the future of its answer (what :meth:`request` awaits and :meth:`send`
        hands out): a PeerError in it after ``timeout_s``; done or cancelled, the request is forgotten."""
        rid = next(self._ids)
        if tail:
            writer.writelines(encode_frame_parts(msg_type, rid, body, tail))
        else:
            writer.write(encode_frame(msg_type, rid, body))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Frame] = loop.create_future()
        self._waiting[rid] = fut  # after the write: no answer can come in before this returns (one loop)
        timer = loop.call_later(timeout_s, self._timed_out, rid, msg_type, timeout_s)
        fut.add_done_callback(functools.partial(self._settled, rid, timer))
        return fut

    def _timed_out(self, rid: int, msg_type: MsgType, timeout_s: float) -> None:
        fut = self._waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(PeerError(f"peer {self.peer_id} did not answer {msg_type.name} within "
                                        f"{timeout_s:.1f} s"))

    def _settled(self, rid: int, timer: asyncio.TimerHandle, _fut: asyncio.Future[Frame]) -> None:
        timer.cancel()
        self._waiting.pop(rid, None)

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        task = self._reader_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_all("closed")


class PeerServer:
    """The listening peer port and its open connections."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and close every connection (a stopped member answers nobody)."""
        if self.server is not None:
            self.server.close()
        for w in list(self.connections):
            w.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)


async def serve_peers(host: str, port: int, *, group: str, self_id: str, peers: Mapping[str, str],
                      handler: RequestHandler, max_frame_bytes: int = 32 << 20,
                      max_connections: int = 64, max_pending: int = 16, pending_timeout_s: float = 3.0,
                      secret: bytes = b"", nonces: NonceSource = secrets.token_bytes,
                      sock: socket.socket | None = None, tls: ssl.SSLContext | None = None,
                      loopback_only: bool = False) -> PeerServer:
    """Listen for peers (on ``sock`` when given, already bound; ``port`` 0 lets the OS choose).

    Args:
        max_connections: peers past HELLO at once; one more is closed.
        max_pending: connections not past HELLO (nor the handshake) at once; a newcomer closes the oldest.
        pending_timeout_s: a connection not past HELLO within this is closed (it also bounds the handshake).
        secret: the cluster secret (``haAuthSecret``); empty: no handshake.
        nonces: random source of the handshake's nonce.
        tls: ``tlsEnable``: accept TLS only, with this context (None: plain TCP). asyncio runs the TLS handshake
            before a connection counts as pending, bounded by ``pending_timeout_s``; a peer that fails it is
            closed without a byte of the peer protocol.
        loopback_only: protected mode (no secret): a peer that is not a loopback address is closed at once.

    Pending connections are shared out by source address (:func:`broker.ha.admission.pending_to_evict_by_source`),
    so a flood from one address cannot push out a member's handshake from another; with a secret, the handshake
    names the address the member dialled, which must be this member's (its connection's local address or its
    ``peers`` entry).
    """
    ps = PeerServer()
    open_conns = ps.connections
    pending: dict[int, tuple[int, asyncio.StreamWriter, str]] = {}  # id -> (accept time ms, writer, source)
    established = [0]
    ids = itertools.count(1)
    refusals = RateLimitedLog(log)

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        remote = writer.get_extra_info("peername")
        source = str(remote[0]) if isinstance(remote, tuple) else str(remote)
        if loopback_only and not is_loopback_peer(source):
            refusals.note(f"peer port: closing {remote}: not a loopback address, and without haAuthSecret the "
                          "DLedger peer port serves loopback peers only (protected mode; set haAuthSecret on every "
                          "member, or protectedMode=false)")
            writer.close()
            return
        tune_loopback(writer.get_extra_info("socket"))
        for old in pending_to_evict_by_source({c: (since, src) for c, (since, _, src) in pending.items()}, source,
                                              max_pending):
            refusals.note(f"peer port: closing a connection that has not passed HELLO to admit {remote} "
                          f"(max_pending={max_pending}, shared out by source address)")
            pending.pop(old)[1].close()
        cid = next(ids)
        pending[cid] = (int(loop.time() * 1000), writer, source)
        open_conns.add(writer)
        # Closing the transport ends the reads below (EOF) wherever they wait.
        deadline = loop.call_later(pending_timeout_s, _close_if_pending, pending, cid, refusals, remote,
                                   pending_timeout_s)
        peer: str | None = None
        counted = False  # one of the ``established``
        tasks: set[asyncio.Task[None]] = set()

        async def answer(f: Frame, who: str, result: Awaitable[tuple[MsgType, bytes]]) -> None:
            """Write the answer once it is known."""
            try:
                msg_type, body = await result
            except Exception:
                log.exception("handling %s from peer %s failed", f.type.name, who)
                return
            if not writer.is_closing():
                writer.write(encode_frame(msg_type, f.request_id, body))

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            if secret:
                names = tuple(n for n in (addr_name(writer.get_extra_info("sockname")), peers.get(self_id)) if n)
                await run_handshake(ServerHandshake(secret, ChannelKind.DLEDGER, nonces=nonces, names=names),
                                    reader.read, write, pending_timeout_s)
            # Made only now: the decoder's buffer is max_frame_bytes (32 MiB), not for anyone who connects.
            dec = FrameDecoder(max_frame_bytes)
            while True:
                data = await reader.read(_READ_BYTES)
                if not data:
                    break
                for f in dec.feed(data):
                    if peer is None:
                        peer = _check_hello(f, group, self_id, peers, remote)
                        if not secret:
                            _check_source(peer, peers, source)
                        pending.pop(cid, None)
                        deadline.cancel()
                        if established[0] >= max_connections:
                            raise PeerProtocolError(f"{established[0]} peers connected (max_connections)")
                        established[0] += 1
                        counted = True
                        continue
                    if len(tasks) >= 1024:
                        raise PeerProtocolError("more than 1024 requests waiting on one connection")
                    try:
                        r = handler(peer, f)
                    except Exception:
                        log.exception("handling %s from peer %s failed", f.type.name, peer)
                        continue
                    if isinstance(r, tuple):
                        if not writer.is_closing():  # answered now: no task, no loop turn
                            writer.write(encode_frame(r[0], f.request_id, r[1]))
                        continue
                    if asyncio.iscoroutine(r):
                        # A task of its own, started now: closing the connection cancels it, and a connection
                        # closed before the answer task below ran cannot leave the coroutine never awaited.
                        inner = loop.create_task(r)
                        tasks.add(inner)
                        inner.add_done_callback(tasks.discard)
                        r = inner
                    t = loop.create_task(answer(f, peer, r))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
        except HandshakeError as e:
            if cid in pending:  # else it was closed here, as the oldest pending or past its deadline, and said so
                refusals.note(f"peer port: {remote} failed the handshake, closing it (no frame read from it): {e}")
        except PeerProtocolError as e:
            log.warning("peer port: closing the connection from %s (%s): %s", remote, peer or "before HELLO", e)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            deadline.cancel()
            if counted:
                established[0] -= 1
            pending.pop(cid, None)
            for t in tasks:
                t.cancel()
            open_conns.discard(writer)
            writer.close()
            # Until the transport has closed its socket: a loop that ends right after (a stopping member, a test)
            # would otherwise drop an open socket (a ResourceWarning, a descriptor until the GC runs).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    tls_kw: dict[str, Any] = {} if tls is None else {"ssl": tls, "ssl_handshake_timeout": pending_timeout_s}
    if sock is not None:
        ps.server = await asyncio.start_server(conn, sock=sock, **tls_kw)
    else:
        ps.server = await asyncio.start_server(conn, host, port, reuse_address=True, **tls_kw)
    return ps


def _close_if_pending(pending: dict[int, tuple[int, asyncio.StreamWriter, str]], cid: int, refusals: RateLimitedLog,
                      remote: object, timeout_s: float) -> None:
    entry = pending.pop(cid, None)
    if entry is not None:
        refusals.note(f"peer port: closing the connection from {remote}: no handshake and HELLO within "
                      f"{timeout_s:.1f} s")
        entry[1].close()


def _check_source(peer: str, peers: Mapping[str, str], source: str) -> None:
    """Without a secret, a HELLO's claim is checked against the address it came from: a member whose
    ``dLegerPeers`` entry is an IP address connects from that address (or, for a loopback entry, from loopback).
    A name is not resolved here, and a multi-homed member needs ``haAuthSecret`` (which proves who it is)."""
    host = peers[peer].rpartition(":")[0].strip("[]")
    try:
        want = ipaddress.ip_address(host)
    except ValueError:
        return
    try:
        got = ipaddress.ip_address(source.split("%", 1)[0])
    except ValueError:
        return
    if got != want and not (got.is_loopback and want.is_loopback):
        raise PeerProtocolError(f"HELLO as {peer} from {source}, but {peer} is at {host} (dLegerPeers); without "
                                "haAuthSecret a member is known by its address")


def _check_hello(f: Frame, group: str, self_id: str, peers: Mapping[str, str], remote: object) -> str:
    if f.type is not MsgType.HELLO:
        raise PeerProtocolError(f"first frame is {f.type.name}, not HELLO")
    h = decode_hello(f.body)
    if h.group != group:
        raise PeerProtocolError(f"HELLO for group {h.group!r}; this is group {group!r}")
    if h.to_id != self_id:
        raise PeerProtocolError(f"HELLO for peer {h.to_id!r}; this is {self_id!r}")
    if h.from_id not in peers or h.from_id == self_id:
        raise PeerProtocolError(f"HELLO from unknown peer {h.from_id!r} (peers: {sorted(peers)})")
    log.info("peer port: %s connected from %s", h.from_id, remote)
    return h.from_id
