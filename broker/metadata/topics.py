"""Topic configuration table (``config/topics.json``): ``{"dataVersion": ..., "topicConfigTable": {...}}``.

System topics exist from the start: ``TBW102`` (the auto-create template, perm 7 = inherit + read + write, only
when ``autoCreateTopicEnable``), ``SCHEDULE_TOPIC_XXXX`` (one queue per delay level) and
``OFFSET_MOVED_EVENT``. Every change bumps the DataVersion, which the nameserver and slaves compare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from broker.metadata.json_file import JsonFile
from client.protocol.codes import Perm
from client.protocol.route import DataVersion, TopicConfig

__all__ = ["AUTO_CREATE_TOPIC", "OFFSET_MOVED_EVENT", "SCHEDULE_TOPIC", "SYSTEM_TOPICS", "TopicConfigManager"]

log = logging.getLogger(__name__)

AUTO_CREATE_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SYSTEM_TOPICS = frozenset({AUTO_CREATE_TOPIC, SCHEDULE_TOPIC, OFFSET_MOVED_EVENT})
#: Topics producers may not send to directly (RocketMQ's ``NOT_ALLOWED_SEND_TOPIC_SET``, the parts we have).
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, OFFSET_MOVED_EVENT})


class TopicConfigManager:
    """The broker's topics, persisted to ``config_dir/topics.json``.

    Args:
        config_dir: ``storePathRootDir/config``.
        auto_create_topic_enable: create ``TBW102`` so clients can send to unknown topics.
        default_topic_queue_nums: queue counts of ``TBW102``.
        delay_level_count: queues of ``SCHEDULE_TOPIC_XXXX``.
        clock_ms: wall clock in ms (DataVersion timestamps).
    """

    def __init__(
        self,
        config_dir: Path,
        *,
        auto_create_topic_enable: bool = True,
        default_topic_queue_nums: int = 8,
        delay_level_count: int = 18,
        clock_ms: Callable[[], int],
    ) -> None:
        self._file = JsonFile(config_dir / "topics.json")
        self._clock_ms = clock_ms
        self._table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        if auto_create_topic_enable:
            n = default_topic_queue_nums
            self._table[AUTO_CREATE_TOPIC] = TopicConfig(AUTO_CREATE_TOPIC, n, n, int(Perm.INHERIT | Perm.READ | Perm.WRITE))
        self._table[SCHEDULE_TOPIC] = TopicConfig(SCHEDULE_TOPIC, delay_level_count, delay_level_count)
        self._table[OFFSET_MOVED_EVENT] = TopicConfig(OFFSET_MOVED_EVENT, 1, 1)

    @property
    def path(self) -> Path:
        return self._file.path

    def load(self) -> None:
        """Read the file (or its ``.bak``); stored topics override the built-in ones."""
        obj = self._file.load()
        if obj is None:
            return
        table, version = decode_topic_table(obj)
        self._table.update(table)
        self.data_version = version

    def persist(self) -> None:
        self._file.save(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {"dataVersion": self.data_version.to_json(),
                "topicConfigTable": {name: tc.to_json() for name, tc in sorted(self._table.items())}}

    def get(self, topic: str) -> TopicConfig | None:
        return self._table.get(topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self._table

    def __iter__(self) -> Iterator[TopicConfig]:
        return iter(list(self._table.values()))

    def __len__(self) -> int:
        return len(self._table)

    def table(self) -> dict[str, TopicConfig]:
        return dict(self._table)

    def update(self, tc: TopicConfig) -> bool:
        """Create or replace one topic; returns True when something changed (then version bumped, persisted)."""
        if self._table.get(tc.topic_name) == tc:
            return False
        self._table[tc.topic_name] = tc
        self._changed()
        return True

    def create_in_send(self, topic: str, client_default_queue_nums: int, default_topic_queue_nums: int
                       ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``TBW102`` (RocketMQ's ``createTopicInSendMessageMethod``).

        Returns:
            The new config, or None when ``TBW102`` is absent or not inheritable.
        """
        template = self._table.get(AUTO_CREATE_TOPIC)
        if template is None or not template.perm & Perm.INHERIT:
            return None
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

    def replace_all(self, table: Mapping[str, TopicConfig], version: DataVersion) -> None:
        """Slave sync: adopt the master's table and version (4.9.3: clear, then put all)."""
        self._table = dict(table)
        self.data_version = version
        self.persist()

    def _changed(self) -> None:
        self.data_version = self.data_version.next(self._clock_ms())
        self.persist()


def decode_topic_table(obj: Mapping[str, Any]) -> tuple[dict[str, TopicConfig], DataVersion]:
    """``topics.json`` / ``GET /topics`` JSON -> (table, version).

    Raises:
        ValueError: the object does not have the expected shape (the message names the entry).
    """
    raw = obj.get("topicConfigTable")
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError("topicConfigTable is not an object")
    table: dict[str, TopicConfig] = {}
    for name, entry in raw.items():
        try:
            table[str(name)] = TopicConfig.from_json(entry)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"topicConfigTable[{name!r}] is malformed: {e}") from None
    return table, DataVersion.from_json(obj.get("dataVersion"))
