"""Timed delivery rules (RocketMQ 5 timer messages), without I/O: which sends are timed, where they are parked,
and what they are delivered as.

A send whose message carries ``TIMER_DELIVER_MS`` (absolute, ms since the epoch), ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS`` (from the broker's clock at the send) is parked: the item gets ``TIMER_DELIVER_MS`` (the
absolute time), ``REAL_TOPIC`` and ``REAL_QID`` appended and goes to ``rmq_sys_wheel_timer`` queue 0, where the
timer service (:mod:`broker.timer.service`) finds it. A time already due is no timer: the message is stored
under its topic at once. Appending rather than rewriting the property string works because the last value of
a name wins when it is read (:mod:`common.properties`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from broker.metadata.topics import TIMER_TOPIC
from broker.schedule import restore_message
from common.codec import BatchItem
from common.errors import MessageIllegalError
from common.properties import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    decode_properties,
)

__all__ = ["TIMER_TOPIC", "deliver_ms_of", "has_timer", "restore_timer_message", "route_timer_send"]

_MARK = b"TIMER_"
_PROPERTIES = attrgetter("properties")
#: More digits than any time in ms until year 33658; int() of thousands of digits is slow.
_MAX_DIGITS = 15


def has_timer(items: Sequence[BatchItem]) -> bool:
    """Whether any item may carry a timer property: one byte search of the items' property strings joined (a
    false match across two of them only costs a parse) -- the only cost a message without a timer pays.

    ``bytes.find``, not ``in``: ``in`` first tries the needle as an int, and the TypeError it raises and
    clears cost about 2k instructions a call, more than the search (a single send paid it per message)."""
    return b"".join(map(_PROPERTIES, items)).find(_MARK) >= 0


def _number(name: str, raw: str) -> int:
    if not raw.isdigit() or not raw.isascii() or len(raw) > _MAX_DIGITS:
        raise MessageIllegalError(f"timer property {name}={raw[:40]!r} is not a non-negative integer")
    return int(raw)


def deliver_ms_of(props: Mapping[str, str], now_ms: int) -> int | None:
    """The absolute deliver time a message asks for, or None when it has no timer property.

    ``TIMER_DELAY_SEC`` wins over ``TIMER_DELAY_MS``, which wins over ``TIMER_DELIVER_MS`` (RocketMQ 5's order);
    delays count from ``now_ms``.

    Raises:
        MessageIllegalError: the value is not a non-negative integer.
    """
    if TIMER_DELAY_SEC in props:
        return now_ms + 1000 * _number(TIMER_DELAY_SEC, props[TIMER_DELAY_SEC])
    if TIMER_DELAY_MS in props:
        return now_ms + _number(TIMER_DELAY_MS, props[TIMER_DELAY_MS])
    if TIMER_DELIVER_MS in props:
        return _number(TIMER_DELIVER_MS, props[TIMER_DELIVER_MS])
    return None


def route_timer_send(topic: str, queue_id: int, items: Sequence[BatchItem], now_ms: int, max_delay_s: int
                     ) -> tuple[str, int, list[BatchItem]] | None:
    """Where a send with timer properties is stored: ``(TIMER_TOPIC, 0, [rewritten item])``, or None when
    nothing is to wait (no timer property, or its time is due).

    Raises:
        MessageIllegalError: a timed message in a batch of several, a timer together with a delay level, a
            malformed value, or a deliver time more than ``max_delay_s`` (``timerMaxDelaySec``) ahead.
    """
    timed = []
    for i, item in enumerate(items):
        deliver = deliver_ms_of(decode_properties(item.properties), now_ms)
        if deliver is not None and deliver > now_ms:
            timed.append((i, deliver))
    if not timed:
        return None
    if len(items) > 1:
        raise MessageIllegalError(f"message {timed[0][0]} to topic {topic} is timed: timed messages cannot be sent "
                                  "in a batch")
    (item,), deliver = items, timed[0][1]
    if item.delay_level:
        raise MessageIllegalError(f"a message to topic {topic} has both a delay level and a timer property")
    if deliver - now_ms > max_delay_s * 1000:
        raise MessageIllegalError(
            f"a timed message to topic {topic} is due in {(deliver - now_ms) / 1000:.0f} s, beyond "
            f"timerMaxDelaySec ({max_delay_s} s)")
    raw = bytes(item.properties)
    sep = b"\x02" if raw and not raw.endswith(b"\x02") else b""
    tail = f"{TIMER_DELIVER_MS}\x01{deliver}\x02{REAL_TOPIC}\x01{topic}\x02{REAL_QID}\x01{queue_id}\x02".encode()
    return TIMER_TOPIC, 0, [item._replace(properties=raw + sep + tail)]


def restore_timer_message(topic: str, queue_id: int, properties: Mapping[str, str]
                          ) -> tuple[str, int, dict[str, str]]:
    """The topic, queue and properties a parked timed message is delivered with: as a delay level's
    (:func:`broker.schedule.restore_message`), without the relative ``TIMER_DELAY_*`` properties (a copy sent
    again must not wait again); ``TIMER_DELIVER_MS`` stays, so a consumer can see when it was due.

    Raises:
        ValueError: ``REAL_TOPIC`` / ``REAL_QID`` missing or malformed.
    """
    real_topic, real_qid, props = restore_message(topic, queue_id, properties)
    props.pop(TIMER_DELAY_SEC, None)
    props.pop(TIMER_DELAY_MS, None)
    return real_topic, real_qid, props
