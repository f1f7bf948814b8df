"""A name -> config table with a DataVersion, persisted as ``{"dataVersion": ..., <table key>: {...}}``.

Topics (``topics.json``) and subscription groups (``subscriptionGroup.json``) are both this: every change bumps
the version and persists; a slave's metadata sync adopts the master's table and version whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from broker.metadata.json_file import JsonFile
from common.route import DataVersion

__all__ = ["VersionedTable", "decode_versioned_table"]


class _JsonValue(Protocol):
    def to_json(self) -> dict[str, Any]: ...


V = TypeVar("V", bound=_JsonValue)


def decode_versioned_table(obj: Mapping[str, Any], table_key: str, from_json: Callable[[Mapping[str, Any]], V]
                           ) -> tuple[dict[str, V], DataVersion]:
    """``{"dataVersion", table_key: {name: entry}}`` -> (table, version).

    Raises:
        ValueError: the table or an entry is malformed (the message names the entry).
    """
    raw = obj.get(table_key)
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{table_key} is not an object")
    table: dict[str, V] = {}
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"{table_key}[{name!r}] is not an object")
        try:
            table[str(name)] = from_json(entry)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{table_key}[{name!r}] is malformed: {e}") from None
    return table, DataVersion.from_json(obj.get("dataVersion"))


class VersionedTable(Generic[V]):
    """The shared mechanics; subclasses name the JSON key and the entry type, and add their own operations."""

    table_key: ClassVar[str]

    def __init__(self, path: Path, *, clock_ms: Callable[[], int]) -> None:
        self._file = JsonFile(path)
        self._clock_ms = clock_ms
        self._table: dict[str, V] = {}
        self.data_version = DataVersion()
        self.dirty = False
        """Changed since the last write (changes made by :meth:`_changed` are written at once)."""

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> tuple[dict[str, V], DataVersion]:
        raise NotImplementedError

    @property
    def path(self) -> Path:
        return self._file.path

    def load(self) -> None:
        """Read the file (or its ``.bak``); stored entries override the ones already present (built-ins)."""
        obj = self._file.load()
        if obj is None:
            return
        table, version = self.decode(obj)
        self._table.update(table)
        self.data_version = version

    def persist(self) -> None:
        self.dirty = False
        try:
            self._file.save(self.to_json())
        except BaseException:
            self.dirty = True
            raise

    def persist_if_dirty(self) -> None:
        """Write the table when something changed since the last write."""
        if self.dirty:
            self.persist()

    def to_json(self) -> dict[str, Any]:
        return {"dataVersion": self.data_version.to_json(),
                self.table_key: {name: v.to_json() for name, v in sorted(self._table.items())}}

    def get(self, name: str) -> V | None:
        return self._table.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[V]:
        return iter(list(self._table.values()))

    def __len__(self) -> int:
        return len(self._table)

    def table(self) -> dict[str, V]:
        return dict(self._table)

    def replace_all(self, table: Mapping[str, V], version: DataVersion) -> None:
        """Slave sync: adopt the master's table and version (4.9.3: clear, then put all)."""
        self._table = dict(table)
        self.data_version = version
        self.persist()

    def _put(self, name: str, value: V) -> bool:
        """Create or replace one entry; True when it changed (then the version is bumped and persisted)."""
        if self._table.get(name) == value:
            return False
        self._table[name] = value
        self._changed()
        return True

    def _changed(self) -> None:
        self.data_version = self.data_version.next(self._clock_ms())
        self.persist()
