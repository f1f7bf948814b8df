"""A non-blocking TCP socket driven straight from the event loop (``add_reader`` / ``add_writer``).

Why not asyncio transports: on Python 3.11 a transport copies every partially sent buffer into its own
bytearray and joins ``writelines`` arguments, and a stream read allocates per call. Replication moves hundreds
of MB/s through one event loop shared with the broker, so this channel

* reads with ``recv_into`` into a buffer its owner provides (the slave's frame buffer; no per-read objects),
* sends a list of buffers with one ``sendmsg`` (frame headers and commit-log memoryviews, no joining), waiting
  for writability only when the socket buffer is full,
* keeps one reader registration for the connection's lifetime (no future per read).

Everything runs in the loop's thread; nothing here blocks.

Under ``tlsEnable`` the socket is a non-blocking :class:`ssl.SSLSocket` (:mod:`broker.ha.tls_io` says why): reads
go on while OpenSSL holds decrypted bytes, and a list of buffers is sent one ``send`` per buffer (an SSL socket
has no ``sendmsg``). The plain path is chosen once, at construction, and runs exactly as before.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Sequence

from broker.ha.tls_io import WOULD_BLOCK
from common.tcp import tune_loopback

__all__ = ["Buffer", "SocketChannel", "advance_buffers"]

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview


def advance_buffers(bufs: Sequence[Buffer], sent: int) -> list[Buffer]:
    """The part of ``bufs`` not yet sent after ``sent`` bytes went out (partial buffers become views)."""
    out: list[Buffer] = []
    for i, buf in enumerate(bufs):
        size = len(buf)
        if sent >= size:
            sent -= size
            continue
        out.append(memoryview(buf)[sent:] if sent else buf)
        out.extend(bufs[i + 1 :])
        break
    return out


class SocketChannel:
    """One connected, non-blocking TCP socket.

    Args:
        loop: the running loop (the broker's).
        sock: a connected socket; the channel owns it from now on.
        get_buffer: returns a non-empty writable view to receive into.
        on_data: called with the number of bytes just received into the last ``get_buffer()`` view; an
            exception closes the channel with the exception's text as the reason.
        name: for logs, e.g. ``"ha-master<-127.0.0.1:53122"``.
        max_backlog_bytes: bound on bytes queued by :meth:`send_nowait`; exceeding it closes the channel.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        *,
        get_buffer: Callable[[], memoryview],
        on_data: Callable[[int], None],
        name: str,
        max_backlog_bytes: int = 1 << 20,
    ) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tune_loopback(sock)
        self.name = name
        self.closed: asyncio.Future[str] = loop.create_future()
        """Done (with the reason) once the channel is closed."""
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._get_buffer = get_buffer
        self._on_data = on_data
        self._max_backlog = max_backlog_bytes
        self._backlog = bytearray()  # send_nowait bytes the kernel did not take yet
        self._write_waiter: asyncio.Future[None] | None = None
        self._writer_registered = False
        if isinstance(sock, ssl.SSLSocket):
            self._sendmsg = self._send_tls  # type: ignore[method-assign]
            loop.add_reader(self._fd, self._on_readable_tls)
        else:
            loop.add_reader(self._fd, self._on_readable)

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    @property
    def close_reason(self) -> str:
        return self.closed.result() if self.closed.done() else ""

    def close(self, reason: str) -> None:
        """Close the socket (idempotent); wakes a pending :meth:`send_all` with ConnectionError."""
        if self.closed.done():
            return
        self.closed.set_result(reason)
        self._loop.remove_reader(self._fd)
        if self._writer_registered:
            self._loop.remove_writer(self._fd)
            self._writer_registered = False
        waiter, self._write_waiter = self._write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError(f"{self.name}: {reason}"))
        try:
            self._sock.close()
        except OSError:
            pass

    # reading --------------------------------------------------------------------------------------------
    def _read_once(self) -> bool:
        """One ``recv_into`` handed to the owner; False when nothing came or the channel closed."""
        try:
            n = self._sock.recv_into(self._get_buffer())
        except WOULD_BLOCK:
            return False
        except OSError as exc:
            self.close(f"read failed: {exc}")
            return False
        if n == 0:
            self.close("peer closed the connection")
            return False
        try:
            self._on_data(n)
        except Exception as exc:
            log.warning("%s: closing: %s", self.name, exc)
            self.close(str(exc))
            return False
        return not self.closed.done()

    def _on_readable(self) -> None:
        if not self.closed.done():
            self._read_once()

    def _on_readable_tls(self) -> None:
        """As :meth:`_on_readable`; OpenSSL may hold decrypted bytes the socket no longer signals, so read on
        while it does (each read into a fresh ``get_buffer()`` view, as the owner expects)."""
        sock = self._sock
        assert isinstance(sock, ssl.SSLSocket)
        while not self.closed.done() and self._read_once() and sock.pending():
            pass

    # writing --------------------------------------------------------------------------------------------
    @property
    def is_writing(self) -> bool:
        """A :meth:`send_all` is waiting for socket space, or :meth:`send_nowait` bytes are queued."""
        return self._write_waiter is not None or bool(self._backlog)

    def _sendmsg(self, bufs: Sequence[Buffer]) -> int:
        """One non-blocking ``sendmsg``: the bytes the kernel took, or -1 when the write failed (the channel is
        closed then, with the reason)."""
        try:
            return self._sock.sendmsg(bufs)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self.close(f"write failed: {exc}")
            return -1

    def _send_tls(self, bufs: Sequence[Buffer]) -> int:
        """:meth:`_sendmsg` for an SSL socket: one ``send`` per buffer until one is not taken whole. A refused
        write is retried later with the same bytes first (what OpenSSL requires), since the caller resends
        exactly the part not counted here."""
        total = 0
        for buf in bufs:
            try:
                n = self._sock.send(buf)
            except WOULD_BLOCK:
                return total
            except OSError as exc:
                self.close(f"write failed: {exc}")
                return -1
            total += n
            if n < len(buf):
                break
        return total

    def send_some(self, bufs: Sequence[Buffer]) -> list[Buffer]:
        """Send what the socket takes now, without waiting; return the part not sent (views, no copies).

        Only when not :attr:`is_writing` (the bytes would overtake queued ones). A failed write closes the
        channel and returns ``[]`` (the closed future says why).
        """
        if self.is_writing:
            raise RuntimeError(f"{self.name}: send_some while a write is pending")
        if self.closed.done():
            return []
        sent = self._sendmsg(bufs)
        return advance_buffers(bufs, sent) if sent >= 0 else []

    async def send_all(self, bufs: Sequence[Buffer]) -> None:
        """Send every byte of ``bufs`` in order, waiting for socket space as needed (no copies).

        Raises:
            ConnectionError: the channel is or becomes closed.
        """
        pending: Sequence[Buffer] = bufs
        while pending:
            if self.closed.done():
                raise ConnectionResetError(f"{self.name}: {self.close_reason}")
            sent = self._sendmsg(pending)
            if sent < 0:
                raise ConnectionResetError(f"{self.name}: {self.close_reason}")
            pending = advance_buffers(pending, sent)
            if pending:
                await self._wait_writable()

    async def _wait_writable(self) -> None:
        if self._write_waiter is not None:
            raise RuntimeError(f"{self.name}: concurrent send_all calls")
        self._write_waiter = self._loop.create_future()
        self._register_writer()
        try:
            await self._write_waiter
        finally:
            self._write_waiter = None
            if not self._backlog:
                self._unregister_writer()

    def send_nowait(self, data: bytes) -> None:
        """Send small data now; what the kernel does not take is queued and flushed when writable.

        A backlog beyond ``max_backlog_bytes`` means the peer stopped reading: the channel is closed.
        """
        if self.closed.done():
            return
        if not self._backlog:
            try:
                sent = self._sock.send(data)
            except WOULD_BLOCK:
                sent = 0
            except OSError as exc:
                self.close(f"write failed: {exc}")
                return
            data = data[sent:]
            if not data:
                return
        self._backlog += data
        if len(self._backlog) > self._max_backlog:
            self.close(f"{len(self._backlog)} unsent bytes queued (ha_max_report_backlog_bytes={self._max_backlog})")
            return
        self._register_writer()

    def _register_writer(self) -> None:
        if not self._writer_registered:
            self._loop.add_writer(self._fd, self._on_writable)
            self._writer_registered = True

    def _unregister_writer(self) -> None:
        if self._writer_registered and not self.closed.done():
            self._loop.remove_writer(self._fd)
        self._writer_registered = False

    def _on_writable(self) -> None:
        if self.closed.done():
            return
        if self._backlog:
            try:
                sent = self._sock.send(self._backlog)
            except WOULD_BLOCK:
                sent = 0
            except OSError as exc:
                self.close(f"write failed: {exc}")
                return
            del self._backlog[:sent]
        waiter = self._write_waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
        elif not self._backlog:
            self._unregister_writer()
