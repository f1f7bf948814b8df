"""The pull and send request models: what the SDK writes is what the broker reads, and bad arguments are named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.codes import PullSysFlag, ResponseCode
from common.requests import (
    DEFAULT_PULL_MAX_BYTES,
    DEFAULT_SEND_TOPIC_QUEUE_NUMS,
    DEFAULT_SUSPEND_TIMEOUT_MS,
    PullRequestHeader,
    SendRequestHeader,
    parse_query,
)
from common.signing import _split_target
from remoting.router import ArgumentError

_NAMES = st.text(alphabet="%|abcXYZ019_-", min_size=1, max_size=20)
_INT64 = st.integers(0, 2**63 - 1)


def _parse(target: str) -> dict[str, str]:
    _, _, query = target.partition("?")
    return parse_query(query.encode())


@given(group=_NAMES, topic=_NAMES, queue_id=st.integers(-(2**31), 2**31 - 1), offset=_INT64,
       max_nums=st.integers(1, 65_536), max_bytes=st.integers(1, 1 << 31), commit=st.none() | _INT64,
       suspend=st.none() | st.integers(1, 2**31 - 1), sub=st.sampled_from(["*", "TagA || TagB", "a&b=c", "%2A", "é"]))
def test_pull_round_trip(group: str, topic: str, queue_id: int, offset: int, max_nums: int, max_bytes: int,
                         commit: int | None, suspend: int | None, sub: str) -> None:
    h = PullRequestHeader.of(group, topic, queue_id, offset, max_nums, sub_expression=sub, commit_offset=commit,
                             suspend_timeout_ms=suspend, max_bytes=max_bytes)
    assert PullRequestHeader.from_query(_parse(h.target())) == h
    assert h.target().startswith("/pull?")
    assert _split_target(h.target()) == _split_target(str(h.target()))  # the signer's shortcut is sound
    assert bool(h.sys_flag & PullSysFlag.COMMIT_OFFSET) == (commit is not None)
    assert bool(h.sys_flag & PullSysFlag.SUSPEND) == (suspend is not None)
    assert h.sys_flag & PullSysFlag.SUBSCRIPTION


def test_pull_writes_only_what_differs_from_the_broker_defaults() -> None:
    h = PullRequestHeader.of("g", "T", 1, 5)
    assert h.to_query() == "group=g&maxNums=32&offset=5&queueId=1&subExpression=%2A&sysFlag=4&topic=T"
    assert (h.max_bytes, h.commit_offset, h.suspend_timeout_ms) == (DEFAULT_PULL_MAX_BYTES, -1,
                                                                    DEFAULT_SUSPEND_TIMEOUT_MS)
    q = PullRequestHeader.of("g", "T", 1, 5, 8, commit_offset=3, suspend_timeout_ms=200, max_bytes=10).to_query()
    assert q == ("commitOffset=3&group=g&maxBytes=10&maxNums=8&offset=5&queueId=1&subExpression=%2A"
                 "&suspendTimeoutMs=200&sysFlag=7&topic=T")


def test_pull_defaults_of_a_bare_query() -> None:
    h = PullRequestHeader.from_query({"group": "g", "topic": "T", "queueId": "0", "offset": "0"})
    assert h == PullRequestHeader("g", "T", 0, 0)
    assert (h.max_nums, h.sys_flag, h.sub_expression) == (32, 0, "*")


_PULL_OK = {"group": "g", "topic": "T", "queueId": "0", "offset": "0"}


@pytest.mark.parametrize(("change", "needle"), [
    ({"group": None}, "missing query argument 'group'"),
    ({"topic": None}, "missing query argument 'topic'"),
    ({"queueId": None}, "missing query argument 'queueId'"),
    ({"offset": None}, "missing query argument 'offset'"),
    ({"offset": "-1"}, "'offset'=-1 is outside [0, 9223372036854775807]"),
    ({"offset": "abc"}, "'offset'='abc' is not an integer"),
    ({"queueId": str(2**31)}, "'queueId'"),
    ({"maxNums": "0"}, "'maxNums'=0 is outside [1, 65536]"),
    ({"maxBytes": "0"}, "'maxBytes'"),
    ({"sysFlag": "-3"}, "'sysFlag'"),
    ({"commitOffset": "-2"}, "'commitOffset'"),
    ({"suspendTimeoutMs": "x"}, "'suspendTimeoutMs'"),
    ({"group": "bad group"}, "query argument 'group':"),
    ({"topic": "bad/topic"}, "query argument 'topic':"),
])
def test_pull_bad_arguments_are_named(change: dict[str, str | None], needle: str) -> None:
    query = {k: v for k, v in {**_PULL_OK, **change}.items() if v is not None}
    with pytest.raises(ArgumentError) as e:
        PullRequestHeader.from_query(query)
    assert needle in e.value.message
    assert e.value.code == ResponseCode.INVALID_PARAMETER


@given(topic=_NAMES, queue_id=st.integers(-(2**31), 2**31 - 1), group=st.just("") | _NAMES,
       reconsume=st.integers(0, 2**31 - 1), nums=st.none() | st.integers(1, 1024))
def test_send_round_trip(topic: str, queue_id: int, group: str, reconsume: int, nums: int | None) -> None:
    h = SendRequestHeader(topic, queue_id, group, reconsume, nums)
    assert SendRequestHeader.from_query(_parse(h.target())) == h
    assert h.target().startswith("/send?")
    assert _split_target(h.target()) == _split_target(str(h.target()))  # the signer's shortcut is sound
    assert h.create_queue_nums == (DEFAULT_SEND_TOPIC_QUEUE_NUMS if nums is None else nums)


def test_send_query_text() -> None:
    assert SendRequestHeader("T%x", 3, "pg").to_query() == "group=pg&queueId=3&topic=T%25x"
    assert SendRequestHeader("T", 0, "pg", default_topic_queue_nums=2, reconsume_times=1).to_query() == \
        "defaultTopicQueueNums=2&group=pg&queueId=0&reconsumeTimes=1&topic=T"


def test_send_topic_is_left_to_the_broker() -> None:
    """The broker checks the topic's name after its role checks, with MESSAGE_ILLEGAL (RocketMQ's order)."""
    assert SendRequestHeader.from_query({"topic": "bad/topic", "queueId": "0"}).topic == "bad/topic"


@pytest.mark.parametrize(("query", "needle"), [
    ({"queueId": "0"}, "missing query argument 'topic'"),
    ({"topic": "T"}, "missing query argument 'queueId'"),
    ({"topic": "T", "queueId": "0", "group": "a b"}, "query argument 'group':"),
    ({"topic": "T", "queueId": "0", "reconsumeTimes": "-1"}, "'reconsumeTimes'"),
    ({"topic": "T", "queueId": "0", "defaultTopicQueueNums": "0"}, "'defaultTopicQueueNums'=0 is outside [1, 1024]"),
])
def test_send_bad_arguments_are_named(query: dict[str, str], needle: str) -> None:
    with pytest.raises(ArgumentError) as e:
        SendRequestHeader.from_query(query)
    assert needle in e.value.message
