"""Subscription filters: TAG expressions on consume-queue tag codes, SQL92 expressions on stored records.

TAG (``*`` or ``TagA || TagB``), like RocketMQ's ``FilterAPI.buildSubscriptionData``: ``*`` or an empty
expression subscribes to everything; otherwise the expression is split on ``||`` and trimmed. Hash collisions
pass the consume-queue filter, as in RocketMQ (the client re-checks tags).

SQL92 (``expressionType=SQL92``), like RocketMQ's ``ExpressionMessageFilter.isMatchedByCommitLog``: only with
``enablePropertyFilter=true``; the expression is compiled once (:func:`common.sql92.compile_sql`
caches it by text) and each candidate record's properties are decoded once, by the read that would return it.
Nothing of this runs for a TAG subscription.
"""

from __future__ import annotations

from collections.abc import Callable

from common.codec import record_layout, tags_hash
from common.codes import ResponseCode
from common.errors import BrokerError, NoPermissionError, ProtocolViolationError
from common.properties import decode_properties
from common.selector import SQL92
from common.sql92 import SqlFilter, SqlFilterError, compile_sql

__all__ = ["MAX_EXPRESSION_LENGTH", "SubscriptionParseError", "build_record_filter", "build_tag_filter",
           "check_expression", "parse_tags"]

#: Longest subscription expression accepted (a bound on the work of one pull).
MAX_EXPRESSION_LENGTH = 4096
SUB_ALL = "*"


class SubscriptionParseError(BrokerError):
    """The subscription expression cannot be parsed (SUBSCRIPTION_PARSE_FAILED, 23)."""

    code = int(ResponseCode.SUBSCRIPTION_PARSE_FAILED)


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The tags of an expression; None means "every message".

    Raises:
        SubscriptionParseError: no tag between the separators, a control character, or longer than
            :data:`MAX_EXPRESSION_LENGTH`.
    """
    if expression is None:
        return None
    expr = expression.strip()
    if not expr or expr == SUB_ALL:
        return None
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise SubscriptionParseError(
            f"subscription expression is {len(expr)} characters, longer than {MAX_EXPRESSION_LENGTH}"
        )
    if any(ord(c) < 0x20 for c in expr):
        raise SubscriptionParseError(f"subscription expression {expr[:60]!r} holds a control character")
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise SubscriptionParseError(f"subscription expression {expr[:60]!r} names no tag (expected * or A || B)")
    return tags


def build_tag_filter(expression: str | None) -> Callable[[int], bool] | None:
    """A consume-queue filter for the expression, or None for "every message".

    Raises:
        SubscriptionParseError: see :func:`parse_tags`.
    """
    tags = parse_tags(expression)
    if tags is None:
        return None
    codes = frozenset(tags_hash(t) for t in tags)
    return codes.__contains__


def _sql_filter(expression: str, *, enabled: bool, where: str) -> SqlFilter:
    if not enabled:
        raise NoPermissionError(f"{where} refuses SQL92 subscriptions: enablePropertyFilter=false (set "
                                f"enablePropertyFilter=true in the broker's properties)")
    try:
        return compile_sql(expression)
    except SqlFilterError as e:
        raise SubscriptionParseError(str(e)) from None


def build_record_filter(expression: str, *, enabled: bool, where: str) -> Callable[[bytes], bool]:
    """A filter on stored records for an SQL92 expression: decodes the record's properties and evaluates.

    Args:
        expression: the SQL92 expression.
        enabled: the broker's ``enablePropertyFilter``.
        where: the broker, as error messages name it.

    Raises:
        NoPermissionError: ``enabled`` is false (the message names ``enablePropertyFilter``).
        SubscriptionParseError: the expression does not parse (the message says where and why).
    """
    flt = _sql_filter(expression, enabled=enabled, where=where)
    matches = flt.matches

    def record_matches(rec: bytes) -> bool:
        try:
            props_len_pos = record_layout(rec, 0, len(rec))[4]
        except ProtocolViolationError:
            return False
        return matches(decode_properties(rec[props_len_pos + 2:]))

    return record_matches


def check_expression(expression: str, expression_type: str, *, enabled: bool, where: str) -> None:
    """Refuse a subscription a pull would refuse (a heartbeat's subscriptions are checked with this).

    Raises:
        NoPermissionError: SQL92 while ``enablePropertyFilter`` is false.
        SubscriptionParseError: the expression does not parse.
    """
    if expression_type == SQL92:
        _sql_filter(expression, enabled=enabled, where=where)
    else:
        parse_tags(expression)
