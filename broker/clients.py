"""Clients that sent heartbeats, per group, with their last-seen time (RocketMQ's consumer/producer
managers), and when each group last pulled each queue (:class:`LastPulls`). Bounded: at most ``max_groups``
groups and ``max_clients_per_group`` clients each. Used by rebalancing (consumer ids of a group).

Expiry: RocketMQ drops a client 120 s after its last heartbeat, or at once when its TCP channel closes. Over
HTTP there is no channel to watch, so a client may announce its own ``heartbeatTimeoutMs`` (like Kafka's session
timeout; the SDK sends two heartbeat periods): a killed consumer then leaves its group within that time
instead of 120 s. The announced value is clamped to ``[MIN_CLIENT_TIMEOUT_MS, expire_ms]``. A client that closes
cleanly unregisters and leaves at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from common.errors import InvalidParameterError

__all__ = ["MIN_CLIENT_TIMEOUT_MS", "ClientInfo", "ClientTable", "LastPulls"]


@attrs.frozen
class ClientInfo:
    client_id: str
    last_seen_ms: int
    subscriptions: tuple[tuple[str, str], ...] = ()
    """``(topic, expression)`` pairs (consumers only)."""
    message_model: str = ""
    timeout_ms: int = 120_000
    """Silence after which this client is gone."""

    def live(self, now_ms: int) -> bool:
        """Heard from within its timeout (a client seen exactly ``timeout_ms`` ago is still live)."""
        return self.last_seen_ms >= now_ms - self.timeout_ms


#: Lower bound of a client-announced heartbeat timeout.
MIN_CLIENT_TIMEOUT_MS = 1000


class ClientTable:
    """Groups -> clients, for producers and consumers.

    Args:
        clock_ms: monotonic-enough clock in ms (injected in tests).
        expire_ms: a client not heard from for this long is dropped.
        max_groups: bound on groups per kind; a heartbeat naming a new group beyond it is refused.
        max_clients_per_group: bound on clients per group.
    """

    def __init__(self, *, clock_ms: Callable[[], int], expire_ms: int = 120_000, max_groups: int = 10_000,
                 max_clients_per_group: int = 10_000) -> None:
        self._clock_ms = clock_ms
        self._expire_ms = expire_ms
        self._max_groups = max_groups
        self._max_clients = max_clients_per_group
        self.consumers: dict[str, dict[str, ClientInfo]] = {}
        self.producers: dict[str, dict[str, ClientInfo]] = {}

    def _put(self, table: dict[str, dict[str, ClientInfo]], group: str, info: ClientInfo) -> None:
        clients = table.get(group)
        if clients is None:
            if len(table) >= self._max_groups:
                raise InvalidParameterError(f"heartbeat refused: more than maxGroups={self._max_groups} groups")
            clients = table[group] = {}
        if info.client_id not in clients and len(clients) >= self._max_clients:
            raise InvalidParameterError(
                f"heartbeat refused: group {group} has maxClientsPerGroup={self._max_clients} clients"
            )
        clients[info.client_id] = info

    def heartbeat(self, client_id: str, producer_groups: Sequence[str],
                  consumer_groups: Sequence[Mapping[str, Any]], timeout_ms: int | None = None) -> None:
        """Record one heartbeat (arguments already validated); ``timeout_ms`` is the client's announced one."""
        now = self._clock_ms()
        timeout = self._expire_ms if timeout_ms is None else max(MIN_CLIENT_TIMEOUT_MS, min(timeout_ms,
                                                                                            self._expire_ms))
        for g in producer_groups:
            self._put(self.producers, g, ClientInfo(client_id, now, timeout_ms=timeout))
        for c in consumer_groups:
            subs = tuple((str(s["topic"]), str(s.get("expression", "*"))) for s in c.get("subscriptions", ()))
            self._put(self.consumers, str(c["group"]),
                      ClientInfo(client_id, now, subs, str(c.get("messageModel", "")), timeout))

    def unregister(self, client_id: str, producer_groups: Sequence[str], consumer_groups: Sequence[str]) -> int:
        """Remove a client from the named groups (RocketMQ's UNREGISTER_CLIENT); returns entries removed."""
        removed = 0
        for table, groups in ((self.producers, producer_groups), (self.consumers, consumer_groups)):
            for g in groups:
                clients = table.get(g)
                if clients is not None and clients.pop(client_id, None) is not None:
                    removed += 1
                    if not clients:
                        del table[g]
        return removed

    def consumer_ids(self, group: str) -> list[str]:
        """Live client ids of a consumer group as of now, sorted (the order rebalancing uses)."""
        now = self._clock_ms()
        return sorted(cid for cid, info in self.consumers.get(group, {}).items() if info.live(now))

    def expire(self) -> int:
        """Drop clients silent for longer than their timeout; returns how many were dropped."""
        now = self._clock_ms()
        dropped = 0
        for table in (self.consumers, self.producers):
            for group in list(table):
                clients = table[group]
                for cid in [c for c, info in clients.items() if not info.live(now)]:
                    del clients[cid]
                    dropped += 1
                if not clients:
                    del table[group]
        return dropped


class LastPulls:
    """When each group last pulled each queue from this broker (``consumer progress`` asks every member of a
    group and shows which one served the newest pull: read/write splitting seen from the operator's side).

    Bounded: past ``max_keys`` (group, topic) pairs the table is cleared rather than grown.
    """

    def __init__(self, max_keys: int = 100_000) -> None:
        self._max_keys = max_keys
        self._table: dict[tuple[str, str], dict[int, int]] = {}

    def record(self, group: str, topic: str, queue_id: int, now_ms: int) -> None:
        queues = self._table.get((group, topic))
        if queues is None:
            if len(self._table) >= self._max_keys:
                self._table.clear()
            queues = self._table[(group, topic)] = {}
        queues[queue_id] = now_ms

    def for_topic(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get((group, topic), {}))
