"""The process-wide client instance: route cache, nameserver failover, heartbeats (RocketMQ ``MQClientInstance``).

One instance per nameserver list (per event loop for the async one) is shared by every producer, consumer and
admin of the process; each user holds a reference and the instance closes when the last one lets go.

* Routes: cached per topic, refreshed every ``poll_name_server_interval_s`` (30 s) and on demand. One nameserver
  is asked at a time (random start, the next one on failure). When every nameserver is down, or a nameserver says
  TOPIC_NOT_EXIST, the cached route stays (docs/BEHAVIOUR.md 6.6), so clients keep working on what they knew.
* Heartbeats: ``POST /heartbeat`` every ``heartbeat_broker_interval_s`` to every master, and to slaves too when
  a consumer uses the instance.
* Background work: a daemon thread waiting on an Event (sync) or an asyncio task (async); both stop at close.

The two classes are thin I/O shells over :class:`_InstanceCore`, which holds the state, the decisions and the
operations (route fetch with nameserver failover, heartbeats) as generators; each class's ``drive`` runs an
operation, blocking or on the event loop, and every producer, consumer and low-level client runs its own
operations (send with retries, pull with the read/write split) the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import http.cookiejar
import itertools
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs
import httpx

from client import _requests as rq
from client._requests import Exchange, Op
from client._routing import (
    DEFAULT_TOPIC,
    BrokerDownTable,
    FindBrokerResult,
    NameServerSelector,
    RouteCache,
    TopicPublishInfo,
    normalize_namesrv_addr,
)
from client._transport import AsyncTransport, SyncTransport
from common.errors import (
    AccessDeniedError,
    ClientClosedError,
    ClientError,
    NameServerUnavailableError,
    RouteNotFoundError,
    TlsError,
)
from common.message import MessageQueue
from common.route import TopicRouteData
from common.selector import MessageSelector
from common.signing import Credentials, RequestSigner, SigningAuth
from common.tls import client_context

__all__ = ["AsyncClientInstance", "ClientConfig", "ClientInstance", "ClientState", "with_credentials"]

log = logging.getLogger(__name__)

_client_ids = itertools.count(1)

T = TypeVar("T")


class ClientState(enum.Enum):
    """Lifecycle of producers, consumers, admins and client instances."""

    UNOPENED = "UNOPENED"
    OPENED = "OPENED"
    CLOSED = "CLOSED"


def _positive(_: Any, attribute: Any, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class ClientConfig:
    """Settings of a client instance (the first user of a nameserver list decides them)."""

    poll_name_server_interval_s: float = attrs.field(default=30.0, validator=_positive)
    """Period of the route refresh of every topic in use (RocketMQ ``pollNameServerInterval``)."""
    heartbeat_broker_interval_s: float = attrs.field(default=30.0, validator=_positive)
    """Period of the heartbeats to brokers."""
    heartbeat_timeout_s: float | None = None
    """Silence after which brokers drop this client from its groups, announced in every heartbeat (so a killed
    consumer's queues move to the others within it). None: two heartbeat periods."""
    request_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    """Bound on a control-plane request (routes, heartbeats, offsets, admin)."""
    connect_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    """Bound on opening a connection."""
    broker_down_isolation_s: float = attrs.field(default=5.0, validator=_positive)
    """How long a consumer avoids a member it could not reach (pulls go to another member meanwhile)."""
    default_topic_queue_nums: int = attrs.field(default=4, validator=_positive)
    """Queues per group of a topic auto-created through the ``TBW102`` route."""
    max_connections_per_host: int = attrs.field(default=64, validator=_positive)
    """Open connections to one server at most."""
    close_timeout_s: float = attrs.field(default=1.0, validator=_positive)
    """Bound on waiting for the background refresh to stop at close."""
    credentials: Credentials | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Credentials)))
    """The account every request is signed with (docs/SECURITY.md); None sends unsigned requests. Unlike the
    other fields it is part of the shared instance's key: two accounts in one process never share an instance."""
    metrics: bool = True
    """Collect client metrics (``stats()``, OpenTelemetry; docs/METRICS.md). False skips even the counters."""
    meter_provider: Any = None
    """The OpenTelemetry ``MeterProvider`` of the metrics; None: the global one (the API's no-op until the
    application sets one). Needs the ``otel`` extra (``opentelemetry-api``)."""
    tls_ca_file: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    """PEM file of the CA that signed the servers' certificates (docs/SECURITY.md, TLS). Setting it turns TLS on
    for every connection of the client (nameservers and brokers alike: a cluster is all TLS or not at all),
    verifying each server's certificate and address against it. Part of the shared instance's key."""
    tls: bool = False
    """TLS on every connection, verified against the system trust store (implied by ``tls_ca_file``)."""

    @property
    def tls_enabled(self) -> bool:
        return self.tls or self.tls_ca_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of this client's connections, or None without TLS.

        Raises:
            client.tls.TlsConfigError: ``tls_ca_file`` is missing or not a PEM CA file.
        """
        return client_context(self.tls_ca_file) if self.tls_enabled else None

    @property
    def effective_heartbeat_timeout_ms(self) -> int:
        t = self.heartbeat_timeout_s if self.heartbeat_timeout_s is not None else 2 * self.heartbeat_broker_interval_s
        return max(1, int(t * 1000))

    def timeout(self, read_s: float | None = None) -> httpx.Timeout:
        read = self.request_timeout_s if read_s is None else read_s
        return httpx.Timeout(read, connect=min(self.connect_timeout_s, read), pool=read)


class _NoCookies(http.cookiejar.CookieJar):
    """SplitMQ servers set no cookies; skipping the jar saves ~10 µs of httpx work per request."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None


def with_credentials(client_config: ClientConfig | None, credentials: Credentials | None) -> ClientConfig | None:
    """``client_config`` carrying ``credentials`` (the ``credentials=`` keyword of every client class).

    Raises:
        ValueError: ``client_config`` already names another account.
    """
    if credentials is None:
        return client_config
    if not isinstance(credentials, Credentials):
        raise TypeError(f"credentials must be a client.Credentials, got {type(credentials).__name__}")
    cfg = client_config or ClientConfig()
    if cfg.credentials is not None and cfg.credentials != credentials:
        raise ValueError(f"credentials={credentials} conflicts with client_config.credentials={cfg.credentials}")
    return attrs.evolve(cfg, credentials=credentials)


def _instance_key(namesrv_addr: str, config: ClientConfig | None) -> tuple[str, Credentials | None]:
    """Shared instances are per nameserver list and account (an instance signs every request it makes), and per
    TLS setting (a client with another CA must not borrow connections another CA verified)."""
    if config is not None and config.tls_enabled:
        return f"{_registry_key(namesrv_addr)}|tls:{config.tls_ca_file or ''}", config.credentials
    return _registry_key(namesrv_addr), config.credentials if config is not None else None


def _registry_key(namesrv_addr: str) -> str:
    return normalize_namesrv_addr(namesrv_addr)


class _InstanceCore:
    """State, decisions and operations shared by the sync and async instances (no I/O here).

    The instance's I/O logic -- route fetch across nameservers, the ``TBW102`` fallback, heartbeats -- is written
    here once as operations (:data:`client._requests.Op`); each instance's ``drive`` runs them.
    """

    def __init__(self, namesrv_addr: str, config: ClientConfig, *, clock_ms: Callable[[], int] | None = None,
                 rng: random.Random | None = None) -> None:
        self.namesrv_addr = _registry_key(namesrv_addr)
        self.config = config
        self.clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.routes = RouteCache(default_topic_queue_nums=config.default_topic_queue_nums)
        self.nameservers = NameServerSelector.parse(self.namesrv_addr, rng=rng)
        self.broker_down = BrokerDownTable(isolation_ms=int(config.broker_down_isolation_s * 1000))
        self.client_id = f"127.0.0.1@{os.getpid()}#{next(_client_ids)}"
        self.producer_groups: collections.Counter[str] = collections.Counter()
        self.consumer_groups: dict[str, set[str]] = {}
        self.consumer_selectors: dict[str, dict[str, MessageSelector]] = {}
        """group -> topic -> SQL92 selector, announced in heartbeats (TAG subscriptions are announced as ``*``)."""
        self.topics_in_use: set[str] = set()
        self.route_asked_ms: dict[str, int] = {}
        """When each topic's route was last asked of the nameservers (``clock_ms``), answered or not."""
        self.route_refreshes: dict[str, int] = {}
        """Route reads from the nameservers per topic (client metrics)."""
        self.state = ClientState.OPENED
        self.refcount = 0
        self.last_nameserver_error: ClientError | None = None
        now = time.monotonic()
        self._next_poll = now + config.poll_name_server_interval_s
        self._next_heartbeat = now + 0.05  # RocketMQ heartbeats right after start

    # --- inspection: RocketMQ's MQClientInstance route lookups ---

    def find_broker_address_in_publish(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` in the cached routes, or None."""
        return self.routes.find_broker_address_in_publish(broker_name)

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int, only_this_broker: bool
    ) -> FindBrokerResult | None:
        """docs/BEHAVIOUR.md 3.3 over the cached routes (see :func:`client._routing.find_broker_address_in_subscribe`)."""
        return self.routes.find_broker_address_in_subscribe(broker_name, broker_id, only_this_broker)

    def topic_route(self, topic: str) -> TopicRouteData | None:
        """The cached route of ``topic``."""
        return self.routes.route(topic)

    def subscribe_queues(self, topic: str) -> tuple[MessageQueue, ...] | None:
        """The cached subscribe set of ``topic``."""
        return self.routes.subscribe_info(topic)

    def publish_info(self, topic: str) -> TopicPublishInfo | None:
        """The cached publish info of ``topic``."""
        return self.routes.publish_info(topic)

    # --- users ---

    def register_producer(self, group: str) -> None:
        """Heartbeat ``group`` as a producer group (counted: one per producer)."""
        self.producer_groups[group] += 1

    def unregister_producer(self, group: str) -> None:
        """One producer of ``group`` left."""
        self.producer_groups[group] -= 1
        if self.producer_groups[group] <= 0:
            del self.producer_groups[group]

    def register_consumer(self, group: str) -> None:
        """Heartbeat ``group`` as a consumer group (and heartbeat slaves too from now on)."""
        self.consumer_groups.setdefault(group, set())

    def consumer_uses_topic(self, group: str, topic: str, selector: MessageSelector | None = None) -> None:
        """``group`` subscribes ``topic`` (announced in the heartbeats, with ``selector`` when it is SQL92)."""
        self.consumer_groups.setdefault(group, set()).add(topic)
        if selector is not None and selector.is_sql:
            self.consumer_selectors.setdefault(group, {})[topic] = selector
        elif selector is not None:
            self.consumer_selectors.get(group, {}).pop(topic, None)

    def heartbeat_targets(self) -> list[str]:
        """Masters for producers; masters and slaves once a consumer is registered (docs/BEHAVIOUR.md 3.3)."""
        return [addr for _, _, addr in self.routes.all_broker_addrs(include_slaves=bool(self.consumer_groups))]

    def heartbeat_body(self) -> bytes:
        """The ``POST /heartbeat`` body announcing this instance's groups."""
        return rq.heartbeat_body(self.client_id, self.producer_groups, self.consumer_groups,
                                 heartbeat_timeout_ms=self.config.effective_heartbeat_timeout_ms,
                                 selectors=self.consumer_selectors)

    def check_open(self) -> None:
        """Raise ClientClosedError once the instance is closed."""
        if self.state is not ClientState.OPENED:
            raise ClientClosedError(f"client instance for {self.namesrv_addr} is closed")

    def no_route_error(self, topic: str) -> ClientError:
        """The error of a topic without a route: :class:`NameServerUnavailableError` when no nameserver answered
        the last time (a dead or wrong nameserver is not a missing topic), else RouteNotFoundError naming the last
        nameserver error."""
        last = self.last_nameserver_error
        if isinstance(last, NameServerUnavailableError):
            return last
        why = f" (last nameserver error: {last})" if last else ""
        return RouteNotFoundError(
            f"No route info of this topic: {topic}, nameservers {self.namesrv_addr}{why}: no broker serves topic "
            f"{topic!r}; create it first ('splitmq -n {self.namesrv_addr} topic create -t {topic}' or "
            f"Admin.create_topic({topic!r})): brokers create topics on a send only with autoCreateTopicEnable=true")

    # --- operations (run by drive) ---

    def fetch_route_op(self, topic: str) -> Op[TopicRouteData | None]:
        """``topic``'s route from the first nameserver that answers, starting with the current one; None when
        none does or one says TOPIC_NOT_EXIST (docs/BEHAVIOUR.md 6.6: the caller keeps what it knew)."""
        unreachable: dict[str, ClientError] = {}
        for addr in self.nameservers.rotation():
            try:
                route = rq.parse_route((yield Exchange("GET", addr, rq.route_target(topic))), addr)
            except httpx.HTTPError as e:
                self.last_nameserver_error = unreachable[addr] = rq.map_transport_error(
                    e, addr, f"nameserver {addr} route of {topic}")
                log.info("%s; trying the next nameserver", self.last_nameserver_error)
                continue
            except AccessDeniedError:
                raise  # the ACL: every nameserver would refuse this account the same way
            except ClientError as e:
                self.last_nameserver_error = e
                continue
            self.nameservers.settle(addr)
            self.last_nameserver_error = None
            return route
        if isinstance(self.last_nameserver_error, TlsError):
            raise self.last_nameserver_error  # a TLS setting to fix, not a route to wait for: say so at once
        if len(unreachable) == len(self.nameservers.addrs):
            self.last_nameserver_error = rq.nameservers_unavailable(unreachable)
        return None

    def update_route_op(self, topic: str) -> Op[bool]:
        """Fetch ``topic``'s route into the cache; True when the cached route changed (see
        :meth:`ClientInstance.update_topic_route_from_nameserver`)."""
        self.check_open()
        route = yield from self.fetch_route_op(topic)
        self.route_asked_ms[topic] = self.clock_ms()
        self.route_refreshes[topic] = self.route_refreshes.get(topic, 0) + 1
        if route is None:
            return False
        self.topics_in_use.add(topic)
        return self.routes.apply_route(topic, route)

    def update_all_routes_op(self) -> Op[None]:
        """Refresh every topic in use (the periodic job)."""
        for topic in sorted(self.topics_in_use):
            if self.state is not ClientState.OPENED:
                return
            yield from self.update_route_op(topic)

    def publish_info_op(self, topic: str) -> Op[TopicPublishInfo]:
        """Cached publish info, else the nameserver's route, else the ``TBW102`` route (auto-create).

        Raises:
            RouteNotFoundError: none of these yields a writable queue.
        """
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        yield from self.update_route_op(topic)
        self.topics_in_use.add(topic)
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        default = yield from self.fetch_route_op(DEFAULT_TOPIC)
        if default is not None:
            info = self.routes.apply_default_route(topic, default)
            if info.ok:
                return info
        raise self.no_route_error(topic)

    def subscribe_queues_op(self, topic: str) -> Op[tuple[MessageQueue, ...]]:
        """The subscribe set of ``topic`` (fetched when not cached).

        Raises:
            RouteNotFoundError: no nameserver knows the topic.
        """
        queues = self.routes.subscribe_info(topic)
        if queues is None:
            yield from self.update_route_op(topic)
            self.topics_in_use.add(topic)
            queues = self.routes.subscribe_info(topic)
        if queues is None:
            raise self.no_route_error(topic)
        return queues

    def _each_broker_op(self, path: str, body: bytes, what: str, targets: list[str],
                        on_answer: Callable[[rq.Answer, str], None] | None = None) -> Op[int]:
        """``POST path`` to each of ``targets``, best effort (each request bounded); how many answered."""
        ok = 0
        for addr in targets:
            try:
                answer = yield Exchange("POST", addr, path, body)
                rq.raise_for_status(answer, addr)
                if on_answer is not None:
                    on_answer(answer, addr)
                ok += 1
            except (httpx.HTTPError, ClientError) as e:
                log.debug("%s to %s failed: %s", what, addr, e)
        return ok

    def heartbeat_op(self) -> Op[int]:
        """One heartbeat to each target; how many brokers answered.

        A consumer group that leaves while the heartbeat is under way (a close on another thread or task) may have
        its unregister reach a broker before this heartbeat, which would list the group there again until the
        heartbeat timeout, keeping its queues from the other members. So a heartbeat that announced a group gone
        by the time its answers are in leaves it again, after them (RocketMQ orders the two with a lock)."""
        announced = set(self.consumer_groups)
        targets = self.heartbeat_targets()
        ok = yield from self._each_broker_op("/heartbeat", self.heartbeat_body(), "heartbeat", targets,
                                             rq.warn_refused_subscriptions)
        for group in sorted(announced.difference(self.consumer_groups)):
            yield from self._leave_op(group, targets)
        return ok

    def unregister_consumer_group_op(self, group: str) -> Op[None]:
        """Stop heartbeating ``group`` and leave it on every broker now, so the other instances rebalance without
        waiting for our heartbeat timeout."""
        targets = self.heartbeat_targets()
        self.consumer_groups.pop(group, None)
        self.consumer_selectors.pop(group, None)
        yield from self._leave_op(group, targets)

    def _leave_op(self, group: str, targets: list[str]) -> Op[int]:
        body = rq.unregister_body(self.client_id, consumer_groups=[group])
        return (yield from self._each_broker_op("/client/unregister", body, f"unregister of {group}", targets))

    def periodic_op(self) -> Op[None]:
        """The background jobs that are due: the route refresh and the heartbeats."""
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.config.poll_name_server_interval_s
            yield from self.update_all_routes_op()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_broker_interval_s
            yield from self.heartbeat_op()

    def periodic_wait_s(self) -> float:
        """Seconds until a background job is due."""
        return max(0.0, min(self._next_poll, self._next_heartbeat) - time.monotonic())


class ClientInstance(_InstanceCore):
    """The sync process-wide client (``producer.client`` / ``consumer.client``). Get one with :meth:`acquire`."""

    _registry: ClassVar[dict[tuple[str, Credentials | None], ClientInstance]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, namesrv_addr: str, config: ClientConfig | None = None, *,
                 transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(namesrv_addr, config or ClientConfig(), **kwargs)
        cfg = self.config
        transport = transport or SyncTransport(max_connections_per_host=cfg.max_connections_per_host,
                                               ssl_context=cfg.ssl_context())
        auth = SigningAuth(cfg.credentials) if cfg.credentials is not None else None
        self.http = httpx.Client(transport=transport, timeout=cfg.timeout(), cookies=_NoCookies(), auth=auth)
        self._raw = transport if isinstance(transport, SyncTransport) else None
        # The data path signs with the account's signer (its HMAC key set up once); None: requests go unsigned.
        self._signer = RequestSigner.of(cfg.credentials) if cfg.credentials is not None else None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, namesrv_addr: str, config: ClientConfig | None = None, *,
                transport: httpx.BaseTransport | None = None) -> ClientInstance:
        """The shared instance for ``namesrv_addr`` and ``config.credentials`` (created on first use), with one
        more reference.

        ``config``'s other fields and ``transport`` (tests inject ``httpx.MockTransport``) apply only when this
        call creates it.
        """
        key = _instance_key(namesrv_addr, config)
        with cls._registry_lock:
            inst = cls._registry.get(key)
            if inst is None or inst.state is not ClientState.OPENED:
                inst = cls(namesrv_addr, config, transport=transport)
                inst._start()
                cls._registry[key] = inst
            inst.refcount += 1
            return inst

    def release(self) -> None:
        """Drop one reference; the last one closes the instance."""
        with self._registry_lock:
            self.refcount -= 1
            if self.refcount > 0:
                return
            key = _instance_key(self.namesrv_addr, self.config)
            if self._registry.get(key) is self:
                del self._registry[key]
        self.close()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._background, name=f"splitmq-client-{self.client_id}",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the background refresh (bounded by ``close_timeout_s``) and close connections. Idempotent."""
        with self._lock:
            if self.state is ClientState.CLOSED:
                return
            self.state = ClientState.CLOSED
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.config.close_timeout_s)
        self.http.close()

    def _background(self) -> None:
        while not self._stop.wait(self.periodic_wait_s()):
            try:
                self.drive(self.periodic_op())
            except Exception as e:  # the loop must survive anything a server answers
                if not self._stop.is_set():
                    log.warning("client %s background refresh failed: %s", self.client_id, e)

    # --- I/O: the operations of _InstanceCore, run ---

    def update_topic_route_from_nameserver(self, topic: str) -> bool:
        """Fetch ``topic``'s route from a nameserver; True when the cached route changed.

        Tries each nameserver once, starting with the current one. TOPIC_NOT_EXIST and unreachable nameservers
        leave the cached route as it was.
        """
        return self.drive(self.update_route_op(topic))

    def update_all_routes(self) -> None:
        """Refresh every topic in use (the periodic job)."""
        self.drive(self.update_all_routes_op())

    def try_to_find_topic_publish_info(self, topic: str) -> TopicPublishInfo:
        """Cached publish info, else the nameserver's route, else the ``TBW102`` route (auto-create).

        Raises:
            RouteNotFoundError: none of these yields a writable queue.
        """
        return self.drive(self.publish_info_op(topic))

    def subscribe_queues_or_fetch(self, topic: str) -> tuple[MessageQueue, ...]:
        """The subscribe set of ``topic`` (fetched when not cached)."""
        return self.drive(self.subscribe_queues_op(topic))

    def unregister_consumer_group(self, group: str) -> None:
        """Leave ``group`` on every broker at once (best effort, each call bounded), so the other instances
        rebalance without waiting for our heartbeat timeout."""
        self.drive(self.unregister_consumer_group_op(group))

    def send_heartbeat_to_all_brokers(self) -> int:
        """One heartbeat to each target; returns how many brokers answered."""
        return self.drive(self.heartbeat_op())

    def exchange(self, method: str, addr: str, target: str, body: bytes = b"", timeout: float | None = None
                 ) -> rq.Answer:
        """One request to ``addr`` (``host:port``): a data-path one (``timeout`` given) through the SDK transport
        without httpx's models when this instance uses it, else through ``http`` (control-plane timeouts when
        ``timeout`` is None; tests inject other transports). Signed with ``config.credentials`` when set.

        Raises:
            httpx.HTTPError: the request failed (callers map it with :func:`client._requests.map_transport_error`).
        """
        raw = self._raw
        if raw is not None and timeout is not None:
            host, port = rq.split_addr(addr)
            signer = self._signer
            if signer is None:
                return raw.exchange(method, host, port, target, body, timeout=timeout)
            return raw.exchange(method, host, port, target, body, timeout=timeout, signer=signer)
        if timeout is None:
            return self.http.request(method, f"http://{addr}{target}", content=body)
        return self.http.request(method, f"http://{addr}{target}", content=body, timeout=timeout)

    def drive(self, op: Op[T]) -> T:
        """Run ``op`` to its end: make each request it yields and send the answer back in (a failed request's
        exception is thrown in at its ``yield``).

        Returns:
            What ``op`` returns.

        Raises:
            Exception: whatever ``op`` raises.
        """
        exchange = self.exchange
        try:
            req = next(op)
            while True:
                try:
                    answer = exchange(*req)
                except BaseException as e:
                    req = op.throw(e)
                else:
                    req = op.send(answer)
        except StopIteration as stop:
            return stop.value

    def __repr__(self) -> str:
        return f"ClientInstance({self.namesrv_addr!r}, state={self.state.value}, refs={self.refcount})"


class AsyncClientInstance(_InstanceCore):
    """The asyncio twin of :class:`ClientInstance`: one per nameserver list and event loop."""

    _registry: ClassVar[dict[tuple[str, Credentials | None, int], AsyncClientInstance]] = {}

    def __init__(self, namesrv_addr: str, config: ClientConfig | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(namesrv_addr, config or ClientConfig(), **kwargs)
        cfg = self.config
        transport = transport or AsyncTransport(max_connections_per_host=cfg.max_connections_per_host,
                                                ssl_context=cfg.ssl_context())
        auth = SigningAuth(cfg.credentials) if cfg.credentials is not None else None
        self.http = httpx.AsyncClient(transport=transport, timeout=cfg.timeout(), cookies=_NoCookies(), auth=auth)
        self._raw = transport if isinstance(transport, AsyncTransport) else None
        # The data path signs with the account's signer (its HMAC key set up once); None: requests go unsigned.
        self._signer = RequestSigner.of(cfg.credentials) if cfg.credentials is not None else None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._loop_key = 0

    @classmethod
    def acquire(cls, namesrv_addr: str, config: ClientConfig | None = None, *,
                transport: httpx.AsyncBaseTransport | None = None) -> AsyncClientInstance:
        """The shared instance for ``namesrv_addr`` and ``config.credentials`` on the running loop, with one more
        reference."""
        loop = asyncio.get_running_loop()
        key = (*_instance_key(namesrv_addr, config), id(loop))
        inst = cls._registry.get(key)
        if inst is None or inst.state is not ClientState.OPENED:
            inst = cls(namesrv_addr, config, transport=transport)
            inst._loop_key = id(loop)
            inst._task = loop.create_task(inst._background(), name=f"splitmq-client-{inst.client_id}")
            cls._registry[key] = inst
        inst.refcount += 1
        return inst

    async def release(self) -> None:
        """Drop one reference; the last one closes the instance."""
        self.refcount -= 1
        if self.refcount > 0:
            return
        key = (*_instance_key(self.namesrv_addr, self.config), self._loop_key)
        if self._registry.get(key) is self:
            del self._registry[key]
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the background task and close connections. Idempotent and bounded."""
        if self.state is ClientState.CLOSED:
            return
        self.state = ClientState.CLOSED
        self._stop.set()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), self.config.close_timeout_s)
            except (asyncio.CancelledError, TimeoutError):
                pass
            except Exception as e:
                log.debug("client background task ended with %s", e)
        await self.http.aclose()

    async def _background(self) -> None:
        while self.state is ClientState.OPENED:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.periodic_wait_s())
                return
            try:
                await self.drive(self.periodic_op())
            except Exception as e:
                if self.state is ClientState.OPENED:
                    log.warning("client %s background refresh failed: %s", self.client_id, e)

    async def update_topic_route_from_nameserver(self, topic: str) -> bool:
        """See :meth:`ClientInstance.update_topic_route_from_nameserver`."""
        return await self.drive(self.update_route_op(topic))

    async def update_all_routes(self) -> None:
        """See :meth:`ClientInstance.update_all_routes`."""
        await self.drive(self.update_all_routes_op())

    async def try_to_find_topic_publish_info(self, topic: str) -> TopicPublishInfo:
        """See :meth:`ClientInstance.try_to_find_topic_publish_info`."""
        return await self.drive(self.publish_info_op(topic))

    async def subscribe_queues_or_fetch(self, topic: str) -> tuple[MessageQueue, ...]:
        """See :meth:`ClientInstance.subscribe_queues_or_fetch`."""
        return await self.drive(self.subscribe_queues_op(topic))

    async def unregister_consumer_group(self, group: str) -> None:
        """See :meth:`ClientInstance.unregister_consumer_group`."""
        await self.drive(self.unregister_consumer_group_op(group))

    async def send_heartbeat_to_all_brokers(self) -> int:
        """See :meth:`ClientInstance.send_heartbeat_to_all_brokers`."""
        return await self.drive(self.heartbeat_op())

    async def exchange(self, method: str, addr: str, target: str, body: bytes = b"", timeout: float | None = None
                       ) -> rq.Answer:
        """See :meth:`ClientInstance.exchange`."""
        raw = self._raw
        if raw is not None and timeout is not None:
            host, port = rq.split_addr(addr)
            signer = self._signer
            if signer is None:
                return await raw.exchange(method, host, port, target, body, timeout=timeout)
            return await raw.exchange(method, host, port, target, body, timeout=timeout, signer=signer)
        if timeout is None:
            return await self.http.request(method, f"http://{addr}{target}", content=body)
        return await self.http.request(method, f"http://{addr}{target}", content=body, timeout=timeout)

    async def drive(self, op: Op[T]) -> T:
        """See :meth:`ClientInstance.drive`; the requests are made on the running loop."""
        exchange = self.exchange
        try:
            req = next(op)
            while True:
                try:
                    answer = await exchange(*req)
                except BaseException as e:
                    req = op.throw(e)
                else:
                    req = op.send(answer)
        except StopIteration as stop:
            return stop.value

    def __repr__(self) -> str:
        return f"AsyncClientInstance({self.namesrv_addr!r}, state={self.state.value}, refs={self.refcount})"
