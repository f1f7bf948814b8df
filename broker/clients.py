"""Clients that sent heartbeats, per group, with their last-seen time (RocketMQ's consumer/producer
managers). Bounded: at most ``max_groups`` groups and ``max_clients_per_group`` clients each; entries expire
``expire_ms`` (120 s) after the last heartbeat. Used by rebalancing (consumer ids of a group)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from client.errors import InvalidParameterError

__all__ = ["ClientInfo", "ClientTable"]


@attrs.frozen
class ClientInfo:
    client_id: str
    last_seen_ms: int
    subscriptions: tuple[tuple[str, str], ...] = ()
    """``(topic, expression)`` pairs (consumers only)."""
    message_model: str = ""


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
                  consumer_groups: Sequence[Mapping[str, Any]]) -> None:
        """Record one heartbeat (arguments already validated)."""
        now = self._clock_ms()
        for g in producer_groups:
            self._put(self.producers, g, ClientInfo(client_id, now))
        for c in consumer_groups:
            subs = tuple((str(s["topic"]), str(s.get("expression", "*"))) for s in c.get("subscriptions", ()))
            self._put(self.consumers, str(c["group"]), ClientInfo(client_id, now, subs, str(c.get("messageModel", ""))))

    def consumer_ids(self, group: str) -> list[str]:
        """Live client ids of a consumer group, sorted (the order rebalancing uses)."""
        return sorted(self.consumers.get(group, {}))

    def expire(self) -> int:
        """Drop clients silent for longer than ``expire_ms``; returns how many were dropped."""
        deadline = self._clock_ms() - self._expire_ms
        dropped = 0
        for table in (self.consumers, self.producers):
            for group in list(table):
                clients = table[group]
                for cid in [c for c, info in clients.items() if info.last_seen_ms < deadline]:
                    del clients[cid]
                    dropped += 1
                if not clients:
                    del table[group]
        return dropped
