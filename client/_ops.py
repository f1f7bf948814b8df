"""The SDK's data-path operations, each written once as a sans-I/O generator (:data:`client._requests.Op`).

The sync and async producers, consumers and low-level clients differ only in how they wait; what they do is
here, and ``ClientInstance.drive`` / ``AsyncClientInstance.drive`` run it:

* :func:`send_op` -- a send batch to the master of each attempt's queue until one stores it (the retry loop of
  :class:`client._producer_core.SendAttempts`, docs/BEHAVIOUR.md 4.6);
* :func:`pull_op` -- a pull from the members :class:`client._routing.PullPlan` names (read/write split,
  fallback after a transport failure, a slave's refusal sent on to the master; docs/BEHAVIOUR.md 3.3, decision 6);
* :func:`member_call_op` -- an offset query or commit answered by the master, else a slave (3.5, 3.6).

Each refreshes the route once, through the instance's :meth:`~client._instance._InstanceCore.update_route_op`,
when the cache cannot resolve its broker group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
import httpx

from client import _requests as rq
from client._instance import _InstanceCore
from client._producer_core import SendAttempts
from client._requests import Answer, Exchange, Op
from client._routing import PullNodeTable, PullPlan, PullTarget, plan_pull
from common import wire
from common.codes import MASTER_ID, PULL_COMMIT_OFFSET
from common.errors import BrokerNotFoundError, ClientError
from common.message import MessageQueue
from common.requests import PullRequestHeader

__all__ = ["admin_targets", "member_call_op", "pull_op", "send_op"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _PullAnswer(Protocol):
    @property
    def suggest_which_broker_id(self) -> int: ...


A = TypeVar("A", bound=_PullAnswer)


def _no_broker(broker_name: str) -> BrokerNotFoundError:
    return BrokerNotFoundError(f"The broker[{broker_name}] not exist")


def send_op(core: _InstanceCore, run: SendAttempts, body: bytes, count: int
            ) -> Op[tuple[MessageQueue, wire.SendReply]]:
    """Send the encoded batch ``body`` of ``count`` messages to the master of each attempt's queue until one
    stores it.

    Returns:
        The queue that stored the batch and the broker's reply.

    Raises:
        SendFailedError: every attempt failed, or the deadline passed.
        ClientError: an attempt failed with an error that is not retried.
    """
    while (step := run.next()) is not None:
        mq, left = step
        try:
            addr = core.find_broker_address_in_publish(mq.broker_name)
            if addr is None:
                yield from core.update_route_op(mq.topic)
                addr = core.find_broker_address_in_publish(mq.broker_name)
            if addr is None:
                raise _no_broker(mq.broker_name)
            try:
                resp = yield Exchange("POST", addr, run.target(mq), body, left)
            except httpx.HTTPError as e:
                raise rq.map_transport_error(e, addr, f"send to {mq} at master {addr}") from None
            reply = rq.parse_send(resp, addr, count)
        except ClientError as err:
            if not run.failed(mq, err):
                raise
            continue
        run.succeeded(mq)
        return mq, reply
    raise run.exhausted()


def _plan(core: _InstanceCore, nodes: PullNodeTable, mq: MessageQueue) -> PullPlan | None:
    return plan_pull(mq.broker_name, core.routes.broker_addrs(mq.broker_name), nodes.recalculate(mq),
                     core.broker_down, core.clock_ms(), pinned=nodes.connect_broker_by_user)


def _role(t: PullTarget) -> str:
    return "slave" if t.slave else "master"


def _target(header: PullRequestHeader, t: PullTarget) -> str:
    """The pull's path and query for ``t``: the commit offset goes to a master only (docs/BEHAVIOUR.md 3.3)."""
    if t.slave and header.sys_flag & PULL_COMMIT_OFFSET:
        header = attrs.evolve(header, sys_flag=header.sys_flag & ~PULL_COMMIT_OFFSET, commit_offset=-1)
    return header.target()


def pull_op(core: _InstanceCore, nodes: PullNodeTable, mq: MessageQueue, header: PullRequestHeader,
            timeout: float, parse: Callable[[Answer, str, MessageQueue], A], refused: Callable[[A, int], bool]
            ) -> Op[A]:
    """Pull ``header`` (a pull of ``mq``) from the members the plan names, and remember the member the answer
    suggests in ``nodes``.

    Args:
        core: the instance (routes, member health, clock).
        nodes: ``pullFromWhichNodeTable``.
        mq: the queue.
        header: the pull's arguments (its commit offset is sent to a master only).
        timeout: bound on each request.
        parse: reads an answer (:func:`client._requests.parse_pull` or ``parse_pull_raw``).
        refused: whether an answer is a member's refusal (:func:`client._routing.pull_refused`).

    Returns:
        The answer; a refusal nobody overrode (NO_MATCHED_MSG, offset unchanged).

    Raises:
        BrokerNotFoundError: the group has no member in the route, even after a refresh.
        TransportError: no member could be reached.
        BrokerError: the broker refused the pull (unknown topic, bad queue id...).
    """
    plan = _plan(core, nodes, mq)
    if plan is None:
        yield from core.update_route_op(mq.topic)
        plan = _plan(core, nodes, mq)
    if plan is None:
        raise _no_broker(mq.broker_name)
    offset = header.offset
    error: ClientError | None = None
    answer: A | None = None  # the last answer: the pull's, or the last refusal when nobody served it
    while (t := plan.next()) is not None:
        try:
            resp = yield Exchange("GET", t.addr, _target(header, t), b"", timeout)
        except httpx.HTTPError as e:
            plan.failed(t, core.clock_ms())
            error = rq.map_transport_error(e, t.addr, f"pull {mq} from {_role(t)} {mq.broker_name}[{t.broker_id}] "
                                                      f"{t.addr}")
            log.info("%s", error)
            continue
        answer = parse(resp, t.addr, mq)
        is_refusal = refused(answer, offset)
        if is_refusal:
            log.debug("pull at %d refused by %s [%d], which suggests [%d]", offset, t.addr, t.broker_id,
                      answer.suggest_which_broker_id)
        if plan.answered(t, refused=is_refusal, suggest_which_broker_id=answer.suggest_which_broker_id,
                         now_ms=core.clock_ms()):
            break
    if answer is None:
        assert error is not None
        raise error
    nodes.update(mq, answer.suggest_which_broker_id)
    return answer


def admin_targets(core: _InstanceCore, broker_name: str) -> list[PullTarget]:
    """Master first when present and not down, then the other members (offsets and range queries)."""
    members = core.routes.broker_addrs(broker_name)
    if not members:
        return []
    now = core.clock_ms()
    up = [bid for bid in sorted(members) if not core.broker_down.is_down(broker_name, bid, now)]
    down = [bid for bid in sorted(members) if bid not in up]
    return [PullTarget(bid, members[bid], bid != MASTER_ID) for bid in (up + down)[:2]]


def member_call_op(core: _InstanceCore, mq: MessageQueue, what: str, method: str, target: str,
                   parse: Callable[[Answer, str], T], body: bytes = b"") -> Op[T]:
    """A control-plane request about ``mq`` to its group's master, or to a slave when the master is missing
    from the route, marked down, or unreachable (a member that cannot be reached is marked down).

    Raises:
        BrokerNotFoundError: the group has no member in the route, even after a refresh.
        TransportError: neither member could be reached.
        ClientError: whatever ``parse`` raises for the answer.
    """
    targets = admin_targets(core, mq.broker_name)
    if not targets or MASTER_ID not in (core.routes.broker_addrs(mq.broker_name) or {}):
        yield from core.update_route_op(mq.topic)
        targets = admin_targets(core, mq.broker_name)
    if not targets:
        raise _no_broker(mq.broker_name)
    error: ClientError | None = None
    for t in targets:
        try:
            resp = yield Exchange(method, t.addr, target, body)
        except httpx.HTTPError as e:
            core.broker_down.mark_down(mq.broker_name, t.broker_id, core.clock_ms())
            error = rq.map_transport_error(e, t.addr, f"{what} of {mq} at {_role(t)} {t.addr}")
            continue
        return parse(resp, t.addr)
    assert error is not None
    raise error
