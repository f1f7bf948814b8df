"""The bodies of ``POST /queue/lock`` and ``POST /queue/unlock`` (RocketMQ's ``lockBatchMQ`` / ``unlockBatchMQ``),
described once for the SDK and the broker (docs/PROTOCOL.md)::

    request  (both)   {"consumerGroup": G, "clientId": C,
                       "mqSet": [{"topic": T, "brokerName": B, "queueId": Q}, ...]}
    response (lock)   {"lockOKMQSet": [{"topic": T, "brokerName": B, "queueId": Q}, ...]}
    response (unlock) {"unlocked": N}

The field names are RocketMQ's ``LockBatchRequestBody`` / ``LockBatchResponseBody``. One request names at most
:data:`MAX_QUEUES_PER_REQUEST` queues.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from common.errors import MessageIllegalError
from common.message import MessageQueue
from common.properties import validate_topic
from common.requests import INT32_MAX, ArgumentError, checked_name

__all__ = ["MAX_QUEUES_PER_REQUEST", "LockBatchRequest", "decode_queues", "encode_queues", "lock_response"]

#: Bound of the queues one lock or unlock request names.
MAX_QUEUES_PER_REQUEST = 10_000


def encode_queues(queues: Iterable[MessageQueue]) -> list[dict[str, Any]]:
    """Queues as the JSON objects of ``mqSet`` / ``lockOKMQSet``, sorted."""
    return [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id} for q in sorted(queues)]


def decode_queues(items: object, field: str) -> list[MessageQueue]:
    """The queues of a ``mqSet`` / ``lockOKMQSet`` list.

    Raises:
        ArgumentError: not a list of ``{topic, brokerName, queueId}`` objects with legal values, or too long
            (the message names ``field`` and the bad item).
    """
    if not isinstance(items, list):
        raise ArgumentError(f"JSON field {field!r} must be a list of {{topic, brokerName, queueId}}")
    if len(items) > MAX_QUEUES_PER_REQUEST:
        raise ArgumentError(f"JSON field {field!r} names {len(items)} queues, more than "
                            f"MAX_QUEUES_PER_REQUEST={MAX_QUEUES_PER_REQUEST}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ArgumentError(f"{field}[{i}] is not an object")
        topic, broker, qid = item.get("topic"), item.get("brokerName"), item.get("queueId")
        if not isinstance(topic, str) or not isinstance(broker, str) or not broker or len(broker) > 255:
            raise ArgumentError(f"{field}[{i}] needs a string 'topic' and a 1 to 255 character 'brokerName'")
        if isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid <= INT32_MAX:
            raise ArgumentError(f"{field}[{i}].queueId={qid!r:.40} is not an integer in [0, {INT32_MAX}]")
        try:
            validate_topic(topic)
        except MessageIllegalError as e:
            raise ArgumentError(f"{field}[{i}].topic: {e.message}") from None
        out.append(MessageQueue(topic, broker, qid))
    return out


@attrs.frozen
class LockBatchRequest:
    """One lock or unlock request: a client of a consumer group and the queues it (un)locks."""

    consumer_group: str
    """The consumer group the locks belong to."""
    client_id: str
    """The asking client instance's id."""
    queues: tuple[MessageQueue, ...]
    """The queues, all of the broker group the request goes to."""

    def to_json(self) -> bytes:
        """The request body."""
        return json.dumps({"consumerGroup": self.consumer_group, "clientId": self.client_id,
                           "mqSet": encode_queues(self.queues)}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LockBatchRequest:
        """Read and check a decoded request body.

        Raises:
            ArgumentError: a field is missing or malformed (the message names it).
        """
        group = body.get("consumerGroup")
        if not isinstance(group, str):
            raise ArgumentError("JSON field 'consumerGroup' is missing or not a string")
        client_id = body.get("clientId")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 255:
            raise ArgumentError("JSON field 'clientId' must be 1 to 255 characters")
        return cls(checked_name("group", group), client_id, tuple(decode_queues(body.get("mqSet"), "mqSet")))


def lock_response(body: Mapping[str, Any]) -> set[MessageQueue]:
    """The queues a ``POST /queue/lock`` answer says the asker holds.

    Raises:
        ArgumentError: the answer lacks a well-formed ``lockOKMQSet``.
    """
    return set(decode_queues(body.get("lockOKMQSet"), "lockOKMQSet"))
