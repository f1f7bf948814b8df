"""The retry and dead-letter rules (docs/BEHAVIOUR.md 8.3), broker side: where a message a consumer failed goes, the
properties of its copy, and the send path's rule for a batch a producer sends straight to ``%RETRY%<group>``.

Pure functions over names, counts and properties; :mod:`broker.processor.sendback` and
:mod:`broker.processor.send` apply them. A sent-back message goes to ``%RETRY%<group>`` with a delay level
(default ``3 + reconsumeTimes``: 10 s, 30 s, 1 min, ... 2 h); once ``reconsumeTimes`` reaches the group's
``retryMaxTimes`` (16) -- or the consumer asks with ``delayLevel < 0`` -- it goes to ``%DLQ%<group>`` instead,
with no delay, where nobody consumes it until an operator looks.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from common.codec import BatchItem
from common.properties import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    decode_properties,
    encode_properties,
)

__all__ = [
    "DLQ_GROUP_TOPIC_PREFIX",
    "DLQ_QUEUE_NUMS",
    "RETRY_BASE_DELAY_LEVEL",
    "RETRY_GROUP_TOPIC_PREFIX",
    "SendBackTarget",
    "build_send_back_properties",
    "decide_send_back",
    "dlq_topic",
    "reroute_retry_batch",
    "retry_send_dlq_topic",
    "retry_topic",
]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
#: Queues of a ``%DLQ%`` topic (RocketMQ's ``DLQ_NUMS_PER_GROUP``).
DLQ_QUEUE_NUMS = 1
#: Delay level of the first retry minus one: reconsumeTimes 0 -> level 3 (10 s with the default levels).
RETRY_BASE_DELAY_LEVEL = 3
_DELAY_KEY = f"{DELAY}\x01".encode()


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


class SendBackTarget(enum.Enum):
    RETRY = "RETRY"
    DLQ = "DLQ"


def decide_send_back(reconsume_times: int, max_reconsume_times: int, delay_level: int) -> tuple[SendBackTarget, int]:
    """Where a sent-back message goes, and with which delay level.

    Args:
        reconsume_times: the original's reconsume count (0 the first time it failed).
        max_reconsume_times: the group's ``retryMaxTimes`` or the consumer's override.
        delay_level: the consumer's wish: 0 = let the broker decide, < 0 = straight to the DLQ.

    Returns:
        ``(DLQ, 0)`` once ``reconsume_times >= max_reconsume_times`` or for ``delay_level < 0``; else
        ``(RETRY, delay_level or 3 + reconsume_times)`` (the store caps it at the highest level).
    """
    if delay_level < 0 or reconsume_times >= max_reconsume_times:
        return SendBackTarget.DLQ, 0
    return SendBackTarget.RETRY, delay_level if delay_level > 0 else RETRY_BASE_DELAY_LEVEL + reconsume_times


def retry_send_dlq_topic(topic: str, reconsume_times: int, properties: Mapping[str, str],
                         group_retry_max_times: int) -> str | None:
    """The send path's rule for a message a producer sends straight to ``%RETRY%<group>`` (the consumer's
    fallback when send-back failed): the ``%DLQ%<group>`` topic it must go to instead, or None.

    It goes to the DLQ when ``reconsume_times`` (the send request's ``reconsumeTimes``, i.e. the message's
    ``RECONSUME_TIME`` property as the SDK sends it) exceeds its ``MAX_RECONSUME_TIMES`` property (the group's
    ``retryMaxTimes`` when absent or malformed). docs/BEHAVIOUR.md 8.3 says "exceeds"; RocketMQ's
    ``handleRetryAndDLQ`` uses ``>=``, which gives the fallback path one retry fewer than send-back.
    The caller then stores it in queue 0 of that topic (created with 1 queue, perm RW) without a delay.
    """
    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return None
    raw = properties.get(MAX_RECONSUME_TIMES, "")
    max_times = int(raw) if raw.lstrip("-").isdigit() else group_retry_max_times
    if reconsume_times > max_times:
        return dlq_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
    return None


def reroute_retry_batch(topic: str, reconsume_times: int, items: Sequence[BatchItem], group_retry_max_times: int
                        ) -> tuple[str, int, list[BatchItem]] | None:
    """The send path's hook: for a batch sent to ``%RETRY%<group>`` whose first message is over its retry
    limit (:func:`retry_send_dlq_topic`), ``(dlq_topic, 0, items without DELAY)`` to store instead; else None.

    The caller creates the DLQ topic when missing (``DLQ_QUEUE_NUMS`` queue, perm RW) and appends the returned
    items to queue 0 of it (RocketMQ also drops the delay level there).
    """
    if not items or not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return None
    dlq = retry_send_dlq_topic(topic, reconsume_times, decode_properties(items[0].properties),
                               group_retry_max_times)
    if dlq is None:
        return None
    return dlq, 0, [_without_delay(item) for item in items]


def _without_delay(item: BatchItem) -> BatchItem:
    if _DELAY_KEY not in bytes(item.properties):
        return item
    props = decode_properties(item.properties)
    if props.pop(DELAY, None) is None:
        return item
    return item._replace(properties=encode_properties(props), delay_level=0)


def build_send_back_properties(original: Mapping[str, str], *, original_topic: str, original_msg_id: str,
                               reconsume_times: int, max_reconsume_times: int, delay_level: int) -> dict[str, str]:
    """Properties of the copy: the original's, plus ``RETRY_TOPIC`` (first topic, kept across retries),
    ``ORIGIN_MESSAGE_ID`` (first id, kept), ``RECONSUME_TIME`` / ``MAX_RECONSUME_TIMES`` and ``DELAY``
    (removed for level 0, so the store's delay rewrite does not apply)."""
    props = dict(original)
    props.setdefault(RETRY_TOPIC, original_topic)
    if not props.get(ORIGIN_MESSAGE_ID):
        props[ORIGIN_MESSAGE_ID] = original_msg_id
    props[RECONSUME_TIME] = str(reconsume_times + 1)
    props[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if delay_level > 0:
        props[DELAY] = str(delay_level)
    else:
        props.pop(DELAY, None)
    return props
