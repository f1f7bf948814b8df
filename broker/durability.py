"""Waiting for a put to be as durable as the broker's mode asks: SYNC_FLUSH (the disk) and SYNC_MASTER (one
slave's ack), SEMANTICS.md 2.9 and decision 5. Shared by ``/send`` and ``/consumer/sendback``."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker.store.api import AppendResult
from client.protocol.codes import BrokerRole, FlushDiskType, ResponseCode

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["await_durability"]

log = logging.getLogger(__name__)

#: Extra bound on top of the store's / HA's own timeouts, in case one of them never completes its future.
_WAIT_SLACK_S = 5.0


async def await_durability(ctrl: BrokerController, result: AppendResult) -> ResponseCode:
    """Wait as the broker's flush / replication mode asks for ``result`` and return the send code.

    SYNC_FLUSH waits for the flush (FLUSH_DISK_TIMEOUT); SYNC_MASTER waits for one slave ack (SLAVE_NOT_AVAILABLE
    at once when no slave is in sync, FLUSH_SLAVE_TIMEOUT after ``syncFlushTimeout``); the replica status wins
    when both fail (SEMANTICS.md 2.9.3). Shared by ``/send`` and ``/consumer/sendback``.
    """
    cfg = ctrl.config
    timeout_s = cfg.sync_flush_timeout_ms / 1000.0
    end = result.end_offset
    waits: list[asyncio.Future[bool]] = []
    flush_fut: asyncio.Future[bool] | None = None
    ack_fut: asyncio.Future[bool] | None = None
    replica_code = ResponseCode.SUCCESS
    if cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
        flush_fut = asyncio.wrap_future(ctrl.store.flush_future(end))
        waits.append(flush_fut)
    if cfg.broker_role is BrokerRole.SYNC_MASTER:
        if ctrl.ha_service.is_slave_ok(end):
            ack_fut = ctrl.ha_service.wait_for_ack(end, timeout_s)
            waits.append(ack_fut)
        else:
            replica_code = ResponseCode.SLAVE_NOT_AVAILABLE
    if waits:
        await asyncio.wait(waits, timeout=timeout_s + _WAIT_SLACK_S)
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
