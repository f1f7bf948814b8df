"""The pull's answer plan (docs/BEHAVIOUR.md 3.2 status table, 3.2.1 read/write-split table, decision 6, the slave's
offset rewrite): each row is one call of :func:`broker.read_split.plan_pull_answer`."""

from __future__ import annotations

import pytest

from broker.read_split import PullAnswer, PullContext, code_for_status, plan_pull_answer
from broker.store.api import GetMessageStatus as S
from common.codes import ResponseCode as C

# Columns: is_slave, slaveReadEnable, master_link_up, offsetCheckInSlave, group ids (brokerId,
# whichBrokerWhenConsumeSlowly), store status (None: not read), request offset, suggestPullingFromSlave
#   -> serves, code, suggestWhichBrokerId
ROWS = [
    # docs/BEHAVIOUR.md 3.2.1: a master, slaveReadEnable=false: always the master
    (False, False, False, False, (0, 1), S.FOUND, 5, False, True, C.SUCCESS, 0),
    (False, False, False, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 0),
    # ... slaveReadEnable=true: a cold read goes to whichBrokerWhenConsumeSlowly, else to the group's brokerId
    (False, True, False, False, (0, 1), S.FOUND, 5, False, True, C.SUCCESS, 0),
    (False, True, False, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 1),
    (False, True, False, False, (2, 3), S.FOUND, 5, False, True, C.SUCCESS, 2),
    (False, True, False, False, (2, 3), S.FOUND, 5, True, True, C.SUCCESS, 3),
    # a slave with slaveReadEnable=true serves whatever its link does
    (True, True, True, False, (0, 1), S.FOUND, 5, False, True, C.SUCCESS, 0),
    (True, True, True, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 1),
    (True, True, False, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 1),
    (True, True, True, False, (2, 3), S.FOUND, 5, True, True, C.SUCCESS, 3),
    # decision 6: slaveReadEnable=false, master link up: not read, sent back to the master
    (True, False, True, False, (0, 1), None, 5, False, False, C.PULL_RETRY_IMMEDIATELY, 0),
    (True, False, True, True, (2, 3), None, 5, False, False, C.PULL_RETRY_IMMEDIATELY, 0),
    # ... master unreachable: the slave serves, suggesting the master
    (True, False, False, False, (0, 1), S.FOUND, 5, False, True, C.SUCCESS, 0),
    (True, False, False, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 0),
    # a master ignores the link flag
    (False, False, True, False, (0, 1), S.FOUND, 5, True, True, C.SUCCESS, 0),
    # codes on a master (docs/BEHAVIOUR.md 3.2)
    (False, False, False, False, (0, 1), S.OFFSET_OVERFLOW_ONE, 5, False, True, C.PULL_NOT_FOUND, 0),
    (False, False, False, False, (0, 1), S.OFFSET_TOO_SMALL, 5, False, True, C.PULL_OFFSET_MOVED, 0),
    (False, False, False, False, (0, 1), S.NO_MESSAGE_IN_QUEUE, 0, False, True, C.PULL_NOT_FOUND, 0),
    (False, False, False, False, (0, 1), S.NO_MESSAGE_IN_QUEUE, 3, False, True, C.PULL_OFFSET_MOVED, 0),
    (False, True, False, False, (2, 3), S.NO_MATCHED_MESSAGE, 5, True, True, C.PULL_RETRY_IMMEDIATELY, 3),
    # a slave without offsetCheckInSlave never says "offset moved": it sends the consumer to the group's broker
    (True, True, True, False, (4, 1), S.OFFSET_OVERFLOW_BADLY, 5, False, True, C.PULL_RETRY_IMMEDIATELY, 4),
    (True, False, False, False, (4, 1), S.OFFSET_TOO_SMALL, 5, True, True, C.PULL_RETRY_IMMEDIATELY, 4),
    (True, False, False, False, (4, 1), S.NO_MESSAGE_IN_QUEUE, 3, False, True, C.PULL_RETRY_IMMEDIATELY, 4),
    # ... with it, the code stands and the usual suggestion applies
    (True, False, False, True, (4, 1), S.OFFSET_TOO_SMALL, 5, False, True, C.PULL_OFFSET_MOVED, 0),
    (True, True, True, True, (4, 1), S.OFFSET_OVERFLOW_BADLY, 5, True, True, C.PULL_OFFSET_MOVED, 1),
    # other codes are never rewritten on a slave
    (True, True, True, False, (4, 1), S.OFFSET_OVERFLOW_ONE, 5, False, True, C.PULL_NOT_FOUND, 4),
    (True, False, False, False, (4, 1), S.NO_MESSAGE_IN_QUEUE, 0, False, True, C.PULL_NOT_FOUND, 0),
]


@pytest.mark.parametrize(
    ("is_slave", "sre", "link", "check", "ids", "status", "offset", "cold", "serves", "code", "suggest"), ROWS,
)
def test_plan_pull(is_slave: bool, sre: bool, link: bool, check: bool, ids: tuple[int, int], status: S | None,
                   offset: int, cold: bool, serves: bool, code: C, suggest: int) -> None:
    ctx = PullContext(is_slave=is_slave, slave_read_enable=sre, master_link_up=link, offset_check_in_slave=check,
                      group_broker_id=ids[0], which_broker_when_consume_slowly=ids[1])
    assert ctx.serves is serves
    assert plan_pull_answer(ctx, status, offset, suggest_pulling_from_slave=cold) == PullAnswer(code, suggest)


def test_a_served_pull_needs_the_store_answer() -> None:
    ctx = PullContext(is_slave=False, slave_read_enable=False, master_link_up=False, offset_check_in_slave=False,
                      group_broker_id=0, which_broker_when_consume_slowly=1)
    with pytest.raises(ValueError, match="store's answer"):
        plan_pull_answer(ctx, None, 0)


@pytest.mark.parametrize(
    ("status", "offset", "code"),
    [
        (S.FOUND, 5, C.SUCCESS),
        (S.MESSAGE_WAS_REMOVING, 5, C.PULL_RETRY_IMMEDIATELY),
        (S.NO_MATCHED_MESSAGE, 5, C.PULL_RETRY_IMMEDIATELY),
        (S.NO_MATCHED_LOGIC_QUEUE, 0, C.PULL_NOT_FOUND),
        (S.NO_MATCHED_LOGIC_QUEUE, 3, C.PULL_OFFSET_MOVED),
        (S.NO_MESSAGE_IN_QUEUE, 0, C.PULL_NOT_FOUND),
        (S.NO_MESSAGE_IN_QUEUE, 3, C.PULL_OFFSET_MOVED),
        (S.OFFSET_FOUND_NULL, 5, C.PULL_NOT_FOUND),
        (S.OFFSET_OVERFLOW_ONE, 5, C.PULL_NOT_FOUND),
        (S.OFFSET_OVERFLOW_BADLY, 5, C.PULL_OFFSET_MOVED),
        (S.OFFSET_TOO_SMALL, 5, C.PULL_OFFSET_MOVED),
    ],
)
def test_code_for_status(status: S, offset: int, code: C) -> None:
    assert code_for_status(status, offset) is code


def test_every_status_has_a_code() -> None:
    for status in S:
        assert code_for_status(status, 1) in (C.SUCCESS, C.PULL_RETRY_IMMEDIATELY, C.PULL_NOT_FOUND,
                                              C.PULL_OFFSET_MOVED)
