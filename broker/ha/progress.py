"""Replication progress on the master, as pure state (no sockets, no clock): docs/BEHAVIOUR.md 2.4, 2.5, 2.8, 2.9.

* :class:`SlaveProgress` - what the master knows about one connected slave (first request, last ack).
* :func:`slave_acks_needed` - the in-sync-replica rule of a SYNC_MASTER send (below).
* :class:`AckWaiters` - the SYNC_MASTER waiters, grouped by how many slave acks they need and ordered by the end
  offset they wait for; one round of acks completes every waiter it covers (group commit).
* :class:`ReplicationState` - the connections plus the waiters: the in-sync count, the rule, the acks.
* :class:`Backoff` - the slave's bounded, jittered reconnect delays.

The in-sync rule is RocketMQ 5's (``inSyncReplicas``, ``minInSyncReplicas``, ``enableAutoInSyncReplicas``, each
counting the master as one replica, docs/BEHAVIOUR.md 2.9.2) with 4.9.3's answer when too few replicas are in sync:
``SLAVE_NOT_AVAILABLE`` at once (decision 5), where RocketMQ 5 would wait for its timeout. A slave is in sync when
*its own* last ack, on a connection that is still open, is less than ``haMaxGapNotInSync`` behind the put
(``inSyncReplicasNums``, docs/BEHAVIOUR.md 2.8). 4.9.3's ``isSlaveOK`` compares the best ack ever seen
(``push2SlaveMaxOffset``, kept after that slave disconnects) instead, so with the in-sync slave dead and a fresh
slave still catching up every send waited for the whole timeout; here that slave no longer counts, and neither
do its acks: a waiter completes when enough *connected* slaves have acked its offset. ``push2SlaveMaxOffset`` is
still kept, for the status page only.

An empty slave is streamed from the start of the master's last file (docs/BEHAVIOUR.md 2.4) -- or from the file of the
oldest put still waiting for a replica, when that file is older (:func:`transfer_start_offset`). Such a put was
appended while a slave was connected but had not yet reported; streamed from after it, that slave acked past its
end without ever receiving it, and the put got SEND_OK (RocketMQ compares the ack with the put's end alone).

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
    "report_violation",
    "slave_acks_needed",
    "slave_in_sync",
    "transfer_start_offset",
]

T = TypeVar("T")

#: Rebuild the heaps when they hold this many more entries than twice the live waiters (lazy expiry).
_SWEEP_SLACK = 1024


def transfer_start_offset(request_offset: int, master_max_offset: int, mapped_file_size: int,
                          master_min_offset: int = 0, oldest_waiting_end: int | None = None) -> int:
    """Where the master starts streaming for a slave's first report (docs/BEHAVIOUR.md 2.4).

    An empty slave (report 0) gets the start of the master's LAST commit-log file; older data is never sent --
    except that it gets the file of the oldest SYNC_MASTER send still waiting for a replica
    (``oldest_waiting_end``, that send's end offset) when that file is older: such a send was appended while a
    slave was connected but silent, and a slave streamed from after it could never ack it truthfully.
    A slave whose log ends before the master's oldest file (it was away while retention deleted what it
    needed) gets the master's first file: it then drops its own log and continues from there (RocketMQ would
    wait forever for bytes the master no longer has).
    """
    if request_offset < 0:
        raise ValueError(f"request offset {request_offset} is negative: the slave has not reported yet")
    if request_offset == 0:
        start = master_max_offset - master_max_offset % mapped_file_size
        if oldest_waiting_end is not None and 0 < oldest_waiting_end <= start:
            last_byte = oldest_waiting_end - 1
            start = last_byte - last_byte % mapped_file_size
        return max(start, master_min_offset)
    if request_offset < master_min_offset:
        return master_min_offset
    return request_offset


def report_violation(offset: int, *, first: bool, master_max_offset: int, sent_to: int) -> str | None:
    """Why an offset report cannot be true of a slave of this master, or None when it can.

    A report is an ack, so a false one makes a SYNC_MASTER answer SEND_OK for bytes no replica holds. An ack
    counts only for bytes that exist and were sent: a slave's first report (its own max offset) can never be past
    the master's log, and every later one can never be past what this connection carried (``sent_to``, the
    offset up to which frames were handed to its socket). The I/O layer closes a connection that sends one.

    Args:
        offset: the reported offset (never negative: the decoder refuses those).
        first: it is the connection's first report.
        master_max_offset: the master's commit-log max offset now.
        sent_to: the offset up to which this connection was sent frames.
    """
    if first and offset > master_max_offset:
        return (f"first report {offset} is past the master's max offset {master_max_offset}: the slave holds bytes "
                f"its master never wrote")
    if not first and offset > sent_to:
        return f"report {offset} is past the {sent_to} this master sent on the connection"
    return None


def slave_in_sync(master_put_where: int, ack_offset: int, max_gap: int) -> bool:
    """One slave counts as in sync when its own ack is less than ``max_gap`` behind (strict; ack -1 before the
    first report, as in RocketMQ)."""
    return master_put_where - ack_offset < max_gap


def slave_acks_needed(in_sync_replicas: int, min_in_sync_replicas: int, auto: bool, in_sync_slaves: int
                      ) -> int | None:
    """How many slave acks a SYNC_MASTER send waits for; None when it answers ``SLAVE_NOT_AVAILABLE`` at once.

    Replica counts include the master (RocketMQ 5, docs/BEHAVIOUR.md 2.9.2): the send needs ``in_sync_replicas``
    copies, or with ``auto`` (``enableAutoInSyncReplicas``) as many as are in sync, but never fewer than
    ``min_in_sync_replicas``. One copy (the master's) needs no slave ack. When more copies are needed than
    replicas are in sync (the master plus ``in_sync_slaves``), the send does not wait for a slave that is gone or
    ``haMaxGapNotInSync`` behind to catch up: it answers at once (decision 5).

    Args:
        in_sync_replicas: ``inSyncReplicas`` (>= 1).
        min_in_sync_replicas: ``minInSyncReplicas`` (>= 1), used with ``auto`` only.
        auto: ``enableAutoInSyncReplicas``.
        in_sync_slaves: connected slaves whose own ack is within ``haMaxGapNotInSync`` of the put.

    Returns:
        The slave acks to wait for (0: none), or None for SLAVE_NOT_AVAILABLE.
    """
    in_sync = 1 + in_sync_slaves
    needed = in_sync_replicas
    if auto:
        needed = max(min(needed, in_sync), min_in_sync_replicas)
    if needed <= 1:
        return 0
    if needed > in_sync:
        return None
    return needed - 1


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
    acks: int
    """Connected slaves that must have acked ``end_offset``."""
    token: T
    active: bool = True


class AckWaiters(Generic[T]):
    """Waiters grouped by the number of slave acks they need, each group a heap ordered by end offset.

    A waiter needing ``k`` acks is satisfied when the ``k``-th best ack of the connected slaves reaches its
    offset; :meth:`on_acks` takes those acks (best first) and completes every group's satisfied prefix.
    Expired waiters are dropped lazily (marked inactive, popped when acks pass them, or swept when they
    outnumber the live ones), so expiry is O(1) and a round of acks is O(k log n) for the k waiters it completes.
    """

    def __init__(self, max_waiters: int) -> None:
        self._max_waiters = max_waiters
        self._heaps: dict[int, list[tuple[int, int, AckWaiter[T]]]] = {}
        self._entries = 0
        self._seq = itertools.count()
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def add(self, end_offset: int, token: T, acks: int = 1) -> AckWaiter[T]:
        """Register a wait for ``acks`` connected slaves to ack ``end_offset``.

        Raises:
            ValueError: ``acks`` < 1 (nothing to wait for: the caller answers at once).
            TooManyWaitersError: ``max_waiters`` waits are already pending (the bound is named).
        """
        if acks < 1:
            raise ValueError(f"a waiter needs at least one slave ack, got {acks}")
        if self._live >= self._max_waiters:
            raise TooManyWaitersError(f"{self._live} ack waiters pending (ha_max_ack_waiters={self._max_waiters})")
        waiter = AckWaiter(end_offset, acks, token)
        heapq.heappush(self._heaps.setdefault(acks, []), (end_offset, next(self._seq), waiter))
        self._entries += 1
        self._live += 1
        return waiter

    def on_acks(self, acks_best_first: list[int]) -> list[T]:
        """The ack offsets of the connected slaves, best first: return the tokens now satisfied, in offset order
        within each group of equal ``acks``."""
        done: list[T] = []
        for acks, heap in self._heaps.items():
            if acks > len(acks_best_first):
                continue  # fewer slaves connected than this group needs
            reached = acks_best_first[acks - 1]
            while heap and heap[0][0] <= reached:
                waiter = heapq.heappop(heap)[2]
                self._entries -= 1
                if waiter.active:
                    waiter.active = False
                    self._live -= 1
                    done.append(waiter.token)
        return done

    def expire(self, waiter: AckWaiter[T]) -> bool:
        """Withdraw a waiter (its timeout fired); False when acks had already completed it."""
        if not waiter.active:
            return False
        waiter.active = False
        self._live -= 1
        if self._entries > 2 * self._live + _SWEEP_SLACK:
            for acks, heap in self._heaps.items():
                kept = [entry for entry in heap if entry[2].active]
                heapq.heapify(kept)
                self._heaps[acks] = kept
            self._entries = self._live
        return True

    def oldest_end(self) -> int | None:
        """The lowest end offset a live waiter waits for (None: no waiter). Expired waiters at the heads are dropped
        on the way: one left from long ago would send a new slave back to a file it has no need of."""
        ends: list[int] = []
        for heap in self._heaps.values():
            while heap and not heap[0][2].active:
                heapq.heappop(heap)
                self._entries -= 1
            if heap:
                ends.append(heap[0][0])
        return min(ends, default=None)

    def drain(self) -> list[T]:
        """Withdraw every pending waiter (shutdown); return their tokens, in offset order."""
        entries = sorted(entry for heap in self._heaps.values() for entry in heap if entry[2].active)
        for heap in self._heaps.values():
            for _, _, waiter in heap:
                waiter.active = False
        self._heaps.clear()
        self._entries = 0
        self._live = 0
        return [waiter.token for _, _, waiter in entries]


class ReplicationState(Generic[T]):
    """All slaves of one master, the acks they gave and the in-sync rule (keys are connection ids chosen by
    the caller).

    Args:
        max_gap: ``haMaxGapNotInSync``, bytes.
        max_waiters: ``ha_max_ack_waiters``.
        in_sync_replicas: ``inSyncReplicas`` (the master counted).
        min_in_sync_replicas: ``minInSyncReplicas`` (the master counted; with ``auto`` only).
        auto: ``enableAutoInSyncReplicas``.
    """

    def __init__(self, *, max_gap: int, max_waiters: int, in_sync_replicas: int = 2, min_in_sync_replicas: int = 1,
                 auto: bool = False) -> None:
        self.max_gap = max_gap
        self.in_sync_replicas = in_sync_replicas
        self.min_in_sync_replicas = min_in_sync_replicas
        self.auto = auto
        self.slaves: dict[int, SlaveProgress] = {}
        self.waiters: AckWaiters[T] = AckWaiters(max_waiters)
        self.push2slave_max_offset = 0
        """The best ack any slave ever gave (monotonic, kept after it disconnects): for the status page only."""

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
        """Forget a connection and its acks. A pending waiter is left alone: it can no longer count this slave,
        but other connected slaves (or one that connects and catches up) may still complete it before its
        deadline, when the I/O layer expires it (FLUSH_SLAVE_TIMEOUT)."""
        self.slaves.pop(conn_id, None)

    def on_report(self, conn_id: int, offset: int) -> tuple[bool, list[T]]:
        """A report from one slave: returns (it was the connection's first report, waiter tokens completed).

        The first report is an ack too: the slave holds every byte below it (a reconnecting slave's data counts).
        """
        progress = self.slaves.get(conn_id)
        if progress is None:
            raise KeyError(f"report from unknown connection id {conn_id}")
        first = progress.on_report(offset)
        if offset > self.push2slave_max_offset:
            self.push2slave_max_offset = offset
        if not len(self.waiters):
            return first, []
        return first, self.waiters.on_acks(self.acks_best_first())

    def acks_best_first(self) -> list[int]:
        """The last ack of each connected slave, best first (-1 for one that has not reported)."""
        return sorted((p.ack_offset for p in self.slaves.values()), reverse=True)

    def in_sync_slave_count(self, master_put_where: int) -> int:
        """Connected slaves whose own ack is less than ``max_gap`` behind ``master_put_where`` (the master not
        counted; RocketMQ's ``inSyncReplicasNums`` is this + 1)."""
        return sum(slave_in_sync(master_put_where, p.ack_offset, self.max_gap) for p in self.slaves.values())

    def is_slave_ok(self, master_put_where: int) -> bool:
        """At least one connected slave is in sync by its own ack (4.9.3's name, the per-connection rule)."""
        return self.in_sync_slave_count(master_put_where) > 0

    def slave_acks_needed(self, master_put_where: int) -> int | None:
        """:func:`slave_acks_needed` for a put ending at ``master_put_where``, with the connected slaves."""
        return slave_acks_needed(self.in_sync_replicas, self.min_in_sync_replicas, self.auto,
                                 self.in_sync_slave_count(master_put_where))

    def wait(self, end_offset: int, token: T, acks: int = 1) -> AckWaiter[T] | None:
        """Register a wait for ``acks`` connected slaves to ack ``end_offset``; None when that already holds.

        Raises:
            ValueError: ``acks`` < 1.
            TooManyWaitersError: ``max_waiters`` waits are already pending.
        """
        best = self.acks_best_first()
        if 1 <= acks <= len(best) and best[acks - 1] >= end_offset:
            return None
        return self.waiters.add(end_offset, token, acks)

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
