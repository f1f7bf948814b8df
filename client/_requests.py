"""Requests and answers of the SDK as pure functions: URLs in, parsed results or client errors out.

The sync and async shells (``_instance``, ``_producer``, ``_consumer``, ``_admin``) only move bytes; everything
they send is built here and everything they receive is read here, following docs/PROTOCOL.md. URLs are built as
strings (httpx's ``params=`` costs ~50 µs a request on the data path).

Operations that need I/O are written once, as generators (:data:`Op`) that yield :class:`Exchange` requests;
the instances' ``drive`` runs them, blocking or on the event loop.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import attrs
import httpx

from client._http11 import RawResponse, TlsHandshakeError
from common import codec, wire
from common.codes import PullStatus, ResponseCode, SendStatus
from common.errors import (
    BrokerConnectError,
    BrokerError,
    ClientError,
    NameServerUnavailableError,
    ProtocolViolationError,
    RequestTimeoutError,
    TlsError,
    TransportError,
)
from common.lazy import LazyFields, read_fields_with
from common.message import MessageExt, MessageQueue
from common.requests import SendRequestHeader, quote_arg
from common.route import TopicRouteData
from common.selector import MessageSelector

__all__ = ["Answer", "Exchange", "Op", "PullResult", "RawPullResult", "RawSendResult", "SendResult", "call_op"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: A response as the data path reads it: ``status_code`` and ``content`` (httpx's, or the SDK transport's raw one).
Answer = httpx.Response | RawResponse


@attrs.frozen
class SendResult:
    """What the broker answered for one message (RocketMQ ``SendResult``)."""

    send_status: SendStatus
    """``SEND_OK`` or one of the stored-but-not-fully-durable statuses (codes 10, 11, 12)."""
    msg_id: str
    """The client unique id (``UNIQ_KEY``)."""
    message_queue: MessageQueue
    """The queue the message was stored in."""
    queue_offset: int
    """Its logical offset in that queue."""
    offset_msg_id: str
    """Broker msgId: store host + commit-log offset."""


@attrs.frozen
class PullResult:
    """One pull's answer (RocketMQ ``PullResult`` plus the id of the member that served it)."""

    pull_status: PullStatus
    """FOUND, NO_NEW_MSG, NO_MATCHED_MSG or OFFSET_ILLEGAL."""
    next_begin_offset: int
    """Offset to pull next."""
    min_offset: int
    """Queue's smallest offset on the serving broker."""
    max_offset: int
    """Queue's max offset (one past the last message) on the serving broker."""
    msg_found_list: list[MessageExt]
    """Messages found (empty unless FOUND)."""
    suggest_which_broker_id: int
    """Which member the broker suggests for the next pull of this queue."""
    served_by_broker_id: int
    """Which member served this pull (0 = master)."""


#: Percent-encode a query value (topic names may hold ``%`` and ``|``).
q = quote_arg


class RawPullResult(NamedTuple):
    """One pull's answer with its records left as stored bytes (the low-level pull, :mod:`client.lowlevel`).

    A tuple because a reader builds one per request on its data path.
    """

    status: PullStatus
    """FOUND, NO_NEW_MSG, NO_MATCHED_MSG or OFFSET_ILLEGAL."""
    next_begin_offset: int
    """Offset to pull next."""
    min_offset: int
    """Queue's smallest offset on the serving broker."""
    max_offset: int
    """Queue's max offset (one past the last message) on the serving broker."""
    suggest_which_broker_id: int
    """Which member the broker suggests for the next pull of this queue."""
    served_by_broker_id: int
    """Which member answered (0 = master)."""
    n_records: int
    """How many records ``records`` holds."""
    records: memoryview
    """The ``n_records`` stored records back to back (commit-log layout, :mod:`common.codec`)."""


@attrs.frozen
class RawSendResult:
    """What the broker answered for one already-encoded batch (the low-level send, :mod:`client.lowlevel`)."""

    message_queue: MessageQueue
    """The queue the batch was stored in."""
    reply: wire.SendReply
    """The broker's reply: code, first queue offset, store host and each message's commit-log offset."""

    @property
    def send_status(self) -> SendStatus:
        """``SEND_OK``, or one of the stored-but-not-fully-durable statuses (codes 10, 11, 12)."""
        return SendStatus.from_code(self.reply.code)


@functools.lru_cache(maxsize=1024)
def split_addr(addr: str) -> tuple[str, int]:
    """``("host", port)`` of a ``host:port`` server address (IPv6 hosts in brackets lose them).

    Raises:
        httpx.ConnectError: the port is not a number (reported like any failure to reach the server).
    """
    host, sep, port = addr.rpartition(":")
    if not sep or host.endswith(":"):
        return addr.strip("[]"), 80  # as httpx reads a URL without a port
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise httpx.ConnectError(f"server address {addr!r} is not host:port") from None


def map_transport_error(exc: httpx.HTTPError, addr: str, what: str) -> ClientError:
    """A client error for an httpx failure talking to ``addr`` (``what`` names the peer and request); its
    ``request_sent`` is False when no connection was made (the request never left)."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return RequestTimeoutError(f"{what}: {exc}", broker_addr=addr)
    err: TransportError
    if isinstance(exc, TlsHandshakeError):
        err = TlsError(f"{what}: {exc}", broker_addr=addr)
    elif isinstance(exc, httpx.PoolTimeout):
        err = RequestTimeoutError(f"{what}: {exc}", broker_addr=addr)
    else:
        err = BrokerConnectError(f"{what}: {type(exc).__name__}: {exc}", broker_addr=addr)
    err.request_sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    return err


def nameservers_unavailable(failures: Mapping[str, ClientError]) -> NameServerUnavailableError:
    """The error when no nameserver answered: each one and why, and what to check first."""
    each = "; ".join(e.message if addr in e.message else f"{addr}: {e.message}" for addr, e in failures.items())
    return NameServerUnavailableError(
        f"no nameserver answered at {';'.join(failures)}: is a nameserver running there? (a local cluster prints "
        f"its address as namesrv=...). {each}")


def raise_for_status(resp: Answer, addr: str) -> None:
    """Raise the client error a non-200 answer carries."""
    if resp.status_code != 200:
        raise wire.decode_error(resp.status_code, resp.content, addr=addr)


def json_of(resp: Answer, addr: str) -> dict[str, Any]:
    """The JSON object of a 200 answer (errors raised as client errors)."""
    raise_for_status(resp, addr)
    try:
        obj = json.loads(resp.content)
    except ValueError as e:
        raise ProtocolViolationError(f"{addr} answered invalid JSON: {e}", broker_addr=addr) from None
    if not isinstance(obj, dict):
        raise ProtocolViolationError(f"{addr} answered JSON that is not an object", broker_addr=addr)
    return obj


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# --- operations ------------------------------------------------------------------------------------------


class Exchange(NamedTuple):
    """One request an operation asks its driver to make (see :data:`Op`)."""

    method: str
    """``GET`` or ``POST``."""
    addr: str
    """``host:port`` of the server."""
    target: str
    """Path and query, already percent-encoded."""
    body: bytes = b""
    """Request body."""
    timeout: float | None = None
    """Data path: seconds for each of connect, pool wait, write and read. None: a control-plane request, bounded
    by :class:`~client.ClientConfig`'s ``request_timeout_s`` and ``connect_timeout_s``."""


#: A sans-I/O operation returning ``T``: a generator that yields each :class:`Exchange` it needs and gets the
#: answer sent back -- or the transport's exception (an ``httpx.HTTPError``) thrown in at the ``yield``.
#: ``ClientInstance.drive`` and ``AsyncClientInstance.drive`` run one, so the logic of an operation (retries,
#: failover, read/write split) is written once for both; operations compose with ``yield from``.
Op = Generator[Exchange, Answer, T]


def call_op(method: str, addr: str, target: str, what: str, parse: Callable[[Answer, str], T], body: bytes = b"",
            timeout: float | None = None) -> Op[T]:
    """One request to ``addr``, its answer read by ``parse(answer, addr)``.

    Raises:
        TransportError: the request failed (``what`` names it in the message).
        ClientError: whatever ``parse`` raises for the answer.
    """
    try:
        resp = yield Exchange(method, addr, target, body, timeout)
    except httpx.HTTPError as e:
        raise map_transport_error(e, addr, what) from None
    return parse(resp, addr)


# --- nameserver -------------------------------------------------------------------------------------------


def route_target(topic: str) -> str:
    return f"/route?topic={q(topic)}"


def parse_route(resp: Answer, addr: str) -> TopicRouteData | None:
    """The route, or None when the nameserver says TOPIC_NOT_EXIST."""
    if resp.status_code != 200:
        err = wire.decode_error(resp.status_code, resp.content, addr=addr)
        if err.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        raise err
    try:
        return TopicRouteData.from_json(json_of(resp, addr))
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolViolationError(f"nameserver {addr} answered a malformed route: {e}", broker_addr=addr) from None


def _subscription(topic: str, selector: MessageSelector | None) -> dict[str, str]:
    # TAG subscriptions are announced as "*" (the consumer filters its pulls); an SQL92 one with its expression
    # and type, so the broker can say at once that it would refuse it.
    if selector is not None and selector.is_sql:
        return {"topic": topic, "expression": selector.expression, "expressionType": selector.expression_type}
    return {"topic": topic, "expression": "*"}


def heartbeat_body(client_id: str, producer_groups: Iterable[str], consumer_groups: dict[str, set[str]], *,
                   heartbeat_timeout_ms: int | None = None,
                   selectors: Mapping[str, Mapping[str, MessageSelector]] | None = None) -> bytes:
    sel = selectors or {}
    return dumps({
        "clientId": client_id,
        **({"heartbeatTimeoutMs": heartbeat_timeout_ms} if heartbeat_timeout_ms else {}),
        "producerGroups": sorted(producer_groups),
        "consumerGroups": [
            {"group": g, "messageModel": "CLUSTERING",
             "subscriptions": [_subscription(t, sel.get(g, {}).get(t)) for t in sorted(topics)]}
            for g, topics in sorted(consumer_groups.items())
        ],
    })


def warn_refused_subscriptions(resp: Answer, addr: str) -> None:
    """Log what a heartbeat's answer says the broker will refuse to serve (an SQL92 subscription to a broker
    with ``enablePropertyFilter=false``): the pulls fail with the same error, this says so once per heartbeat."""
    if not resp.content or resp.content == b"{}":
        return
    try:
        refused = json.loads(resp.content).get("refusedSubscriptions") or []
    except (ValueError, AttributeError):
        return
    for r in refused[:8] if isinstance(refused, list) else ():
        if isinstance(r, dict):
            log.warning("broker %s will refuse the subscription of group %s to %s: [code=%s] %s", addr,
                        r.get("group"), r.get("topic"), r.get("code"), r.get("remark"))


def unregister_body(client_id: str, *, producer_groups: Iterable[str] = (), consumer_groups: Iterable[str] = ()
                    ) -> bytes:
    return dumps({"clientId": client_id, "producerGroups": sorted(producer_groups),
                  "consumerGroups": sorted(consumer_groups)})


# --- send -------------------------------------------------------------------------------------------------


def send_url(addr: str, topic: str, queue_id: int, group: str) -> str:
    """URL of a ``POST /send`` (:class:`~common.requests.SendRequestHeader`)."""
    return f"http://{addr}{SendRequestHeader(topic, queue_id, group).target()}"


def parse_send(resp: Answer, addr: str, expected: int) -> wire.SendReply:
    """The send reply; broker errors raised as :class:`BrokerError` subclasses.

    Raises:
        ProtocolViolationError: the reply does not cover ``expected`` messages or has an unknown code.
    """
    raise_for_status(resp, addr)
    reply = wire.decode_send_reply(resp.content)
    if len(reply.commit_log_offsets) != expected:
        raise ProtocolViolationError(
            f"{addr} stored {len(reply.commit_log_offsets)} messages of a batch of {expected}", broker_addr=addr
        )
    if reply.code not in (0, 10, 11, 12):
        raise BrokerError.for_code(reply.code, f"send answered code {reply.code}", broker_addr=addr)
    return reply


def send_results(reply: wire.SendReply, mq: MessageQueue, uniq_keys: Sequence[str]) -> list[SendResult]:
    """One SendResult per message of a stored batch, each with its own offsets (read from the reply when used)."""
    status = SendStatus.from_code(reply.code)
    if reply.placements:  # an idempotent send answered partly from earlier copies: each message's own place
        host, places = reply.store_host, reply.placements
        return [SendResult(status, key, mq if mq.queue_id == places[2 * i] else
                           MessageQueue(mq.topic, mq.broker_name, places[2 * i]), places[2 * i + 1],
                           codec.create_offset_msg_id(host, offset))
                for i, (key, offset) in enumerate(zip(uniq_keys, reply.commit_log_offsets, strict=True))]
    queue = mq if mq.queue_id == reply.queue_id else MessageQueue(mq.topic, mq.broker_name, reply.queue_id)
    # codec.create_offset_msg_id, its host part written once per batch
    batch = (status, queue, uniq_keys, reply.queue_offset, reply.store_host.hex().upper(), reply.commit_log_offsets)
    new, cls, set_state = object.__new__, _BatchSendResult, _set_batch_state
    out: list[SendResult] = []
    append = out.append
    for at in range(len(reply.commit_log_offsets)):
        r = new(cls)
        set_state(r, (batch, at))
        append(r)
    return out


_U64 = 0xFFFFFFFFFFFFFFFF


class _BatchSendResult(LazyFields, SendResult):
    """A :class:`SendResult` of a stored batch that reads its fields from the batch's reply when they are used.

    Five fields set through the frozen class's ``__init__`` cost a batch of 64 more than encoding it, and a sender
    often reads none of them. To every caller it is a SendResult (:class:`~common.lazy.LazyFields`).
    """

    __slots__ = ("_state",)
    _state: tuple[tuple[SendStatus, MessageQueue, Sequence[str], int, str, tuple[int, ...]], int]
    """``((status, queue, unique ids, first queue offset, store host as hex, commit-log offsets), index)``."""


_set_batch_state = _BatchSendResult._state.__set__  # type: ignore[attr-defined]  # the slot, past the frozen setattr


def _batch_offset_msg_id(r: _BatchSendResult) -> str:
    batch, at = r._state
    return f"{batch[4]}{batch[5][at] & _U64:016X}"


# Each field of SendResult, read from the batch (properties set here, where mypy does not see them override the
# fields).
read_fields_with(_BatchSendResult, SendResult, {
    "send_status": lambda r: r._state[0][0],
    "message_queue": lambda r: r._state[0][1],
    "msg_id": lambda r: r._state[0][2][r._state[1]],
    "queue_offset": lambda r: r._state[0][3] + r._state[1],
    "offset_msg_id": _batch_offset_msg_id,
}, "the batch's reply")


# --- pull -------------------------------------------------------------------------------------------------


def parse_pull(resp: Answer, addr: str, mq: MessageQueue) -> PullResult:
    """Decode a pull answer: the binary head, then the records (bodies copied once). A large answer is read where
    the transport received it (:meth:`RawResponse.body_view`): the records copy out what they keep."""
    raise_for_status(resp, addr)
    data = resp.body_view() if isinstance(resp, RawResponse) else resp.content
    head = wire.decode_pull_header(data)
    status = PullStatus.from_code(head.code)
    if status is None:
        raise BrokerError.for_code(head.code, f"pull of {mq} answered code {head.code}", broker_addr=addr)
    msgs = codec.decode_records(data, broker_name=mq.broker_name, offset=wire.PULL_HEAD.size) if head.count else []
    if len(msgs) != head.count:
        raise ProtocolViolationError(f"pull of {mq}: head says {head.count} records, body holds {len(msgs)}",
                                     broker_addr=addr)
    return PullResult(status, head.next_begin_offset, head.min_offset, head.max_offset, msgs,
                      head.suggest_which_broker_id, head.served_by_broker_id)


def parse_pull_raw(resp: Answer, addr: str, mq: MessageQueue) -> RawPullResult:
    """Decode a pull answer's head; the records stay as the broker sent them.

    Raises:
        BrokerError: an error answer, or a code that is not a pull status.
    """
    raise_for_status(resp, addr)
    data = memoryview(resp.content)
    head = wire.decode_pull_header(data)
    status = PullStatus.from_code(head.code)
    if status is None:
        raise BrokerError.for_code(head.code, f"pull of {mq} answered code {head.code}", broker_addr=addr)
    return RawPullResult(status, head.next_begin_offset, head.min_offset, head.max_offset,
                         head.suggest_which_broker_id, head.served_by_broker_id, head.count,
                         data[wire.PULL_HEAD.size:])


# --- offsets ----------------------------------------------------------------------------------------------


def offset_url(addr: str, kind: str, mq: MessageQueue, *, group: str | None = None, timestamp_ms: int | None = None) -> str:
    return f"http://{addr}{offset_target(kind, mq, group=group, timestamp_ms=timestamp_ms)}"


def offset_target(kind: str, mq: MessageQueue, *, group: str | None = None, timestamp_ms: int | None = None) -> str:
    """Path and query of a ``GET /offset/<kind>`` (``min``, ``max``, ``search``, ``consumer``)."""
    target = f"/offset/{kind}?topic={q(mq.topic)}&queueId={mq.queue_id}"
    if group is not None:
        target += f"&group={q(group)}"
    if timestamp_ms is not None:
        target += f"&timestamp={timestamp_ms}"
    return target


def parse_offset(resp: Answer, addr: str) -> int:
    obj = json_of(resp, addr)
    try:
        return int(obj["offset"])
    except (KeyError, TypeError, ValueError):
        raise ProtocolViolationError(f"{addr} answered an offset without 'offset': {obj!r:.200}",
                                     broker_addr=addr) from None


def commit_offset_body(group: str, mq: MessageQueue, offset: int) -> bytes:
    return commit_offsets_body(group, [(mq, offset)])


def commit_offsets_body(group: str, offsets: Iterable[tuple[MessageQueue, int]]) -> bytes:
    """The ``POST /offset/consumer`` body storing ``group``'s offset of each queue."""
    return dumps({"group": group,
                  "offsets": [{"topic": mq.topic, "queueId": mq.queue_id, "offset": o} for mq, o in offsets]})
