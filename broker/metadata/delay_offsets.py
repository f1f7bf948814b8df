"""Delay-level offsets (``config/delayOffset.json``): ``{"offsetTable": {"LEVEL": offset}}``.

Only loaded, saved and served for now (the scheduler that advances them comes later); a slave stores the
master's JSON text as is and reloads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.metadata.json_file import JsonFile

__all__ = ["DelayOffsetManager", "decode_delay_table"]


class DelayOffsetManager:
    """``delay level -> offset`` in ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``."""

    def __init__(self, config_dir: Path) -> None:
        self._file = JsonFile(config_dir / "delayOffset.json")
        self._table: dict[int, int] = {}
        self.dirty = False

    @property
    def path(self) -> Path:
        return self._file.path

    def load(self) -> None:
        obj = self._file.load()
        if obj is not None:
            try:
                self._table = decode_delay_table(obj)
            except ValueError:
                self._table = {}

    def persist(self) -> None:
        self._file.save(self.to_json())
        self.dirty = False

    def to_json(self) -> dict[str, Any]:
        return {"offsetTable": {str(level): off for level, off in sorted(self._table.items())}}

    def get(self, level: int) -> int:
        return self._table.get(level, 0)

    def update(self, level: int, offset: int) -> None:
        self._table[level] = offset
        self.dirty = True

    def table(self) -> dict[int, int]:
        return dict(self._table)

    def replace_from_master(self, obj: Mapping[str, Any]) -> None:
        """Slave sync: write the master's table to the file and reload it.

        Raises:
            ValueError: the master's object is malformed (nothing is written).
        """
        table = decode_delay_table(obj)
        self._file.save_text(json.dumps(obj, indent=2, sort_keys=True))
        self._table = table
        self.dirty = False


def decode_delay_table(obj: Mapping[str, Any]) -> dict[int, int]:
    """Raises ValueError on a malformed table."""
    raw = obj.get("offsetTable")
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError("offsetTable is not an object")
    try:
        return {int(level): int(off) for level, off in raw.items()}
    except (TypeError, ValueError):
        raise ValueError("delay offsetTable holds a non-integer level or offset") from None
