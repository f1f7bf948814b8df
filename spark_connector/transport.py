"""The connector's wire access: routes, raw pulls, raw sends, queue offsets, consumer-offset reports, a pool.

The reader needs the *raw* record bytes of each pull (decoding them to ``MessageExt`` objects first would cost
more than the whole Arrow conversion), explicit control over which member of a broker group answers, and route
snapshots it can ship inside Spark partitions. So it speaks docs/PROTOCOL.md directly, using only the shared
protocol modules of ``client`` (``wire`` for the binary pull head and JSON errors, ``route`` for routes) and the
SDK's fast HTTP/1.1 transport. Member choice follows the SDK's pure rules (``client._routing``).

:class:`BrokerClient` is one process-wide client per nameserver list; :func:`pooled_client` hands out the
module-level instance of the current Python worker, so later tasks reuse its connections and its per-queue
broker hints (the ``pullFromWhichNodeTable`` of a long-running consumer).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol
from urllib.parse import quote

import httpx

from client._transport import SyncTransport
from client.errors import (
    BrokerConnectError,
    BrokerError,
    ClientError,
    ProtocolViolationError,
    RequestTimeoutError,
    RouteNotFoundError,
)
from client.protocol import wire
from client.protocol.codes import PullStatus, PullSysFlag, ResponseCode
from client.protocol.message import MessageQueue
from client.protocol.route import TopicRouteData
from spark_connector.offsets import QueueKey

log = logging.getLogger(__name__)

__all__ = ["BrokerClient", "RawPull", "close_pool", "pooled_client"]

#: Consumer group named in pull requests when the user gave none (brokers auto-create subscription groups).
DEFAULT_READER_GROUP = "spark-rocketmq-reader"
_CONTROL_TIMEOUT_S = 5.0


class RawPull(NamedTuple):
    """One pull answer with its records left as stored bytes."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    served_by_broker_id: int
    n_records: int
    records: memoryview
    """The ``n_records`` stored records back to back (commit-log layout)."""


def _q(value: str) -> str:
    return quote(value, safe="")


class _Answer(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...


class BrokerClient:
    """Routes, pulls and offset queries for one nameserver list (thread-safe; one per worker process).

    Args:
        namesrv_addr: ``;``-joined nameserver addresses.
        http: the HTTP client (tests inject one with a mock transport).
    """

    def __init__(self, namesrv_addr: str, *, http: httpx.Client | None = None) -> None:
        self.namesrv_addrs = [a for a in namesrv_addr.split(";") if a]
        if not self.namesrv_addrs:
            raise ValueError("nameserver address list is empty")
        # pulls and sends go through the SDK transport's raw exchange, which skips httpx's request and response
        # models (~100 us of CPU per request); an injected client (tests) is used as it is
        self._raw: SyncTransport | None = None
        if http is None:
            self._raw = SyncTransport(max_connections_per_host=64, max_idle_per_host=8)
            http = httpx.Client(transport=self._raw)
        self._http = http
        self._lock = threading.Lock()
        self._routes: dict[str, TopicRouteData] = {}
        self._hints: dict[QueueKey, int] = {}
        self._closed = False

    # --- routes -------------------------------------------------------------------------------------------

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The topic's route (cached; ``refresh`` asks the nameservers again).

        Raises:
            RouteNotFoundError: no nameserver knows the topic.
            BrokerConnectError: no nameserver answered.
        """
        if not refresh:
            cached = self._routes.get(topic)
            if cached is not None:
                return cached
        last: ClientError | None = None
        for ns in self.namesrv_addrs:
            try:
                resp = self._http.get(f"http://{ns}/route?topic={_q(topic)}", timeout=_CONTROL_TIMEOUT_S)
            except httpx.HTTPError as e:
                last = _transport_error(e, ns, f"route of {topic} from nameserver {ns}")
                continue
            if resp.status_code != 200:
                err = wire.decode_error(resp.status_code, resp.content, addr=ns)
                if err.code == ResponseCode.TOPIC_NOT_EXIST:
                    raise RouteNotFoundError(f"No route info of this topic: {topic} (nameserver {ns})")
                raise err
            try:
                route = TopicRouteData.from_json(json.loads(resp.content))
            except (ValueError, KeyError, TypeError) as e:
                raise ProtocolViolationError(f"nameserver {ns} answered a malformed route: {e}") from None
            with self._lock:
                self._routes[topic] = route
            return route
        assert last is not None
        raise last

    def broker_addrs(self, topic: str, broker_name: str, *, refresh: bool = False) -> dict[int, str]:
        """``{brokerId: addr}`` of one broker group from the topic's route (empty when absent)."""
        data = self.route(topic, refresh=refresh).broker_data(broker_name)
        return dict(data.broker_addrs) if data else {}

    # --- hints (pullFromWhichNodeTable) ------------------------------------------------------------------

    def hint(self, key: QueueKey) -> int:
        """The broker id the last pull of ``key`` suggested (0 = master when never pulled)."""
        return self._hints.get(key, 0)

    def set_hint(self, key: QueueKey, broker_id: int) -> None:
        self._hints[key] = broker_id

    def _exchange(self, method: str, addr: str, target: str, body: bytes, timeout_s: float) -> _Answer:
        """One data-path request; raises ``httpx.HTTPError`` like httpx does."""
        raw = self._raw
        if raw is not None:
            host, _, port = addr.rpartition(":")
            return raw.exchange(method, host, int(port), target, body, timeout=timeout_s)
        return self._http.request(method, f"http://{addr}{target}", content=body, timeout=timeout_s)

    # --- data path ----------------------------------------------------------------------------------------

    def pull(
        self, addr: str, key: QueueKey, offset: int, *, max_nums: int, max_bytes: int, sub_expression: str,
        group: str, timeout_s: float,
    ) -> RawPull:
        """One ``GET /pull`` without long polling; the records stay raw.

        Raises:
            TransportError: no answer (connect error or timeout).
            BrokerError: the broker answered an error code.
        """
        target = (
            f"/pull?group={_q(group)}&topic={_q(key.topic)}&queueId={key.queue_id}&offset={offset}"
            f"&maxNums={max_nums}&maxBytes={max_bytes}&sysFlag={int(PullSysFlag.SUBSCRIPTION)}"
            f"&subExpression={_q(sub_expression)}"
        )
        try:
            resp = self._exchange("GET", addr, target, b"", timeout_s)
        except httpx.HTTPError as e:
            raise _transport_error(e, addr, f"pull of {key} at {offset} from {addr}") from None
        if resp.status_code != 200:
            raise wire.decode_error(resp.status_code, resp.content, addr=addr)
        data = memoryview(resp.content)
        head = wire.decode_pull_header(data)
        status = PullStatus.from_code(head.code)
        if status is None:
            raise BrokerError.for_code(head.code, f"pull of {key} answered code {head.code}", broker_addr=addr)
        return RawPull(status, head.next_begin_offset, head.min_offset, head.max_offset,
                       head.suggest_which_broker_id, head.served_by_broker_id, head.count,
                       data[wire.PULL_HEAD.size:])

    def send(
        self, addr: str, mq: MessageQueue, group: str, body: bytes, *, timeout_s: float,
        default_topic_queue_nums: int | None = None,
    ) -> wire.SendReply:
        """One ``POST /send`` of a send-batch body to ``mq`` at the master ``addr``.

        Raises:
            TransportError: no answer (connect error or timeout).
            BrokerError: the broker answered an error code.
            ProtocolViolationError: the answer is not a send reply.
        """
        target = f"/send?topic={_q(mq.topic)}&queueId={mq.queue_id}&group={_q(group)}"
        if default_topic_queue_nums is not None:
            target += f"&defaultTopicQueueNums={default_topic_queue_nums}"
        try:
            resp = self._exchange("POST", addr, target, body, timeout_s)
        except httpx.HTTPError as e:
            raise _transport_error(e, addr, f"send of {len(body)} bytes to {mq} at {addr}") from None
        if resp.status_code != 200:
            raise wire.decode_error(resp.status_code, resp.content, addr=addr)
        return wire.decode_send_reply(resp.content)

    def queue_offset(self, addr: str, kind: str, key: QueueKey, *, timestamp_ms: int | None = None) -> int:
        """``min``, ``max`` or ``search`` (by store time) offset of a queue on one broker.

        Raises:
            TransportError: no answer.
            BrokerError: the broker answered an error code.
        """
        url = f"http://{addr}/offset/{kind}?topic={_q(key.topic)}&queueId={key.queue_id}"
        if timestamp_ms is not None:
            url += f"&timestamp={timestamp_ms}"
        try:
            resp = self._http.get(url, timeout=_CONTROL_TIMEOUT_S)
        except httpx.HTTPError as e:
            raise _transport_error(e, addr, f"{kind} offset of {key} from {addr}") from None
        if resp.status_code != 200:
            raise wire.decode_error(resp.status_code, resp.content, addr=addr)
        try:
            return int(json.loads(resp.content)["offset"])
        except (ValueError, KeyError, TypeError):
            raise ProtocolViolationError(f"{addr} answered a malformed offset: {resp.content[:200]!r}") from None

    def commit_offsets(self, addr: str, group: str, offsets: Iterable[tuple[QueueKey, int]]) -> None:
        """``POST /offset/consumer``: store ``group``'s consumer offsets on one broker.

        Raises:
            TransportError: no answer.
            BrokerError: the broker answered an error code.
        """
        body = {"group": group,
                "offsets": [{"topic": k.topic, "queueId": k.queue_id, "offset": o} for k, o in offsets]}
        try:
            resp = self._http.post(f"http://{addr}/offset/consumer", content=json.dumps(body).encode(),
                                   headers={"content-type": "application/json"}, timeout=_CONTROL_TIMEOUT_S)
        except httpx.HTTPError as e:
            raise _transport_error(e, addr, f"consumer offset commit to {addr}") from None
        if resp.status_code != 200:
            raise wire.decode_error(resp.status_code, resp.content, addr=addr)

    def close(self) -> None:
        """Close the HTTP connections (idempotent)."""
        if not self._closed:
            self._closed = True
            self._http.close()


def _transport_error(exc: httpx.HTTPError, addr: str, what: str) -> ClientError:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return RequestTimeoutError(f"{what}: timed out", broker_addr=addr)
    return BrokerConnectError(f"{what}: {type(exc).__name__}: {exc}", broker_addr=addr)


# --- the per-worker pool --------------------------------------------------------------------------------

#: One client per (nameserver list, client options) in this Python process. Spark reuses Python workers
#: across tasks and queries, so connections and broker hints outlive a single task.
_POOL: dict[tuple[str, tuple[tuple[str, str], ...]], BrokerClient] = {}
_POOL_LOCK = threading.Lock()
_POOL_MAX = 16


def pooled_client(namesrv_addr: str, client_options: Mapping[str, str] | None = None) -> BrokerClient:
    """This process's shared :class:`BrokerClient` for ``namesrv_addr`` (created on first use)."""
    key = (namesrv_addr, tuple(sorted((client_options or {}).items())))
    with _POOL_LOCK:
        c = _POOL.get(key)
        if c is None:
            if len(_POOL) >= _POOL_MAX:  # bound the pool: drop the oldest client
                _, old = next(iter(_POOL.items()))
                _POOL.pop(next(iter(_POOL)))
                old.close()
            c = _POOL[key] = BrokerClient(namesrv_addr)
        return c


def close_pool() -> None:
    """Close every pooled client (registered with ``atexit``; Spark never calls ``stop()`` reliably)."""
    with _POOL_LOCK:
        clients = list(_POOL.values())
        _POOL.clear()
    for c in clients:
        try:
            c.close()
        except Exception:  # closing at exit must not raise
            log.debug("closing a pooled client failed", exc_info=True)


atexit.register(close_pool)
