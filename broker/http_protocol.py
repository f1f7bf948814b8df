"""uvicorn's httptools protocol with one socket write per response.

uvicorn writes a response head (``http.response.start``) and its body (``http.response.body``) with two
``transport.write`` calls; uvloop sends each at once, so every answer costs two ``send`` syscalls and two TCP
segments, and the client wakes up twice. On loopback that second syscall was about a third of the broker's CPU
per small request. :class:`CoalescingHttpToolsProtocol` hands uvicorn a transport that holds a bare response head
(it ends the write with the blank line and announces a non-empty body) and sends it together with the body writes
that complete the announced length (a large pull answer comes as a few pieces,
:meth:`client.protocol.asgi.Response.of_pieces`, and goes out as one gathered write without being joined).
Everything else passes straight through, so uvicorn's flow control, keep-alive and shutdown are unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from client.protocol.http_guard import LimitedHttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol"]

_HEAD_END = b"\r\n\r\n"
#: A head and one body smaller than this are joined into one buffer (cheaper than a gathered write of two).
_JOIN_BELOW_BYTES = 64 * 1024


def _held_body_bytes(data: bytes) -> int:
    """The body length a bare response head announces (its body is not in this write, so it follows at once);
    0 for any other write."""
    if not data.startswith(b"HTTP/1.1 ") or not data.endswith(_HEAD_END):
        return 0
    lower = data.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    end = lower.find(b"\r\n", at + 17)
    value = lower[at + 17 : end].strip()
    return int(value) if value.isdigit() else 0


class _CoalescingTransport:
    """Wraps an asyncio transport: a bare response head waits for the body writes it announces and goes out
    with them in one write (one ``writev`` when the body is large, so its pieces are not copied into one)."""

    __slots__ = ("_due", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes] = []
        self._due = 0
        """Body bytes still to come before the held response is complete."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held:
            piece = data if isinstance(data, bytes) else bytes(data)  # held across awaits: a snapshot of it
            held.append(piece)
            self._due -= len(piece)
            if self._due <= 0:
                self.flush()
        elif isinstance(data, bytes) and (due := _held_body_bytes(data)) > 0:
            held.append(data)
            self._due = due
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send what is held now (at the end of its body, or of a response that ends without a body write, e.g.
        to HEAD)."""
        held = self._held
        if not held:
            return
        self._held = []
        self._due = 0
        if len(held) == 1:
            self._transport.write(held[0])
        elif len(held) == 2 and len(held[1]) < _JOIN_BELOW_BYTES:
            self._transport.write(held[0] + held[1])
        else:
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(LimitedHttpToolsProtocol):
    """Pass as ``uvicorn.Config(http=with_limits(CoalescingHttpToolsProtocol, limits))`` (the connection bounds of
    :mod:`client.protocol.http_guard` come with it)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Wraps what the base left (a TLS connection's closing wrapper, or the transport itself).
        self.transport = _CoalescingTransport(self.transport)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        transport = self.transport
        if isinstance(transport, _CoalescingTransport):
            transport.flush()
        super().on_response_complete()
