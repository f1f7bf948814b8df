"""The durability wait on its own: built from the flush future and a replica-ack stand-in, no broker around it."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from broker.durability import DurabilityWaiter
from broker.store.api import AppendResult, PutMessageStatus
from common.codes import BrokerRole, FlushDiskType, ResponseCode

C = ResponseCode
RESULT = AppendResult(PutMessageStatus.PUT_OK, wrote_offset=1000, wrote_bytes=200)


class Replicas:
    """``wait_for_replicas`` answering ``outcome``: None (too few in sync), True / False (the acks came / not),
    or "never" (a future that nobody completes)."""

    def __init__(self, outcome: bool | str | None) -> None:
        self.outcome = outcome
        self.asked: list[tuple[int, float]] = []

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        self.asked.append((end_offset, timeout_s))
        if self.outcome is None:
            return None
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if isinstance(self.outcome, bool):
            fut.set_result(self.outcome)
        return fut


def flushed(ok: bool) -> Future[bool]:
    fut: Future[bool] = Future()
    fut.set_result(ok)
    return fut


@pytest.mark.parametrize(
    ("flush", "role", "flush_ok", "replicas", "expected"),
    [
        (FlushDiskType.ASYNC_FLUSH, BrokerRole.ASYNC_MASTER, False, None, C.SUCCESS),  # nothing to wait for
        (FlushDiskType.SYNC_FLUSH, BrokerRole.ASYNC_MASTER, False, None, C.FLUSH_DISK_TIMEOUT),
        (FlushDiskType.ASYNC_FLUSH, BrokerRole.SYNC_MASTER, True, None, C.SLAVE_NOT_AVAILABLE),
        (FlushDiskType.ASYNC_FLUSH, BrokerRole.SYNC_MASTER, True, True, C.SUCCESS),
        (FlushDiskType.ASYNC_FLUSH, BrokerRole.SYNC_MASTER, True, False, C.FLUSH_SLAVE_TIMEOUT),
        (FlushDiskType.SYNC_FLUSH, BrokerRole.SYNC_MASTER, False, True, C.FLUSH_DISK_TIMEOUT),
        (FlushDiskType.SYNC_FLUSH, BrokerRole.SYNC_MASTER, False, None, C.SLAVE_NOT_AVAILABLE),  # replica wins
        (FlushDiskType.SYNC_FLUSH, BrokerRole.SYNC_MASTER, False, False, C.FLUSH_SLAVE_TIMEOUT),
        (FlushDiskType.SYNC_FLUSH, BrokerRole.SYNC_MASTER, True, True, C.SUCCESS),
    ],
)
def test_codes(flush: FlushDiskType, role: BrokerRole, flush_ok: bool, replicas: bool | None,
               expected: ResponseCode) -> None:
    flushes: list[int] = []
    stand_in = Replicas(replicas)

    def flush_future(end: int) -> Future[bool]:
        flushes.append(end)
        return flushed(flush_ok)

    waiter = DurabilityWaiter(flush_disk_type=flush, broker_role=role, sync_flush_timeout_ms=1500,
                              flush_future=flush_future, replicas=stand_in)
    assert asyncio.run(waiter.wait(RESULT)) is expected
    assert flushes == ([1200] if flush is FlushDiskType.SYNC_FLUSH else [])
    assert stand_in.asked == ([(1200, 1.5)] if role is BrokerRole.SYNC_MASTER else [])


def test_a_future_nobody_completes_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HA service bounds its own waits; should one never complete, the wait still ends (with a timeout code)
    shortly after ``syncFlushTimeout`` plus the slack."""
    monkeypatch.setattr("broker.durability._WAIT_SLACK_S", 0.05)
    waiter = DurabilityWaiter(flush_disk_type=FlushDiskType.ASYNC_FLUSH, broker_role=BrokerRole.SYNC_MASTER,
                              sync_flush_timeout_ms=50, flush_future=lambda _: flushed(True),
                              replicas=Replicas("never"))
    assert asyncio.run(waiter.wait(RESULT)) is C.FLUSH_SLAVE_TIMEOUT
