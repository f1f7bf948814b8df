"""One JSON metadata file with RocketMQ's ``.bak`` discipline, written atomically.

Write: serialise to ``<name>.tmp`` and fsync it, move the current file to ``<name>.bak``, then rename the temp
file into place. A crash at any point leaves either the new file, or the old one as ``.bak``; :meth:`load`
reads the file and falls back to ``.bak`` when the file is missing or unreadable.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonFile"]

log = logging.getLogger(__name__)


class JsonFile:
    """A JSON object stored at ``path`` with a ``.bak`` of the previous version.

    Args:
        path: the file (its directory is created on the first write).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.bak_path = self.path.with_name(self.path.name + ".bak")
        self._tmp_path = self.path.with_name(self.path.name + ".tmp")

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cannot read %s: %s", path, e)
            return None
        if not text.strip():
            return None
        try:
            obj = json.loads(text)
        except ValueError as e:
            log.warning("%s is not valid JSON (%s)", path, e)
            return None
        if not isinstance(obj, dict):
            log.warning("%s does not hold a JSON object", path)
            return None
        return obj

    def load(self) -> dict[str, Any] | None:
        """The stored object, from the file or else its ``.bak``; None when neither is readable."""
        obj = self._read(self.path)
        if obj is None:
            obj = self._read(self.bak_path)
            if obj is not None:
                log.warning("%s missing or unreadable; loaded %s", self.path, self.bak_path)
        return obj

    def save(self, obj: Any) -> None:
        """Write ``obj`` as JSON atomically, keeping the previous version as ``.bak``.

        Raises:
            OSError: the directory or file cannot be written (disk full, permissions).
        """
        self.save_text(json.dumps(obj, indent=2, sort_keys=True))

    def save_text(self, text: str) -> None:
        """Write already-serialised JSON text (slave sync stores the master's text as is)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._tmp_path, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if self.path.exists():
            os.replace(self.path, self.bak_path)
        os.replace(self._tmp_path, self.path)
