"""HTTP framing of the data path: the binary send and pull responses. The only module that owns them.

Send response (``POST /send`` answered 200), big-endian::

      0   4  CODE            0 SEND_OK, 10 FLUSH_DISK_TIMEOUT, 11 SLAVE_NOT_AVAILABLE, 12 FLUSH_SLAVE_TIMEOUT
      4   4  QUEUEID
      8   8  QUEUEOFFSET     logical offset of the first message of the batch
     16   4  COUNT           messages stored
     20   1  HOSTLEN         8 (IPv4) or 20 (IPv6)
     21   .  STOREHOST       packed store host (ip + int32 port), for offset msgIds
      .   8*COUNT            commit-log offset of each message, in order
      .  12*COUNT            optional: queue id (4) and queue offset (8) of each message, in order. Present only
                             when an idempotent send's messages are not all at QUEUEID from QUEUEOFFSET on (some
                             were stored before, by an earlier send of the same keys); QUEUEID and QUEUEOFFSET
                             are then the first message's. A reader tells the two forms by the answer's length.

Pull response (``GET /pull`` answered 200), big-endian::

      0   4  CODE            0 FOUND, 19 PULL_NOT_FOUND, 20 PULL_RETRY_IMMEDIATELY, 21 PULL_OFFSET_MOVED
      4   8  NEXTBEGINOFFSET
     12   8  MINOFFSET
     20   8  MAXOFFSET
     28   4  SUGGESTWHICHBROKERID
     32   4  SERVEDBYBROKERID
     36   4  COUNT           records that follow
     40   .  RECORDS         stored commit-log records back to back (codec module layout)

Every other answer, and every error on any endpoint, is JSON: ``{"code": int, "remark": str, "broker": addr,
"role": role}`` with an HTTP status from :func:`http_status_for_code`.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from common.codes import ResponseCode
from common.errors import AccessDeniedError, BrokerError, ProtocolViolationError

__all__ = [
    "PULL_HEAD",
    "SEND_HEAD",
    "PullHeader",
    "SendReply",
    "decode_error",
    "decode_pull_header",
    "decode_send_reply",
    "encode_error",
    "encode_pull_header",
    "encode_send_reply",
    "http_status_for_code",
]

SEND_HEAD = struct.Struct(">iiqiB")
PULL_HEAD = struct.Struct(">iqqqiii")

CONTENT_BINARY = "application/octet-stream"
CONTENT_JSON = "application/json"


class SendReply(NamedTuple):
    """A decoded send response."""

    code: int
    queue_id: int
    queue_offset: int
    store_host: bytes
    commit_log_offsets: tuple[int, ...]
    placements: tuple[int, ...] = ()
    """Empty: message ``i`` is at ``queue_offset + i`` of ``queue_id``. Else ``(queue id, queue offset)`` of each
    message, flattened: message ``i`` at ``placements[2 * i]``, ``placements[2 * i + 1]``."""


def encode_send_reply(
    code: int, queue_id: int, queue_offset: int, store_host: bytes, commit_log_offsets: Sequence[int],
    placements: Sequence[int] = (),
) -> bytes:
    """A send response; ``placements`` as :attr:`SendReply.placements` (empty for the plain form)."""
    n = len(commit_log_offsets)
    parts = [SEND_HEAD.pack(code, queue_id, queue_offset, n, len(store_host)), store_host,
             _offsets_of(n).pack(*commit_log_offsets)]
    if placements:
        parts.append(_placements_of(n).pack(*placements))
    return b"".join(parts)


@functools.lru_cache(maxsize=64)
def _offsets_of(n: int) -> struct.Struct:
    """The struct of ``n`` commit-log offsets (a producer's batches come in a few sizes)."""
    return struct.Struct(f">{n}q")


@functools.lru_cache(maxsize=64)
def _placements_of(n: int) -> struct.Struct:
    """The struct of ``n`` (queue id, queue offset) pairs."""
    return struct.Struct(">" + "iq" * n)


def decode_send_reply(data: bytes) -> SendReply:
    """Raises ProtocolViolationError when ``data`` is not a send response."""
    try:
        code, queue_id, queue_offset, n, host_len = SEND_HEAD.unpack_from(data, 0)
        p = SEND_HEAD.size
        host = bytes(data[p : p + host_len])
        offsets = _offsets_of(n).unpack_from(data, p + host_len)
    except struct.error as e:
        raise ProtocolViolationError(f"malformed send response ({len(data)} bytes): {e}") from None
    end = p + host_len + 8 * n
    if len(host) != host_len or (end != len(data) and end + 12 * n != len(data)):
        raise ProtocolViolationError(f"malformed send response: {len(data)} bytes for {n} offsets")
    if end == len(data):
        return SendReply(code, queue_id, queue_offset, host, offsets)
    return SendReply(code, queue_id, queue_offset, host, offsets, _placements_of(n).unpack_from(data, end))


class PullHeader(NamedTuple):
    """The fixed head of a pull response; records follow at ``PULL_HEAD.size``."""

    code: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    served_by_broker_id: int
    count: int  # type: ignore[assignment]  # shadows tuple.count; the wire name wins


def encode_pull_header(
    code: int, next_begin_offset: int, min_offset: int, max_offset: int, suggest_which_broker_id: int,
    served_by_broker_id: int, count: int,
) -> bytes:
    return PULL_HEAD.pack(
        code, next_begin_offset, min_offset, max_offset, suggest_which_broker_id, served_by_broker_id, count
    )


def decode_pull_header(data: bytes | memoryview) -> PullHeader:
    """Raises ProtocolViolationError when ``data`` is shorter than the head."""
    if len(data) < PULL_HEAD.size:
        raise ProtocolViolationError(f"pull response of {len(data)} bytes is shorter than its {PULL_HEAD.size}-byte head")
    return PullHeader(*PULL_HEAD.unpack_from(data, 0))


_HTTP_STATUS = {
    ResponseCode.SUCCESS: 200,
    ResponseCode.SYSTEM_ERROR: 500,
    ResponseCode.SYSTEM_BUSY: 503,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: 404,
    ResponseCode.MESSAGE_ILLEGAL: 400,
    ResponseCode.SERVICE_NOT_AVAILABLE: 503,
    ResponseCode.NO_PERMISSION: 403,
    ResponseCode.TOPIC_NOT_EXIST: 404,
    ResponseCode.TOPIC_EXIST_ALREADY: 409,
    ResponseCode.QUERY_NOT_FOUND: 404,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: 400,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: 404,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: 404,
    ResponseCode.INVALID_PARAMETER: 400,
}


def http_status_for_code(code: int) -> int:
    """HTTP status used for a JSON answer carrying ``code`` (400 for codes not listed)."""
    return _HTTP_STATUS.get(code, 400)  # type: ignore[call-overload]


def encode_error(code: int, remark: str, *, broker: str | None = None, role: str | None = None,
                 acl: bool = False) -> bytes:
    """A JSON error answer; ``acl`` marks an ACL refusal (the SDK raises AccessDeniedError and does not retry)."""
    body: dict[str, Any] = {"code": int(code), "remark": remark}
    if acl:
        body["acl"] = True
    if broker:
        body["broker"] = broker
    if role:
        body["role"] = role
    return json.dumps(body).encode()


def decode_error(status: int, data: bytes, *, addr: str | None = None) -> BrokerError:
    """The client error for a non-200 answer (JSON when the server sent it, else a generic one)."""
    try:
        body = json.loads(data)
        code = int(body["code"])
        remark = str(body.get("remark", ""))
        if code == ResponseCode.NO_PERMISSION and body.get("acl") is True:
            return AccessDeniedError(remark, broker_addr=body.get("broker") or addr, broker_role=body.get("role"))
        return BrokerError.for_code(
            code, remark, broker_addr=body.get("broker") or addr, broker_role=body.get("role")
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        text = data[:200].decode("utf-8", "replace")
        code = ResponseCode.SYSTEM_ERROR if status >= 500 else ResponseCode.INVALID_PARAMETER
        return BrokerError.for_code(int(code), f"HTTP {status}: {text}", broker_addr=addr)
