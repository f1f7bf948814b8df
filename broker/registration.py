"""Registration with the nameservers (docs/BEHAVIOUR.md 6.2-6.3): ``POST /broker/register`` to every nameserver in
parallel, at start, every ``max(10000, min(registerNameServerPeriod, 60000))`` ms and at once after a topic
change; ``POST /broker/unregister`` at graceful shutdown. Failures are logged and retried next period.

For a slave the answer carries its master's client and HA addresses; :class:`Registrar` hands them to a
callback (the HA client and the metadata sync follow them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpx

from common.codes import Perm
from common.route import DataVersion, TopicConfig

__all__ = ["BrokerIdentity", "RegisterResult", "Registrar", "build_register_body", "pick_register_result"]

log = logging.getLogger(__name__)


@attrs.frozen
class BrokerIdentity:
    """What a broker registers as."""

    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str
    """``brokerIP1:<bound listen port>``."""
    ha_server_addr: str
    """``brokerIP2:<bound HA port>``."""


@attrs.frozen
class RegisterResult:
    """One nameserver's answer: the master's addresses (non-null only for a slave whose master is live)."""

    master_addr: str | None
    ha_server_addr: str | None


def build_register_body(identity: BrokerIdentity, topics: Mapping[str, TopicConfig], version: DataVersion,
                        broker_permission: int) -> dict[str, Any]:
    """The JSON of ``POST /broker/register``.

    When ``brokerPermission`` lacks read or write, every topic's perm is ANDed with it (HEAD behaviour), so
    the route shows the broker read-only or write-only.
    """
    restrict = not (Perm.readable(broker_permission) and Perm.writeable(broker_permission))
    table = {}
    for name, tc in topics.items():
        if restrict:
            tc = attrs.evolve(tc, perm=tc.perm & broker_permission)
        table[name] = tc.to_json()
    return {
        "clusterName": identity.cluster_name,
        "brokerAddr": identity.broker_addr,
        "brokerName": identity.broker_name,
        "brokerId": identity.broker_id,
        "haServerAddr": identity.ha_server_addr,
        "dataVersion": version.to_json(),
        "topicConfigTable": table,
    }


def pick_register_result(answers: list[RegisterResult | None]) -> RegisterResult | None:
    """The result to act on: the first answer naming a master, else the first answer (None if all failed)."""
    ok = [a for a in answers if a is not None]
    for a in ok:
        if a.master_addr:
            return a
    return ok[0] if ok else None


def _parse_result(obj: Any) -> RegisterResult:
    if not isinstance(obj, dict):
        raise ValueError("register answer is not a JSON object")
    master = obj.get("masterAddr")
    ha = obj.get("haServerAddr")
    return RegisterResult(master if isinstance(master, str) and master else None,
                          ha if isinstance(ha, str) and ha else None)


class Registrar:
    """Registers one broker with its nameservers.

    Args:
        namesrv_addrs: ``host:port`` of each nameserver.
        identity: what to register as.
        body_factory: builds the register body (current topics and version).
        timeout_s: per-request bound (``registerBrokerTimeoutMills``).
        on_result: called with the chosen answer after every round that got one.
        client: the HTTP client (owned by the caller).
    """

    def __init__(self, namesrv_addrs: tuple[str, ...], identity: BrokerIdentity,
                 body_factory: Callable[[], dict[str, Any]], *, timeout_s: float,
                 on_result: Callable[[RegisterResult], None], client: httpx.AsyncClient,
                 scheme: str = "http") -> None:
        self._addrs = namesrv_addrs
        self._scheme = scheme  # "https" with tlsEnable (the client verifies the nameservers then)
        self.identity = identity
        self._body_factory = body_factory
        self._timeout_s = timeout_s
        self._on_result = on_result
        self._client = client
        self._lock = asyncio.Lock()
        self.rounds = 0
        self.failures = 0

    async def _post(self, addr: str, path: str, body: dict[str, Any]) -> Any:
        r = await self._client.post(f"{self._scheme}://{addr}{path}", json=body, timeout=self._timeout_s)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    async def _register_one(self, addr: str, body: dict[str, Any]) -> RegisterResult | None:
        try:
            return _parse_result(await self._post(addr, "/broker/register", body))
        except (httpx.HTTPError, RuntimeError, ValueError) as e:
            self.failures += 1
            log.warning("register with nameserver %s failed (retry next period): %s", addr, e or type(e).__name__)
            return None

    async def register_all(self) -> RegisterResult | None:
        """One registration round with every nameserver; rounds never overlap."""
        if not self._addrs:
            return None
        async with self._lock:
            body = self._body_factory()
            answers = await asyncio.gather(*(self._register_one(a, body) for a in self._addrs))
            self.rounds += 1
        result = pick_register_result(list(answers))
        if result is not None:
            self._on_result(result)
        return result

    async def unregister_all(self) -> None:
        """Tell every nameserver this broker is leaving (failures logged; bounded by the timeout)."""
        ident = self.identity
        body = {"clusterName": ident.cluster_name, "brokerAddr": ident.broker_addr,
                "brokerName": ident.broker_name, "brokerId": ident.broker_id}

        async def one(addr: str) -> None:
            try:
                await self._post(addr, "/broker/unregister", body)
            except (httpx.HTTPError, RuntimeError, ValueError) as e:
                log.warning("unregister from nameserver %s failed: %s", addr, e or type(e).__name__)

        await asyncio.gather(*(one(a) for a in self._addrs))

    async def run_periodic(self, period_s: float) -> None:
        """Register every ``period_s`` until cancelled (the first round is the caller's)."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.register_all()
            except Exception:  # never let one bad round end the schedule
                log.exception("registration round failed")
