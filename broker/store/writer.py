"""Validation and planning of a put (docs/BEHAVIOUR.md 7.8 put path, 8.1 delay rewrite), without I/O.

The fast path (no delay level, no transaction flags) checks sizes in one loop and hands the caller's items to
the writer untouched. The delay level is the item's (read once, when the batch was decoded); nothing here parses
properties. Messages with a delay level get ``REAL_TOPIC`` and ``REAL_QID`` appended to their properties and go
to ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``; prepared / rollback transactional messages get queue
offset 0 and do not advance their queue. A batch then becomes several *runs*, written back to back.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.store.api import AppendResult, PutMessageStatus
from broker.store.commitlog import Run
from broker.store.config import StoreConfig
from broker.store.dispatch import SCHEDULE_TOPIC
from common.codec import RECORD_FIXED_SIZE, BatchItem
from common.errors import MessageIllegalError
from common.properties import MAX_PROPERTIES_BYTES, REAL_QID, REAL_TOPIC, validate_topic

__all__ = ["Plan", "PutValidator"]

_SCHEDULE_B = SCHEDULE_TOPIC.encode()
_MAX_CACHED_TOPICS = 100_000

#: ``(runs, total bytes, [((topic, queue), messages added)], queue offset of the first message)``.
Plan = tuple[list[Run], int, list[tuple[tuple[str, int], int]], int]


def _illegal(remark: str) -> AppendResult:
    return AppendResult(PutMessageStatus.MESSAGE_ILLEGAL, remark)


class PutValidator:
    """Checks and plans puts; remembers validated topic names."""

    def __init__(self, config: StoreConfig, delay_levels_ms: tuple[int, ...]) -> None:
        self.max_message_size = config.max_message_size
        self.levels = delay_levels_ms
        self.last_store_ts = 0
        self._topics: dict[str, bytes] = {}

    def topic_bytes(self, topic: str) -> bytes | AppendResult:
        tb = self._topics.get(topic)
        if tb is None:
            try:
                validate_topic(topic)
            except MessageIllegalError as exc:
                return _illegal(str(exc))
            tb = topic.encode()
            if len(self._topics) < _MAX_CACHED_TOPICS:
                self._topics[topic] = tb
        return tb

    def plan(
        self, topic: str, queue_id: int, items: Sequence[BatchItem], table: dict[tuple[str, int], int]
    ) -> Plan | AppendResult:
        """The runs to write, or the reason (status + remark) to write nothing."""
        tb = self.topic_bytes(topic)
        if isinstance(tb, AppendResult):
            return tb
        if not isinstance(queue_id, int) or queue_id < 0:
            return _illegal(f"queue id {queue_id!r} of topic {topic} is negative")
        if not items:
            return _illegal(f"no messages to store for topic {topic}")
        fixed = RECORD_FIXED_SIZE + len(tb)
        limit = self.max_message_size
        total = 0
        special = False
        for i, (_, sys_flag, _, _, body, props, _, _, _, delay, _) in enumerate(items):
            plen = len(props)
            if plen > MAX_PROPERTIES_BYTES:
                return AppendResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                    f"message {i} to topic {topic}: properties are {plen} bytes, more than "
                                    f"{MAX_PROPERTIES_BYTES}")
            size = fixed + len(body) + plen
            if size > limit:
                return _illegal(f"message {i} to topic {topic} is {size} bytes stored, more than maxMessageSize "
                                f"{limit}")
            total += size
            if sys_flag & 0xC or delay:
                special = True
        if special:
            return self._plan_special(topic, tb, queue_id, items, table)
        key = (topic, queue_id)
        first = table.get(key, 0)
        return [(tb, queue_id, first, items, total)], total, [(key, len(items))], first

    def _rewrite_delay(self, topic: str, queue_id: int, item: BatchItem) -> BatchItem:
        """The item with ``REAL_TOPIC`` / ``REAL_QID`` appended: the last value of a name wins when read (see
        :mod:`common.properties`), so an older pair of the same name (a message delayed again after a
        delivery) is overridden without decoding the others."""
        raw = bytes(item.properties)
        sep = b"\x02" if raw and not raw.endswith(b"\x02") else b""
        tail = f"{REAL_TOPIC}\x01{topic}\x02{REAL_QID}\x01{queue_id}\x02".encode()
        return item._replace(properties=raw + sep + tail)

    def _plan_special(
        self, topic: str, tb: bytes, queue_id: int, items: Sequence[BatchItem], table: dict[tuple[str, int], int]
    ) -> Plan | AppendResult:
        runs: list[list] = []
        local: dict[tuple[str, int], int] = {}
        total = 0
        first_offset = -1
        for i, item in enumerate(items):
            t, t_b, q = topic, tb, queue_id
            advance = item.sys_flag & 0xC in (0, 8)
            if advance:
                level = item.delay_level
                if level > 0:
                    level = min(level, len(self.levels))
                    item = self._rewrite_delay(topic, queue_id, item)
                    t, t_b, q = SCHEDULE_TOPIC, _SCHEDULE_B, level - 1
            plen = len(item.properties)
            if plen > MAX_PROPERTIES_BYTES:
                return AppendResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                    f"message {i} to topic {topic}: properties are {plen} bytes with the delay "
                                    f"rewrite, more than {MAX_PROPERTIES_BYTES}")
            size = RECORD_FIXED_SIZE + len(t_b) + len(item.body) + plen
            if size > self.max_message_size:
                return _illegal(f"message {i} to topic {topic} is {size} bytes stored, more than maxMessageSize "
                                f"{self.max_message_size}")
            key = (t, q)
            qoff = 0
            if advance:
                qoff = local[key] if key in local else table.get(key, 0)
                local[key] = qoff + 1
            if first_offset < 0:
                first_offset = qoff
            last = runs[-1] if runs else None
            if last is not None and advance and last[5] == key and last[6]:
                last[3].append(item)
                last[4] += size
            else:
                runs.append([t_b, q, qoff, [item], size, key, advance])
            total += size
        plan_runs: list[Run] = [(r[0], r[1], r[2], r[3], r[4]) for r in runs]
        advances = [(k, v - table.get(k, 0)) for k, v in local.items()]
        return plan_runs, total, advances, first_offset
