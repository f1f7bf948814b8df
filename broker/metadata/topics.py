"""Topic configuration table (``config/topics.json``): ``{"dataVersion": ..., "topicConfigTable": {...}}``.

System topics exist from the start: ``TBW102`` (the auto-create template, perm 7 = inherit + read + write, only
when ``autoCreateTopicEnable``), ``SCHEDULE_TOPIC_XXXX`` (one queue per delay level) and
``OFFSET_MOVED_EVENT`` and the three topics of transactional messages. Every change bumps the DataVersion, which the nameserver and slaves compare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from broker.metadata.versioned import VersionedTable, decode_versioned_table
from common.codes import Perm
from common.errors import TopicNotExistError
from common.route import DataVersion, TopicConfig

__all__ = ["AUTO_CREATE_TOPIC", "OFFSET_MOVED_EVENT", "SCHEDULE_TOPIC", "SYSTEM_TOPICS", "TIMER_TOPIC",
           "TopicConfigManager"]

log = logging.getLogger(__name__)

AUTO_CREATE_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
#: Where timed messages wait (RocketMQ 5's name; see :mod:`broker.timer`).
TIMER_TOPIC = "rmq_sys_wheel_timer"
#: Transactional messages (:mod:`broker.transaction`): half messages, op records, and half messages checked
#: ``transactionCheckMax`` times. Half and op records are write-only for clients (perm 2: a pull is refused).
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SYSTEM_TOPICS = frozenset({AUTO_CREATE_TOPIC, SCHEDULE_TOPIC, OFFSET_MOVED_EVENT, TIMER_TOPIC, TRANS_HALF_TOPIC,
                           TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})
#: Topics producers may not send to directly (RocketMQ's ``NOT_ALLOWED_SEND_TOPIC_SET``, the parts we have).
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, OFFSET_MOVED_EVENT, TIMER_TOPIC, TRANS_HALF_TOPIC,
                                     TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC})


class TopicConfigManager(VersionedTable[TopicConfig]):
    """The broker's topics, persisted to ``config_dir/topics.json``.

    Args:
        config_dir: ``storePathRootDir/config``.
        auto_create_topic_enable: create ``TBW102`` so clients can send to unknown topics.
        default_topic_queue_nums: queue counts of ``TBW102``.
        delay_level_count: queues of ``SCHEDULE_TOPIC_XXXX``.
        max_auto_create: ``maxAutoCreateTopics``: a send stops auto-creating topics once the broker holds this
            many (explicit creation is not limited).
        clock_ms: wall clock in ms (DataVersion timestamps).
    """

    def __init__(
        self,
        config_dir: Path,
        *,
        auto_create_topic_enable: bool = True,
        default_topic_queue_nums: int = 8,
        delay_level_count: int = 18,
        max_auto_create: int = 1024,
        clock_ms: Callable[[], int],
    ) -> None:
        super().__init__(config_dir / "topics.json", clock_ms=clock_ms)
        self._max_auto_create = max_auto_create
        if auto_create_topic_enable:
            n = default_topic_queue_nums
            self._table[AUTO_CREATE_TOPIC] = TopicConfig(AUTO_CREATE_TOPIC, n, n, int(Perm.INHERIT | Perm.READ | Perm.WRITE))
        self._table[SCHEDULE_TOPIC] = TopicConfig(SCHEDULE_TOPIC, delay_level_count, delay_level_count)
        self._table[OFFSET_MOVED_EVENT] = TopicConfig(OFFSET_MOVED_EVENT, 1, 1)
        self._table[TIMER_TOPIC] = TopicConfig(TIMER_TOPIC, 1, 1)
        for topic in (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC):
            self._table[topic] = TopicConfig(topic, 1, 1, int(Perm.WRITE))
        self._table[TRANS_CHECK_MAX_TIME_TOPIC] = TopicConfig(TRANS_CHECK_MAX_TIME_TOPIC, 1, 1)

    table_key = "topicConfigTable"

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> tuple[dict[str, TopicConfig], DataVersion]:
        return decode_topic_table(obj)

    def update(self, tc: TopicConfig) -> bool:
        """Create or replace one topic; returns True when something changed (then version bumped, persisted)."""
        return self._put(tc.topic_name, tc)

    def create_in_send(self, topic: str, client_default_queue_nums: int, default_topic_queue_nums: int
                       ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``TBW102`` (RocketMQ's ``createTopicInSendMessageMethod``).

        Returns:
            The new config, or None when ``TBW102`` is absent or not inheritable.

        Raises:
            TopicNotExistError: the broker already holds ``maxAutoCreateTopics`` topics (each costs a consume
                queue per queue id and a rewrite of topics.json: auto-creation must not be a resource hole).
        """
        template = self._table.get(AUTO_CREATE_TOPIC)
        if template is None or not template.perm & Perm.INHERIT:
            return None
        if len(self._table) >= self._max_auto_create:
            raise TopicNotExistError(
                f"topic[{topic}] not exist, and not auto-created: the broker holds {len(self._table)} topics, "
                f"the auto-create limit (maxAutoCreateTopics={self._max_auto_create}); create it explicitly "
                "(splitmq topic create / Admin.create_topic) or raise the limit")
        n = max(1, min(client_default_queue_nums, default_topic_queue_nums, template.write_queue_nums))
        tc = TopicConfig(topic, n, n, template.perm & ~int(Perm.INHERIT))
        self._table[topic] = tc
        self._changed()
        log.info("auto-created topic %s with %d queues from %s", topic, n, AUTO_CREATE_TOPIC)
        return tc

    def create_retry_topic(self, topic: str, queue_nums: int) -> TopicConfig:
        """Create a ``%RETRY%group`` topic (needed by send-back whatever ``autoCreateTopicEnable`` says)."""
        tc = TopicConfig(topic, queue_nums, queue_nums, int(Perm.READ | Perm.WRITE))
        self._table[topic] = tc
        self._changed()
        return tc


def decode_topic_table(obj: Mapping[str, Any]) -> tuple[dict[str, TopicConfig], DataVersion]:
    """``topics.json`` / ``GET /topics`` JSON -> (table, version).

    Raises:
        ValueError: the object does not have the expected shape (the message names the entry).
    """
    return decode_versioned_table(obj, TopicConfigManager.table_key, TopicConfig.from_json)
