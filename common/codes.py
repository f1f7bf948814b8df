"""Status codes, roles and flags shared by the SDK and the servers (RocketMQ's values).

Pure data: nothing here does I/O. The numeric values are RocketMQ's own so that a RocketMQ user reading a log
or a metric recognises them (see docs/BEHAVIOUR.md sections 2.10, 3.2 and 3.3).
"""

from __future__ import annotations

import enum

__all__ = [
    "DEFAULT_TRANSFER_TIMEOUT_MS",
    "MASTER_ID",
    "MAX_TRANSFER_TIMEOUT_MS",
    "PULL_COMMIT_OFFSET",
    "PULL_SUBSCRIPTION",
    "PULL_SUSPEND",
    "BrokerRole",
    "FlushDiskType",
    "Perm",
    "PullStatus",
    "PullSysFlag",
    "ResponseCode",
    "SendStatus",
    "SysFlag",
]

#: ``brokerId`` of a broker group's master; every other id is a slave.
MASTER_ID = 0

#: Bound of a DLedger leadership transfer (``POST /dledger/transfer``) that names no ``timeoutMs``: the peer's
#: catch-up, then its election.
DEFAULT_TRANSFER_TIMEOUT_MS = 5000
#: Longest ``timeoutMs`` a leadership transfer may ask for (the request holds its connection that long).
MAX_TRANSFER_TIMEOUT_MS = 60_000


class ResponseCode(enum.IntEnum):
    """RocketMQ remoting response codes used by SplitMQ."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    FLOW_CONTROL = 215


class SendStatus(enum.Enum):
    """Outcome of a send that the broker stored (codes 0, 10, 11, 12)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"

    @classmethod
    def from_code(cls, code: int) -> SendStatus:
        """Map a stored-message response code to its status.

        Raises:
            ValueError: ``code`` is not one of 0, 10, 11, 12.
        """
        try:
            return _SEND_STATUS_BY_CODE[code]
        except KeyError:
            raise ValueError(f"response code {code} is not a send status") from None

    @property
    def code(self) -> int:
        """The response code this status travels as."""
        return _CODE_BY_SEND_STATUS[self]


_SEND_STATUS_BY_CODE: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
}
_CODE_BY_SEND_STATUS = {v: int(k) for k, v in _SEND_STATUS_BY_CODE.items()}


class PullStatus(enum.Enum):
    """Client-side pull outcome (docs/BEHAVIOUR.md 3.3: 0 FOUND, 19 NO_NEW_MSG, 20 NO_MATCHED_MSG, 21 OFFSET_ILLEGAL)."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"

    @classmethod
    def from_code(cls, code: int) -> PullStatus | None:
        """The status for a pull response code, or None when the code is an error."""
        return _PULL_STATUS_BY_CODE.get(code)


_PULL_STATUS_BY_CODE: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


class BrokerRole(enum.Enum):
    """``brokerRole``: masters accept writes, slaves replicate and may serve reads."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


class FlushDiskType(enum.Enum):
    """``flushDiskType``: when a put counts as durable on the local disk."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class Perm(enum.IntFlag):
    """Topic / broker permission bits (``PermName``)."""

    NONE = 0
    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8

    @staticmethod
    def readable(perm: int) -> bool:
        return bool(perm & _READ)

    @staticmethod
    def writeable(perm: int) -> bool:
        return bool(perm & _WRITE)


# Plain ints: ``int & Perm.READ`` goes through IntFlag's Python-level __rand__ (about 0.6 µs, every send and pull).
_READ = int(Perm.READ)
_WRITE = int(Perm.WRITE)


class SysFlag(enum.IntFlag):
    """Commit-log record SYSFLAG bits (``MessageSysFlag``)."""

    NONE = 0
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    IDEMPOTENT = 0x1000
    """SplitMQ: sent by an idempotent producer. The broker checks the record's ``UNIQ_KEY`` against its window of
    recent keys (``duplicateWindowMs``) and rebuilds that window from the records of its log that carry the bit;
    copies the broker makes (a delayed delivery, a send-back, a committed transaction) do not carry it."""

    @staticmethod
    def transaction_type(flag: int) -> int:
        return flag & 0xC


class PullSysFlag(enum.IntFlag):
    """Pull request flag bits (docs/BEHAVIOUR.md 3.3)."""

    NONE = 0
    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


#: :class:`PullSysFlag`'s bits the data path tests and sets, as plain ints: ``int & IntFlag`` and ``|=`` go through
#: the enum machinery (about 0.5 µs each, a few times per pull in the SDK and on the broker).
PULL_COMMIT_OFFSET = int(PullSysFlag.COMMIT_OFFSET)
PULL_SUSPEND = int(PullSysFlag.SUSPEND)
PULL_SUBSCRIPTION = int(PullSysFlag.SUBSCRIPTION)
