"""The queue locks of orderly consumption as plain state (RocketMQ's ``RebalanceLockManager``); no I/O, no clock
of its own.

An orderly push consumer locks the queues a rebalance gave it on their group's master before it consumes them,
renews the locks every 20 s (``rebalanceLockInterval``) and unlocks the queues it hands over. The master keeps one
entry per (consumer group, topic, queue id): the client id holding it and when it last locked or renewed it. The
rules, each a row of ``tests/broker/test_rebalance_lock.py``:

* a queue nobody holds is given to the asker;
* a queue the asker holds is renewed (its timestamp moves to now);
* a queue another client holds is refused while that client's entry is younger than ``max_live_ms``
  (``rebalanceLockMaxLiveTime``, 60 s) -- twice the renew period, so one lost renewal does not lose the lock;
* an entry older than that is expired: the asker takes it over;
* an unlock removes only the asker's own entries (an unlock of a queue another client holds does nothing).

The client stops consuming a queue when its own view of the lock is older than 30 s (half of the broker's
expiry), so by the time the broker lets another client take a queue over, the first one has stopped.

The number of entries is bounded (``max_entries``): when a lock would pass it, expired entries are swept first,
and a queue that still does not fit is refused (renewals always fit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import attrs

__all__ = ["DEFAULT_MAX_ENTRIES", "REBALANCE_LOCK_MAX_LIVE_MS", "LockEntry", "QueueKey", "RebalanceLockTable"]

log = logging.getLogger(__name__)

#: RocketMQ's ``rebalanceLockMaxLiveTime`` (``-Drocketmq.broker.rebalance.lockMaxLiveTime``): 60 s.
REBALANCE_LOCK_MAX_LIVE_MS = 60_000
#: Bound of the (group, queue) entries one broker keeps.
DEFAULT_MAX_ENTRIES = 1_000_000

#: ``(topic, queue id)``: a queue of this broker group (the broker name is the same for every entry).
QueueKey = tuple[str, int]


@attrs.define
class LockEntry:
    """Who holds one queue for one group, since when."""

    client_id: str
    """The holder's client id."""
    last_update_ms: int
    """When the holder last locked or renewed the queue (broker clock)."""


class RebalanceLockTable:
    """Queue locks per consumer group (see the module docstring). Not thread-safe: the broker's event loop is
    its only user.

    Args:
        clock_ms: the broker's clock in ms (injected by tests).
        max_live_ms: an entry not renewed for longer than this is expired.
        max_entries: bound on the entries of all groups.
    """

    def __init__(self, clock_ms: Callable[[], int], *, max_live_ms: int = REBALANCE_LOCK_MAX_LIVE_MS,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_live_ms <= 0:
            raise ValueError(f"max_live_ms must be > 0, got {max_live_ms}")
        if max_entries <= 0:
            raise ValueError(f"max_entries must be > 0, got {max_entries}")
        self._clock_ms = clock_ms
        self._max_live_ms = max_live_ms
        self._max_entries = max_entries
        self._groups: dict[str, dict[QueueKey, LockEntry]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _expired(self, entry: LockEntry, now_ms: int) -> bool:
        return now_ms - entry.last_update_ms > self._max_live_ms

    def holder(self, group: str, queue: QueueKey) -> str | None:
        """The client holding ``queue`` for ``group`` now, or None (no entry, or an expired one)."""
        entry = self._groups.get(group, {}).get(queue)
        if entry is None or self._expired(entry, self._clock_ms()):
            return None
        return entry.client_id

    def try_lock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> set[QueueKey]:
        """Lock (or renew) ``queues`` for ``client_id``; returns those it holds now (RocketMQ's ``tryLockBatch``).

        The others are held by another live client, or did not fit within ``max_entries``.
        """
        now = self._clock_ms()
        table = self._groups.setdefault(group, {})
        locked: set[QueueKey] = set()
        for q in queues:
            entry = table.get(q)
            if entry is None:
                if self._count >= self._max_entries:
                    self._sweep(now)
                    table = self._groups.setdefault(group, {})  # the sweep may have dropped the group's dict
                    if self._count >= self._max_entries:
                        log.warning("queue lock of %s %s for %s refused: %d entries, the bound max_entries",
                                    group, q, client_id, self._count)
                        continue
                table[q] = LockEntry(client_id, now)
                self._count += 1
                locked.add(q)
            elif entry.client_id == client_id:
                entry.last_update_ms = now
                locked.add(q)
            elif self._expired(entry, now):
                log.info("queue lock of %s %s: %s took it over from %s (not renewed for %d ms)", group, q,
                         client_id, entry.client_id, now - entry.last_update_ms)
                entry.client_id, entry.last_update_ms = client_id, now
                locked.add(q)
        if not table:
            del self._groups[group]
        return locked

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> set[QueueKey]:
        """Release those of ``queues`` that ``client_id`` holds; returns them."""
        table = self._groups.get(group)
        if table is None:
            return set()
        released: set[QueueKey] = set()
        for q in queues:
            entry = table.get(q)
            if entry is not None and entry.client_id == client_id:
                del table[q]
                self._count -= 1
                released.add(q)
        if not table:
            del self._groups[group]
        return released

    def clear(self) -> None:
        """Forget every lock (a broker that stops being the master: the next master starts empty)."""
        self._groups.clear()
        self._count = 0

    def _sweep(self, now_ms: int) -> None:
        for group in list(self._groups):
            table = self._groups[group]
            for q in [q for q, e in table.items() if self._expired(e, now_ms)]:
                del table[q]
                self._count -= 1
            if not table:
                del self._groups[group]
