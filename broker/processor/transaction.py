"""``POST /transaction/end`` and ``GET /transaction/checks`` (docs/PROTOCOL.md "Transactions").

End (RocketMQ's ``EndTransactionProcessor``): refused on a SLAVE (SERVICE_NOT_AVAILABLE, the producer sends it to
the master of the broker group that stored the half message), and when the broker is not writeable
(NO_PERMISSION); otherwise :meth:`~broker.transaction.TransactionalMessageService.end` commits or rolls back and
the answer waits for the writes' durability as a send does. A second end of a settled transaction answers
``ALREADY_ENDED`` and writes nothing.

Checks: a producer of group G long-polls for the check-backs of G (:class:`~broker.transaction.CheckQueues`);
``timeoutMs`` is cut to ``MAX_CHECK_POLL_MS``, ``maxNums`` to ``MAX_CHECKS_PER_POLL``. A slave has no checks (its
check service does not run) and answers an empty list at once, so a producer polling it does not spin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.durability import Durability
from broker.role import RoleState
from broker.transaction.service import TransactionalMessageService
from common.codes import Perm, ResponseCode
from common.errors import NoPermissionError, ServiceNotAvailableError
from common.requests import checked_name
from common.transaction import (
    CHECKS_PATH,
    DEFAULT_CHECK_POLL_MS,
    END_PATH,
    MAX_CHECK_POLL_MS,
    MAX_CHECKS_PER_POLL,
    EndTransactionRequest,
)
from remoting.router import Request, Response, json_response

__all__ = ["TransactionProcessor"]

log = logging.getLogger(__name__)


class TransactionProcessor:
    """Serves the transaction endpoints of one broker.

    Args:
        service: the transactional message service.
        durability: the flush / replica wait after the writes of an end.
        role: the broker's current role.
        broker_name / addr: for error messages.
        permission: the broker's ``brokerPermission`` (read at each request: it can change).
    """

    def __init__(self, service: TransactionalMessageService, *, durability: Durability, role: RoleState,
                 broker_name: str, addr: str, permission: Callable[[], int]) -> None:
        self._service = service
        self._durability = durability
        self._role = role
        self._broker_name = broker_name
        self._addr = addr
        self._permission = permission

    def routes(self) -> dict[tuple[str, str], Callable[[Request], object]]:
        return {("POST", END_PATH): self.end, ("GET", CHECKS_PATH): self.poll_checks}

    async def end(self, request: Request) -> Response:
        req = EndTransactionRequest.from_query(request.query)
        if self._role.is_slave:
            raise ServiceNotAvailableError(
                f"broker {self._broker_name} (id {self._role.broker_id}, {self._addr}) is a SLAVE and does not end "
                f"transactions; send the end of {req.transaction_id} to the master of {self._broker_name}")
        if not Perm.writeable(self._permission()):
            raise NoPermissionError(f"the broker[{self._broker_name} {self._addr}] ending transactions is forbidden "
                                    f"(brokerPermission={self._permission()})")
        outcome = self._service.end(req)
        code = ResponseCode.SUCCESS
        if outcome.last_put is not None:
            code = await self._durability.wait(outcome.last_put)
        return json_response({"code": int(code), "result": outcome.state, "transactionId": req.transaction_id,
                              "offsetMsgId": outcome.offset_msg_id})

    async def poll_checks(self, request: Request) -> Response:
        group = checked_name("group", request.arg("group"))
        client_id = request.arg("clientId", "")
        max_nums = request.int_arg("maxNums", MAX_CHECKS_PER_POLL, lo=1)
        hold_ms = request.int_arg("timeoutMs", DEFAULT_CHECK_POLL_MS, lo=0)
        if self._role.is_slave:
            return json_response({"checks": []})
        checks = await self._service.checks.take(group, min(max_nums, MAX_CHECKS_PER_POLL),
                                                 min(hold_ms, MAX_CHECK_POLL_MS) / 1000.0)
        if checks:
            log.debug("%d transaction check(s) of group %s handed to %s", len(checks), group, client_id or "?")
        return json_response({"checks": [c.to_json() for c in checks]})
