"""Tag subscriptions: ``*`` or ``TagA || TagB`` -> a filter on consume-queue tag codes (Java string hashes).

Like RocketMQ's ``FilterAPI.buildSubscriptionData``: ``*`` or an empty expression subscribes to everything;
otherwise the expression is split on ``||`` and trimmed. Hash collisions pass the consume-queue filter, as in
RocketMQ (the client re-checks tags).
"""

from __future__ import annotations

from collections.abc import Callable

from client.errors import BrokerError
from client.protocol.codec import tags_hash
from client.protocol.codes import ResponseCode

__all__ = ["MAX_EXPRESSION_LENGTH", "SubscriptionParseError", "build_tag_filter", "parse_tags"]

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
