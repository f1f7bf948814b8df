"""What a consumer subscribes to: RocketMQ's ``MessageSelector`` (a TAG expression or an SQL92 filter).

The type travels with the expression: ``expressionType=SQL92`` on a pull's query (``TAG`` is the default and is
not written) and in a heartbeat's subscription (docs/PROTOCOL.md, "Subscription expressions"). A plain string
wherever the SDK takes a ``sub_expression`` keeps meaning a TAG expression.
"""

from __future__ import annotations

import attrs

from common.errors import InvalidParameterError
from common.sql92 import SqlFilterError, compile_sql

__all__ = ["EXPRESSION_TYPES", "SQL92", "TAG", "MessageSelector"]

#: RocketMQ's ``ExpressionType.TAG``: ``*`` or ``TagA || TagB``, filtered on the consume queue's tag hashes.
TAG = "TAG"
#: RocketMQ's ``ExpressionType.SQL92``: a property filter evaluated by the broker (``enablePropertyFilter``).
SQL92 = "SQL92"
EXPRESSION_TYPES = frozenset({TAG, SQL92})


@attrs.frozen
class MessageSelector:
    """A subscription expression with its type; build it with :meth:`sql` or :meth:`tags`.

    ::

        consumer.subscribe("Orders", MessageSelector.sql("region = 'EU' AND amount > 100"))
    """

    expression: str
    """The expression as sent to the broker."""
    expression_type: str = TAG
    """:data:`TAG` or :data:`SQL92`."""

    @classmethod
    def sql(cls, expression: str) -> MessageSelector:
        """An SQL92 filter over message properties (RocketMQ's grammar, see :mod:`common.sql92`).

        Raises:
            InvalidParameterError: the expression does not parse; the message says where and why.
        """
        try:
            compile_sql(expression)
        except SqlFilterError as e:
            raise InvalidParameterError(str(e)) from None
        return cls(expression, SQL92)

    @classmethod
    def tags(cls, expression: str = "*") -> MessageSelector:
        """A TAG expression: ``*`` or ``TagA || TagB`` (the same as passing the string itself).

        Raises:
            InvalidParameterError: not a str.
        """
        if not isinstance(expression, str):
            raise InvalidParameterError(f"a tag expression must be a str, got {type(expression).__name__}")
        return cls(expression, TAG)

    @classmethod
    def of(cls, sub_expression: str | MessageSelector | None) -> MessageSelector:
        """A selector from what a ``sub_expression`` argument accepts (None and a str are TAG expressions).

        Raises:
            InvalidParameterError: neither a str nor a MessageSelector.
        """
        if isinstance(sub_expression, MessageSelector):
            return sub_expression
        if sub_expression is None:
            return cls("*", TAG)
        return cls.tags(sub_expression)

    @property
    def is_sql(self) -> bool:
        """True for an SQL92 filter."""
        return self.expression_type == SQL92
