"""When a group consumer's background jobs are due: :class:`RebalanceClock`, shared by the sync and async engines
(:class:`client._group_engine.GroupEngine`), which differ only in how they wait for :meth:`RebalanceClock.wait_s`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from client._consume_core import GroupConsumerConfig

__all__ = ["SOON_FIRST_S", "Due", "RebalanceClock"]

#: A topic expected to get queues (a send-back created ``%RETRY%<group>``; a subscribed topic without a route
#: yet) is looked at again this soon, doubling up to ``rebalance_interval_s``.
SOON_FIRST_S = 1.0


class Due(NamedTuple):
    """The background jobs due now."""

    rebalance: bool
    commit: bool
    lock: bool


class RebalanceClock:
    """When an engine's background jobs are due (no I/O, thread-safe): the periodic rebalance, offset commit and
    lock renewal, and a rebalance out of period.

    A rebalance out of period is asked for now (a subscription changed: :meth:`asked_now`), at most once per
    :data:`SOON_FIRST_S` (a send-back expects a retry topic's queues: :meth:`expect`), or after a gap that doubles
    from :data:`SOON_FIRST_S` up to the period (a round could not allocate a topic -- no route yet, or the brokers
    do not list this client yet: :meth:`retry_soon`; a round that allocates every topic resets the gap).

    Args:
        config: the consumer's periods.
        lock_renewal: renew queue locks (orderly push consumers in clustering mode).
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, config: GroupConsumerConfig, *, lock_renewal: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._lock_renewal = lock_renewal
        self._clock = clock
        self._lock = threading.Lock()
        self._soon_at: float | None = None
        self._soon_gap_s = SOON_FIRST_S
        self._last_soon_run = -math.inf
        self.started()

    def started(self) -> None:
        """The engine starts now: a rebalance at once, the other jobs a period later."""
        now = self._clock()
        cfg = self._config
        with self._lock:
            self._next_rebalance = now
            self._next_commit = now + cfg.auto_commit_interval_s if cfg.auto_commit else math.inf
            self._next_lock = now + cfg.rebalance_lock_interval_s if self._lock_renewal else math.inf
            self._next_poll_commit = now + cfg.auto_commit_interval_s

    def asked_now(self) -> None:
        """Rebalance at once (a subscription or the assignment changed)."""
        with self._lock:
            self._soon_at = self._clock()

    def expect(self) -> None:
        """Rebalance at once, but not within :data:`SOON_FIRST_S` of the last rebalance out of period."""
        with self._lock:
            at = max(self._clock(), self._last_soon_run + SOON_FIRST_S)
            if self._soon_at is None or at < self._soon_at:
                self._soon_at = at

    def retry_soon(self) -> None:
        """A topic could not be allocated: rebalance again after the gap, which doubles up to the period."""
        with self._lock:
            at = self._clock() + self._soon_gap_s
            self._soon_gap_s = min(self._soon_gap_s * 2, self._config.rebalance_interval_s)
            if self._soon_at is None or at < self._soon_at:
                self._soon_at = at

    def allocated_all(self) -> None:
        """A round allocated every topic: the next :meth:`retry_soon` waits :data:`SOON_FIRST_S` again."""
        with self._lock:
            self._soon_gap_s = SOON_FIRST_S

    def take_due(self) -> Due:
        """The jobs due now; each is scheduled again a period from now."""
        now = self._clock()
        cfg = self._config
        with self._lock:
            soon = self._soon_at is not None and now >= self._soon_at
            if soon:
                self._soon_at = None
                self._last_soon_run = now
            due = Due(soon or now >= self._next_rebalance, now >= self._next_commit, now >= self._next_lock)
            if due.rebalance:
                self._next_rebalance = now + cfg.rebalance_interval_s
            if due.commit:
                self._next_commit = now + cfg.auto_commit_interval_s
            if due.lock:
                self._next_lock = now + cfg.rebalance_lock_interval_s
        return due

    def poll_commit_due(self) -> bool:
        """Lite pull: whether ``poll`` commits now (every ``auto_commit_interval_s`` with ``auto_commit``)."""
        if not self._config.auto_commit:
            return False
        now = self._clock()
        with self._lock:
            if now < self._next_poll_commit:
                return False
            self._next_poll_commit = now + self._config.auto_commit_interval_s
            return True

    def wait_s(self) -> float:
        """Seconds until a job is due (at least 10 ms: a clock that stands still cannot spin a loop)."""
        with self._lock:
            due = min(self._next_rebalance, self._next_commit, self._next_lock,
                      math.inf if self._soon_at is None else self._soon_at)
        return max(0.01, due - self._clock())
