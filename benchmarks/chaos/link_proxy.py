"""``python -m benchmarks.chaos.link_proxy UPSTREAM [UPSTREAM ...]``: a TCP relay per HA link that the chaos
nemesis can cut.

The HA channel has no fault layer of its own, and a slave can be pointed anywhere with ``haMasterAddress``; so the
chaos cluster points each slave at one of these relays, which forwards to its master's HA port. A relay in its
own process keeps the replication path out of the harness's GIL: a SYNC_MASTER send waits on this path.

For each ``host:port`` given, a listener on ``127.0.0.1:0``; once all listen, one line on stdout:
``link-proxy ready listen=HOST:PORT,HOST:PORT,...`` (in the order given). Commands, one per line on stdin, each
answered by one line on stdout once applied, so the caller knows the link is down before it counts the fault:

* ``cut I``: close every connection of link ``I`` (both sides see EOF), and close each new one at once;
* ``heal I``: relay link ``I`` again;
* end of stdin (the harness exited or closed the pipe): stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

__all__ = ["Link", "main"]

log = logging.getLogger(__name__)

#: Bytes read at once on either side.
CHUNK = 256 * 1024
#: Bound on connecting to the master's HA port (a paused master never accepts).
CONNECT_TIMEOUT_S = 2.0


class Link:
    """One relayed HA link: a listener, the upstream it forwards to, and its open connection pairs."""

    def __init__(self, index: int, upstream: str) -> None:
        self.index = index
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.cut = False
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listen on a free loopback port; returns ``host:port``."""
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def set_cut(self, cut: bool) -> None:
        """Cut (close every pair, refuse new ones) or heal the link."""
        self.cut = cut
        if cut:
            for w in list(self.writers):
                w.transport.abort()
            self.writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            writer.transport.abort()  # the master is down: the slave sees what it would see without the relay
            return
        if self.cut:  # cut while connecting
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self.writers.discard(w)
                w.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error on either side, then close the writer (the other pump then ends too)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.transport.abort()


async def _serve(upstreams: list[str]) -> int:
    links = [Link(i, u) for i, u in enumerate(upstreams)]
    addrs = [await link.start() for link in links]
    print(f"link-proxy ready listen={','.join(addrs)}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        verb, _, arg = line.decode().strip().partition(" ")
        try:
            link = links[int(arg)]
        except (ValueError, IndexError):
            print(f"error bad command {line!r}", flush=True)
            continue
        if verb not in ("cut", "heal"):
            print(f"error bad command {line!r}", flush=True)
            continue
        link.set_cut(verb == "cut")
        print(f"ok {verb} {link.index}", flush=True)
    for link in links:
        link.set_cut(True)
        if link.server is not None:
            link.server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Relay until stdin ends; returns the exit code (2: no upstream given)."""
    upstreams = sys.argv[1:] if argv is None else argv
    if not upstreams:
        print("usage: python -m benchmarks.chaos.link_proxy HOST:PORT [HOST:PORT ...]", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(upstreams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
