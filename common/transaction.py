"""The wire models of transactional messages (issue 17), shared by the SDK and the broker; no I/O.

RocketMQ's two phases, over this project's HTTP API (docs/PROTOCOL.md "Transactions")::

    POST /send?topic=T&queueId=Q&group=G      one item, SYSFLAG TRANSACTION_PREPARED (0x4), properties
                                              TRAN_MSG=true and PGROUP=G: stored as a half message
    POST /transaction/end?group=G&topic=T&transactionId=X&commitLogOffset=O&commitOrRollback=COMMIT|ROLLBACK
                         [&fromTransactionCheck=true]
    GET  /transaction/checks?group=G&clientId=C[&maxNums=N][&timeoutMs=W]
                                              long poll: {"checks": [TransactionCheck...]}

``transactionId`` is the half message's ``UNIQ_KEY`` (the ``msg_id`` the producer got back) and stays the same
when the broker re-puts the half message for another check; ``commitLogOffset`` is where that half message (or
its latest re-put copy, which a check names) is stored. RocketMQ sends the check back over the producer's
connection; the SDK talks HTTP to brokers, so producers of a group poll for their checks instead, and answer
each with the same end request, flagged ``fromTransactionCheck``.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Mapping
from typing import Any

import attrs

from common.requests import INT64_MAX, ArgumentError, checked_name, query_arg, query_int, quote_arg

__all__ = [
    "CHECKS_PATH",
    "DEFAULT_CHECK_POLL_MS",
    "END_PATH",
    "MAX_CHECKS_PER_POLL",
    "MAX_CHECK_POLL_MS",
    "EndTransactionRequest",
    "TransactionCheck",
    "TransactionResolution",
]

END_PATH = "/transaction/end"
CHECKS_PATH = "/transaction/checks"
#: Longest hold of a check poll the broker grants (a longer ``timeoutMs`` is cut to this).
MAX_CHECK_POLL_MS = 30_000
#: Hold of a check poll that names no ``timeoutMs``.
DEFAULT_CHECK_POLL_MS = 15_000
#: Most checks one poll answer carries.
MAX_CHECKS_PER_POLL = 64


class TransactionResolution(enum.Enum):
    """How a transaction ends (RocketMQ's ``TRANSACTION_COMMIT_TYPE`` / ``TRANSACTION_ROLLBACK_TYPE``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


@attrs.frozen
class EndTransactionRequest:
    """The arguments of ``POST /transaction/end`` (RocketMQ's ``EndTransactionRequestHeader``)."""

    group: str
    """Producer group of the transaction (must be the half message's ``PGROUP``)."""
    topic: str
    """The real topic of the message (must be the half message's ``REAL_TOPIC``; the ACL checks PUB on it)."""
    transaction_id: str
    """The half message's ``UNIQ_KEY``."""
    commit_log_offset: int
    """Where the half message (or a re-put copy of it) is stored."""
    resolution: TransactionResolution
    """Commit or roll back."""
    from_check: bool = False
    """The answer to a check-back (logged by the broker; the outcome is the same)."""

    def to_query(self) -> str:
        """The query string (without ``?``)."""
        query = (f"group={quote_arg(self.group)}&topic={quote_arg(self.topic)}"
                 f"&transactionId={quote_arg(self.transaction_id)}&commitLogOffset={self.commit_log_offset}"
                 f"&commitOrRollback={self.resolution.value}")
        return query + "&fromTransactionCheck=true" if self.from_check else query

    def target(self) -> str:
        return f"{END_PATH}?{self.to_query()}"

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> EndTransactionRequest:
        """Read and check every argument.

        Raises:
            ArgumentError: an argument is missing or malformed (named in the message).
        """
        group = checked_name("group", query_arg(query, "group"))
        topic = checked_name("topic", query_arg(query, "topic"))
        txid = query_arg(query, "transactionId")
        if not txid or len(txid) > 128 or not txid.isascii() or not txid.isalnum():
            raise ArgumentError(f"transactionId {txid[:40]!r} is not 1 to 128 ASCII letters and digits")
        offset = query_int(query, "commitLogOffset", lo=0, hi=INT64_MAX)
        raw = query_arg(query, "commitOrRollback")
        try:
            resolution = TransactionResolution(raw.upper())
        except ValueError:
            raise ArgumentError(f"commitOrRollback must be COMMIT or ROLLBACK, got {raw[:20]!r}") from None
        from_check = query_arg(query, "fromTransactionCheck", "false")
        if from_check not in ("true", "false"):
            raise ArgumentError(f"fromTransactionCheck must be true or false, got {from_check[:20]!r}")
        return cls(group, topic, txid, offset, resolution, from_check == "true")


@attrs.frozen
class TransactionCheck:
    """One check-back a broker asks of a producer group (RocketMQ's ``CheckTransactionStateRequestHeader`` and
    the message it carries)."""

    transaction_id: str
    """The half message's ``UNIQ_KEY``."""
    commit_log_offset: int
    """Where the half message copy being checked is stored (the end request names it)."""
    queue_offset: int
    """Its offset in ``RMQ_SYS_TRANS_HALF_TOPIC`` (for logs)."""
    topic: str
    """The message's real topic."""
    queue_id: int
    """The message's real queue."""
    check_times: int
    """How many times the broker has asked about this transaction, this time included."""
    record: bytes
    """The half message as stored (commit-log record layout, :func:`common.codec.decode_records`)."""

    def to_json(self) -> dict[str, Any]:
        return {"transactionId": self.transaction_id, "commitLogOffset": self.commit_log_offset,
                "queueOffset": self.queue_offset, "topic": self.topic, "queueId": self.queue_id,
                "checkTimes": self.check_times, "record": base64.b64encode(self.record).decode("ascii")}

    @classmethod
    def from_json(cls, obj: Any) -> TransactionCheck:
        """Raises ValueError on a malformed entry."""
        try:
            return cls(str(obj["transactionId"]), int(obj["commitLogOffset"]), int(obj["queueOffset"]),
                       str(obj["topic"]), int(obj["queueId"]), int(obj["checkTimes"]),
                       base64.b64decode(obj["record"], validate=True))
        except (KeyError, TypeError, ValueError, binascii.Error) as e:
            raise ValueError(f"malformed transaction check {str(obj)[:80]!r}: {e}") from None
