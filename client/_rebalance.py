"""Consumption state as pure logic: queue allocation, per-queue processing state, start offsets, tag checks.

Nothing here does I/O or reads a clock, so every rule is table-tested (``tests/client/test_rebalance.py``).
The rules are RocketMQ's:

* :class:`AllocateMessageQueueAveragely` / :class:`AllocateMessageQueueAveragelyByCircle` -- each instance of a
  group computes its own share from the sorted client ids and the sorted queues, so every instance arrives at
  the same disjoint cover without talking to the others (``RebalanceImpl.rebalanceByTopic``).
* :class:`ProcessQueue` -- the messages pulled but not yet consumed for one queue. The offset to commit is the
  smallest offset still in flight (or one past the largest pulled when none is), so a commit never skips a
  message that a slow callback still holds (``ProcessQueue.removeMessage``).
* :func:`plan_start_offset` -- ``computePullFromWhere`` for CONSUME_FROM_LAST/FIRST_OFFSET/TIMESTAMP.
* :class:`TagFilter` -- the client re-check of ``TagA || TagB`` (the broker filters on tag hashes, which collide).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from common.message import MessageExt, MessageQueue
from common.properties import RETRY_TOPIC
from common.selector import SQL92, TAG, MessageSelector
from common.sql92 import compile_sql

__all__ = [
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueStrategy",
    "ConsumeFromWhere",
    "MessageModel",
    "ProcessQueue",
    "StartPlan",
    "TagFilter",
    "dlq_topic",
    "is_retry_topic",
    "plan_start_offset",
    "restore_retry_topic",
    "retry_topic",
]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


class MessageModel(enum.Enum):
    """How the instances of a group share a topic."""

    CLUSTERING = "CLUSTERING"
    """Each message goes to one instance: queues are divided among them; offsets live on the broker."""
    BROADCASTING = "BROADCASTING"
    """Each instance gets every message: it takes every queue; offsets live in a local file."""


class ConsumeFromWhere(enum.Enum):
    """Where a queue with no committed offset starts (RocketMQ ``ConsumeFromWhere``)."""

    LAST_OFFSET = "LAST_OFFSET"
    """The queue's max offset: only messages stored from now on (retry topics start at 0)."""
    FIRST_OFFSET = "FIRST_OFFSET"
    """The queue's first stored message."""
    TIMESTAMP = "TIMESTAMP"
    """The first message stored at or after ``consume_timestamp_ms``."""


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a group's failed messages come back."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where a group's messages go after ``max_reconsume_times`` retries."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def restore_retry_topic(msg: MessageExt, group: str) -> MessageExt:
    """A message pulled from ``%RETRY%<group>`` shown under its original topic (``resetRetryAndNamespace``).

    The queue fields stay those of the retry queue: offsets are committed per queue pulled.
    """
    original = msg.properties.get(RETRY_TOPIC)
    if original and msg.topic == retry_topic(group):
        return attrs.evolve(msg, topic=original)
    return msg


# --- allocation -------------------------------------------------------------------------------------------


class AllocateMessageQueueStrategy(Protocol):
    """How one instance picks its share of a topic's queues."""

    @property
    def name(self) -> str:
        """Strategy name (``AVG``, ``AVG_BY_CIRCLE``)."""
        ...

    def allocate(self, group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        """The queues ``current_cid`` owns; [] when it is not among ``cid_all``."""
        ...


def _check_allocate_args(current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
                         ) -> tuple[list[MessageQueue], list[str]] | None:
    if not current_cid:
        raise ValueError("current_cid is empty")
    # Sorting here (RocketMQ sorts in the caller) keeps the result independent of the order brokers answered.
    mqs = sorted(set(mq_all))
    cids = sorted(set(cid_all))
    if not mqs or current_cid not in cids:
        return None
    return mqs, cids


@attrs.frozen
class AllocateMessageQueueAveragely:
    """Contiguous blocks: with 8 queues and 3 clients, the sorted clients get 3, 3 and 2 queues.

    When there are more clients than queues, the first ``len(queues)`` clients get one each and the rest none.
    """

    name: str = "AVG"

    def allocate(self, group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        """See :class:`AllocateMessageQueueStrategy`."""
        checked = _check_allocate_args(current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        index, n_mq, n_cid = cids.index(current_cid), len(mqs), len(cids)
        mod = n_mq % n_cid
        size = 1 if n_mq <= n_cid else n_mq // n_cid + (1 if mod > 0 and index < mod else 0)
        start = index * size if mod > 0 and index < mod else index * size + mod
        count = min(size, n_mq - start)
        return [mqs[(start + i) % n_mq] for i in range(max(0, count))]


@attrs.frozen
class AllocateMessageQueueAveragelyByCircle:
    """Round robin: queue ``i`` goes to the client at index ``i % len(clients)``."""

    name: str = "AVG_BY_CIRCLE"

    def allocate(self, group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        """See :class:`AllocateMessageQueueStrategy`."""
        checked = _check_allocate_args(current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        index = cids.index(current_cid)
        return [mq for i, mq in enumerate(mqs) if i % len(cids) == index]


# --- start offsets ----------------------------------------------------------------------------------------


@attrs.frozen
class StartPlan:
    """Where a newly owned queue starts: a known offset, or a query the caller must make."""

    kind: str
    """``offset`` (use :attr:`offset`), ``max`` (queue max offset) or ``search`` (offset at the timestamp)."""
    offset: int = -1
    """The offset when ``kind == "offset"``."""


def plan_start_offset(where: ConsumeFromWhere, committed: int, topic: str) -> StartPlan:
    """``computePullFromWhere``: the committed offset when there is one, else what ``where`` says.

    Args:
        where: the consumer's policy for queues without a committed offset.
        committed: the broker's (or the local store's) offset; -1 when none was ever committed.
        topic: the queue's topic (retry topics always start at 0 with LAST_OFFSET, at max with TIMESTAMP).

    Raises:
        ValueError: ``committed`` < -1 (the caller failed to read it and must not guess).
    """
    if committed >= 0:
        return StartPlan("offset", committed)
    if committed != -1:
        raise ValueError(f"committed offset {committed} is neither >= 0 nor -1 (not committed)")
    retry = is_retry_topic(topic)
    if where is ConsumeFromWhere.LAST_OFFSET:
        return StartPlan("offset", 0) if retry else StartPlan("max")
    if where is ConsumeFromWhere.FIRST_OFFSET:
        return StartPlan("offset", 0)
    return StartPlan("max") if retry else StartPlan("search")


# --- tags -------------------------------------------------------------------------------------------------


@attrs.frozen
class TagFilter:
    """A parsed ``sub_expression``: ``*`` (everything), ``TagA || TagB``, or an SQL92 filter (the broker's job)."""

    expression: str
    """The expression as sent to the broker."""
    tags: frozenset[str] | None
    """The accepted tags; None accepts every message (and every message an SQL92 filter let through)."""
    expression_type: str = TAG
    """``TAG`` or ``SQL92``."""

    @classmethod
    def parse(cls, expression: str | MessageSelector | None) -> TagFilter:
        """Parse as RocketMQ's ``FilterAPI`` does (split on ``||``, trim, ``*`` or empty = all); an SQL92
        selector is compiled once to refuse a bad one early, and filtered by the broker.

        Raises:
            ValueError: not a str or selector, a control character, ``||`` with no tag between, or bad SQL92.
        """
        if isinstance(expression, MessageSelector):
            if expression.is_sql:
                compile_sql(expression.expression)  # SqlFilterError is a ValueError naming the problem
                return cls(expression.expression, None, SQL92)
            expression = expression.expression
        if expression is None:
            expression = "*"
        if not isinstance(expression, str):
            raise ValueError(f"sub_expression must be a str or a MessageSelector, got {type(expression).__name__}")
        expr = expression.strip()
        if not expr or expr == "*":
            return cls("*", None)
        if any(ord(c) < 0x20 for c in expr):
            raise ValueError(f"sub_expression {expr[:60]!r} holds a control character")
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        if not tags:
            raise ValueError(f"sub_expression {expr[:60]!r} names no tag (expected '*' or 'TagA || TagB')")
        return cls(expr, tags)

    @property
    def selector(self) -> MessageSelector:
        """What a pull sends."""
        return MessageSelector(self.expression, self.expression_type)

    def matches(self, msg: MessageExt) -> bool:
        """True when the message's tag is accepted (the broker's hash filter can let collisions through)."""
        return self.tags is None or (msg.tags is not None and msg.tags in self.tags)


# --- per-queue processing state ---------------------------------------------------------------------------


class ProcessQueue:
    """Pulled-but-unconsumed messages of one queue (RocketMQ ``ProcessQueue``); not thread-safe by itself.

    Messages enter in offset order (``put``) and leave in any order (``remove``); the dict keeps insertion
    order, so its first key is always the smallest offset still in flight.

    Args:
        mq: the queue.
        start_offset: the first offset this instance consumes (the committed offset it was handed).
    """

    def __init__(self, mq: MessageQueue, start_offset: int) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.mq = mq
        self.next_pull_offset = start_offset
        """Where the next pull starts (ahead of what is consumed by the prefetch)."""
        self.consume_offset = start_offset
        """The offset to commit: every message below it is consumed."""
        self.dropped = False
        """Set when the queue left this instance (or was reset); in-flight results for it are discarded."""
        self.paused = False
        """User pause: the queue stays owned but is not pulled."""
        self.generation = 0
        """Bumped by :meth:`reset` so a pull begun before a seek cannot deliver stale messages."""
        self._msgs: dict[int, MessageExt] = {}
        self._size = 0
        self._max_put = start_offset - 1
        self._consuming: dict[int, MessageExt] = {}  # orderly mode: taken by a callback, not yet committed

    # --- observation ---

    @property
    def msg_count(self) -> int:
        """Messages held (cached and, in orderly mode, being consumed)."""
        return len(self._msgs) + len(self._consuming)

    @property
    def msg_size_bytes(self) -> int:
        """Body bytes held."""
        return self._size

    def min_offset_in_flight(self) -> int | None:
        """Smallest offset held, or None when empty."""
        firsts = [next(iter(d)) for d in (self._consuming, self._msgs) if d]
        return min(firsts) if firsts else None

    def over_threshold(self, max_count: int, max_size_bytes: int) -> str | None:
        """Why pulling should pause (naming the bound), or None.

        Args:
            max_count: ``pull_threshold_for_queue``.
            max_size_bytes: ``pull_threshold_size_for_queue_mib`` in bytes.
        """
        if self.msg_count >= max_count:
            return f"{self.msg_count} cached messages >= pull_threshold_for_queue={max_count}"
        if self._size >= max_size_bytes:
            return f"{self._size} cached bytes >= pull_threshold_size_for_queue {max_size_bytes} bytes"
        return None

    # --- transitions ---

    def put(self, msgs: Iterable[MessageExt], next_pull_offset: int) -> list[MessageExt]:
        """Add a pull's messages (offsets already held or below the consume offset are ignored).

        Args:
            msgs: messages of the pull, ascending offsets.
            next_pull_offset: the pull's next begin offset.

        Returns:
            The messages actually added.
        """
        added = []
        for m in msgs:
            off = m.queue_offset
            if off <= self._max_put or off < self.consume_offset:
                continue
            self._msgs[off] = m
            self._size += len(m.body)
            self._max_put = off
            added.append(m)
        self.next_pull_offset = max(self.next_pull_offset, next_pull_offset)
        if not self._msgs and not self._consuming:
            # Nothing in flight: everything the pull skipped (filtered tags) is consumed too.
            self.consume_offset = max(self.consume_offset, self.next_pull_offset)
        return added

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Mark ``msgs`` consumed; returns the new offset to commit (:attr:`consume_offset`)."""
        for m in msgs:
            held = self._msgs.pop(m.queue_offset, None)
            if held is not None:
                self._size -= len(held.body)
        low = self.min_offset_in_flight()
        if low is None:
            low = max(self._max_put + 1, self.next_pull_offset)
        self.consume_offset = max(self.consume_offset, low)
        return self.consume_offset

    def take(self, max_nums: int) -> list[MessageExt]:
        """Orderly mode: move up to ``max_nums`` lowest-offset messages to "consuming" and return them."""
        out: list[MessageExt] = []
        for off in list(self._msgs)[:max_nums]:
            m = self._msgs.pop(off)
            self._consuming[off] = m
            out.append(m)
        return out

    def commit_consuming(self) -> int:
        """Orderly mode: the taken messages are consumed; returns the new offset to commit."""
        for m in self._consuming.values():
            self._size -= len(m.body)
        self._consuming.clear()
        return self.remove(())

    def return_consuming(self, msgs: Sequence[MessageExt]) -> None:
        """Orderly mode: put taken messages back in front (consumed again later, in order)."""
        for m in msgs:
            self._consuming.pop(m.queue_offset, None)
        merged = {m.queue_offset: m for m in msgs}
        merged.update(self._msgs)
        self._msgs = dict(sorted(merged.items()))

    def messages(self) -> list[MessageExt]:
        """Cached messages in offset order (not the ones being consumed in orderly mode)."""
        return list(self._msgs.values())

    def reset(self, offset: int) -> None:
        """Forget everything held and restart at ``offset`` (a seek)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._msgs.clear()
        self._consuming.clear()
        self._size = 0
        self._max_put = offset - 1
        self.next_pull_offset = offset
        self.consume_offset = offset
        self.generation += 1

    def __repr__(self) -> str:
        return (f"ProcessQueue({self.mq}, next_pull={self.next_pull_offset}, consume={self.consume_offset}, "
                f"count={self.msg_count}, dropped={self.dropped})")
