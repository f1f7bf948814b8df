"""``POST /queue/lock`` and ``POST /queue/unlock``: the queue locks of orderly consumption (RocketMQ's
``lockBatchMQ`` / ``unlockBatchMQ`` of ``AdminBrokerProcessor``), kept in :class:`broker.rebalance_lock.
RebalanceLockTable`. Bodies: :mod:`common.queue_lock`.

Locks live on the master only, as in RocketMQ (clients send them to the master of each broker group). A slave
refuses with SERVICE_NOT_AVAILABLE naming its role, so a client never believes it holds a lock a slave granted.
Locks are not replicated: after a failover the new master starts with an empty table, and the clients lock
again at their next renewal (within 20 s). A broker that stops being the master (a DLedger leader stepping down)
forgets its table (the controller clears it), so were it to lead again it would not honour locks from before.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.config import BrokerConfig
from broker.processor.args import ArgumentError, broker_where
from broker.rebalance_lock import RebalanceLockTable
from broker.role import RoleState
from common.errors import ServiceNotAvailableError
from common.message import MessageQueue
from common.queue_lock import LockBatchRequest, encode_queues
from remoting.router import Request, Response, json_response

__all__ = ["QueueLockProcessor"]

log = logging.getLogger(__name__)


class QueueLockProcessor:
    """Serves the queue-lock endpoints of one broker.

    Args:
        config: the broker's configuration (its name: every queue of a request must be of this broker group).
        addr: the broker's client address (in error messages).
        role: the broker's current role (locks only on a master).
        table: the lock table.
    """

    def __init__(self, config: BrokerConfig, *, addr: str, role: RoleState, table: RebalanceLockTable) -> None:
        self._config = config
        self._addr = addr
        self._role = role
        self._table = table

    def routes(self) -> dict[tuple[str, str], Any]:
        return {("POST", "/queue/lock"): self.lock, ("POST", "/queue/unlock"): self.unlock}

    def _request(self, request: Request) -> LockBatchRequest:
        if self._role.is_slave:
            raise ServiceNotAvailableError(
                f"{broker_where(self._config, self._addr, self._role)} is a SLAVE: queue locks live on the master "
                f"of {self._config.broker_name}")
        req = LockBatchRequest.from_json(request.json())
        name = self._config.broker_name
        for q in req.queues:
            if q.broker_name != name:
                raise ArgumentError(f"queue {q} is not of broker group {name}: lock it on its own group's master")
        return req

    async def lock(self, request: Request) -> Response:
        """Lock or renew the queues for the client; answers the queues it holds now (``lockOKMQSet``)."""
        req = self._request(request)
        locked = self._table.try_lock(req.consumer_group, req.client_id,
                                      [(q.topic, q.queue_id) for q in req.queues])
        name = self._config.broker_name
        return json_response({"lockOKMQSet": encode_queues(MessageQueue(t, name, i) for t, i in locked)})

    async def unlock(self, request: Request) -> Response:
        """Release the client's locks on the queues; answers how many it held."""
        req = self._request(request)
        released = self._table.unlock(req.consumer_group, req.client_id,
                                      [(q.topic, q.queue_id) for q in req.queues])
        if released:
            log.debug("%s unlocked %d queues of group %s", req.client_id, len(released), req.consumer_group)
        return json_response({"unlocked": len(released)})
