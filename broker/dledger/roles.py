"""The broker's role-change handler in DLedger mode (docs/BEHAVIOUR.md 9.8): the member's role becomes the broker's.

* FOLLOWER or CANDIDATE: the broker is a SLAVE with its follower id (``n1`` -> 2) at once: the store refuses
  writes, the schedule service stops, the slave metadata sync follows the master, the broker registers.
* LEADER: the broker keeps refusing writes until every entry of its log is committed and dispatched (the queues
  then hold everything a client was ever acknowledged, and the queue-offset table is rebuilt from them), then
  becomes id 0 / SYNC_MASTER, starts the schedule service and registers at once. A leader that loses the
  leadership meanwhile never becomes master.

One transition runs at a time; a newer role change cancels the one in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from broker.dledger.member import Role
from broker.dledger.wakeup import Wakeup
from broker.role import RoleState
from common.codes import BrokerRole

__all__ = ["RoleHandler"]

log = logging.getLogger(__name__)

#: Bound between two looks at the leader's progress when no wake-up came (docs/BEHAVIOUR.md 9.8 polls every 100 ms).
_POLL_S = 0.1


class RoleHandler:
    """Applies the member's role changes to the broker.

    Args:
        role: the broker's role and id (shared with the processors).
        follower_id: the id this broker registers with as a follower.
        leading: ``leading(term)`` -- whether the member still leads in ``term``.
        caught_up: every entry of the log is committed and dispatched.
        set_store_role: the store's ``set_broker_role`` (a new master rebuilds its queue-offset table).
        become_master / become_slave: the broker's side effects (schedule service, metadata sync, registration).
    """

    def __init__(self, *, role: RoleState, follower_id: int, leading: Callable[[int], bool],
                 caught_up: Callable[[], bool], set_store_role: Callable[[BrokerRole], None],
                 become_master: Callable[[], Awaitable[None]], become_slave: Callable[[], Awaitable[None]]) -> None:
        self.role = role
        self._follower_id = follower_id
        self._leading = leading
        self._caught_up = caught_up
        self._set_store_role = set_store_role
        self._become_master = become_master
        self._become_slave = become_slave
        self._task: asyncio.Task[None] | None = None
        self._progress = Wakeup()
        self.transitions = 0

    def changed(self, role: Role, term: int, leader_id: str | None) -> None:
        """The member's callback (on its event loop): start the transition to ``role``."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._apply(role, term), name="dledger-role-change")

    def poke(self) -> None:
        """Something the leader waits for moved (an entry committed, a batch dispatched)."""
        self._progress.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _apply(self, role: Role, term: int) -> None:
        try:
            if role is Role.LEADER:
                await self._lead(term)
            elif not (self.role.is_slave and self.role.broker_id == self._follower_id):
                await self._follow()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("DLedger role change to %s in term %d failed", role.value, term)

    async def _lead(self, term: int) -> None:
        while self._leading(term) and not self._caught_up():
            await self._progress.wait(_POLL_S)
        if not self._leading(term):
            return
        self._set_store_role(BrokerRole.SYNC_MASTER)
        self.role.role, self.role.broker_id = BrokerRole.SYNC_MASTER, 0
        self.transitions += 1
        log.info("DLedger leader in term %d: the broker is now the master (id 0, SYNC_MASTER)", term)
        await self._become_master()

    async def _follow(self) -> None:
        self._set_store_role(BrokerRole.SLAVE)
        self.role.role, self.role.broker_id = BrokerRole.SLAVE, self._follower_id
        self.transitions += 1
        log.info("DLedger follower: the broker is now a slave (id %d)", self._follower_id)
        await self._become_slave()
