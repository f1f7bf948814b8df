"""The offset model of the connector: per-queue positions, their JSON form, and the per-trigger rate limit.

A position is keyed by ``QueueKey(topic, brokerName, queueId)`` and holds the *next* offset to read (exclusive
end, the RocketMQ consumer-offset meaning). Its JSON form is rocketmq-spark's::

    {"<topic>": {"<brokerName>": {"<queueId>": <offset>}}}

with ``-2`` = earliest and ``-1`` = latest allowed in user-supplied start/end options. Spark compares offsets
as JSON *text*, so :func:`offsets_to_json` always emits keys sorted at every level (the same order
``json.dumps(sort_keys=True)`` would give), whatever order the input had.

Offsets a streaming query checkpoints also carry, under the reserved key ``"@groups"`` (no topic name can hold
an ``@``), the group identity of each broker group they were taken from (``{"@groups": {"broker-a": "1f0c..."}}``,
see the broker's ``GET /identity``): offsets only mean something in the store that assigned them, and a fresh
cluster that reuses the group names would otherwise take a checkpoint's offsets as its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple

from common.message import MessageQueue

__all__ = [
    "EARLIEST",
    "EARLIEST_MARKER",
    "GROUPS_KEY",
    "LATEST",
    "LATEST_MARKER",
    "OffsetMap",
    "OffsetSpec",
    "QueueKey",
    "groups_from_json",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offsets_json",
    "parse_timestamps_json",
    "rate_limit",
]

EARLIEST: Literal["earliest"] = "earliest"
LATEST: Literal["latest"] = "latest"
EARLIEST_MARKER = -2
LATEST_MARKER = -1
#: The reserved top-level key of checkpointed offsets that maps each broker group to its group identity.
GROUPS_KEY = "@groups"


class QueueKey(NamedTuple):
    """One queue of a topic: ordered by topic, broker group, then queue id."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"

    @property
    def message_queue(self) -> MessageQueue:
        """The same queue as the SDK names it."""
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


OffsetMap = dict[QueueKey, int]
OffsetSpec = Literal["earliest", "latest"] | OffsetMap


def _parse_queue_id(raw: object, where: str) -> int:
    try:
        qid = int(str(raw))
    except ValueError:
        raise ValueError(f"{where}: queue id {raw!r} is not an integer") from None
    if qid < 0 or str(qid) != str(raw).strip():
        raise ValueError(f"{where}: queue id {raw!r} must be a non-negative integer")
    return qid


def _per_queue(doc: Any, what: str, leaf: str, *, allow_groups: bool) -> Iterator[tuple[str, str, int, Any, str]]:
    """``(topic, broker, queue id, value, where)`` of every leaf of ``{"topic":{"brokerName":{"queueId": v}}}``."""
    if not isinstance(doc, Mapping):
        raise ValueError(f'{what} must be a JSON object {{"topic":{{"brokerName":{{"queueId":{leaf}}}}}}}')
    for topic, brokers in doc.items():
        if topic == GROUPS_KEY:
            if not allow_groups:
                raise ValueError(f"{GROUPS_KEY!r} is reserved for checkpoints (no topic has that name)")
            continue
        if not isinstance(brokers, Mapping):
            raise ValueError(f"{what}[{topic!r}] must be an object of broker names")
        for broker, queues in brokers.items():
            if not isinstance(queues, Mapping):
                raise ValueError(f"{what}[{topic!r}][{broker!r}] must be an object of queue ids")
            for qid_raw, value in queues.items():
                where = f"{what}[{topic!r}][{broker!r}][{qid_raw!r}]"
                yield str(topic), str(broker), _parse_queue_id(qid_raw, where), value, where


def parse_timestamps_json(doc: Any) -> OffsetMap:
    """Parse ``{"topic": {"brokerName": {"queueId": epochMs}}}`` (``startingOffsetsByTimestamp``) per queue.

    Raises:
        ValueError: wrong shape, a queue id or time that is not a non-negative integer; names the path.
    """
    out: OffsetMap = {}
    for topic, broker, qid, ms, where in _per_queue(doc, "timestamps", "epochMs", allow_groups=False):
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(f"{where}: {ms!r} is not a time in epoch milliseconds (an integer >= 0)")
        out[QueueKey(topic, broker, qid)] = ms
    return out


def groups_from_json(doc: Any) -> dict[str, str]:
    """The ``"@groups"`` of checkpointed offsets: broker name -> group identity (empty for older checkpoints)."""
    if not isinstance(doc, Mapping):
        return {}
    groups = doc.get(GROUPS_KEY)
    if not isinstance(groups, Mapping):
        return {}
    return {str(k): str(v) for k, v in groups.items() if isinstance(v, str) and v}


def parse_offsets_json(doc: Any, *, allow_earliest: bool = True, allow_latest: bool = True,
                       allow_groups: bool = False) -> OffsetMap:
    """Parse ``{"topic": {"brokerName": {"queueId": offset}}}`` into an :data:`OffsetMap`.

    Args:
        doc: the decoded JSON document.
        allow_earliest: whether ``-2`` may appear.
        allow_latest: whether ``-1`` may appear.
        allow_groups: whether the checkpoint key ``"@groups"`` may appear (it is skipped here; read it with
            :func:`groups_from_json`).

    Raises:
        ValueError: wrong shape, a non-integer offset or queue id, or a marker not allowed here; the
            message names the offending path.
    """
    out: OffsetMap = {}
    for topic, broker, qid, off, where in _per_queue(doc, "offsets", "offset", allow_groups=allow_groups):
        if isinstance(off, bool) or not isinstance(off, int):
            raise ValueError(f"{where}: offset {off!r} is not an integer")
        if off < EARLIEST_MARKER:
            raise ValueError(f"{where}: offset {off} is negative (only -2 earliest / -1 latest)")
        if off == EARLIEST_MARKER and not allow_earliest:
            raise ValueError(f"{where}: -2 (earliest) is not allowed here")
        if off == LATEST_MARKER and not allow_latest:
            raise ValueError(f"{where}: -1 (latest) is not allowed here")
        out[QueueKey(topic, broker, qid)] = off
    return out


def offsets_to_json(offsets: Mapping[QueueKey, int], groups: Mapping[str, str | None] | None = None
                    ) -> dict[str, Any]:
    """The canonical nested dict of ``offsets``: keys sorted (as strings) at every level.

    Two equal maps always give dicts that serialise to the same JSON text, which Spark requires.

    Args:
        offsets: the positions.
        groups: broker name -> group identity, kept under ``"@groups"`` (unknown identities are left out).
    """
    nested: dict[str, Any] = {}
    for key in sorted(offsets, key=lambda k: (k.topic, k.broker_name, str(k.queue_id))):
        nested.setdefault(key.topic, {}).setdefault(key.broker_name, {})[str(key.queue_id)] = int(offsets[key])
    known = {name: ident for name, ident in sorted((groups or {}).items()) if ident}
    if known:
        nested[GROUPS_KEY] = known
    return dict(sorted(nested.items()))


def offsets_from_json(doc: Any) -> OffsetMap:
    """Parse a checkpointed offset dict (no -2/-1 markers allowed: checkpoints hold real positions)."""
    return parse_offsets_json(doc, allow_earliest=False, allow_latest=False, allow_groups=True)


def rate_limit(start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int], max_rows: int) -> OffsetMap:
    """End offsets reading at most about ``max_rows`` offsets, prorated by each queue's backlog.

    Kafka's ``maxOffsetsPerTrigger`` rule: when the total backlog fits, read everything; otherwise each queue
    gets ``max_rows * backlog / total`` offsets, rounded down, except that a share below one is rounded up so
    small queues are never starved (the total may then exceed ``max_rows`` by at most one per such queue).
    A queue never goes beyond ``latest``, and queues missing from ``start`` start at 0.

    Args:
        start: where each queue's next read begins.
        latest: each queue's current max offset.
        max_rows: the limit (>= 1).

    Returns:
        The end offset of every queue in ``latest``.
    """
    if max_rows < 1:
        raise ValueError(f"maxOffsetsPerTrigger must be >= 1, got {max_rows}")
    backlog = {k: max(0, end - start.get(k, 0)) for k, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return {k: max(end, start.get(k, 0)) for k, end in latest.items()}
    out: OffsetMap = {}
    for k, end in latest.items():
        begin = start.get(k, 0)
        size = backlog[k]
        if size == 0:
            out[k] = max(begin, end)
            continue
        share = max_rows * (size / total)
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[k] = min(end, begin + take)
    return out
