"""Read/write splitting on the broker side: whether a broker serves a pull, which broker the consumer should pull
from next, and the code of the answer (docs/BEHAVIOUR.md 3.2, 3.2.1 and decision 6). Pure, table-tested.

The pull processor plans its whole answer with one call, :func:`plan_pull_answer`, from the facts of the pull
(:class:`PullContext`: the broker's role and settings, its master link, the subscription group's broker ids) and
what the store answered. It reads the store only when :attr:`PullContext.serves`; a pull it does not serve is
planned with no store answer.

Decision 6: a slave with ``slaveReadEnable=false`` sends the consumer back to the master
(``PULL_RETRY_IMMEDIATELY``, suggest 0, no messages) while its HA link to the master is up; when the master is
unreachable the slave serves the read, so consumers keep consuming while the master is down. With
``slaveReadEnable=true`` the 4.9.3 table applies: a lagging consumer (``suggestPullingFromSlave``) is sent to
the group's ``whichBrokerWhenConsumeSlowly``, any other to the group's ``brokerId``. A slave without
``offsetCheckInSlave`` never tells a consumer its offset moved: it sends it to the group's broker instead.
"""

from __future__ import annotations

import attrs

from broker.store.api import GetMessageStatus
from common.codes import MASTER_ID, ResponseCode

__all__ = ["PullAnswer", "PullContext", "code_for_status", "plan_pull_answer"]


@attrs.frozen
class PullContext:
    """The facts a pull's answer depends on, besides what the store says."""

    is_slave: bool
    """The serving broker's role is SLAVE."""
    slave_read_enable: bool
    """The broker's ``slaveReadEnable``."""
    master_link_up: bool
    """On a slave, whether its HA link to the master is connected (ignored on a master)."""
    offset_check_in_slave: bool
    """The broker's ``offsetCheckInSlave``."""
    group_broker_id: int
    """The subscription group's ``brokerId``."""
    which_broker_when_consume_slowly: int
    """The group's ``whichBrokerWhenConsumeSlowly``."""

    @property
    def serves(self) -> bool:
        """Whether this broker reads the store for the pull at all (decision 6: a slave with
        ``slaveReadEnable=false`` leaves reads to its master while the link to it is up)."""
        return not (self.is_slave and not self.slave_read_enable and self.master_link_up)


@attrs.frozen
class PullAnswer:
    """The answer to a pull, apart from the records and offsets the store gave (the broker side; the SDK's
    choice of the member to pull from is :class:`client._routing.PullPlan`)."""

    code: ResponseCode
    """The response code (SUCCESS carries the records; any other code carries none)."""
    suggest_which_broker_id: int
    """Broker id the consumer should pull from next."""


def plan_pull_answer(ctx: PullContext, status: GetMessageStatus | None, request_offset: int, *,
                     suggest_pulling_from_slave: bool = False) -> PullAnswer:
    """Plan a pull's answer: route, code and the slave's offset rewrite in one decision.

    Args:
        ctx: the facts of the pull.
        status: what the store answered; None when it was not read because ``ctx.serves`` is False.
        request_offset: the pull's ``offset``.
        suggest_pulling_from_slave: the store's hint that the consumer reads cold data.

    Returns:
        The code and the suggested broker id.

    Raises:
        ValueError: ``status`` is None for a pull the context serves (the store must be read first).
    """
    if status is None:
        if ctx.serves:
            raise ValueError("a pull this broker serves needs the store's answer")
        return PullAnswer(ResponseCode.PULL_RETRY_IMMEDIATELY, MASTER_ID)
    code = code_for_status(status, request_offset)
    if code is ResponseCode.PULL_OFFSET_MOVED and ctx.is_slave and not ctx.offset_check_in_slave:
        # The slave's own view of the queue may simply lag the master's: no offset correction from here.
        return PullAnswer(ResponseCode.PULL_RETRY_IMMEDIATELY, ctx.group_broker_id)
    return PullAnswer(code, _suggest(ctx, suggest_pulling_from_slave))


def _suggest(ctx: PullContext, suggest_pulling_from_slave: bool) -> int:
    """Where the consumer should read next (docs/BEHAVIOUR.md 3.2.1 and decision 6)."""
    if ctx.slave_read_enable:
        return ctx.which_broker_when_consume_slowly if suggest_pulling_from_slave else ctx.group_broker_id
    return MASTER_ID  # reads belong to the master; a slave serving while it is down still points there


def code_for_status(status: GetMessageStatus, request_offset: int) -> ResponseCode:
    """The pull response code for a store status (docs/BEHAVIOUR.md 3.2 table)."""
    if status is GetMessageStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if request_offset != 0 else ResponseCode.PULL_NOT_FOUND
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL

