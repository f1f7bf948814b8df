"""The broker's current role and id, which the processors read on every request.

In the classic mode they are the configuration's and never change. In DLedger mode (docs/BEHAVIOUR.md 9.8) they follow
the election: a member starts as a SLAVE with id -1, becomes id 0 / SYNC_MASTER when it leads and has caught up,
and its follower id (``n1`` -> 2) when another member leads. One object, shared by reference, so every reader
sees a change at once; only the controller's role handler changes it.
"""

from __future__ import annotations

import attrs

from common.codes import BrokerRole

__all__ = ["RoleState"]


@attrs.define
class RoleState:
    role: BrokerRole
    broker_id: int

    @property
    def is_slave(self) -> bool:
        return self.role is BrokerRole.SLAVE

    @property
    def name(self) -> str:
        return self.role.value
