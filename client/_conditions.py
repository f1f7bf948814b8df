"""A :class:`threading.Condition` whose notifications cost nothing while no thread waits.

CPython's ``notify`` and ``notify_all`` build a deque of the waiters to wake on every call, and a producer's send
and a transport's request each end with one: a few µs of every single send, almost always with nobody waiting.
"""

from __future__ import annotations

import threading

__all__ = ["CountedCondition"]


class CountedCondition(threading.Condition):
    """A Condition that counts the threads in :meth:`wait` and notifies only when there are any.

    The count changes under the condition's lock, as the waiters list does, so a notify made under the lock never
    misses a thread that is waiting (``wait_for`` waits through :meth:`wait`).
    """

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        super().__init__(lock)
        self.waiting = 0
        """Threads in :meth:`wait` now."""

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1

    def notify(self, n: int = 1) -> None:
        if self.waiting:
            super().notify(n)

    def notify_all(self) -> None:
        if self.waiting:
            super().notify_all()
