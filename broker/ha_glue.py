"""Wiring of the HA objects (:mod:`broker.ha`) into the broker, with inert stand-ins when that package cannot be
imported (it is optional for unit tests of the processors).

The stand-in service still opens a TCP listener on the HA port (so the ready line reports a real port) and
closes every connection; ``is_slave_ok`` is False, so a SYNC_MASTER answers SLAVE_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from broker.store.api import MessageStore

__all__ = ["HAClientLike", "HAServiceLike", "NullHAClient", "NullHAService", "create_ha"]

log = logging.getLogger(__name__)


class HAServiceLike(Protocol):
    async def start(self, host: str, port: int) -> int: ...
    async def stop(self) -> None: ...
    def notify_new_data(self) -> None: ...
    def is_slave_ok(self, master_put_where: int) -> bool: ...
    def wait_for_ack(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool]: ...
    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None: ...
    def status(self) -> dict[str, Any]: ...


class HAClientLike(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def update_master_address(self, addr: str | None) -> None: ...
    @property
    def is_connected(self) -> bool: ...
    def status(self) -> dict[str, Any]: ...


class NullHAService:
    """Accepts and drops HA connections; never has a slave in sync."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        self._server = await asyncio.start_server(drop, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def notify_new_data(self) -> None:
        pass

    def is_slave_ok(self, master_put_where: int) -> bool:
        return False

    def wait_for_ack(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        fut.set_result(False)
        return fut

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        return None

    def status(self) -> dict[str, Any]:
        return {"available": False, "connections": []}


class NullHAClient:
    """A slave without replication: never connected (so it serves reads itself)."""

    def __init__(self, master_ha_addr: str | None = None) -> None:
        self.master_ha_addr = master_ha_addr

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def update_master_address(self, addr: str | None) -> None:
        self.master_ha_addr = addr

    @property
    def is_connected(self) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"available": False, "masterAddress": self.master_ha_addr, "connected": False}


def create_ha(store: MessageStore, ha_config_factory: Any, *, is_slave: bool, master_ha_addr: str | None
              ) -> tuple[HAServiceLike, HAClientLike | None]:
    """The HA service (every broker) and, on a slave, the HA client.

    Args:
        store: the broker's store.
        ha_config_factory: zero-argument callable returning a :class:`broker.ha.HAConfig`.
        is_slave: create the client too.
        master_ha_addr: ``haMasterAddress`` when configured.
    """
    try:
        from broker.ha import HAClient, HAService
    except ImportError as e:
        log.warning("HA replication unavailable (%s); running without it", e)
        return NullHAService(), (NullHAClient(master_ha_addr) if is_slave else None)
    config = ha_config_factory()
    service = HAService(store, config)
    client = HAClient(store, config, master_ha_addr) if is_slave else None
    return service, client
