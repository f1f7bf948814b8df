"""Waiting for a put to be as durable as the broker's mode asks, docs/BEHAVIOUR.md 2.9 and decision 5; shared by
``/send`` and ``/consumer/sendback``.

* ``SYNC_FLUSH``: wait for the commit log to be flushed past the put (``FLUSH_DISK_TIMEOUT`` after
  ``syncFlushTimeout``).
* ``SYNC_MASTER``: ask the HA service for the replica wait (:class:`ReplicaAcks`). Replica counts include the
  master: with the default ``inSyncReplicas=2`` the send waits for one slave's ack (``FLUSH_SLAVE_TIMEOUT`` after
  ``syncFlushTimeout``); when fewer replicas are in sync than it needs -- a slave is in sync while it is connected
  and its own last ack is less than ``haMaxGapNotInSync`` behind the put -- it answers ``SLAVE_NOT_AVAILABLE``
  at once, without waiting. ``inSyncReplicas=1`` waits for no slave.
* Both: the replica status wins when both fail (docs/BEHAVIOUR.md 2.9.3).

The message is in the master's commit log whatever the answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from broker.store.api import AppendResult
from common.codes import BrokerRole, FlushDiskType, ResponseCode
from common.errors import ServiceNotAvailableError, SystemBusyError

__all__ = ["Durability", "DurabilityWaiter", "QuorumWait", "ReplicaAcks"]

log = logging.getLogger(__name__)

#: Extra bound on top of the store's / HA's own timeouts, in case one of them never completes its future.
_WAIT_SLACK_S = 5.0


class Durability(Protocol):
    """What ``/send`` and ``/consumer/sendback`` wait on after a PUT_OK append."""

    async def wait(self, result: AppendResult) -> ResponseCode:
        """The send code once the put is as durable as the mode asks; raises a broker error when it cannot be."""
        ...


class ReplicaAcks(Protocol):
    """What the durability wait needs from the HA service (:meth:`broker.ha.HAService.wait_for_replicas`)."""

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        """None: too few replicas in sync (SLAVE_NOT_AVAILABLE at once); else a future, True when enough slaves
        acked ``end_offset``, False after ``timeout_s``."""
        ...


class DurabilityWaiter:
    """Waits after an append as the broker's flush and replication modes ask, and says which code to answer.

    Args:
        flush_disk_type: ``flushDiskType``.
        broker_role: ``brokerRole`` (only SYNC_MASTER waits for slaves).
        sync_flush_timeout_ms: ``syncFlushTimeout``, the bound of both waits.
        flush_future: the store's ``flush_future(end_offset)``: a future True once the commit log is flushed to
            ``end_offset``, False at its timeout.
        replicas: the HA service.
    """

    def __init__(self, *, flush_disk_type: FlushDiskType, broker_role: BrokerRole, sync_flush_timeout_ms: int,
                 flush_future: Callable[[int], Future[bool]], replicas: ReplicaAcks) -> None:
        self._sync_flush = flush_disk_type is FlushDiskType.SYNC_FLUSH
        self._sync_master = broker_role is BrokerRole.SYNC_MASTER
        self._timeout_s = sync_flush_timeout_ms / 1000.0
        self._flush_future = flush_future
        self._replicas = replicas

    async def wait(self, result: AppendResult) -> ResponseCode:
        """Wait as the modes ask for the put of ``result`` (PUT_OK) and return the send code.

        Returns:
            SUCCESS, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE (see the module docstring).
            Bounded by ``syncFlushTimeout`` plus a few seconds of slack, whatever the futures do.
        """
        end = result.end_offset
        waits: list[asyncio.Future[bool]] = []
        flush_fut: asyncio.Future[bool] | None = None
        ack_fut: asyncio.Future[bool] | None = None
        replica_code = ResponseCode.SUCCESS
        if self._sync_flush:
            flush_fut = asyncio.wrap_future(self._flush_future(end))
            waits.append(flush_fut)
        if self._sync_master:
            ack_fut = self._replicas.wait_for_replicas(end, self._timeout_s)
            if ack_fut is None:
                replica_code = ResponseCode.SLAVE_NOT_AVAILABLE
            else:
                waits.append(ack_fut)
        if waits:
            await asyncio.wait(waits, timeout=self._timeout_s + _WAIT_SLACK_S)
        code = ResponseCode.SUCCESS
        if flush_fut is not None and not _true(flush_fut):
            code = ResponseCode.FLUSH_DISK_TIMEOUT
        if ack_fut is not None and not _true(ack_fut):
            replica_code = ResponseCode.FLUSH_SLAVE_TIMEOUT
        if replica_code is not ResponseCode.SUCCESS:
            code = replica_code
        if code is not ResponseCode.SUCCESS:
            log.warning("put ending at offset %d answered %s", end, code.name)
        return code


def _true(fut: asyncio.Future[bool]) -> bool:
    if not fut.done():
        fut.cancel()
        return False
    if fut.cancelled() or fut.exception() is not None:
        return False
    return bool(fut.result())


class QuorumWait:
    """DLedger mode (docs/BEHAVIOUR.md 9.4, 9.8): a send is acknowledged once a quorum of the group stores its entry.

    It never answers SEND_OK otherwise: past ``maxWaitAckTimeMs`` the send fails with SYSTEM_BUSY (the entry may
    still commit later, so a retry can duplicate it); when leadership moved while it waited, with
    SERVICE_NOT_AVAILABLE, which makes the SDK look up the new leader.

    Args:
        group: the DLedger group (in error messages).
        max_wait_ack_ms: ``maxWaitAckTimeMs``; the member fails the entry's future then, this wait adds slack.
    """

    def __init__(self, *, group: str, max_wait_ack_ms: int) -> None:
        self._group = group
        self._timeout_s = max_wait_ack_ms / 1000.0 + _WAIT_SLACK_S

    async def wait(self, result: AppendResult) -> ResponseCode:
        fut = result.committed
        if fut is None:
            return ResponseCode.SUCCESS
        try:
            await asyncio.wait_for(asyncio.shield(fut), self._timeout_s)
        except TimeoutError:
            raise SystemBusyError(f"no quorum of DLedger group {self._group} acknowledged the message within "
                                  f"{self._timeout_s:.1f} s") from None
        except Exception as e:
            code = getattr(e, "code", "")
            if code in ("WAIT_QUORUM_ACK_TIMEOUT", "LEADER_PENDING_FULL"):
                raise SystemBusyError(f"DLedger group {self._group}: {e}; the message was not acknowledged "
                                      f"(it may still be stored later)") from None
            raise ServiceNotAvailableError(f"DLedger group {self._group}: {e}; the message was not acknowledged: "
                                           f"send it to the new leader") from None
        return ResponseCode.SUCCESS
