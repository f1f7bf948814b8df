"""What the broker uses of its HA objects, as protocols: :class:`broker.ha.HAService` and
:class:`broker.ha.HAClient` implement them, and unit tests of the broker pass their own fakes through
:class:`broker.controller.BrokerController`'s keyword arguments.

HA is part of the broker: the controller constructs the real classes when none are given; there is no stand-in
that would let a broker run without replication.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

__all__ = ["HAClientAPI", "HAServiceAPI"]


class HAServiceAPI(Protocol):
    """The master side, opened on every broker (:class:`broker.ha.HAService`)."""

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (0: any free port), or on ``sock`` (bound and listening), and return the bound
        port."""
        ...

    async def stop(self) -> None:
        """Close the listener and every slave connection (idempotent, bounded)."""
        ...

    def notify_new_data(self) -> None:
        """The commit log grew: send to idle slaves now."""
        ...

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        """The SYNC_MASTER wait of a put ending at ``end_offset``; None when too few slaves are in sync."""
        ...

    def status(self) -> dict[str, Any]:
        """``haStatus``: the master's max offset and each slave's progress."""
        ...


class HAClientAPI(Protocol):
    """The slave side (:class:`broker.ha.HAClient`)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def update_master_address(self, addr: str | None) -> None:
        """Follow another master HA address (from the nameserver's registration answer)."""
        ...

    @property
    def is_connected(self) -> bool:
        """Whether the link to the master is up (decides whether a slave serves reads, decision 6)."""
        ...

    def status(self) -> dict[str, Any]: ...
