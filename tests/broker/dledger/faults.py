"""Faults between DLedger members, injected from outside: a member is built with a channel factory
(``DLedgerServer(channels=...)``), and the tests wrap the real one so each request passes the faults of both ends.

* :class:`Faults` -- one member's faults: the peers it is cut off from (``block``) and the delay it adds to its
  traffic with a peer (``delay_s``);
* :class:`FaultyNetwork` -- every member's faults, and the channel factories that apply them;
* :class:`FaultyChannel` -- member A's channel to B: A's faults toward B drop or hold a request before it leaves
  and its answer after it arrives; B's faults toward A drop or hold B's answer (A's request then waits out its
  timeout, as for an answer lost on the way). Request and answer are both delivered (B acts on them) unless A's
  own faults drop the request first, as when B's port answers nothing.

Nothing in the broker knows of this: without a fault set, a channel passes every call straight through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.dledger.protocol import Frame, MsgType
from broker.dledger.transport import ChannelFactory, PeerChannel, PeerError

__all__ = ["Faults", "FaultyChannel", "FaultyNetwork", "Tap"]

#: ``(from member, to member, request type, bytes of entries)`` of every request that leaves a member.
Tap = Callable[[str, str, MsgType, int], None]


class Faults:
    """What one member drops or holds of its traffic with each peer (by default nothing)."""

    def __init__(self) -> None:
        self.blocked: set[str] = set()
        self.delay_s: dict[str, float] = {}

    def block(self, *peer_ids: str) -> None:
        """Cut this member off from these peers, both ways."""
        self.blocked.update(peer_ids)

    def heal(self, *peer_ids: str) -> None:
        """Undo :meth:`block` for these peers (none named: for all)."""
        for p in peer_ids or tuple(self.blocked):
            self.blocked.discard(p)

    def touches(self, peer_id: str) -> bool:
        """Whether any fault applies to the traffic with ``peer_id``."""
        return peer_id in self.blocked or bool(self.delay_s.get(peer_id))

    async def passes(self, peer_id: str) -> bool:
        """Hold the traffic with ``peer_id`` for its delay; then whether it gets through."""
        delay = self.delay_s.get(peer_id)
        if delay:
            await asyncio.sleep(delay)
        return peer_id not in self.blocked


class FaultyNetwork:
    """The faults of every member of a group (made on first use)."""

    def __init__(self) -> None:
        self._members: dict[str, Faults] = {}
        self.tap: Tap | None = None
        """Told of every request that leaves a member (a test counts frames with it)."""

    def __getitem__(self, member: str) -> Faults:
        return self._members.setdefault(member, Faults())

    def channels(self, self_id: str, inner: ChannelFactory) -> ChannelFactory:
        """``self_id``'s channel factory: ``inner``'s channels, through the faults of both ends."""
        def connect(peer: str) -> PeerChannel:
            return FaultyChannel(inner(peer), self, self_id)
        return connect


class FaultyChannel:
    """A channel through the faults of both ends (see the module docstring)."""

    def __init__(self, inner: PeerChannel, network: FaultyNetwork, self_id: str) -> None:
        self._inner = inner
        self._net = network
        self._self_id = self_id
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def peer_id(self) -> str:
        return self._inner.peer_id

    def _faulty(self) -> bool:
        return self._net[self._self_id].touches(self.peer_id) or self._net[self.peer_id].touches(self._self_id)

    def _tapped(self, msg_type: MsgType, tail: bytes | memoryview) -> None:
        if self._net.tap is not None:
            self._net.tap(self._self_id, self.peer_id, msg_type, len(tail))

    async def request(self, msg_type: MsgType, body: bytes, timeout_s: float,
                      tail: bytes | memoryview = b"") -> Frame:
        mine = self._net[self._self_id]
        if not await mine.passes(self.peer_id):
            raise PeerError(f"traffic to peer {self.peer_id} is blocked (fault)")
        self._tapped(msg_type, tail)
        deadline = asyncio.get_running_loop().time() + timeout_s
        answer = await self._inner.request(msg_type, body, timeout_s, tail)
        await self._answer_passes(msg_type, timeout_s, deadline)
        return answer

    async def _answer_passes(self, msg_type: MsgType, timeout_s: float, deadline: float) -> None:
        """The peer's faults hold its answer (a request waits out its timeout for one it drops), then ours.

        Raises:
            PeerError: the answer does not arrive.
        """
        loop = asyncio.get_running_loop()
        theirs = self._net[self.peer_id]
        delay = theirs.delay_s.get(self._self_id, 0.0)
        if delay:
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        if self._self_id in theirs.blocked or loop.time() >= deadline:
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            raise PeerError(f"peer {self.peer_id} did not answer {msg_type.name} within {timeout_s:.1f} s (fault)")
        if not await self._net[self._self_id].passes(self.peer_id):
            raise PeerError(f"traffic from peer {self.peer_id} is blocked (fault)")

    def send(self, msg_type: MsgType, body: bytes, timeout_s: float,
             tail: bytes | memoryview = b"") -> asyncio.Future[Frame] | None:
        """At once only when no fault touches this pair (else None: the caller uses :meth:`request`); an answer
        that arrives once one does passes the faults on its way back."""
        if self._faulty():
            return None
        inner = self._inner.send(msg_type, body, timeout_s, tail)
        if inner is None:
            return None
        self._tapped(msg_type, tail)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        out: asyncio.Future[Frame] = loop.create_future()

        def relay(f: asyncio.Future[Frame]) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif (exc := f.exception()) is not None:
                out.set_exception(exc)
            elif not self._faulty():
                out.set_result(f.result())
            else:
                task = loop.create_task(self._relay_through_faults(f.result(), out, msg_type, timeout_s, deadline))
                self._relays.add(task)
                task.add_done_callback(self._relays.discard)

        inner.add_done_callback(relay)
        out.add_done_callback(lambda o: inner.cancel() if o.cancelled() else None)
        return out

    async def _relay_through_faults(self, answer: Frame, out: asyncio.Future[Frame], msg_type: MsgType,
                                    timeout_s: float, deadline: float) -> None:
        try:
            await self._answer_passes(msg_type, timeout_s, deadline)
        except PeerError as e:
            if not out.done():
                out.set_exception(e)
            return
        if not out.done():
            out.set_result(answer)

    async def close(self) -> None:
        for t in list(self._relays):
            t.cancel()
        await self._inner.close()
