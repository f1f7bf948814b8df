"""Master side of classic HA (docs/BEHAVIOUR.md 2.4, 2.5, 2.8, 2.9): accept slaves, stream the commit log, collect
acks, complete SYNC_MASTER waits.

Everything runs as tasks and callbacks in the broker's event loop (a sender thread beside a busy loop collapses
under the GIL). Per slave connection:

* the socket's reader callback parses offset reports and feeds :class:`ReplicationState`; an ack completes the
  ``wait_for_ack`` futures it covers right there (no polling);
* one writer task streams ``[phyOffset][size] + body`` frames, several per ``sendmsg``, and when caught up waits
  on an event (bounded by the heartbeat interval, after which an idle link gets a heartbeat frame);
* while the writer waits, :meth:`HAService.notify_new_data` sends an append's frames itself, from the send
  request (``push_now``): the SYNC_MASTER ack round trip starts before the loop runs the other requests that
  are ready, which measured about +10 points of sync/async throughput ratio. What the socket does not take
  is carried over to the writer, which sends it first. With ``ha_transfer_delay_ms`` (an ASYNC_MASTER's
  ``haAsyncTransferDelayMs``) small appends wait up to that long, until ``ha_transfer_batch_size`` bytes are
  waiting, and go in one push: a slave wakes, appends and acks once for many single-message sends (each of
  those had cost the slave about 75 µs of CPU and the master one more wake-up for the ack).

A SYNC_MASTER send asks :meth:`HAService.wait_for_replicas`: the in-sync rule of :mod:`broker.ha.progress`
decides from the connected slaves' own acks whether it waits (and for how many acks) or answers
SLAVE_NOT_AVAILABLE at once. A slave that disconnects stops counting, for new sends and for pending waits alike;
a pending wait is not failed early, since another connected slave may still ack it: it ends at its deadline.

One housekeeping task per service drops slaves that sent nothing for ``ha_housekeeping_interval_ms``.

With ``ha_auth_secret`` a connection starts with the handshake of :mod:`broker.peer_auth`, fed from the same
reader callback: until it passes, the master reads no report and streams nothing; a connection that fails it is
closed. A handshaking connection is pending (:mod:`broker.ha.admission`), so junk cannot lock a slave out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import broker.ha.tls_io as tls_io
from broker.ha.admission import expired_pending, is_loopback_peer, pending_to_evict_by_source, report_admitted
from broker.ha.channel import Buffer, SocketChannel
from broker.ha.config import HAConfig
from broker.ha.progress import (
    AckWaiter,
    ReplicationState,
    SlaveProgress,
    TooManyWaitersError,
    report_violation,
    slave_in_sync,
    transfer_start_offset,
)
from broker.ha.protocol import FRAME_HEADER, ReportDecoder, encode_frame_header
from broker.peer_auth import (
    ChannelKind,
    HandshakeError,
    NonceSource,
    RateLimitedLog,
    ServerHandshake,
    addr_name,
)
from broker.store.api import MessageStore

__all__ = ["HAService"]

log = logging.getLogger(__name__)

_MASTER_READ_BUFFER_BYTES = 64 * 1024
_LISTEN_BACKLOG = 64
_ACCEPT_ERROR_PAUSE_S = 0.1  # e.g. EMFILE: pause instead of spinning on a listener that keeps failing


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _format_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class _SlaveConnection:
    """One accepted slave: a channel, its progress entry and its writer task."""

    def __init__(self, service: HAService, conn_id: int, sock: socket.socket, addr: str, source: str) -> None:
        self.service = service
        self.conn_id = conn_id
        self.addr = addr
        self.source = source
        """The peer's address without the port (pending connections are shared out per source)."""
        self.progress: SlaveProgress = service._state.add_slave(conn_id, addr)
        self.last_read_ms = service._clock_ms()
        self.accepted_ms = self.last_read_ms
        self.new_data = asyncio.Event()
        self.first_report = asyncio.Event()
        self.speed_bytes_per_s = 0.0
        self.sent_to = 0
        """Commit-log offset up to which frames were handed to the socket."""
        self.last_write = 0.0
        self._idle = False  # the writer task is caught up and waiting for new data
        self._carry: list[Buffer] = []
        self._speed_mark = (self.last_read_ms, 0)
        self._reports = ReportDecoder()
        self._rbuf = memoryview(bytearray(_MASTER_READ_BUFFER_BYTES))
        self._warned = False
        secret = service._config.ha_auth_secret
        names = (addr_name(sock.getsockname()), *service._config.advertised_names) if secret else ()
        self.auth: ServerHandshake | None = (
            ServerHandshake(secret, ChannelKind.HA, nonces=service._nonces, names=names) if secret else None)
        """The handshake while it runs (None once passed, or without ``haAuthSecret``): until then the master
        reads no report and sends no byte of the log."""
        loop = service._require_loop()
        self.channel = SocketChannel(
            loop, sock, get_buffer=lambda: self._rbuf, on_data=self._on_data, name=f"ha-master<-{addr}"
        )
        self.writer = loop.create_task(self._write_loop(), name=f"ha-transfer->{addr}")
        self.channel.closed.add_done_callback(lambda _: service._on_connection_closed(self))
        if self.auth is not None:
            self.channel.send_nowait(self.auth.start())

    def close(self, reason: str) -> None:
        self.channel.close(reason)

    def _on_data(self, nbytes: int) -> None:
        self.last_read_ms = self.service._clock_ms()
        if self.auth is not None:
            self._authenticate(self.auth, nbytes)
            return
        offset = self._reports.feed(self._rbuf[:nbytes])
        if offset is not None:
            self.service._on_report(self, offset)

    def _authenticate(self, auth: ServerHandshake, nbytes: int) -> None:
        try:
            proof = auth.feed(self._rbuf[:nbytes])
        except HandshakeError as exc:
            self.service._refusals.note(f"HA: {self.addr} failed the handshake, closing it (nothing sent): {exc}")
            self.close(f"handshake failed: {exc}")
            return
        if auth.done:
            self.channel.send_nowait(proof)
            self.auth = None
            log.info("HA slave %s passed the handshake", self.addr)

    def update_speed(self, now_ms: int) -> None:
        mark_ms, mark_bytes = self._speed_mark
        if now_ms - mark_ms >= 1000:
            sent = self.progress.transferred_bytes
            self.speed_bytes_per_s = (sent - mark_bytes) * 1000.0 / (now_ms - mark_ms)
            self._speed_mark = (now_ms, sent)

    async def _write_loop(self) -> None:
        try:
            await self.first_report.wait()
            await self._stream()
        except ConnectionError:
            pass  # the channel is closed and says why
        except Exception:
            log.exception("ha-transfer->%s: transfer loop failed", self.addr)
            self.close("transfer loop failed")
        finally:
            self.close("transfer loop ended")

    async def _stream(self) -> None:
        svc = self.service
        cfg, loop = svc._config, svc._require_loop()
        # ``sent_to`` was set to the start offset when the first report arrived (``HAService._on_report``).
        log.info("ha-transfer->%s: first report %d, streaming from %d", self.addr, self.progress.request_offset,
                 self.sent_to)
        heartbeat_s = cfg.ha_send_heartbeat_interval_ms / 1000.0
        self.last_write = loop.time()
        while True:
            # Clear before looking for data: an append after this point sets the event again.
            self.new_data.clear()
            if self._carry:  # the unsent tail of a frame push_now started
                carry, self._carry = self._carry, []
                await self.channel.send_all(carry)
                self.last_write = loop.time()
                continue
            if await self._send_available():
                self.last_write = loop.time()
                continue
            if self._skip_deleted():
                continue
            self._warn_if_unservable(self.sent_to)
            idle_s = loop.time() - self.last_write
            if idle_s >= heartbeat_s:
                await self.channel.send_all([encode_frame_header(self.sent_to, 0)])
                self.last_write = loop.time()
                continue
            self._idle = True  # push_now may send from here on
            try:
                await asyncio.wait_for(self.new_data.wait(), heartbeat_s - idle_s)
            except TimeoutError:
                pass
            finally:
                self._idle = False

    def _frames(self, offset: int) -> tuple[list[bytes | memoryview], int]:
        """Frames of every byte available from ``offset``, up to ``ha_send_gather_bytes``, and their payload
        size (0 when nothing is available)."""
        cfg, store = self.service._config, self.service._store
        bufs: list[bytes | memoryview] = []
        total = 0
        while total < cfg.ha_send_gather_bytes:
            data = store.get_commitlog_data(offset + total, cfg.ha_transfer_batch_size)
            if data is None or len(data) == 0:
                break
            size = min(len(data), cfg.ha_transfer_batch_size)
            bufs.append(FRAME_HEADER.pack(offset + total, size))
            bufs.append(data[:size] if size < len(data) else data)
            total += size
        return bufs, total

    async def _send_available(self) -> bool:
        """Send the frames available from ``sent_to`` in one ``sendmsg``; False when there were none."""
        bufs, total = self._frames(self.sent_to)
        if not total:
            return False
        # Counted before the await: the slave may ack the first of these bytes while the rest are still queued,
        # and a report past ``sent_to`` is refused as a protocol error.
        self.sent_to += total
        self.progress.transferred_bytes += total
        await self.channel.send_all(bufs)
        return True

    def push_now(self) -> None:
        """New bytes were appended (loop thread): when the writer is idle, send them from here, now.

        The SYNC_MASTER round trip starts at once instead of after every request already queued in this loop
        turn has run. What the socket does not take now is left to the writer task, which goes on with it.
        """
        if not self._idle or self._carry or self.channel.is_writing:
            self.new_data.set()
            return
        bufs, total = self._frames(self.sent_to)
        if not total:
            return
        self._carry = self.channel.send_some(bufs)
        self.sent_to += total
        self.progress.transferred_bytes += total
        self.last_write = self.service._require_loop().time()
        if self._carry or total >= self.service._config.ha_send_gather_bytes:
            self.new_data.set()  # the writer sends the rest

    def _skip_deleted(self) -> bool:
        """Nothing to send because retention deleted what this slave needs next: continue from the master's oldest
        file (the slave drops its own log and follows). Only looked at when a send found nothing."""
        oldest = self.service._store.min_physical_offset
        if not 0 < self.sent_to < oldest:
            return False
        log.warning("ha-transfer->%s: offset %d was deleted by retention; continuing from the master's oldest file "
                    "at %d", self.addr, self.sent_to, oldest)
        self.sent_to = oldest
        return True

    def _warn_if_unservable(self, next_offset: int) -> None:
        """Nothing to send: say so once when that is because the slave wants bytes the master does not have
        (ahead of the master, or older than its oldest file); it then only gets heartbeats."""
        if self._warned:
            return
        store = self.service._store
        master_max, master_min = store.max_physical_offset, store.min_physical_offset
        if next_offset > master_max or next_offset < master_min:
            self._warned = True
            log.warning("ha-transfer->%s: slave wants offset %d outside the master's commit log %d..%d",
                        self.addr, next_offset, master_min, master_max)


class HAService:
    """The master side: listens on the HA port (opened on every broker) and serves slaves.

    Args:
        store: the broker's message store (``get_commitlog_data``, ``max_physical_offset``,
            ``mapped_file_size_commitlog``). Its owner subscribes :meth:`notify_new_data` to the store's append
            event (the broker's controller does), so an append reaches idle slaves at once.
        config: HA settings (with ``ha_auth_secret``, every connection must pass the handshake first).
        clock_ms: wall clock in ms (injected in tests); used for read timestamps and housekeeping.
        nonces: random source of the handshake's nonces (injected in tests).
    """

    def __init__(self, store: MessageStore, config: HAConfig, *, clock_ms: Callable[[], int] | None = None,
                 nonces: NonceSource = secrets.token_bytes) -> None:
        self._store = store
        self._config = config
        self._clock_ms = clock_ms or _wall_clock_ms
        self._nonces = nonces
        self._state: ReplicationState[asyncio.Future[bool]] = ReplicationState(
            max_gap=config.ha_max_gap_not_in_sync, max_waiters=config.ha_max_ack_waiters,
            in_sync_replicas=config.in_sync_replicas, min_in_sync_replicas=config.min_in_sync_replicas,
            auto=config.enable_auto_in_sync_replicas,
        )
        self._conns: dict[int, _SlaveConnection] = {}
        self._ids = itertools.count(1)
        self._refusals = RateLimitedLog(log)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._lsock: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._tls_handshakes: set[asyncio.Task[None]] = set()
        self._state_name = "new"
        self._transfer_timer: asyncio.TimerHandle | None = None  # a gathered transfer due (ha_transfer_delay_ms)
        self._wake_at: int | float = math.inf  # while it is due: the log offset that sends it at once
        self.port = 0
        """The bound HA port (0 before ``start``)."""

    # lifecycle -------------------------------------------------------------------------------------------
    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Bind and listen; return the bound port (``port=0`` lets the OS choose). ``sock``: a socket already bound
        and listening (inherited from a supervisor) to serve on instead; ``host`` and ``port`` are then unused.

        Raises:
            RuntimeError: started twice.
            OSError: the address cannot be bound (the message names it).
        """
        if self._state_name != "new":
            raise RuntimeError(f"HAService cannot start: it is {self._state_name}")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if sock is not None:
            lsock = sock
            lsock.setblocking(False)
        else:
            infos = await self._loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            lsock = socket.socket(family, socket.SOCK_STREAM)
            try:
                lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                lsock.bind(sockaddr)
                lsock.listen(_LISTEN_BACKLOG)
                lsock.setblocking(False)
            except OSError as exc:
                lsock.close()
                raise OSError(exc.errno, f"HA listener cannot bind {host}:{port}: {exc.strerror}") from exc
        self._lsock = lsock
        self.port = lsock.getsockname()[1]
        self._state_name = "started"
        self._tasks = [
            self._loop.create_task(self._accept_loop(), name="ha-accept"),
            self._loop.create_task(self._housekeeping_loop(), name="ha-housekeeping"),
        ]
        log.info("HA service listening on %s:%d", host, self.port)
        return self.port

    async def stop(self) -> None:
        """Close the listener and every slave connection; pending ack waits complete False. Idempotent and
        bounded by ``ha_stop_timeout_ms``."""
        if self._state_name != "started":
            self._state_name = "stopped"
            return
        self._state_name = "stopped"
        if self._transfer_timer is not None:
            self._transfer_timer.cancel()
            self._transfer_timer = None
        for task in [*self._tasks, *self._tls_handshakes]:
            task.cancel()
        writers = [conn.writer for conn in self._conns.values()]
        for conn in list(self._conns.values()):
            conn.close("HA service stopping")
        for fut in self._state.waiters.drain():
            if not fut.done():
                fut.set_result(False)
        pending = [t for t in [*self._tasks, *writers] if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._config.ha_stop_timeout_ms / 1000.0)
            if late:
                log.warning("HA service stop: %d tasks still running after ha_stop_timeout_ms=%d",
                            len(late), self._config.ha_stop_timeout_ms)
        # Closed only now: the accept task has unregistered the listener's fd, so it cannot be reused under it.
        if self._lsock is not None:
            self._lsock.close()
        log.info("HA service stopped")

    # called by the broker --------------------------------------------------------------------------------
    def notify_new_data(self) -> None:
        """New bytes are in the commit log: wake every transfer loop, now or, with ``ha_transfer_delay_ms``, once
        enough bytes wait or the delay ends (safe from any thread)."""
        loop = self._loop
        if loop is None or self._state_name != "started":
            return
        if threading.get_ident() == self._loop_thread:
            self._on_new_data()
        else:
            loop.call_soon_threadsafe(self._on_new_data)

    def _on_new_data(self) -> None:
        if not self._conns or self._state_name != "started":
            return
        delay_ms = self._config.ha_transfer_delay_ms
        if delay_ms:
            if self._transfer_timer is None:
                wake_at = self._batch_full_at()
                if self._store.max_physical_offset < wake_at:
                    self._wake_at = wake_at
                    self._transfer_timer = self._require_loop().call_later(delay_ms / 1000.0, self._wake_writers)
                    return
            elif self._store.max_physical_offset < self._wake_at:
                return  # the gathered transfer is due later: one comparison per append until then
        self._wake_writers()

    def _batch_full_at(self) -> int | float:
        """The log offset at which ``ha_transfer_batch_size`` bytes wait for the streaming slave furthest behind
        (never, while none streams). Worked out when a gathered transfer is armed: until it goes, the slaves are
        sent nothing, so it holds (a slave that starts streaming meanwhile waits for the timer at most)."""
        sent = [c.sent_to for c in self._conns.values() if c.first_report.is_set()]
        return min(sent) + self._config.ha_transfer_batch_size if sent else math.inf

    def _wake_writers(self) -> None:
        if self._transfer_timer is not None:
            self._transfer_timer.cancel()
            self._transfer_timer = None
        for conn in list(self._conns.values()):
            conn.push_now()

    def is_slave_ok(self, master_put_where: int) -> bool:
        """At least one connected slave's own ack is less than ``haMaxGapNotInSync`` behind ``master_put_where``
        (docs/BEHAVIOUR.md 2.8 counted per connection, not 4.9.3's ``push2SlaveMaxOffset``)."""
        return self._state.is_slave_ok(master_put_where)

    def in_sync_slave_count(self, master_put_where: int) -> int:
        """Connected slaves whose own ack is less than ``haMaxGapNotInSync`` behind (the master not counted;
        RocketMQ's ``inSyncReplicasNums`` is this + 1)."""
        return self._state.in_sync_slave_count(master_put_where)

    @property
    def push2slave_max_offset(self) -> int:
        """The best offset any slave has acked (monotonic, kept when slaves disconnect; status only)."""
        return self._state.push2slave_max_offset

    @property
    def connection_count(self) -> int:
        return self._state.connection_count

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        """The replica wait of a SYNC_MASTER put ending at ``end_offset`` (docs/BEHAVIOUR.md 2.9, decision 5).

        Returns:
            None when fewer replicas are in sync than the put needs (``inSyncReplicas`` and friends): the send
            answers SLAVE_NOT_AVAILABLE at once. Otherwise a future as :meth:`wait_for_ack` for the number of
            acks the rule asks, already True when it asks none (``inSyncReplicas=1``).
        """
        acks = self._state.slave_acks_needed(end_offset)
        if acks is None:
            return None
        if acks == 0:
            fut: asyncio.Future[bool] = self._require_loop().create_future()
            fut.set_result(True)
            return fut
        return self.wait_for_ack(end_offset, timeout_s, acks=acks)

    def wait_for_ack(self, end_offset: int, timeout_s: float, *, acks: int = 1) -> asyncio.Future[bool]:
        """A future: True once ``acks`` connected slaves have each acked ``end_offset``; False after ``timeout_s``,
        at ``stop()``, or at once when ``ha_max_ack_waiters`` waits are pending.

        Only the acks of slaves connected when the count is made are counted: a slave that acked and then
        disconnected no longer counts, one that connects later counts from its first report. Concurrent waiters
        share acks: one report completes every waiter it covers. Call from the loop thread. Cancelling the
        future withdraws the wait.
        """
        loop = self._require_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        try:
            waiter = self._state.wait(end_offset, fut, acks)
        except TooManyWaitersError as exc:
            log.warning("wait_for_ack(%d) refused: %s", end_offset, exc)
            fut.set_result(False)
            return fut
        if waiter is None:
            fut.set_result(True)
            return fut
        handle = loop.call_later(max(0.0, timeout_s), self._expire, waiter)
        fut.add_done_callback(lambda _: self._on_wait_done(waiter, handle))
        return fut

    def _expire(self, waiter: AckWaiter[asyncio.Future[bool]]) -> None:
        if self._state.waiters.expire(waiter) and not waiter.token.done():
            waiter.token.set_result(False)

    def _on_wait_done(self, waiter: AckWaiter[asyncio.Future[bool]], handle: asyncio.TimerHandle) -> None:
        handle.cancel()
        self._state.waiters.expire(waiter)  # no-op unless the caller cancelled the future

    def status(self) -> dict[str, Any]:
        """``haStatus``: the master's max offset, pending ack waits and, per slave, its ack, gap, in-sync flag
        (against the master's max offset) and transfer rate."""
        master_max = self._store.max_physical_offset
        slaves = []
        for conn in self._conns.values():
            ack = conn.progress.ack_offset
            slaves.append({
                "addr": conn.addr,
                "ackOffset": ack,
                "sentOffset": conn.sent_to,
                "diff": master_max - ack,
                "inSync": slave_in_sync(master_max, ack, self._config.ha_max_gap_not_in_sync),
                "transferredBytes": conn.progress.transferred_bytes,
                "transferSpeedBytesPerS": round(conn.speed_bytes_per_s, 1),
            })
        return {
            "masterMaxOffset": master_max,
            "push2SlaveMaxOffset": self._state.push2slave_max_offset,
            "connectionCount": self._state.connection_count,
            "ackWaiters": len(self._state.waiters),
            "slaves": slaves,
        }

    # internals -------------------------------------------------------------------------------------------
    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("HAService is not started")
        return self._loop

    def _start_offset(self, request_offset: int) -> int:
        store = self._store
        return transfer_start_offset(request_offset, store.max_physical_offset, store.mapped_file_size_commitlog,
                                     store.min_physical_offset, self._state.waiters.oldest_end())

    def _on_report(self, conn: _SlaveConnection, offset: int) -> None:
        first = conn.progress.request_offset < 0
        bad = report_violation(offset, first=first, master_max_offset=self._store.max_physical_offset,
                               sent_to=conn.sent_to)
        if bad is not None:
            log.warning("HA slave %s: protocol error, closing: %s", conn.addr, bad)
            conn.close(f"protocol error: {bad}")
            return
        if first:  # before any later report can be checked against it
            reporting = sum(1 for c in self._conns.values() if c.first_report.is_set())
            if not report_admitted(reporting, self._config.ha_max_connections):
                self._refusals.note(f"HA: refusing slave {conn.addr}: {reporting} slaves connected "
                                    f"(ha_max_connections={self._config.ha_max_connections})")
                conn.close("too many slaves")
                return
            conn.sent_to = self._start_offset(offset)
        first, done = self._state.on_report(conn.conn_id, offset)
        if first:
            conn.first_report.set()
        for fut in done:
            if not fut.done():
                fut.set_result(True)

    def _on_connection_closed(self, conn: _SlaveConnection) -> None:
        if self._conns.pop(conn.conn_id, None) is None:
            return
        self._state.remove_slave(conn.conn_id)
        conn.writer.cancel()
        log.info("HA slave %s disconnected: %s (acked %d)", conn.addr, conn.channel.close_reason,
                 conn.progress.ack_offset)

    async def _accept_loop(self) -> None:
        loop, lsock = self._require_loop(), self._lsock
        assert lsock is not None
        while True:
            try:
                sock, raw_addr = await loop.sock_accept(lsock)
            except OSError as exc:
                log.warning("HA accept failed: %s", exc)
                await asyncio.sleep(_ACCEPT_ERROR_PAUSE_S)
                continue
            addr = _format_addr(raw_addr)
            source = str(raw_addr[0]) if isinstance(raw_addr, tuple) else addr
            if self._config.loopback_only and not is_loopback_peer(source):
                self._refusals.note(f"HA: closing {addr}: not a loopback address, and without haAuthSecret the HA "
                                    "port serves loopback peers only (protected mode; set haAuthSecret on master and "
                                    "slaves, or protectedMode=false)")
                sock.close()
                continue
            if self._config.tls_server is not None:
                self._start_tls(sock, addr, source)
                continue
            self._admit(sock, addr, source)

    def _start_tls(self, sock: socket.socket, addr: str, source: str) -> None:
        """The TLS handshake of an accepted connection, in its own task so the accept loop goes on; at most
        ``ha_max_pending_connections`` run at once (a newcomer past it is closed), each bounded by
        ``ha_auth_timeout_ms``. A peer that fails it is closed before it is a connection: nothing was sent."""
        ctx = self._config.tls_server
        assert ctx is not None
        if len(self._tls_handshakes) >= self._config.ha_max_pending_connections:
            self._refusals.note(f"HA: closing {addr}: {len(self._tls_handshakes)} TLS handshakes running "
                                f"(ha_max_pending_connections={self._config.ha_max_pending_connections})")
            sock.close()
            return

        async def run() -> None:
            tls_sock = tls_io.wrap(ctx, sock, server_side=True)
            try:
                await tls_io.handshake(tls_sock, self._config.ha_auth_timeout_ms / 1000.0)
            except (OSError, TimeoutError) as exc:
                self._refusals.note(f"HA: {addr} failed the TLS handshake, closing it (nothing sent): "
                                    f"{exc or 'timed out (ha_auth_timeout_ms)'}")
                tls_sock.close()
                return
            except BaseException:
                tls_sock.close()
                raise
            if self._state_name == "started":
                self._admit(tls_sock, addr, source)
            else:
                tls_sock.close()

        task = self._require_loop().create_task(run(), name=f"ha-tls<-{addr}")
        self._tls_handshakes.add(task)
        task.add_done_callback(self._tls_handshakes.discard)

    def _admit(self, sock: socket.socket, addr: str, source: str) -> None:
        """Make an accepted (and, with TLS, handshaken) socket a slave connection. Pending connections are
        shared out by source: a newcomer evicts the oldest pending connection of its own source once that source
        holds its share, else of the source holding most (so a flood from one address cannot push out a real
        slave's handshake from another)."""
        cap = self._config.ha_max_pending_connections
        pending = {cid: (c.accepted_ms, c.source) for cid, c in self._conns.items() if not c.first_report.is_set()}
        for cid in pending_to_evict_by_source(pending, source, cap):
            old = self._conns[cid]
            self._refusals.note(f"HA: closing {old.addr}, connected without an offset report, to admit {addr} "
                                f"(ha_max_pending_connections={cap}, shared out by source address)")
            old.close("replaced by a newer connection while it had not reported")
            self._on_connection_closed(old)
        conn_id = next(self._ids)
        self._conns[conn_id] = _SlaveConnection(self, conn_id, sock, addr, source)
        log.info("HA slave %s connected", addr)

    def _pending_since(self) -> dict[int, int]:
        return {cid: c.accepted_ms for cid, c in self._conns.items() if not c.first_report.is_set()}

    async def _housekeeping_loop(self) -> None:
        cfg = self._config
        while True:
            await asyncio.sleep(min(cfg.tick_ms, min(cfg.ha_pending_timeout_ms, cfg.ha_auth_timeout_ms) // 4 or 1)
                                / 1000.0)
            now = self._clock_ms()
            handshaking = {cid: c.accepted_ms for cid, c in self._conns.items() if c.auth is not None}
            for cid in expired_pending(handshaking, now, cfg.ha_auth_timeout_ms):
                conn = self._conns[cid]
                self._refusals.note(f"HA: closing {conn.addr}: handshake not done within {cfg.ha_auth_timeout_ms} "
                                    f"ms (ha_auth_timeout_ms; haAuthSecret is set on this master)")
                conn.close("no handshake in time")
            for cid in expired_pending(self._pending_since(), now, cfg.ha_pending_timeout_ms):
                conn = self._conns[cid]
                if conn.channel.is_closed:  # just closed above
                    continue
                self._refusals.note(f"HA: closing {conn.addr}: no offset report within "
                                    f"{cfg.ha_pending_timeout_ms} ms (ha_pending_timeout_ms)")
                conn.close("no offset report in time")
            for conn in list(self._conns.values()):
                silent_ms = now - conn.last_read_ms
                if silent_ms > cfg.ha_housekeeping_interval_ms:
                    conn.close(f"no bytes from the slave for {silent_ms} ms "
                               f"(ha_housekeeping_interval_ms={cfg.ha_housekeeping_interval_ms})")
                else:
                    conn.update_speed(now)
