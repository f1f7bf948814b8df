"""uvicorn's httptools protocol with one socket write per response.

uvicorn writes a response head (``http.response.start``) and its body (``http.response.body``) with two
``transport.write`` calls; uvloop sends each at once, so every answer costs two ``send`` syscalls and two TCP
segments, and the client wakes up twice. On loopback that second syscall was about a third of the broker's CPU
per small request. :class:`CoalescingHttpToolsProtocol` hands uvicorn a transport that holds a bare response head
(it ends the write with the blank line and announces a non-empty body) and sends it together with the next write.
Everything else passes straight through, so uvicorn's flow control, keep-alive and shutdown are unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from client.protocol.http_guard import LimitedHttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol"]

_HEAD_END = b"\r\n\r\n"


def _is_bare_head(data: bytes) -> bool:
    """A response head announcing a body that is not in this write (so another write follows at once)."""
    if not data.startswith(b"HTTP/1.1 ") or not data.endswith(_HEAD_END):
        return False
    lower = data.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return False
    end = lower.find(b"\r\n", at + 17)
    value = lower[at + 17 : end].strip()
    return value.isdigit() and int(value) > 0


class _CoalescingTransport:
    """Wraps an asyncio transport: a bare response head waits for the body write and goes out with it."""

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif isinstance(data, bytes) and _is_bare_head(data):
            self._held = data
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now (a response that ends without a body write, e.g. to HEAD)."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

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
