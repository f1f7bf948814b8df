"""The queue locks of an orderly push consumer (RocketMQ's ``RebalanceImpl.lock`` / ``lockAll`` / ``unlock`` and
the locks of ``ConsumeMessageOrderlyService``), so two instances of a group never consume one queue at once.

The protocol, on top of the group's rebalance (:class:`client._group_engine.GroupEngine`):

* a queue the rebalance gives this instance is locked on the master of its broker group (``POST /queue/lock``)
  before it is held; a queue whose lock is refused (another instance still holds it) is left for the next
  rebalance;
* every ``rebalance_lock_interval_s`` (20 s, RocketMQ's ``rebalanceLockInterval``) the held queues are locked
  again, which renews them on the broker (60 s expiry there); a queue the broker no longer grants stops being
  consumed until a later lock succeeds;
* a queue is consumed only while its lock is fresh: granted within :data:`LOCAL_LOCK_MAX_LIVE_S` (30 s, half the
  broker's expiry), so an instance that cannot reach the master stops before the broker lets another take over;
* a queue the rebalance takes away is handed over once its running callback has finished (waiting at most
  :data:`DROP_WAIT_S`; else the next rebalance tries again, still holding the lock): its consumed offset is
  committed, then it is unlocked, so the next owner starts exactly after the last message consumed here;
* on close, after the final commit, every held queue is unlocked.

:class:`LockView` is the local state as pure data (injected clock, table-tested); :class:`QueueLocker` adds the
requests, as operations (:data:`client._requests.Op`) the engine's client instance runs. Locks live on masters
only (a slave refuses them): while a group has no master, its queues cannot be locked or renewed, and their
consumption stops within 30 s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from client import _requests as rq
from client._instance import _InstanceCore
from client._requests import Op, call_op
from common.errors import BrokerNotFoundError, ClientError
from common.message import MessageQueue
from common.queue_lock import LockBatchRequest, lock_response

__all__ = ["DROP_WAIT_S", "LOCAL_LOCK_MAX_LIVE_S", "REBALANCE_LOCK_INTERVAL_S", "LockView", "QueueLocker"]

log = logging.getLogger(__name__)

#: RocketMQ's ``rebalanceLockInterval``: how often held queues are locked again (renewed).
REBALANCE_LOCK_INTERVAL_S = 20.0
#: RocketMQ's client-side ``REBALANCE_LOCK_MAX_LIVE_TIME``: a lock not renewed for longer is not trusted.
LOCAL_LOCK_MAX_LIVE_S = 30.0
#: How long a hand-over waits for the queue's running callback (RocketMQ's ``tryLock(1000 ms)``).
DROP_WAIT_S = 1.0


class LockView:
    """Which queues this instance believes it holds locked, and since when (no I/O, not thread-safe by itself).

    Args:
        clock: monotonic seconds (injected by tests).
        max_live_s: a lock not granted again within this is stale.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_live_s: float = LOCAL_LOCK_MAX_LIVE_S
                 ) -> None:
        self._clock = clock
        self._max_live_s = max_live_s
        self._granted: dict[MessageQueue, float] = {}

    def granted(self, asked: Iterable[MessageQueue], locked: set[MessageQueue]) -> None:
        """A lock answer: the ``locked`` ones of ``asked`` are fresh now; the others are not held."""
        now = self._clock()
        for mq in asked:
            if mq in locked:
                self._granted[mq] = now
            else:
                self._granted.pop(mq, None)

    def forget(self, mq: MessageQueue) -> None:
        """``mq`` was unlocked (or handed over)."""
        self._granted.pop(mq, None)

    def holds(self, mq: MessageQueue) -> bool:
        """True while ``mq`` was granted within ``max_live_s``."""
        at = self._granted.get(mq)
        return at is not None and self._clock() - at <= self._max_live_s

    def locked(self) -> set[MessageQueue]:
        """Every queue granted (fresh or not)."""
        return set(self._granted)


class QueueLocker:
    """Locks, renews and unlocks the queues of one orderly consumer on their masters.

    Args:
        group: the consumer group.
        client: the client instance (its id names the holder; its route finds the masters).
        view: the local lock state.
    """

    def __init__(self, group: str, client: _InstanceCore, view: LockView | None = None) -> None:
        self.group = group
        self._client = client
        self.view = view or LockView()
        self._lock = threading.Lock()
        self._consuming: dict[MessageQueue, threading.Lock] = {}

    # --- local ---

    def holds(self, mq: MessageQueue) -> bool:
        """True while this instance may consume ``mq`` (its lock is fresh)."""
        with self._lock:
            return self.view.holds(mq)

    def consume_lock(self, mq: MessageQueue) -> threading.Lock:
        """The lock a callback of ``mq`` holds while it runs and commits (a hand-over waits for it)."""
        with self._lock:
            return self._consuming.setdefault(mq, threading.Lock())

    @contextlib.contextmanager
    def idle(self, mq: MessageQueue, wait_s: float = DROP_WAIT_S) -> Iterator[bool]:
        """Hold ``mq``'s consume lock (yields True), waiting at most ``wait_s`` for a running callback; yields
        False when it is still running then."""
        lock = self.consume_lock(mq)
        got = lock.acquire(timeout=wait_s)
        try:
            yield got
        finally:
            if got:
                lock.release()

    # --- requests ---

    def lock_op(self, queues: Iterable[MessageQueue]) -> Op[set[MessageQueue]]:
        """Lock (or renew) ``queues`` on their masters; returns those granted. A master that cannot be reached
        changes nothing (its queues' locks age until :meth:`holds` says no)."""
        granted: set[MessageQueue] = set()
        for broker, mqs in _by_broker(queues).items():
            try:
                answer = lock_response((yield from self._post_op(broker, "/queue/lock", mqs)))
            except ClientError as e:
                log.info("%s: locking %d queues on %s failed: %s", self.group, len(mqs), broker, e)
                continue
            ok = {mq for mq in answer if mq in mqs}
            with self._lock:
                self.view.granted(mqs, ok)
            if len(ok) < len(mqs):
                log.info("%s: %d of %d queues on %s are locked by another instance", self.group,
                         len(mqs) - len(ok), len(mqs), broker)
            granted |= ok
        return granted

    def unlock_op(self, queues: Iterable[MessageQueue]) -> Op[None]:
        """Unlock ``queues`` on their masters (failures are logged: the broker's lock then expires in 60 s)."""
        for broker, mqs in _by_broker(queues).items():
            with self._lock:
                for mq in mqs:
                    self.view.forget(mq)
                    self._consuming.pop(mq, None)
            try:
                yield from self._post_op(broker, "/queue/unlock", mqs)
            except ClientError as e:
                log.warning("%s: unlocking %d queues on %s failed (they expire on the broker): %s", self.group,
                            len(mqs), broker, e)

    def _post_op(self, broker: str, path: str, mqs: list[MessageQueue]) -> Op[dict[str, Any]]:
        client = self._client
        addr = client.find_broker_address_in_publish(broker)
        if addr is None:
            yield from client.update_route_op(mqs[0].topic)
            addr = client.find_broker_address_in_publish(broker)
        if addr is None:
            raise BrokerNotFoundError(f"The broker[{broker}] has no master to lock queues on")
        body = LockBatchRequest(self.group, client.client_id, tuple(mqs)).to_json()
        return (yield from call_op("POST", addr, path, f"{path} of {self.group} at {addr}", rq.json_of, body))


def _by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = {}
    for mq in sorted(set(queues)):
        out.setdefault(mq.broker_name, []).append(mq)
    return out
