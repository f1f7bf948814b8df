"""How much of the newest commit log a read can count on finding in memory (``suggestPullingFromSlave``'s
``memory``): a pure function of the host's RAM, the memory cgroup's limit and ``accessMessageInMemoryMaxRatio``,
and the cache that re-reads the limit now and then (docs/HA.md, "Read/write splitting").

The limit is read at the edge (:func:`common.memory_cgroup.effective_memory_limit_bytes`), at most once per
``refresh_ms`` by the clock given, never once per pull: it changes when an operator resizes a container, not
between two pulls.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryLimitCache", "memory_bytes_for_reads"]


def memory_bytes_for_reads(ram_bytes: int, limit_bytes: int | None, ratio_percent: int) -> int:
    """``ratio_percent`` % of the memory the broker can use: its host's RAM, or its memory cgroup's limit when
    that is smaller (None: no limit). Truncated like Java's long cast."""
    usable = ram_bytes if limit_bytes is None else min(ram_bytes, limit_bytes)
    return int(usable * (ratio_percent / 100.0))


class MemoryLimitCache:
    """The memory-cgroup limit (None: unlimited), read on first use and again once ``refresh_ms`` has passed.

    Args:
        read: reads the limit (None: no limit).
        clock_ms: the clock the refresh is timed by; a clock that steps back counts as due.
        refresh_ms: how long a reading is used.
    """

    def __init__(self, read: Callable[[], int | None], clock_ms: Callable[[], int], refresh_ms: int) -> None:
        if refresh_ms <= 0:
            raise ValueError(f"refresh_ms must be > 0, got {refresh_ms}")
        self._read = read
        self._clock = clock_ms
        self._refresh_ms = refresh_ms
        self._limit: int | None = None
        self._read_at: int | None = None
        self.reads = 0
        """How many times the limit was read (for tests)."""

    def limit_bytes(self) -> int | None:
        now = self._clock()
        at = self._read_at
        if at is None or not 0 <= now - at < self._refresh_ms:
            self._limit = self._read()
            self._read_at = now
            self.reads += 1
        return self._limit
