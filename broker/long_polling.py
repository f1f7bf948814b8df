"""Long polling: pulls that found nothing new wait here until their queue grows or their deadline passes.

RocketMQ's ``PullRequestHoldService`` re-checks parked pulls every 5 s and on every dispatch; here the
dispatcher's listener wakes exactly the pulls of the queue that grew (``max offset > requested offset``), in the
broker's event loop. Both the number of parked pulls (``maxParkedPulls``) and each wait
(``min(suspendTimeoutMs, maxSuspendTimeoutMs)``) are bounded.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["PullHoldService"]

log = logging.getLogger(__name__)


class _Parked:
    __slots__ = ("future", "offset")

    def __init__(self, future: asyncio.Future[bool], offset: int) -> None:
        self.future = future
        self.offset = offset


class PullHoldService:
    """Parked pulls by ``(topic, queue_id)``; all methods run in the event loop's thread.

    Args:
        max_parked: bound on the number of pulls parked at once (``maxParkedPulls``).
    """

    def __init__(self, max_parked: int) -> None:
        self._max_parked = max_parked
        self._parked: dict[tuple[str, int], list[_Parked]] = {}
        self._count = 0
        self._closed = False

    @property
    def parked_count(self) -> int:
        return self._count

    def can_park(self) -> bool:
        """False when ``maxParkedPulls`` pulls are already waiting (the pull is answered at once)."""
        return not self._closed and self._count < self._max_parked

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until the queue's max offset passes ``offset`` or ``timeout_s`` elapses.

        Returns:
            True when new data arrived, False at the deadline or on shutdown.
        """
        if not self.can_park() or timeout_s <= 0:
            return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = _Parked(fut, offset)
        key = (topic, queue_id)
        self._parked.setdefault(key, []).append(entry)
        self._count += 1
        try:
            done, _ = await asyncio.wait((fut,), timeout=timeout_s)
            return bool(done) and fut.result()
        finally:
            self._remove(key, entry)

    def _remove(self, key: tuple[str, int], entry: _Parked) -> None:
        waiters = self._parked.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(entry)
        except ValueError:
            return
        self._count -= 1
        if not waiters:
            del self._parked[key]

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Wake the pulls of ``(topic, queue_id)`` that asked for an offset below ``max_offset``."""
        waiters = self._parked.get((topic, queue_id))
        if not waiters:
            return
        for entry in waiters:
            if entry.offset < max_offset and not entry.future.done():
                entry.future.set_result(True)

    def close(self) -> None:
        """Wake every parked pull (they answer with what they have) and refuse new ones."""
        self._closed = True
        for waiters in self._parked.values():
            for entry in waiters:
                if not entry.future.done():
                    entry.future.set_result(False)
