"""Partition planning: per-queue offset ranges, empty ones dropped, big ones split.

Pure functions over offset maps; the source calls them on the driver (batch ``partitions()`` and streaming
``partitions(start, end)``). The same inputs always give the same ranges in the same order, which Spark's
offset-log replay relies on for exactly-once reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from spark_connector.offsets import QueueKey

__all__ = ["MinOffsetsGate", "QueueRange", "plan_ranges", "split_ranges"]


@dataclass(frozen=True, order=True)
class QueueRange:
    """Offsets ``[start, end)`` of one queue that one Spark task reads.

    ``broker_addrs`` is a snapshot of the group's route (``((brokerId, addr), ...)``, ascending ids) taken at
    planning time, so executors can pull without asking the nameserver first; they refresh it only on failure.
    """

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    broker_addrs: tuple[tuple[int, str], ...] = field(default=(), compare=False)

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.broker_name, self.queue_id)

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}[{self.start},{self.end})"


def _split_even(r: QueueRange, parts: int) -> list[QueueRange]:
    """``r`` cut into ``parts`` consecutive sub-ranges whose sizes differ by at most one."""
    out: list[QueueRange] = []
    remaining = r.size
    begin = r.start
    for i in range(parts):
        n = remaining // (parts - i)
        remaining -= n
        out.append(QueueRange(r.topic, r.broker_name, r.queue_id, begin, begin + n, r.broker_addrs))
        begin += n
    return [x for x in out if x.size > 0]


def split_ranges(
    ranges: Sequence[QueueRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[QueueRange]:
    """Split ranges like Kafka's offset range calculator.

    First every range larger than ``max_records_per_partition`` is cut into pieces of at most that many
    offsets. Then, if there are still fewer ranges than ``min_partitions``, each range gets a number of pieces
    proportional to its share of all offsets (at least one).

    Args:
        ranges: non-empty ranges.
        min_partitions: the task count to reach, approximately.
        max_records_per_partition: the largest range allowed.

    Returns:
        The pieces, in input order (pieces of one range in offset order).
    """
    out = list(ranges)
    if max_records_per_partition:
        cut: list[QueueRange] = []
        for r in out:
            cut.extend(_split_even(r, max(1, math.ceil(r.size / max_records_per_partition))))
        out = cut
    if min_partitions and len(out) < min_partitions:
        total = sum(r.size for r in out)
        if total > 0:
            cut = []
            for r in out:
                parts = max(1, round(r.size / total * min_partitions))
                cut.extend(_split_even(r, parts))
            out = cut
    return out


def plan_ranges(
    starts: Mapping[QueueKey, int],
    ends: Mapping[QueueKey, int],
    *,
    routes: Mapping[str, Mapping[int, str]] | None = None,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[QueueRange]:
    """The tasks that read ``[starts[q], ends[q])`` for every queue in ``ends``.

    Queues whose range is empty (or inverted) are dropped: a task per empty queue only costs time (and was a
    crash in rocketmq-spark, issue #148). Queues missing from ``starts`` start at 0.

    Args:
        starts: first offset per queue.
        ends: exclusive end offset per queue.
        routes: ``brokerName -> {brokerId: addr}`` to snapshot into each range.
        min_partitions: see :func:`split_ranges`.
        max_records_per_partition: see :func:`split_ranges`.

    Returns:
        Ranges sorted by (topic, broker, queue, start).
    """
    routes = routes or {}
    base: list[QueueRange] = []
    for key in sorted(ends):
        start = starts.get(key, 0)
        end = ends[key]
        if end > start:
            addrs = tuple(sorted((int(i), a) for i, a in routes.get(key.broker_name, {}).items()))
            base.append(QueueRange(key.topic, key.broker_name, key.queue_id, start, end, addrs))
    pieces = split_ranges(
        base, min_partitions=min_partitions, max_records_per_partition=max_records_per_partition
    )
    return sorted(pieces)


class MinOffsetsGate:
    """Kafka's ``minOffsetsPerTrigger`` rule, pure with the clock injected: a trigger with fewer new offsets
    waits, unless ``maxTriggerDelay`` passed since the last trigger let through (``lastTriggerMillis``, taken when
    the trigger is planned, not when its micro-batch ends). The first trigger always runs."""

    def __init__(self, min_offsets: int, max_delay_ms: int, clock_ms: Callable[[], int]) -> None:
        self.min_offsets = min_offsets
        self.max_delay_ms = max_delay_ms
        self._clock_ms = clock_ms
        self._last_ms: int | None = None

    def admit(self, new_offsets: int) -> bool:
        """Whether a trigger with ``new_offsets`` new offsets runs now (and, if so, restart the delay)."""
        now = self._clock_ms()
        if (self._last_ms is None or now - self._last_ms >= self.max_delay_ms
                or new_offsets >= self.min_offsets):
            self._last_ms = now
            return True
        return False
