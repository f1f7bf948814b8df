"""Subscription groups (``config/subscriptionGroup.json``):
``{"dataVersion": ..., "subscriptionGroupTable": {name: config}}``.

A group's ``brokerId`` and ``whichBrokerWhenConsumeSlowly`` steer read/write splitting (docs/BEHAVIOUR.md 3.2).
Groups are created on first use when ``autoCreateSubscriptionGroup`` is on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from broker.metadata.versioned import VersionedTable, decode_versioned_table
from common.errors import SubscriptionGroupNotExistError
from common.route import DataVersion

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "decode_group_table"]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class SubscriptionGroupConfig:
    """One consumer group's settings on this broker (RocketMQ's defaults)."""

    group_name: str
    consume_enable: bool = True
    """False: pulls get NO_PERMISSION."""
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    """Queues of the group's ``%RETRY%`` topic."""
    retry_max_times: int = 16
    broker_id: int = 0
    """Broker a non-lagging consumer should read from."""
    which_broker_when_consume_slowly: int = 1
    """Broker a lagging consumer should read from (``suggestPullingFromSlave``)."""
    notify_consumer_ids_changed_enable: bool = True

    _FIELDS = (
        ("groupName", "group_name", str), ("consumeEnable", "consume_enable", bool),
        ("consumeFromMinEnable", "consume_from_min_enable", bool),
        ("consumeBroadcastEnable", "consume_broadcast_enable", bool),
        ("retryQueueNums", "retry_queue_nums", int), ("retryMaxTimes", "retry_max_times", int),
        ("brokerId", "broker_id", int), ("whichBrokerWhenConsumeSlowly", "which_broker_when_consume_slowly", int),
        ("notifyConsumerIdsChangedEnable", "notify_consumer_ids_changed_enable", bool),
    )

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, field) for key, field, _ in self._FIELDS}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SubscriptionGroupConfig:
        """Build from camelCase JSON; missing keys take defaults.

        Raises:
            ValueError: a value has the wrong type (the message names the key).
        """
        kwargs: dict[str, Any] = {}
        for key, field, typ in cls._FIELDS:
            if key not in d or d[key] is None:
                continue
            v = d[key]
            if typ is bool and not isinstance(v, bool):
                raise ValueError(f"{key}={v!r} is not a boolean")
            if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"{key}={v!r} is not an integer")
            if typ is str and not isinstance(v, str):
                raise ValueError(f"{key}={v!r} is not a string")
            kwargs[field] = v
        if "group_name" not in kwargs:
            raise ValueError("groupName is missing")
        return cls(**kwargs)


class SubscriptionGroupManager(VersionedTable[SubscriptionGroupConfig]):
    """The broker's subscription groups.

    Args:
        config_dir: ``storePathRootDir/config``.
        auto_create: ``autoCreateSubscriptionGroup``.
        clock_ms: wall clock in ms (DataVersion timestamps).
    """

    def __init__(self, config_dir: Path, *, auto_create: bool = True, max_auto_create: int = 10_000,
                 clock_ms: Callable[[], int]) -> None:
        super().__init__(config_dir / "subscriptionGroup.json", clock_ms=clock_ms)
        self._auto_create = auto_create
        self._max_auto_create = max_auto_create

    table_key = "subscriptionGroupTable"

    @classmethod
    def decode(cls, obj: Mapping[str, Any]) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion]:
        return decode_group_table(obj)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults when absent and auto-creation is on, else None.

        An auto-created group is written to disk by the next :meth:`persist_if_dirty` (the broker calls it every
        second and at shutdown), not here: a pull with a new group name once rewrote the whole file. A group lost
        to a crash inside that second is auto-created again, with the same defaults, on its next use.

        Raises:
            SubscriptionGroupNotExistError: the broker already holds ``maxAutoCreateSubscriptionGroups`` groups.
        """
        g = self._table.get(group)
        if g is None and self._auto_create:
            if len(self._table) >= self._max_auto_create:
                raise SubscriptionGroupNotExistError(
                    f"subscription group [{group}] does not exist, and not auto-created: the broker holds "
                    f"{len(self._table)} groups, the auto-create limit (maxAutoCreateSubscriptionGroups="
                    f"{self._max_auto_create}); create it explicitly (Admin / POST /subscription-group) or raise "
                    "the limit")
            g = SubscriptionGroupConfig(group_name=group)
            self._table[group] = g
            self.data_version = self.data_version.next(self._clock_ms())
            self.dirty = True
            log.info("auto-created subscription group %s", group)
        return g

    def update(self, config: SubscriptionGroupConfig) -> None:
        self._put(config.group_name, config)


def decode_group_table(obj: Mapping[str, Any]) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion]:
    """``subscriptionGroup.json`` / ``GET /subscription-groups`` JSON -> (table, version).

    Raises:
        ValueError: malformed entry (named in the message).
    """
    return decode_versioned_table(obj, SubscriptionGroupManager.table_key, SubscriptionGroupConfig.from_json)
