"""The check-backs waiting for their producer group, and the producers' long polls for them.

RocketMQ's broker calls a producer of the group over that producer's connection (``Broker2Client``). Here the
producers poll ``GET /transaction/checks``: a poll takes what is queued for its group at once, or parks until a
check is offered or its hold ends. Any producer of the group may take a check; a check handed out is gone from
the queue, and if the producer dies before answering, the half message is simply checked again next round (it
was re-put with one more check), as a lost oneway call is in RocketMQ.

Why not :mod:`broker.long_polling`: it parks pulls by (topic, queue, offset) and answers them from the store;
a check poll waits on an in-memory queue per group. The waiting here is one ``asyncio.Event`` per group.

Bounds: ``max_per_group`` checks per group (offering to a full queue drops the oldest, which a later round
checks again), ``max_groups`` groups (checks for a group past it are dropped with a warning), ``max_parked``
polls parked at once (more are answered empty at once), and each poll's hold.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from common.transaction import TransactionCheck

__all__ = ["CheckQueues"]

log = logging.getLogger(__name__)


class _Group:
    __slots__ = ("event", "queue")

    def __init__(self, max_len: int) -> None:
        self.queue: collections.deque[TransactionCheck] = collections.deque(maxlen=max_len)
        self.event = asyncio.Event()


class CheckQueues:
    """Bounded check queues per producer group; use on the broker's event loop.

    Args:
        max_per_group: checks kept per group (the oldest are dropped past it).
        max_groups: groups with a queue.
        max_parked: polls parked at once.
    """

    def __init__(self, *, max_per_group: int = 2000, max_groups: int = 1000, max_parked: int = 1000) -> None:
        if max_per_group <= 0 or max_groups <= 0 or max_parked < 0:
            raise ValueError("max_per_group and max_groups must be > 0, max_parked >= 0")
        self._max_per_group = max_per_group
        self._max_groups = max_groups
        self._max_parked = max_parked
        self._groups: dict[str, _Group] = {}
        self._parked = 0
        self._closed = False
        self.dropped = 0
        """Checks dropped by a bound since creation."""

    @property
    def parked(self) -> int:
        return self._parked

    def pending(self, group: str) -> int:
        g = self._groups.get(group)
        return len(g.queue) if g is not None else 0

    def _group(self, group: str) -> _Group | None:
        g = self._groups.get(group)
        if g is None:
            if len(self._groups) >= self._max_groups:
                return None
            g = self._groups[group] = _Group(self._max_per_group)
        return g

    def offer(self, group: str, check: TransactionCheck) -> bool:
        """Queue a check for ``group`` and wake its parked polls; False when a bound dropped a check."""
        g = self._group(group)
        if g is None:
            self.dropped += 1
            log.warning("transaction check of %s for group %s dropped: %d producer groups have checks queued "
                        "(bound maxGroups)", check.transaction_id, group, self._max_groups)
            return False
        full = len(g.queue) == g.queue.maxlen
        g.queue.append(check)
        g.event.set()
        if full:
            self.dropped += 1
            log.warning("transaction check queue of group %s is full (%d, bound maxPerGroup): oldest check "
                        "dropped (checked again next round)", group, self._max_per_group)
        return not full

    def clear(self) -> None:
        """Forget every queued check (the broker stopped being a master: a new master checks again)."""
        for g in self._groups.values():
            g.queue.clear()

    def close(self) -> None:
        """Answer every parked poll now (broker stop)."""
        self._closed = True
        for g in self._groups.values():
            g.event.set()

    async def take(self, group: str, max_nums: int, hold_s: float) -> list[TransactionCheck]:
        """Up to ``max_nums`` checks of ``group``, waiting up to ``hold_s`` for the first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold_s
        while True:
            g = self._groups.get(group)
            if g is not None and g.queue:
                out = [g.queue.popleft() for _ in range(min(max_nums, len(g.queue)))]
                if not g.queue:
                    g.event.clear()
                return out
            left = deadline - loop.time()
            if self._closed or left <= 0 or self._parked >= self._max_parked:
                return []
            g = self._group(group)
            if g is None:
                return []
            self._parked += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(g.event.wait(), left)
            finally:
                self._parked -= 1
            if not g.queue:  # another poll of the group took it first
                g.event.clear()
