"""Consumer offsets (``config/consumerOffset.json``): ``{"offsetTable": {"TOPIC@GROUP": {"QUEUE_ID": OFFSET}}}``.

Commits only mark the table dirty; the controller persists every ``flushConsumerOffsetInterval`` and at
shutdown, as RocketMQ does (a crash loses at most one interval: consumers re-consume, never skip).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from broker.metadata.json_file import JsonFile
from common.route import DataVersion

__all__ = ["ConsumerOffsetManager", "decode_offset_table"]

KEY_SEPARATOR = "@"


class ConsumerOffsetManager:
    """``topic@group -> {queueId: offset}``.

    Args:
        config_dir: ``storePathRootDir/config``.
        clock_ms: wall clock in ms (DataVersion timestamps).
    """

    def __init__(self, config_dir: Path, *, clock_ms: Callable[[], int]) -> None:
        self._file = JsonFile(config_dir / "consumerOffset.json")
        self._clock_ms = clock_ms
        self._table: dict[str, dict[int, int]] = {}
        self.data_version = DataVersion()
        self.dirty = False

    @property
    def path(self) -> Path:
        return self._file.path

    def load(self) -> None:
        obj = self._file.load()
        if obj is not None:
            self._table = decode_offset_table(obj)
            self.data_version = DataVersion.from_json(obj.get("dataVersion"))

    def persist(self) -> None:
        self._file.save(self.to_json())
        self.dirty = False

    def persist_if_dirty(self) -> bool:
        if not self.dirty:
            return False
        self.persist()
        return True

    def to_json(self) -> dict[str, Any]:
        return {"offsetTable": {key: {str(q): off for q, off in sorted(queues.items())}
                                for key, queues in sorted(self._table.items())},
                "dataVersion": self.data_version.to_json()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}{KEY_SEPARATOR}{group}"
        queues = self._table.setdefault(key, {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset, or None when this group never committed for the queue."""
        queues = self._table.get(f"{topic}{KEY_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(f"{topic}{KEY_SEPARATOR}{group}", {}))

    def table(self) -> dict[str, dict[int, int]]:
        return {k: dict(v) for k, v in self._table.items()}

    def put_all(self, table: Mapping[str, Mapping[int, int]], version: DataVersion | None = None) -> None:
        """Slave sync: each master key replaces that key's queue map; slave-only keys survive."""
        for key, queues in table.items():
            self._table[key] = dict(queues)
        if version is not None:
            self.data_version = version
        self.dirty = True


def decode_offset_table(obj: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """``{"offsetTable": {"T@G": {"0": 5}}}`` -> ``{"T@G": {0: 5}}``.

    Raises:
        ValueError: malformed table (the message names the entry).
    """
    raw = obj.get("offsetTable")
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError("offsetTable is not an object")
    out: dict[str, dict[int, int]] = {}
    for key, queues in raw.items():
        if not isinstance(queues, Mapping):
            raise ValueError(f"offsetTable[{key!r}] is not an object")
        try:
            out[str(key)] = {int(q): int(off) for q, off in queues.items()}
        except (TypeError, ValueError):
            raise ValueError(f"offsetTable[{key!r}] holds a non-integer queue id or offset") from None
    return out
