"""Slave metadata sync (docs/BEHAVIOUR.md 5, 4.9.3 rules, decision 7): every ``slaveMetadataSyncInterval`` (10 s) a
slave fetches its master's topics, consumer offsets, delay offsets and subscription groups and applies them, and
the group identity of the store (:mod:`broker.group_identity`).

Apply rules, kept pure (:func:`plan_topics`, :func:`plan_groups`, :func:`merge_offsets`):
topics and groups are replaced wholesale when the master's DataVersion differs from the slave's; consumer
offsets are ``putAll`` (each master ``topic@group`` key replaces the slave's, slave-only keys survive); delay
offsets are written as the master sent them. Each item is fetched and applied separately: a failure is logged
and the other items still run; nothing is retried before the next period. No master address (the master is not
live in the nameserver) pauses the sync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from broker.dledger.wakeup import Wakeup
from broker.group_identity import GroupIdentity
from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.metadata.consumer_offsets import decode_offset_table
from broker.metadata.subscription_groups import SubscriptionGroupConfig, decode_group_table
from broker.metadata.topics import decode_topic_table
from common.route import DataVersion, TopicConfig

__all__ = ["SlaveSynchronizer", "merge_offsets", "plan_groups", "plan_topics"]

log = logging.getLogger(__name__)


def plan_topics(local_version: DataVersion, master: Mapping[str, Any]
                ) -> tuple[dict[str, TopicConfig], DataVersion] | None:
    """The table to adopt from the master's ``GET /topics`` answer, or None when versions are equal.

    Raises:
        ValueError: the master's answer is malformed.
    """
    table, version = decode_topic_table(master)
    return None if version == local_version else (table, version)


def plan_groups(local_version: DataVersion, master: Mapping[str, Any]
                ) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion] | None:
    """The table to adopt from the master's ``GET /subscription-groups`` answer, or None when versions are equal.

    Raises:
        ValueError: the master's answer is malformed.
    """
    table, version = decode_group_table(master)
    return None if version == local_version else (table, version)


def merge_offsets(local: Mapping[str, Mapping[int, int]], master: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """4.9.3 ``putAll``: the master's keys replace the slave's whole queue maps; slave-only keys survive.

    Raises:
        ValueError: the master's answer is malformed.
    """
    merged = {k: dict(v) for k, v in local.items()}
    merged.update(decode_offset_table(master))
    return merged


class SlaveSynchronizer:
    """Pulls the master's metadata into this slave's managers.

    Args:
        master_addr: returns the master's client address (None pauses the sync).
        own_addr: this broker's address (never sync from oneself).
        topics / offsets / groups / delay_offsets: the managers to update.
        client: HTTP client (owned by the caller).
        timeout_s: bound of each request (RocketMQ: 3 s).
    """

    def __init__(self, *, master_addr: Callable[[], str | None], own_addr: str, topics: TopicConfigManager,
                 offsets: ConsumerOffsetManager, groups: SubscriptionGroupManager,
                 delay_offsets: DelayOffsetManager, client: httpx.AsyncClient, timeout_s: float = 3.0,
                 scheme: str = "http", identity: GroupIdentity | None = None) -> None:
        self._master_addr = master_addr
        self._scheme = scheme  # "https" with tlsEnable
        self._own_addr = own_addr
        self._topics = topics
        self._offsets = offsets
        self._groups = groups
        self._delay = delay_offsets
        self._identity = identity
        self._client = client
        self._timeout_s = timeout_s
        self.rounds = 0
        self.failures = 0
        self._kick = Wakeup()

    def kick(self) -> None:
        """Run a round now (the master changed) instead of at the end of the current wait."""
        self._kick.set()

    async def _get(self, addr: str, path: str) -> dict[str, Any]:
        r = await self._client.get(f"{self._scheme}://{addr}{path}", timeout=self._timeout_s)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path} answered HTTP {r.status_code}: {r.text[:200]}")
        obj = r.json()
        if not isinstance(obj, dict):
            raise ValueError(f"GET {path} did not answer a JSON object")
        return obj

    def _apply_topics(self, obj: dict[str, Any]) -> None:
        plan = plan_topics(self._topics.data_version, obj)
        if plan is not None:
            self._topics.replace_all(*plan)
            log.info("synced %d topics from the master (version %s)", len(plan[0]), plan[1])

    def _apply_offsets(self, obj: dict[str, Any]) -> None:
        self._offsets.put_all(decode_offset_table(obj), DataVersion.from_json(obj.get("dataVersion")))
        self._offsets.persist()

    def _apply_delay(self, obj: dict[str, Any]) -> None:
        self._delay.replace_from_master(obj)

    def _apply_groups(self, obj: dict[str, Any]) -> None:
        plan = plan_groups(self._groups.data_version, obj)
        if plan is not None:
            self._groups.replace_all(*plan)
            log.info("synced %d subscription groups from the master", len(plan[0]))

    def _apply_identity(self, obj: dict[str, Any]) -> None:
        assert self._identity is not None
        if self._identity.adopt(obj):
            log.info("synced the group identity %s from the master", self._identity.value)

    async def sync_all(self) -> int:
        """One round over the items (four, five with the group identity); returns how many succeeded (0 when
        paused)."""
        addr = self._master_addr()
        if not addr or addr == self._own_addr:
            return 0
        items: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
            ("/topics", self._apply_topics), ("/offsets", self._apply_offsets),
            ("/delay-offsets", self._apply_delay), ("/subscription-groups", self._apply_groups),
        ]
        if self._identity is not None:
            items.append(("/identity", self._apply_identity))
        ok = 0
        for path, apply in items:
            try:
                apply(await self._get(addr, path))
                ok += 1
            except (httpx.HTTPError, RuntimeError, ValueError, OSError) as e:
                self.failures += 1
                log.warning("slave sync of %s from master %s failed (retry next period): %s", path, addr,
                            e or type(e).__name__)
        self.rounds += 1
        return ok

    async def run_periodic(self, period_s: float) -> None:
        """Sync every ``period_s`` until cancelled, starting at once, and at once after each :meth:`kick`."""
        while True:
            try:
                await self.sync_all()
            except Exception:  # a bug in one round must not end the schedule
                log.exception("slave sync round failed")
            await self._kick.wait(period_s)
