"""TLS on the HA port without leaving :class:`~broker.ha.channel.SocketChannel`.

The channel drives a raw non-blocking socket from the event loop (see its docstring for why). Under ``tlsEnable``
it drives a non-blocking :class:`ssl.SSLSocket` the same way, rather than an asyncio TLS transport or an
``SSLObject`` with memory BIOs:

* the encryption has to read every byte anyway, so the zero-copy ``sendmsg`` of the plain path buys nothing
  under TLS; ``SSLSocket.send`` encrypts straight from the commit-log memoryview into OpenSSL's record buffer
  and writes each 16 KiB record with one syscall, without the extra bytes objects a memory BIO hands back;
* ``recv_into`` still decrypts into the owner's buffer (the slave's frame buffer), so the read path allocates
  nothing per read, as without TLS;
* one code path for reading and writing, with the TLS differences confined to "would block" coming as
  :class:`ssl.SSLWantReadError` / :class:`ssl.SSLWantWriteError` and decrypted bytes that OpenSSL holds
  (``pending()``) and the socket no longer signals.

This module holds the steps before the channel exists: wrapping, the handshake, and the small reads and writes
of the ``haAuthSecret`` handshake on the slave side, each bounded by a deadline. Nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

__all__ = ["WOULD_BLOCK", "handshake", "recv", "sendall", "wrap"]

#: What a non-blocking plain or TLS socket raises when it cannot go on now.
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def wrap(ctx: ssl.SSLContext, sock: socket.socket, *, server_side: bool, server_hostname: str | None = None
         ) -> ssl.SSLSocket:
    """``sock`` (connected, non-blocking) as a TLS socket whose handshake has not run yet."""
    sock.setblocking(False)
    return ctx.wrap_socket(sock, server_side=server_side, server_hostname=server_hostname,
                           do_handshake_on_connect=False)


async def _wait(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, exc: BaseException, deadline: float) -> None:
    """Wait until ``sock`` can do what ``exc`` said it wanted (read or write), at most until ``deadline``."""
    remaining = deadline - loop.time()
    if remaining <= 0:
        raise TimeoutError("TLS timed out")
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    fd = sock.fileno()
    add: Callable[..., None]
    remove: Callable[[int], object]
    if isinstance(exc, ssl.SSLWantWriteError | BlockingIOError) and not isinstance(exc, ssl.SSLWantReadError):
        add, remove = loop.add_writer, loop.remove_writer
    else:
        add, remove = loop.add_reader, loop.remove_reader
    add(fd, ready)
    try:
        await asyncio.wait_for(fut, remaining)
    finally:
        remove(fd)


async def handshake(sock: ssl.SSLSocket, timeout_s: float) -> None:
    """Run the TLS handshake of a non-blocking TLS socket.

    Raises:
        TimeoutError: not done within ``timeout_s``.
        ssl.SSLError: the handshake failed (certificate not verified, no TLS on the other side...).
        OSError: the connection failed.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            sock.do_handshake()
            return
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as exc:
            await _wait(loop, sock, exc, deadline)


async def recv(sock: ssl.SSLSocket, n: int, timeout_s: float) -> bytes:
    """Up to ``n`` decrypted bytes (``b""`` at end of stream), waiting at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return sock.recv(n)
        except WOULD_BLOCK as exc:
            await _wait(loop, sock, exc, deadline)


async def sendall(sock: ssl.SSLSocket, data: bytes, timeout_s: float) -> None:
    """Send all of ``data``, waiting at most ``timeout_s`` in all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except WOULD_BLOCK as exc:
            await _wait(loop, sock, exc, deadline)
