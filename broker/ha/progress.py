"""Replication progress on the master, as pure state (no sockets, no clock): SEMANTICS.md 2.4, 2.5, 2.8, 2.9.1.

* :class:`SlaveProgress` - what the master knows about one connected slave (first request, last ack).
* :class:`AckWaiters` - ``push2SlaveMaxOffset`` (the best ack of any slave, never lowered) and the SYNC_MASTER
  waiters ordered by the end offset they need; one ack completes every waiter it covers (group commit).
* :class:`ReplicationState` - the connections plus the waiters: ``is_slave_ok``, ``in_sync_slave_count``.
* :class:`Backoff` - the slave's bounded, jittered reconnect delays.

The I/O layer (:mod:`broker.ha.service`) feeds reports in and completes whatever tokens come back.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import attrs

__all__ = [
    "AckWaiter",
    "AckWaiters",
    "Backoff",
    "ReplicationState",
    "SlaveProgress",
    "TooManyWaitersError",
    "is_slave_ok",
    "slave_in_sync",
    "transfer_start_offset",
]

T = TypeVar("T")


def transfer_start_offset(request_offset: int, master_max_offset: int, mapped_file_size: int) -> int:
    """Where the master starts streaming for a slave's first report (SEMANTICS.md 2.4).

    An empty slave (report 0) gets the start of the master's LAST commit-log file; older data is never sent.
    """
    if request_offset < 0:
        raise ValueError(f"request offset {request_offset} is negative: the slave has not reported yet")
    if request_offset == 0:
        return max(0, master_max_offset - master_max_offset % mapped_file_size)
    return request_offset


def is_slave_ok(connection_count: int, master_put_where: int, push2slave_max_offset: int, max_gap: int) -> bool:
    """``isSlaveOK``: a slave is connected and the best ack is less than ``max_gap`` behind (strict)."""
    return connection_count > 0 and master_put_where - push2slave_max_offset < max_gap


def slave_in_sync(master_put_where: int, ack_offset: int, max_gap: int) -> bool:
    """One slave counts as in sync when its own ack is less than ``max_gap`` behind (strict; ack -1 before the
    first report, as in RocketMQ)."""
    return master_put_where - ack_offset < max_gap


@attrs.define
class SlaveProgress:
    """What the master knows about one connected slave."""

    addr: str
    """``host:port`` of the slave's end of the connection."""
    request_offset: int = -1
    """The first report on this connection (where to start); -1 until it arrives."""
    ack_offset: int = -1
    """The last report (the slave's max physical offset); -1 until the first report."""
    transferred_bytes: int = 0
    """Body bytes sent to this slave on this connection."""

    def on_report(self, offset: int) -> bool:
        """Record a report; return True when it is the first one (the writer may start)."""
        self.ack_offset = offset
        if self.request_offset < 0:
            self.request_offset = offset
            return True
        return False


class TooManyWaitersError(RuntimeError):
    """More ack waiters than ``ha_max_ack_waiters`` are pending."""


@attrs.define(eq=False)
class AckWaiter(Generic[T]):
    """A handle on one pending wait; ``token`` is whatever the I/O layer completes (an asyncio future)."""

    end_offset: int
    token: T
    active: bool = True


class AckWaiters(Generic[T]):
    """``push2SlaveMaxOffset`` plus waiters ordered by the offset they wait for.

    Expired waiters are dropped lazily (marked inactive, popped when an ack passes them, or swept when they
    outnumber the live ones), so expiry is O(1) and an ack is O(k log n) for the k waiters it completes.
    """

    def __init__(self, max_waiters: int) -> None:
        self.push2slave_max_offset = 0
        self._max_waiters = max_waiters
        self._heap: list[tuple[int, int, AckWaiter[T]]] = []
        self._seq = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def add(self, end_offset: int, token: T) -> AckWaiter[T] | None:
        """Register a wait for ``push2SlaveMaxOffset >= end_offset``; None when that already holds.

        Raises:
            TooManyWaitersError: ``max_waiters`` waits are already pending (the bound is named).
        """
        if self.push2slave_max_offset >= end_offset:
            return None
        if self._live >= self._max_waiters:
            raise TooManyWaitersError(f"{self._live} ack waiters pending (ha_max_ack_waiters={self._max_waiters})")
        waiter = AckWaiter(end_offset, token)
        heapq.heappush(self._heap, (end_offset, next(self._seq), waiter))
        self._live += 1
        return waiter

    def on_ack(self, offset: int) -> list[T]:
        """Raise ``push2SlaveMaxOffset`` to ``offset`` (never lowers it); return the tokens now satisfied, in
        offset order."""
        if offset > self.push2slave_max_offset:
            self.push2slave_max_offset = offset
        done: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= self.push2slave_max_offset:
            waiter = heapq.heappop(heap)[2]
            if waiter.active:
                waiter.active = False
                self._live -= 1
                done.append(waiter.token)
        return done

    def expire(self, waiter: AckWaiter[T]) -> bool:
        """Withdraw a waiter (its timeout fired); False when an ack had already completed it."""
        if not waiter.active:
            return False
        waiter.active = False
        self._live -= 1
        if len(self._heap) > 2 * self._live + 1024:
            self._heap = [entry for entry in self._heap if entry[2].active]
            heapq.heapify(self._heap)
        return True

    def drain(self) -> list[T]:
        """Withdraw every pending waiter (shutdown); return their tokens."""
        tokens = [w.token for _, _, w in sorted(self._heap, key=lambda e: (e[0], e[1])) if w.active]
        for _, _, waiter in self._heap:
            waiter.active = False
        self._heap.clear()
        self._live = 0
        return tokens


class ReplicationState(Generic[T]):
    """All slaves of one master and the acks they gave (keys are connection ids chosen by the caller)."""

    def __init__(self, *, max_gap: int, max_waiters: int) -> None:
        self.max_gap = max_gap
        self.slaves: dict[int, SlaveProgress] = {}
        self.waiters: AckWaiters[T] = AckWaiters(max_waiters)

    @property
    def push2slave_max_offset(self) -> int:
        return self.waiters.push2slave_max_offset

    @property
    def connection_count(self) -> int:
        return len(self.slaves)

    def add_slave(self, conn_id: int, addr: str) -> SlaveProgress:
        if conn_id in self.slaves:
            raise ValueError(f"connection id {conn_id} is already registered")
        progress = SlaveProgress(addr)
        self.slaves[conn_id] = progress
        return progress

    def remove_slave(self, conn_id: int) -> None:
        """Forget a connection; ``push2SlaveMaxOffset`` keeps the acks it gave (SEMANTICS.md 2.5)."""
        self.slaves.pop(conn_id, None)

    def on_report(self, conn_id: int, offset: int) -> tuple[bool, list[T]]:
        """A report from one slave: returns (it was the connection's first report, waiter tokens completed)."""
        progress = self.slaves.get(conn_id)
        if progress is None:
            raise KeyError(f"report from unknown connection id {conn_id}")
        first = progress.on_report(offset)
        return first, self.waiters.on_ack(offset)

    def is_slave_ok(self, master_put_where: int) -> bool:
        return is_slave_ok(self.connection_count, master_put_where, self.push2slave_max_offset, self.max_gap)

    def in_sync_slave_count(self, master_put_where: int) -> int:
        """Slaves (the master not counted) whose ack is less than ``max_gap`` behind ``master_put_where``."""
        return sum(slave_in_sync(master_put_where, p.ack_offset, self.max_gap) for p in self.slaves.values())

    def __iter__(self) -> Iterator[tuple[int, SlaveProgress]]:
        return iter(list(self.slaves.items()))


class Backoff:
    """Reconnect delays: doubling from ``min_ms`` up to ``max_ms``, each drawn in [delay/2, delay] and never
    below ``min_ms`` - so a flapping master is not hammered and many slaves do not reconnect in lockstep."""

    def __init__(self, min_ms: int, max_ms: int, rand: Callable[[], float]) -> None:
        if not 0 < min_ms <= max_ms:
            raise ValueError(f"backoff bounds must satisfy 0 < min_ms <= max_ms, got {min_ms}, {max_ms}")
        self._min_ms = min_ms
        self._max_ms = max_ms
        self._rand = rand
        self._attempt = 0

    @property
    def attempt(self) -> int:
        return self._attempt

    def next_ms(self) -> int:
        """The delay before the next attempt (and count the attempt)."""
        ceiling = min(self._max_ms, self._min_ms << min(self._attempt, 30))
        self._attempt += 1
        return max(self._min_ms, int(ceiling * (0.5 + 0.5 * self._rand())))

    def reset(self) -> None:
        """A connection worked: start again from ``min_ms``."""
        self._attempt = 0
