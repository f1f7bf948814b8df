"""The read/write-split decision (SEMANTICS.md 3.2.1 table and decision 6) and the status -> code rules."""

from __future__ import annotations

import pytest

from broker.read_split import PullRoute, code_for_status, decide_pull_route, rewrite_offset_moved
from broker.store.api import GetMessageStatus as S
from client.protocol.codes import ResponseCode as C

# group brokerId 0, whichBrokerWhenConsumeSlowly 1 (the defaults) unless a row says otherwise
ROWS = [
    # is_slave, slaveReadEnable, master_link_up, suggestPullingFromSlave, group ids -> serve, suggest
    # SEMANTICS 3.2.1 rows
    (False, False, False, False, (0, 1), True, 0),
    (False, False, False, True, (0, 1), True, 0),
    (False, True, False, False, (0, 1), True, 0),
    (False, True, False, True, (0, 1), True, 1),
    (True, True, True, False, (0, 1), True, 0),
    (True, True, True, True, (0, 1), True, 1),
    (True, True, False, True, (0, 1), True, 1),
    # decision 6: slave with slaveReadEnable=false redirects while its master link is up ...
    (True, False, True, False, (0, 1), False, 0),
    (True, False, True, True, (0, 1), False, 0),
    # ... and serves (suggesting the master) while the master is unreachable
    (True, False, False, False, (0, 1), True, 0),
    (True, False, False, True, (0, 1), True, 0),
    # a master ignores the link flag
    (False, False, True, True, (0, 1), True, 0),
    # the group's own ids steer the suggestion when slaveReadEnable=true
    (False, True, False, False, (2, 3), True, 2),
    (False, True, False, True, (2, 3), True, 3),
    (True, True, True, True, (2, 3), True, 3),
    (True, False, True, True, (2, 3), False, 0),
]


@pytest.mark.parametrize(("is_slave", "sre", "link", "slow", "ids", "serve", "suggest"), ROWS)
def test_decide_pull_route(is_slave: bool, sre: bool, link: bool, slow: bool, ids: tuple[int, int], serve: bool,
                           suggest: int) -> None:
    route = decide_pull_route(is_slave=is_slave, slave_read_enable=sre, master_link_up=link,
                              suggest_pulling_from_slave=slow, group_broker_id=ids[0],
                              which_broker_when_consume_slowly=ids[1])
    assert route == PullRoute(serve=serve, suggest_which_broker_id=suggest)


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


@pytest.mark.parametrize(
    ("code", "is_slave", "check", "expected"),
    [
        (C.PULL_OFFSET_MOVED, True, False, (C.PULL_RETRY_IMMEDIATELY, 4)),
        (C.PULL_OFFSET_MOVED, True, True, (C.PULL_OFFSET_MOVED, 1)),
        (C.PULL_OFFSET_MOVED, False, False, (C.PULL_OFFSET_MOVED, 1)),
        (C.PULL_NOT_FOUND, True, False, (C.PULL_NOT_FOUND, 1)),
        (C.SUCCESS, True, False, (C.SUCCESS, 1)),
    ],
)
def test_rewrite_offset_moved(code: C, is_slave: bool, check: bool, expected: tuple[C, int]) -> None:
    assert rewrite_offset_moved(code, 1, is_slave=is_slave, offset_check_in_slave=check, group_broker_id=4) == expected
