"""The identity of a broker group's store: one random id, minted by the group's first master, shared by its slaves.

Queue offsets only mean something in the store that assigned them. A reader that keeps offsets across runs (a
Spark checkpoint) must be able to tell "the same queues, further on" from "a different store that reuses the
names": a fresh cluster with the same ``brokerName``, or a master whose disk was wiped, both start their queues
at 0 again. The group identity is that distinction.

* **Minted once.** A master (a DLedger member when it starts to lead) that has no identity yet draws a random one
  (``uuid4``) and writes it to ``config/groupIdentity.json`` in its store, with the ``.bak`` discipline of the
  other metadata files; it keeps it across restarts. A store that is wiped loses it, and its next start mints a
  new one, which is right: its offsets start again at 0.
* **Copied to slaves.** A slave (a DLedger follower) takes its master's identity with the metadata sync
  (``GET /identity`` every ``slaveMetadataSyncInterval``) and persists it, so it answers the same id while the
  master is down, and keeps it when it is promoted. The master is the authority: a slave that holds another id
  takes the master's and logs the change. A slave that has never reached its master answers null ("unknown").
* **Read by clients** in ``GET /identity`` (and ``GET /runtime``'s ``groupIdentity``).

Why not derive it from the data (the first record's bytes)? A slave that joins after retention deleted the
first commit-log file never sees that record, so it would need the copy above anyway; and a random id also tells
a wiped store from the old one when both happen to hold the same first message.

The one gap: a DLedger leader lost within one sync period of the group's very first election, before any
follower copied its id, leaves the next leader to mint another. A checkpoint taken in that window then fails as
"another store" (loud, never silent), and ``failOnDataLoss=false`` or a new checkpoint gets past it.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

from broker.metadata.json_file import JsonFile

__all__ = ["FILE_NAME", "GroupIdentity", "valid_identity"]

log = logging.getLogger(__name__)

FILE_NAME = "groupIdentity.json"
_ID = re.compile(r"^[0-9a-f]{32}$")


def valid_identity(value: object) -> bool:
    """Whether ``value`` is an identity as minted here (32 lower-case hex digits)."""
    return isinstance(value, str) and bool(_ID.match(value))


class GroupIdentity:
    """The group identity held by one broker (``config/groupIdentity.json``).

    Args:
        config_dir: the store's ``config/`` directory.
        broker_name: this broker's group (written with the id, and checked when a master's id is adopted).
        clock_ms: wall clock of the ``createdMs`` field.
        mint: the source of new ids (tests inject one).
    """

    def __init__(self, config_dir: str | os.PathLike[str], broker_name: str, *, clock_ms: Callable[[], int],
                 mint: Callable[[], str] | None = None) -> None:
        self._file = JsonFile(os.path.join(config_dir, FILE_NAME))
        self._broker_name = broker_name
        self._clock_ms = clock_ms
        self._mint = mint or (lambda: uuid.uuid4().hex)
        self._value: str | None = None
        self._created_ms = 0

    @property
    def value(self) -> str | None:
        """The identity, or None while a slave has not copied its master's yet."""
        return self._value

    def load(self) -> None:
        """Read the file (or its ``.bak``); a missing or malformed file leaves the identity unknown."""
        obj = self._file.load()
        if obj is None:
            return
        value = obj.get("groupIdentity")
        if not valid_identity(value):
            log.warning("%s holds no valid groupIdentity (%r): the group identity is unknown until minted or "
                        "copied from the master", self._file.path, value)
            return
        if obj.get("brokerName") not in (None, self._broker_name):
            log.warning("%s was written by broker group %s, this broker is %s: keeping its identity", self._file.path,
                        obj.get("brokerName"), self._broker_name)
        self._value = str(value)
        self._created_ms = int(obj.get("createdMs", 0) or 0)

    def ensure_minted(self) -> str:
        """On a master: the identity, minted and persisted first when there is none.

        Raises:
            OSError: the file cannot be written (the identity stays unknown, and the next call tries again).
        """
        if self._value is None:
            value, created = self._mint(), self._clock_ms()
            self._save(value, created)
            log.info("broker group %s: minted group identity %s", self._broker_name, value)
        assert self._value is not None
        return self._value

    def adopt(self, answer: dict[str, Any]) -> bool:
        """On a slave: take the master's ``GET /identity`` answer; True when the identity changed.

        Raises:
            ValueError: the answer is malformed or comes from another broker group.
            OSError: the file cannot be written.
        """
        value = answer.get("groupIdentity")
        if value is None:
            return False  # the master has none yet (it mints one when it starts as master)
        if not valid_identity(value):
            raise ValueError(f"groupIdentity {value!r} is not 32 hex digits")
        if answer.get("brokerName") != self._broker_name:
            raise ValueError(f"the master answers for broker group {answer.get('brokerName')!r}, not "
                             f"{self._broker_name!r}")
        if value == self._value:
            return False
        if self._value is not None:
            log.warning("broker group %s: the master's group identity is %s, this slave held %s: taking the "
                        "master's (its store is the one the queues' offsets come from)", self._broker_name, value,
                        self._value)
        self._save(str(value), int(answer.get("createdMs", 0) or 0))
        return True

    def to_json(self) -> dict[str, Any]:
        """The ``GET /identity`` answer."""
        return {"brokerName": self._broker_name, "groupIdentity": self._value, "createdMs": self._created_ms}

    def _save(self, value: str, created_ms: int) -> None:
        self._file.save({"brokerName": self._broker_name, "groupIdentity": value, "createdMs": created_ms})
        self._value, self._created_ms = value, created_ms
