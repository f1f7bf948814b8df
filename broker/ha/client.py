"""Slave side of classic HA (docs/BEHAVIOUR.md 2.6 with decisions 3 and 4): connect to the master's HA port, append
the streamed commit-log bytes at the same physical offsets, report progress.

One task per client runs the connection cycle (READY -> connect -> [handshake, with ``haAuthSecret``] -> TRANSFER
-> closed -> back-off -> READY).
Frames are handled in the socket's reader callback straight from the read buffer: consistency check, record
check (:class:`broker.store.records.ReplicaChecker`: only whole good records reach the log; a bad one closes the
link), append, one report per read (covering every frame in it). The cycle task only wakes every ``tick_ms`` for the idle
report (``ha_send_heartbeat_interval_ms``) and housekeeping (no bytes from the master for
``ha_housekeeping_interval_ms`` -> drop the link, HEAD semantics).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import broker.ha.tls_io as tls_io
from broker.ha.channel import SocketChannel
from broker.ha.config import HAConfig
from broker.ha.progress import Backoff
from broker.ha.protocol import FrameDecoder, encode_report
from broker.peer_auth import (
    ChannelKind,
    ClientHandshake,
    HandshakeError,
    NonceSource,
    RateLimitedLog,
    addr_name,
    run_handshake,
)
from broker.store.api import MessageStore
from broker.store.records import RecordViolation, ReplicaChecker
from common.codec import DEFAULT_MAX_MESSAGE_SIZE
from common.tls import describe_tls_failure

__all__ = ["HAClient", "HAOffsetMismatchError", "parse_ha_addr"]

log = logging.getLogger(__name__)


class HAOffsetMismatchError(ValueError):
    """The master sent a frame that does not continue the slave's commit log."""


def parse_ha_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:port"``) -> (host, port).

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535 (the message quotes the address).
    """
    host, sep, port_text = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"HA master address {addr!r} is not host:port")
    return host, int(port_text)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class HAClient:
    """The slave's replication client.

    Args:
        store: the slave's message store (``append_to_commitlog``, ``max_physical_offset``).
        config: HA settings.
        master_ha_addr: ``host:port`` of the master's HA listener, or None until the nameserver tells us.
        clock_ms: wall clock in ms (injected in tests); timestamps and housekeeping use it.
        rand: uniform [0, 1) source for the reconnect jitter (injected in tests).
        max_record_bytes: largest record accepted from the master (the broker's ``maxMessageSize``: a master
            stores nothing larger); also the bound on the bytes held of a record split across frames.
        nonces: random source of the handshake's nonce (with ``config.ha_auth_secret``; injected in tests).
    """

    def __init__(
        self,
        store: MessageStore,
        config: HAConfig,
        master_ha_addr: str | None,
        *,
        clock_ms: Callable[[], int] | None = None,
        rand: Callable[[], float] | None = None,
        max_record_bytes: int = DEFAULT_MAX_MESSAGE_SIZE,
        nonces: NonceSource = secrets.token_bytes,
    ) -> None:
        if master_ha_addr is not None:
            parse_ha_addr(master_ha_addr)
        self._store = store
        self._config = config
        self._clock_ms = clock_ms or _wall_clock_ms
        self._backoff = Backoff(
            config.reconnect_backoff_min_ms, config.reconnect_backoff_max_ms, rand or random.Random().random
        )
        self._decoder = FrameDecoder(config.ha_slave_read_buffer_bytes)
        self._max_record_bytes = max_record_bytes
        self._nonces = nonces
        self._auth_failures = RateLimitedLog(log)
        self._checker: ReplicaChecker | None = None  # made at the first session (the store's file size)
        self._refused = False  # this session ended on bad records: keep backing off
        self.master_ha_addr = master_ha_addr
        self.last_read_ms = 0
        """Clock of the last bytes read from the master (0 before the first connection)."""
        self.last_write_ms = 0
        """Clock of the last offset report sent."""
        self.last_error = ""
        """Why the last connection ended or failed (for status and logs)."""
        self.connect_count = 0
        """Successful connections so far."""
        self._channel: SocketChannel | None = None
        self._reported = -1
        self._received = False
        self._addr_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._state_name = "new"

    @property
    def is_connected(self) -> bool:
        return self._channel is not None and not self._channel.is_closed

    # lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the connection cycle (returns at once; connecting happens in the background).

        Raises:
            RuntimeError: started twice.
        """
        if self._state_name != "new":
            raise RuntimeError(f"HAClient cannot start: it is {self._state_name}")
        self._state_name = "started"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-client")

    async def stop(self) -> None:
        """Close the link and end the cycle; idempotent, bounded by ``ha_stop_timeout_ms``."""
        if self._state_name != "started":
            self._state_name = "stopped"
            return
        self._state_name = "stopped"
        if self._channel is not None:
            self._channel.close("HA client stopping")
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            _, late = await asyncio.wait([task], timeout=self._config.ha_stop_timeout_ms / 1000.0)
            if late:
                log.warning("HA client stop: still running after ha_stop_timeout_ms=%d",
                            self._config.ha_stop_timeout_ms)

    def update_master_address(self, addr: str | None) -> None:
        """Point the client at a (new) master. None keeps the known address (docs/BEHAVIOUR.md 2.2: the client keeps
        retrying the old master). A different address drops the current link and connects there at once.

        Raises:
            ValueError: ``addr`` is not ``host:port``.
        """
        if addr is None or addr == self.master_ha_addr:
            return
        parse_ha_addr(addr)
        log.info("HA master address %s -> %s", self.master_ha_addr, addr)
        self.master_ha_addr = addr
        if self._channel is not None:
            self._channel.close(f"master address changed to {addr}")
        self._addr_changed.set()

    def status(self) -> dict[str, Any]:
        """The slave's view: master address, local max offset, last read/write timestamps, link state."""
        return {
            "masterAddress": self.master_ha_addr,
            "maxOffset": self._store.max_physical_offset,
            "lastReadTimestamp": self.last_read_ms,
            "lastWriteTimestamp": self.last_write_ms,
            "connected": self.is_connected,
            "lastError": self.last_error,
        }

    # the connection cycle --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            addr = self.master_ha_addr
            if addr is None:
                self._addr_changed.clear()
                await self._addr_changed.wait()
                continue
            self._addr_changed.clear()
            try:
                sock = await self._connect(addr)
            except ssl.SSLError as exc:  # the master is there but TLS failed: say so, it needs an operator
                self.last_error = describe_tls_failure(exc, addr, "tlsCaFile") or str(exc)
                self._received = False  # back off as after a failed handshake
                self._auth_failures.note(f"HA client: {self.last_error}; nothing replicated, retrying")
            except (OSError, TimeoutError) as exc:
                self.last_error = f"connect to {addr} failed: {exc or type(exc).__name__}"
                log.debug("HA client: %s", self.last_error)
            else:
                passed = await self._authenticate(sock, addr)  # closes the socket when not
                if passed and self.master_ha_addr == addr:
                    await self._session(sock, addr)
                elif passed:  # the address moved while connecting or handshaking: go there instead
                    sock.close()
            if self._received and not self._refused:
                self._backoff.reset()
            if not self._addr_changed.is_set():
                delay_ms = self._backoff.next_ms()
                try:
                    await asyncio.wait_for(self._addr_changed.wait(), delay_ms / 1000.0)
                except TimeoutError:
                    pass

    async def _connect(self, addr: str) -> socket.socket:
        loop = asyncio.get_running_loop()
        host, port = parse_ha_addr(addr)
        timeout_s = self._config.ha_connect_timeout_ms / 1000.0
        infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s)
        family, _, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, sockaddr), timeout_s)
        except BaseException:
            sock.close()
            raise
        ctx = self._config.tls_client
        if ctx is None:
            return sock
        tls_sock = tls_io.wrap(ctx, sock, server_side=False, server_hostname=host)
        try:
            await tls_io.handshake(tls_sock, timeout_s)
        except BaseException:
            tls_sock.close()
            raise
        return tls_sock

    async def _authenticate(self, sock: socket.socket, addr: str) -> bool:
        """With ``ha_auth_secret``: the handshake, before anything is reported or appended. False (the socket
        closed, the reason in ``last_error``) when the master fails it: a master that cannot prove the secret
        could be anyone, and its bytes would go into this slave's log."""
        secret = self._config.ha_auth_secret
        if not secret:
            return True
        loop = asyncio.get_running_loop()
        timeout_s = self._config.ha_auth_timeout_ms / 1000.0

        async def read(n: int) -> bytes:
            if isinstance(sock, ssl.SSLSocket):  # the loop's sock_* calls refuse SSL sockets
                return await tls_io.recv(sock, n, timeout_s)
            return await loop.sock_recv(sock, n)

        async def write(data: bytes) -> None:
            if isinstance(sock, ssl.SSLSocket):
                await tls_io.sendall(sock, data, timeout_s)
                return
            await loop.sock_sendall(sock, data)

        try:
            server = addr_name(sock.getpeername())  # the address this connection goes to: the proof names it
            await run_handshake(ClientHandshake(secret, ChannelKind.HA, nonces=self._nonces, server=server), read,
                                write, self._config.ha_auth_timeout_ms / 1000.0)
        except HandshakeError as exc:
            sock.close()
            self._received = False  # back off as after a failed connect
            self.last_error = f"handshake with {addr} failed: {exc}"
            self._auth_failures.note(f"HA client: {self.last_error}; nothing replicated, retrying")
            return False
        except BaseException:  # cancelled by stop()
            sock.close()
            raise
        return True

    @property
    def master_authenticated(self) -> bool:
        """Whether the master of a session proved who it is: it passed the ``haAuthSecret`` handshake (bound to the
        address dialled), or TLS verified its certificate. Only such a master may make this slave drop its log."""
        return bool(self._config.ha_auth_secret) or self._config.tls_client is not None

    async def _session(self, sock: socket.socket, addr: str) -> None:
        cfg = self._config
        self._decoder.reset()
        self._received = self._refused = False
        if self._checker is None:
            self._checker = ReplicaChecker(self._store.mapped_file_size_commitlog, self._max_record_bytes)
        # The log ends at a record start (only checked records are appended; recovery cuts a torn tail).
        self._checker.reset(self._store.max_physical_offset)
        channel = SocketChannel(
            asyncio.get_running_loop(), sock, get_buffer=self._decoder.get_buffer, on_data=self._on_data,
            name=f"ha-slave->{addr}", max_backlog_bytes=cfg.ha_max_report_backlog_bytes,
        )
        self._channel = channel
        self.connect_count += 1
        self.last_read_ms = self._clock_ms()
        # Decision 3: report at once, so data flows without waiting a heartbeat interval.
        self._send_report(self._store.max_physical_offset)
        log.info("HA client connected to %s, reported offset %d", addr, self._reported)
        try:
            while not channel.is_closed:
                await asyncio.wait([channel.closed], timeout=cfg.tick_ms / 1000.0)
                if channel.is_closed:
                    break
                now = self._clock_ms()
                silent_ms = now - self.last_read_ms
                if silent_ms > cfg.ha_housekeeping_interval_ms:
                    channel.close(f"no bytes from the master for {silent_ms} ms "
                                  f"(ha_housekeeping_interval_ms={cfg.ha_housekeeping_interval_ms})")
                elif now - self.last_write_ms >= cfg.ha_send_heartbeat_interval_ms:
                    self._send_report(self._store.max_physical_offset)
        finally:
            channel.close("HA session ended")
            self._channel = None
            self.last_error = channel.close_reason
            log.info("HA client disconnected from %s: %s", addr, self.last_error)

    def _send_report(self, offset: int) -> None:
        if self._channel is None:
            return
        self._channel.send_nowait(encode_report(offset))
        self._reported = offset
        self.last_write_ms = self._clock_ms()

    def _on_data(self, nbytes: int) -> None:
        """Frames from the master (reader callback); raising closes the link, the cycle reconnects."""
        self.last_read_ms = self._clock_ms()
        self._received = True
        decoder, store, checker = self._decoder, self._store, self._checker
        assert checker is not None  # made by _session before the channel exists
        decoder.buffer_updated(nbytes)
        # The checked bytes of every frame of one read are appended as one piece: each append wakes the
        # dispatcher and the append listeners, and a 64-message batch arrives as three 32 KiB frames.
        run: list[memoryview | bytes] = []
        run_at = -1
        try:
            while (frame := decoder.next_frame()) is not None:
                phy = frame.phy_offset
                expected = checker.next_offset
                if expected == 0 and not run and store.max_physical_offset == 0:
                    # An empty slave takes the master's start (docs/BEHAVIOUR.md 2.6), which is always a file start.
                    if phy % store.mapped_file_size_commitlog:
                        raise HAOffsetMismatchError(
                            f"master sent phyOffset {phy} to an empty slave, not a commit-log file start"
                        )
                    checker.reset(phy)
                elif phy > expected and not run and not checker.held and not phy % store.mapped_file_size_commitlog:
                    # The master says its log now starts at a file past this log's end: retention deleted the bytes
                    # between while the slave was away, and following means dropping everything held here. One
                    # frame from anyone must not do that (issue 39): only a master that proved who it is may.
                    held_from = int(store.min_physical_offset)
                    if not self.master_authenticated:
                        self._refused = True
                        raise HAOffsetMismatchError(
                            f"the master says its log starts at {phy}, past this slave's end {expected}: following "
                            f"it would drop this slave's whole commit log ({expected - held_from} bytes, offsets "
                            f"{held_from}..{expected}); refusing to drop it on the word of an unauthenticated master. "
                            f"Set haAuthSecret (or tlsEnable) on master and slaves to let an authenticated master "
                            f"restart it, or empty this slave's store to resync it")
                    log.error("HA client: DATA DROPPED: the authenticated master's log now starts at %d, past this "
                              "slave's end %d (retention deleted the bytes between while the slave was away); "
                              "dropping the local commit log, %d bytes (offsets %d..%d), and continuing from %d",
                              phy, expected, expected - held_from, held_from, expected, phy)
                    store.restart_log_at(phy)
                    checker.reset(phy)
                elif phy != expected:
                    held = f" (its log ends at {expected - checker.held}, {checker.held} bytes of an incomplete " \
                           f"record held)" if checker.held else ""
                    raise HAOffsetMismatchError(
                        f"master sent phyOffset {phy} but the slave's max offset is {expected}{held}"
                    )
                if frame.body:
                    if not run:
                        run_at = checker.next_offset - checker.held
                    checker.feed(frame.body, run)
        except RecordViolation as exc:
            self._refused = True
            log.error("HA client: refusing the master's data: %s; nothing from that record on is appended, "
                      "closing the link to reconnect from offset %d", exc, exc.offset)
            raise
        finally:
            if run:
                store.append_to_commitlog(run_at, b"".join(run) if len(run) > 1 else run[0])
            # One report per read covers every frame appended from it (and reports partial progress on error).
            current = store.max_physical_offset
            if current > self._reported:
                self._send_report(current)
