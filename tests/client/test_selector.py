"""``MessageSelector`` on its way to the broker: the pull query (``expressionType`` only for SQL92, round trip),
the heartbeat's subscriptions, and the consumers' parsed filter."""

from __future__ import annotations

import json

import pytest

from client import MessageSelector
from client._rebalance import TagFilter
from client._requests import heartbeat_body
from common.requests import ArgumentError, PullRequestHeader, parse_query


@pytest.mark.parametrize("selector", [MessageSelector.tags("A || B"), MessageSelector.sql("a > 1 AND b = 'x y'")])
def test_pull_query_round_trip(selector: MessageSelector) -> None:
    h = PullRequestHeader.of("g", "T", 0, 5, sub_expression=selector.expression,
                             expression_type=selector.expression_type)
    query = h.to_query()
    assert ("expressionType=SQL92" in query) is selector.is_sql
    assert PullRequestHeader.from_query(parse_query(query.encode())) == h


def test_unknown_expression_type_is_refused() -> None:
    with pytest.raises(ArgumentError, match="expressionType"):
        PullRequestHeader.from_query(parse_query(b"group=g&topic=T&queueId=0&offset=0&expressionType=XPATH"))


def test_heartbeat_announces_sql_subscriptions() -> None:
    body = json.loads(heartbeat_body("c1", [], {"g": {"A", "B"}},
                                     selectors={"g": {"B": MessageSelector.sql("x IS NULL")}}))
    assert body["consumerGroups"][0]["subscriptions"] == [
        {"topic": "A", "expression": "*"},
        {"topic": "B", "expression": "x IS NULL", "expressionType": "SQL92"},
    ]


def test_tag_filter_of_a_selector() -> None:
    sql = TagFilter.parse(MessageSelector.sql("a = 1"))
    assert (sql.tags, sql.selector) == (None, MessageSelector.sql("a = 1"))
    assert TagFilter.parse("A || B") == TagFilter.parse(MessageSelector.tags(" A || B "))
    assert TagFilter.parse("A").selector == MessageSelector("A", "TAG")
    with pytest.raises(ValueError, match="SQL92"):
        TagFilter.parse(MessageSelector("a >", "SQL92"))  # built without the check of MessageSelector.sql
    with pytest.raises(ValueError, match="MessageSelector"):
        TagFilter.parse(5)  # type: ignore[arg-type]
