"""Read/write splitting on the broker side: which broker a consumer should pull from next, and the pull
status -> response code rules (SEMANTICS.md 3.2, 3.2.1 and decision 6). Pure functions, table-tested.

Decision 6: a slave with ``slaveReadEnable=false`` sends the consumer back to the master
(``PULL_RETRY_IMMEDIATELY``, suggest 0, no messages) while its HA link to the master is up; when the master is
unreachable the slave serves the read, so consumers keep consuming while the master is down. With
``slaveReadEnable=true`` the 4.9.3 table applies: a lagging consumer (``suggestPullingFromSlave``) is sent to
the group's ``whichBrokerWhenConsumeSlowly``, any other to the group's ``brokerId``.
"""

from __future__ import annotations

import attrs

from broker.store.api import GetMessageStatus
from client.protocol.codes import MASTER_ID, ResponseCode

__all__ = ["PullRoute", "code_for_status", "decide_pull_route", "rewrite_offset_moved"]


@attrs.frozen
class PullRoute:
    """What the serving broker does with a pull."""

    serve: bool
    """Read the store and answer; False: answer PULL_RETRY_IMMEDIATELY without messages."""
    suggest_which_broker_id: int
    """Broker id the consumer should pull from next."""


def decide_pull_route(
    *,
    is_slave: bool,
    slave_read_enable: bool,
    master_link_up: bool,
    suggest_pulling_from_slave: bool,
    group_broker_id: int,
    which_broker_when_consume_slowly: int,
) -> PullRoute:
    """Decide where the consumer should read next (SEMANTICS.md 3.2.1 and decision 6).

    Args:
        is_slave: the serving broker's role is SLAVE.
        slave_read_enable: the broker's ``slaveReadEnable``.
        master_link_up: on a slave, whether its HA link to the master is connected (ignored on a master).
        suggest_pulling_from_slave: the store's hint that the consumer reads cold data (False before a read).
        group_broker_id: the subscription group's ``brokerId``.
        which_broker_when_consume_slowly: the group's ``whichBrokerWhenConsumeSlowly``.

    Returns:
        Whether to serve, and the suggested broker id.
    """
    if is_slave and not slave_read_enable:
        # While the master is up, reads belong to it; while it is down, the slave keeps consumers going.
        return PullRoute(serve=not master_link_up, suggest_which_broker_id=MASTER_ID)
    if slave_read_enable:
        suggest = which_broker_when_consume_slowly if suggest_pulling_from_slave else group_broker_id
        return PullRoute(serve=True, suggest_which_broker_id=suggest)
    return PullRoute(serve=True, suggest_which_broker_id=MASTER_ID)


def code_for_status(status: GetMessageStatus, request_offset: int) -> ResponseCode:
    """The pull response code for a store status (SEMANTICS.md 3.2 table)."""
    if status is GetMessageStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if request_offset != 0 else ResponseCode.PULL_NOT_FOUND
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL


def rewrite_offset_moved(
    code: ResponseCode, suggest: int, *, is_slave: bool, offset_check_in_slave: bool, group_broker_id: int
) -> tuple[ResponseCode, int]:
    """A slave without ``offsetCheckInSlave`` never tells a consumer its offset moved: it sends it to the
    group's broker instead (its own view of the queue may simply lag the master's).

    Returns:
        The final ``(code, suggestWhichBrokerId)``.
    """
    if code is ResponseCode.PULL_OFFSET_MOVED and is_slave and not offset_check_in_slave:
        return ResponseCode.PULL_RETRY_IMMEDIATELY, group_broker_id
    return code, suggest
