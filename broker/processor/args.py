"""Request-argument helpers the broker's processors share: names, queue arguments, JSON fields, and the broker's
own name in error messages.

The query models of ``/pull`` and ``/send`` and the readers of single query arguments live with the protocol
(:mod:`common.requests`, shared with the SDK); what is here is the broker side of the other endpoints.
Every bad argument raises :class:`ArgumentError` (answered INVALID_PARAMETER) naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.config import BrokerConfig
from broker.role import RoleState
from common.requests import INT32_MAX, INT64_MAX, ArgumentError, checked_name
from remoting.router import Request

__all__ = ["INT32_MAX", "INT64_MAX", "ArgumentError", "broker_where", "checked_name", "json_field", "queue_args"]


def queue_args(request: Request) -> tuple[str, int]:
    """``(topic, queueId)`` of a query, both checked."""
    topic = checked_name("topic", request.arg("topic"))
    return topic, request.int_arg("queueId", lo=0, hi=INT32_MAX)


def json_field(obj: Mapping[str, Any], key: str, typ: type, *, default: Any = None, lo: int | None = None,
               hi: int | None = None) -> Any:
    """One field of a JSON body, type-checked (and for integers range-checked).

    Args:
        obj: the decoded body (or one object in it).
        key: the field name.
        typ: ``int``, ``str``, ``bool``, ``list``, ``dict``... (a bool is not an int here).
        default: the value when the field is absent; None makes it required.
        lo / hi: inclusive bounds of an integer field (None: unbounded).

    Raises:
        ArgumentError: the field is missing, of another type or out of range (the message names it).
    """
    v = obj.get(key, default)
    if v is None:
        raise ArgumentError(f"JSON field {key!r} is missing")
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ArgumentError(f"JSON field {key!r}={v} is outside [{lo}, {hi}]")
    elif not isinstance(v, typ):
        raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not a {typ.__name__}")
    return v


def broker_where(config: BrokerConfig, addr: str, role: RoleState) -> str:
    """``broker NAME (ADDR, ROLE)``: which broker answered, for error messages."""
    return f"broker {config.broker_name} ({addr}, {role.name})"
