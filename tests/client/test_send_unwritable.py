"""A broker whose store is not writeable (SERVICE_NOT_AVAILABLE, e.g. disk full) is not retried within a send:
the send moves to another group, or stops after one attempt with the broker's own error (code 14, its remark)."""

from __future__ import annotations

import pytest

from client.errors import (
    BrokerError,
    ClientError,
    RequestTimeoutError,
    ServiceNotAvailableError,
    SystemBusyError,
)
from client.lowlevel import LatencyFaultTolerance, QueueSelector, SendAttempts, TopicPublishInfo
from common.message import MessageQueue
from common.route import TopicRouteData


def _attempts(*brokers: str, retries: int = 2) -> SendAttempts:
    queues = tuple(MessageQueue("T", b, q) for b in brokers for q in range(2))
    info = TopicPublishInfo("T", queues, TopicRouteData([], []))
    return SendAttempts(info, None, deadline=100.0, group="pg", retries=retries,
                        selector=QueueSelector(start_index=0), fault=LatencyFaultTolerance(), clock=lambda: 1.0)


def _run(attempts: SendAttempts, fail: dict[str, ClientError]) -> tuple[list[str], ClientError | None]:
    """Drive ``attempts`` like send_op: returns the brokers tried and the error re-raised (None: exhausted)."""
    tried: list[str] = []
    while (step := attempts.next()) is not None:
        mq, _ = step
        tried.append(mq.broker_name)
        if not attempts.failed(mq, fail[mq.broker_name]):
            return tried, fail[mq.broker_name]
    return tried, None


DISK_FULL = ServiceNotAvailableError("SERVICE_NOT_AVAILABLE: message store is not writeable (disk full)")


@pytest.mark.parametrize(("brokers", "fail", "tried", "raised"), [
    # one group, disk full: one attempt, the broker's own error
    (("a",), {"a": DISK_FULL}, ["a"], DISK_FULL),
    # two groups, a's disk full, b busy: a once, then b until attempts run out
    (("a", "b"), {"a": DISK_FULL, "b": SystemBusyError("busy")}, ["a", "b", "b"], None),
    # two groups, both full: each once, then b's error
    (("a", "b"), {"a": DISK_FULL, "b": DISK_FULL}, ["a", "b"], DISK_FULL),
    # other retriable errors still retry the same (only) group, as RocketMQ does
    (("a",), {"a": SystemBusyError("busy")}, ["a", "a", "a"], None),
    (("a",), {"a": RequestTimeoutError("slow")}, ["a", "a", "a"], None),
])
def test_an_unwritable_broker_is_tried_once_per_send(brokers: tuple[str, ...], fail: dict[str, ClientError],
                                                      tried: list[str], raised: ClientError | None) -> None:
    got_tried, got_raised = _run(_attempts(*brokers), fail)
    assert (got_tried, got_raised) == (tried, raised)
    if raised is not None:
        assert isinstance(got_raised, BrokerError) and got_raised.code == 14
