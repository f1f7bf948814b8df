"""Consumer offsets kept in memory and persisted: on the broker (clustering) or in a local file (broadcasting).

:class:`OffsetTable` is the in-memory part (RocketMQ's ``offsetTable`` of ``RemoteBrokerOffsetStore``): pure,
with ``increase_only`` updates so a late commit of an older batch never moves an offset back, and a dirty set
so a periodic persist sends only what changed. :class:`LocalFileOffsetStore` (``LocalFileOffsetStore``) writes
the whole table as JSON with a write-then-rename, so a crash leaves either the old file or the new one.

Local file layout (``<offset_store_dir>/<instance_name>/<group>/offsets.json``)::

    {"offsetTable": [{"topic": "T", "brokerName": "broker-a", "queueId": 0, "offset": 42}, ...]}
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from common.message import MessageQueue
from common.properties import validate_group

__all__ = ["DEFAULT_OFFSET_STORE_DIR", "LocalFileOffsetStore", "OffsetTable"]

log = logging.getLogger(__name__)

#: RocketMQ's ``rocketmq.client.localOffsetStoreDir`` default is ``~/.rocketmq_offsets``.
DEFAULT_OFFSET_STORE_DIR = os.path.join("~", ".splitmq_offsets")

#: A local offsets file larger than this is refused (a bound on what a corrupt file can make us read).
MAX_OFFSET_FILE_BYTES = 64 * 1024 * 1024


class OffsetTable:
    """``MessageQueue -> offset`` with increase-only updates and dirty tracking. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offsets: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> bool:
        """Set the offset of ``mq``; with ``increase_only`` a lower value is ignored. Returns True if changed.

        Raises:
            ValueError: ``offset`` < 0.
        """
        if offset < 0:
            raise ValueError(f"offset of {mq} must be >= 0, got {offset}")
        with self._lock:
            old = self._offsets.get(mq)
            if old is not None and (old == offset or (increase_only and offset < old)):
                return False
            self._offsets[mq] = offset
            self._dirty.add(mq)
            return True

    def read(self, mq: MessageQueue) -> int:
        """The offset in memory, -1 when absent (``READ_FROM_MEMORY``)."""
        return self._offsets.get(mq, -1)

    def remove(self, mq: MessageQueue) -> int:
        """Forget ``mq``; returns its last offset (-1 when absent)."""
        with self._lock:
            self._dirty.discard(mq)
            return self._offsets.pop(mq, -1)

    def take_dirty(self) -> dict[MessageQueue, int]:
        """The offsets changed since the last call (cleared; :meth:`mark_dirty` puts back what failed)."""
        with self._lock:
            out = {mq: self._offsets[mq] for mq in self._dirty if mq in self._offsets}
            self._dirty.clear()
            return out

    def mark_dirty(self, mqs: Iterable[MessageQueue]) -> None:
        with self._lock:
            self._dirty.update(mq for mq in mqs if mq in self._offsets)

    def snapshot(self) -> dict[MessageQueue, int]:
        with self._lock:
            return dict(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> bytes:
    rows = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
            for mq, off in sorted(offsets.items())]
    return json.dumps({"offsetTable": rows}, indent=1).encode()


def offsets_from_json(data: bytes, where: str) -> dict[MessageQueue, int]:
    """Parse a local offsets file.

    Raises:
        ValueError: not the layout of the module docstring (the message names ``where``).
    """
    try:
        rows = json.loads(data)["offsetTable"]
        out = {}
        for r in rows:
            off = int(r["offset"])
            if off < 0:
                raise ValueError(f"negative offset {off}")
            out[MessageQueue(str(r["topic"]), str(r["brokerName"]), int(r["queueId"]))] = off
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"offsets file {where} is malformed: {e}") from None


class LocalFileOffsetStore:
    """Broadcasting offsets in ``<root>/<instance_name>/<group>/offsets.json``.

    Args:
        root: the offset store directory (``~`` expanded).
        instance_name: separates several consumers of one group on one host.
        group: the consumer group.
    """

    def __init__(self, root: str | os.PathLike[str], instance_name: str, group: str) -> None:
        validate_group(group)
        if not instance_name or "/" in instance_name or instance_name in (".", ".."):
            raise ValueError(f"instance_name {instance_name!r} must be a non-empty name without '/'")
        self.path = Path(os.path.expanduser(os.fspath(root))) / instance_name / group / "offsets.json"
        self.table = OffsetTable()
        self._io_lock = threading.Lock()

    def load(self) -> None:
        """Read the file (or its ``.bak`` when the file is unreadable); a missing file is an empty table.

        Raises:
            ValueError: the file and its backup are both malformed or too large.
        """
        for path in (self.path, self.path.with_suffix(".json.bak")):
            try:
                if path.stat().st_size > MAX_OFFSET_FILE_BYTES:
                    raise ValueError(f"offsets file {path} is larger than {MAX_OFFSET_FILE_BYTES} bytes")
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            offsets = offsets_from_json(data, str(path))
            for mq, off in offsets.items():
                self.table.update(mq, off, increase_only=False)
            self.table.take_dirty()
            return

    def read(self, mq: MessageQueue) -> int:
        return self.table.read(mq)

    def persist(self) -> None:
        """Write the whole table (write to a temp file, keep the old one as ``.bak``, rename into place)."""
        data = offsets_to_json(self.table.snapshot())
        with self._io_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():
                os.replace(self.path, self.path.with_suffix(".json.bak"))
            os.replace(tmp, self.path)
        self.table.take_dirty()
