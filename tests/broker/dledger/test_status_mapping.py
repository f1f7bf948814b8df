"""docs/BEHAVIOUR.md 9.8's status table: how a DLedger append that fails is answered, at the store and after the
quorum wait."""

from __future__ import annotations

import asyncio

import pytest

from broker.dledger.config import AppendError
from broker.dledger.message_store import put_status
from broker.durability import QuorumWait
from broker.store.api import AppendResult, PutMessageStatus
from client.errors import ServiceNotAvailableError, SystemBusyError
from common.codes import ResponseCode


@pytest.mark.parametrize(("code", "status"), [
    ("NOT_LEADER", PutMessageStatus.SERVICE_NOT_AVAILABLE),
    ("LEADER_TRANSFERRING", PutMessageStatus.SERVICE_NOT_AVAILABLE),
    ("LEADER_PENDING_FULL", PutMessageStatus.OS_PAGE_CACHE_BUSY),  # -> SYSTEM_BUSY (2), which the SDK retries
    ("SOMETHING_ELSE", PutMessageStatus.UNKNOWN_ERROR),
])
def test_a_refused_append_maps_to_its_put_status(code: str, status: PutMessageStatus) -> None:
    assert put_status(code) is status


def wait_on(outcome: object, max_wait_ack_ms: int = 2500) -> ResponseCode:
    async def main() -> ResponseCode:
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        elif outcome is not None:
            fut.set_result((3, 96))
        result = AppendResult(PutMessageStatus.PUT_OK, wrote_offset=96, wrote_bytes=10, committed=fut)
        return await QuorumWait(group="g", max_wait_ack_ms=max_wait_ack_ms).wait(result)
    return asyncio.run(main())


@pytest.mark.parametrize(("code", "error"), [
    ("WAIT_QUORUM_ACK_TIMEOUT", SystemBusyError),  # 4.9.3: OS_PAGECACHE_BUSY -> SYSTEM_BUSY
    ("LEADER_PENDING_FULL", SystemBusyError),
    ("TERM_CHANGED", ServiceNotAvailableError),  # leadership moved: the SDK looks for the new leader
    ("NOT_LEADER", ServiceNotAvailableError),
])
def test_a_failed_quorum_wait_is_an_error_never_send_ok(code: str, error: type[Exception]) -> None:
    with pytest.raises(error, match="DLedger group g"):
        wait_on(AppendError(code, "why"))


def test_a_quorum_ack_is_send_ok_and_no_future_means_nothing_to_wait_for() -> None:
    assert wait_on(True) is ResponseCode.SUCCESS
    assert asyncio.run(QuorumWait(group="g", max_wait_ack_ms=1).wait(AppendResult(PutMessageStatus.PUT_OK))) \
        is ResponseCode.SUCCESS
