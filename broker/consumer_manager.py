"""``GET /consumer/ids?group=G`` and ``POST /client/unregister``: group membership for rebalancing.

:class:`broker.clients.ClientTable` records heartbeats and drops silent clients every
``CLIENT_EXPIRE_CHECK_S`` (10 s). Rebalancing needs the set as of now, so the answer filters by each client's
own timeout (its announced ``heartbeatTimeoutMs``, else RocketMQ's 120 s channel expiry) even if the periodic
sweep has not dropped it yet. Every instance of a group asks every broker and sorts the ids the same way, so
they all compute the same assignment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from broker.clients import ClientInfo
from broker.pull_processor import checked_name
from client.protocol.asgi import ArgumentError, Request, Response, json_response

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = ["CLIENT_EXPIRE_MS", "ConsumerIdsProcessor", "LastPulls", "live_client_ids"]

log = logging.getLogger(__name__)

#: A client not heard from for this long is not part of its group (RocketMQ's 120 s channel expiry).
CLIENT_EXPIRE_MS = 120_000


def live_client_ids(clients: Mapping[str, ClientInfo], now_ms: int, expire_ms: int = CLIENT_EXPIRE_MS) -> list[str]:
    """The ids of ``clients`` heard from within their timeout (and never more than ``expire_ms``) of ``now_ms``,
    sorted (the rebalance order). A client seen exactly at its limit is still live, as in ClientTable.expire.
    """
    return sorted(cid for cid, info in clients.items()
                  if info.last_seen_ms >= now_ms - min(info.timeout_ms, expire_ms))


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


class ConsumerIdsProcessor:
    """Serves ``GET /consumer/ids``.

    Args:
        ctrl: the broker (its ``clients`` table).
        clock_ms: the clock the client table stamps heartbeats with.
        expire_ms: silence after which a client is left out.
    """

    def __init__(self, ctrl: BrokerController, *, clock_ms: Callable[[], int],
                 expire_ms: int = CLIENT_EXPIRE_MS) -> None:
        if expire_ms <= 0:
            raise ValueError(f"expire_ms must be > 0, got {expire_ms}")
        self._ctrl = ctrl
        self._clock_ms = clock_ms
        self._expire_ms = expire_ms

    def routes(self) -> dict[tuple[str, str], Any]:
        return {("GET", "/consumer/ids"): self.handle, ("POST", "/client/unregister"): self.unregister,
                ("GET", "/consumer/pulls"): self.last_pulls}

    async def last_pulls(self, request: Request) -> Response:
        """``{"lastPullTimestamp": {"QUEUE_ID": ms}}``: the group's last pull of each queue of ``topic`` here."""
        group = checked_name("group", request.arg("group"))
        topic = checked_name("topic", request.arg("topic"))
        pulls = self._ctrl.last_pulls.for_topic(group, topic)
        return json_response({"lastPullTimestamp": {str(q): ms for q, ms in sorted(pulls.items())}})

    async def unregister(self, request: Request) -> Response:
        """``{"clientId", "producerGroups": [..], "consumerGroups": [..]}`` -> ``{"removed": n}``."""
        body = request.json()
        client_id = body.get("clientId")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 255:
            raise ArgumentError("JSON field 'clientId' must be 1 to 255 characters")
        groups: dict[str, list[str]] = {}
        for key in ("producerGroups", "consumerGroups"):
            names = body.get(key) or []
            if not isinstance(names, list) or not all(isinstance(g, str) for g in names):
                raise ArgumentError(f"JSON field {key!r} must be a list of group names")
            groups[key] = [checked_name("group", g) for g in names]
        removed = self._ctrl.clients.unregister(client_id, groups["producerGroups"], groups["consumerGroups"])
        if removed:
            log.info("client %s unregistered from %s", client_id, groups)
        return json_response({"removed": removed})

    async def handle(self, request: Request) -> Response:
        group = checked_name("group", request.arg("group"))
        clients = self._ctrl.clients.consumers.get(group, {})
        return json_response({"clientIds": live_client_ids(clients, self._clock_ms(), self._expire_ms)})
