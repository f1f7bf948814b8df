"""The process-wide client instance: route cache, nameserver failover, heartbeats (RocketMQ ``MQClientInstance``).

One instance per nameserver list (per event loop for the async one) is shared by every producer, consumer and
admin of the process; each user holds a reference and the instance closes when the last one lets go.

* Routes: cached per topic, refreshed every ``poll_name_server_interval_s`` (30 s) and on demand. One nameserver
  is asked at a time (random start, the next one on failure). When every nameserver is down, or a nameserver says
  TOPIC_NOT_EXIST, the cached route stays (SEMANTICS.md 6.6), so clients keep working on what they knew.
* Heartbeats: ``POST /heartbeat`` every ``heartbeat_broker_interval_s`` to every master, and to slaves too when
  a consumer uses the instance.
* Background work: a daemon thread waiting on an Event (sync) or an asyncio task (async); both stop at close.

The two classes are thin I/O shells over :class:`_InstanceCore`, which holds the state and decisions.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import http.cookiejar
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import httpx

from client import _requests as rq
from client._routing import (
    DEFAULT_TOPIC,
    BrokerDownTable,
    FindBrokerResult,
    NameServerSelector,
    RouteCache,
    TopicPublishInfo,
)
from client._transport import AsyncTransport, SyncTransport
from client.errors import ClientClosedError, ClientError, RouteNotFoundError
from client.protocol.message import MessageQueue
from client.protocol.route import TopicRouteData

__all__ = ["AsyncClientInstance", "ClientConfig", "ClientInstance", "ClientState"]

log = logging.getLogger(__name__)

_client_ids = itertools.count(1)


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


def _registry_key(namesrv_addr: str) -> str:
    addrs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
    if not addrs:
        raise ValueError(f"namesrv_addr {namesrv_addr!r} names no nameserver (expected 'host:port;host:port')")
    return ";".join(addrs)


class _InstanceCore:
    """State and decisions shared by the sync and async instances (no I/O here)."""

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
        self.topics_in_use: set[str] = set()
        self.state = ClientState.OPENED
        self.refcount = 0
        self.last_nameserver_error: ClientError | None = None

    # --- inspection (CONTRACT section 3) ---

    def find_broker_address_in_publish(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` in the cached routes, or None."""
        return self.routes.find_broker_address_in_publish(broker_name)

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int, only_this_broker: bool
    ) -> FindBrokerResult | None:
        """SEMANTICS.md 3.3 over the cached routes (see :func:`client._routing.find_broker_address_in_subscribe`)."""
        return self.routes.find_broker_address_in_subscribe(broker_name, broker_id, only_this_broker)

    def topic_route(self, topic: str) -> TopicRouteData | None:
        """The cached route of ``topic``."""
        return self.routes.route(topic)

    def subscribe_queues(self, topic: str) -> tuple[MessageQueue, ...] | None:
        return self.routes.subscribe_info(topic)

    def publish_info(self, topic: str) -> TopicPublishInfo | None:
        return self.routes.publish_info(topic)

    # --- users ---

    def register_producer(self, group: str) -> None:
        self.producer_groups[group] += 1

    def unregister_producer(self, group: str) -> None:
        self.producer_groups[group] -= 1
        if self.producer_groups[group] <= 0:
            del self.producer_groups[group]

    def register_consumer(self, group: str) -> None:
        self.consumer_groups.setdefault(group, set())

    def consumer_uses_topic(self, group: str, topic: str) -> None:
        self.consumer_groups.setdefault(group, set()).add(topic)

    def heartbeat_targets(self) -> list[str]:
        """Masters for producers; masters and slaves once a consumer is registered (SEMANTICS.md 3.3)."""
        return [addr for _, _, addr in self.routes.all_broker_addrs(include_slaves=bool(self.consumer_groups))]

    def heartbeat_body(self) -> bytes:
        return rq.heartbeat_body(self.client_id, self.producer_groups, self.consumer_groups,
                                 heartbeat_timeout_ms=self.config.effective_heartbeat_timeout_ms)

    def forget_consumer_group(self, group: str) -> tuple[list[str], bytes]:
        """Stop heartbeating ``group``; returns the brokers to tell and the ``/client/unregister`` body."""
        targets = self.heartbeat_targets()
        self.consumer_groups.pop(group, None)
        return targets, rq.unregister_body(self.client_id, consumer_groups=[group])

    def check_open(self) -> None:
        if self.state is not ClientState.OPENED:
            raise ClientClosedError(f"client instance for {self.namesrv_addr} is closed")

    def no_route_error(self, topic: str) -> RouteNotFoundError:
        why = f" (last nameserver error: {self.last_nameserver_error})" if self.last_nameserver_error else ""
        return RouteNotFoundError(f"No route info of this topic: {topic}, nameservers {self.namesrv_addr}{why}")


class ClientInstance(_InstanceCore):
    """The sync process-wide client (``producer.client`` / ``consumer.client``). Get one with :meth:`acquire`."""

    _registry: ClassVar[dict[str, ClientInstance]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, namesrv_addr: str, config: ClientConfig | None = None, *,
                 transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(namesrv_addr, config or ClientConfig(), **kwargs)
        cfg = self.config
        transport = transport or SyncTransport(max_connections_per_host=cfg.max_connections_per_host)
        self.http = httpx.Client(transport=transport, timeout=cfg.timeout(), cookies=_NoCookies())
        self._raw = transport if isinstance(transport, SyncTransport) else None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, namesrv_addr: str, config: ClientConfig | None = None, *,
                transport: httpx.BaseTransport | None = None) -> ClientInstance:
        """The shared instance for ``namesrv_addr`` (created on first use), with one more reference.

        ``config`` and ``transport`` (tests inject ``httpx.MockTransport``) apply only when this call creates it.
        """
        key = _registry_key(namesrv_addr)
        with cls._registry_lock:
            inst = cls._registry.get(key)
            if inst is None or inst.state is not ClientState.OPENED:
                inst = cls(key, config, transport=transport)
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
            if self._registry.get(self.namesrv_addr) is self:
                del self._registry[self.namesrv_addr]
        self.close()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"splitmq-client-{self.client_id}", daemon=True)
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

    def _run(self) -> None:
        cfg = self.config
        now = time.monotonic()
        next_poll = now + cfg.poll_name_server_interval_s
        next_hb = now + 0.05  # RocketMQ heartbeats right after start
        while not self._stop.wait(max(0.0, min(next_poll, next_hb) - time.monotonic())):
            now = time.monotonic()
            try:
                if now >= next_poll:
                    next_poll = now + cfg.poll_name_server_interval_s
                    self.update_all_routes()
                if now >= next_hb:
                    next_hb = now + cfg.heartbeat_broker_interval_s
                    self.send_heartbeat_to_all_brokers()
            except Exception as e:  # the loop must survive anything a server answers
                if not self._stop.is_set():
                    log.warning("client %s background refresh failed: %s", self.client_id, e)

    # --- routes ---

    def update_topic_route_from_nameserver(self, topic: str) -> bool:
        """Fetch ``topic``'s route from a nameserver; True when the cached route changed.

        Tries each nameserver once, starting with the current one. TOPIC_NOT_EXIST and unreachable nameservers
        leave the cached route as it was.
        """
        self.check_open()
        route = self._fetch_route(topic)
        if route is None:
            return False
        self.topics_in_use.add(topic)
        return self.routes.apply_route(topic, route)

    def _fetch_route(self, topic: str) -> TopicRouteData | None:
        for addr in self.nameservers.rotation():
            try:
                resp = self.http.get(rq.route_url(addr, topic))
                route = rq.parse_route(resp, addr)
            except httpx.HTTPError as e:
                self.last_nameserver_error = rq.map_transport_error(e, addr, f"nameserver {addr} route of {topic}")
                log.info("%s; trying the next nameserver", self.last_nameserver_error)
                continue
            except ClientError as e:
                self.last_nameserver_error = e
                continue
            self.nameservers.settle(addr)
            self.last_nameserver_error = None
            return route
        return None

    def update_all_routes(self) -> None:
        """Refresh every topic in use (the periodic job)."""
        for topic in sorted(self.topics_in_use):
            if self.state is not ClientState.OPENED:
                return
            self.update_topic_route_from_nameserver(topic)

    def try_to_find_topic_publish_info(self, topic: str) -> TopicPublishInfo:
        """Cached publish info, else the nameserver's route, else the ``TBW102`` route (auto-create).

        Raises:
            RouteNotFoundError: none of these yields a writable queue.
        """
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        self.update_topic_route_from_nameserver(topic)
        self.topics_in_use.add(topic)
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        default = self._fetch_route(DEFAULT_TOPIC)
        if default is not None:
            info = self.routes.apply_default_route(topic, default)
            if info.ok:
                return info
        raise self.no_route_error(topic)

    def subscribe_queues_or_fetch(self, topic: str) -> tuple[MessageQueue, ...]:
        """The subscribe set of ``topic`` (fetched when not cached)."""
        queues = self.routes.subscribe_info(topic)
        if queues is None:
            self.update_topic_route_from_nameserver(topic)
            self.topics_in_use.add(topic)
            queues = self.routes.subscribe_info(topic)
        if queues is None:
            raise self.no_route_error(topic)
        return queues

    # --- heartbeats ---

    def unregister_consumer_group(self, group: str) -> None:
        """Leave ``group`` on every broker at once (best effort, each call bounded), so the other instances
        rebalance without waiting for our heartbeat timeout."""
        targets, body = self.forget_consumer_group(group)
        for addr in targets:
            try:
                rq.raise_for_status(self.http.post(f"http://{addr}/client/unregister", content=body), addr)
            except (httpx.HTTPError, ClientError) as e:
                log.debug("unregister of %s from %s failed: %s", group, addr, e)

    def send_heartbeat_to_all_brokers(self) -> int:
        """One heartbeat to each target; returns how many brokers answered."""
        body = self.heartbeat_body()
        ok = 0
        for addr in self.heartbeat_targets():
            try:
                rq.raise_for_status(self.http.post(f"http://{addr}/heartbeat", content=body), addr)
                ok += 1
            except (httpx.HTTPError, ClientError) as e:
                log.debug("heartbeat to %s failed: %s", addr, e)
        return ok

    def exchange(self, method: str, addr: str, target: str, body: bytes = b"", *,
                 timeout: float | None) -> rq.Answer:
        """One data-path request to ``addr`` (``host:port``): through the SDK transport without httpx's models
        when this instance uses it, else through ``http`` (tests inject other transports).

        Raises:
            httpx.HTTPError: the request failed (callers map it with :func:`client._requests.map_transport_error`).
        """
        raw = self._raw
        if raw is not None:
            host, port = rq.split_addr(addr)
            return raw.exchange(method, host, port, target, body, timeout=timeout)
        return self.http.request(method, f"http://{addr}{target}", content=body, timeout=timeout)

    def __repr__(self) -> str:
        return f"ClientInstance({self.namesrv_addr!r}, state={self.state.value}, refs={self.refcount})"


class AsyncClientInstance(_InstanceCore):
    """The asyncio twin of :class:`ClientInstance`: one per nameserver list and event loop."""

    _registry: ClassVar[dict[tuple[str, int], AsyncClientInstance]] = {}

    def __init__(self, namesrv_addr: str, config: ClientConfig | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(namesrv_addr, config or ClientConfig(), **kwargs)
        cfg = self.config
        transport = transport or AsyncTransport(max_connections_per_host=cfg.max_connections_per_host)
        self.http = httpx.AsyncClient(transport=transport, timeout=cfg.timeout(), cookies=_NoCookies())
        self._raw = transport if isinstance(transport, AsyncTransport) else None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._loop_key = 0

    @classmethod
    def acquire(cls, namesrv_addr: str, config: ClientConfig | None = None, *,
                transport: httpx.AsyncBaseTransport | None = None) -> AsyncClientInstance:
        """The shared instance for ``namesrv_addr`` on the running loop, with one more reference."""
        loop = asyncio.get_running_loop()
        key = (_registry_key(namesrv_addr), id(loop))
        inst = cls._registry.get(key)
        if inst is None or inst.state is not ClientState.OPENED:
            inst = cls(key[0], config, transport=transport)
            inst._loop_key = id(loop)
            inst._task = loop.create_task(inst._run(), name=f"splitmq-client-{inst.client_id}")
            cls._registry[key] = inst
        inst.refcount += 1
        return inst

    async def release(self) -> None:
        """Drop one reference; the last one closes the instance."""
        self.refcount -= 1
        if self.refcount > 0:
            return
        key = (self.namesrv_addr, self._loop_key)
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

    async def _run(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + cfg.poll_name_server_interval_s
        next_hb = loop.time() + 0.05
        while self.state is ClientState.OPENED:
            try:
                await asyncio.wait_for(self._stop.wait(), max(0.0, min(next_poll, next_hb) - loop.time()))
                return
            except TimeoutError:
                pass
            now = loop.time()
            try:
                if now >= next_poll:
                    next_poll = now + cfg.poll_name_server_interval_s
                    await self.update_all_routes()
                if now >= next_hb:
                    next_hb = now + cfg.heartbeat_broker_interval_s
                    await self.send_heartbeat_to_all_brokers()
            except Exception as e:
                if self.state is ClientState.OPENED:
                    log.warning("client %s background refresh failed: %s", self.client_id, e)

    async def update_topic_route_from_nameserver(self, topic: str) -> bool:
        """See :meth:`ClientInstance.update_topic_route_from_nameserver`."""
        self.check_open()
        route = await self._fetch_route(topic)
        if route is None:
            return False
        self.topics_in_use.add(topic)
        return self.routes.apply_route(topic, route)

    async def _fetch_route(self, topic: str) -> TopicRouteData | None:
        for addr in self.nameservers.rotation():
            try:
                resp = await self.http.get(rq.route_url(addr, topic))
                route = rq.parse_route(resp, addr)
            except httpx.HTTPError as e:
                self.last_nameserver_error = rq.map_transport_error(e, addr, f"nameserver {addr} route of {topic}")
                log.info("%s; trying the next nameserver", self.last_nameserver_error)
                continue
            except ClientError as e:
                self.last_nameserver_error = e
                continue
            self.nameservers.settle(addr)
            self.last_nameserver_error = None
            return route
        return None

    async def update_all_routes(self) -> None:
        for topic in sorted(self.topics_in_use):
            if self.state is not ClientState.OPENED:
                return
            await self.update_topic_route_from_nameserver(topic)

    async def try_to_find_topic_publish_info(self, topic: str) -> TopicPublishInfo:
        """See :meth:`ClientInstance.try_to_find_topic_publish_info`."""
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        await self.update_topic_route_from_nameserver(topic)
        self.topics_in_use.add(topic)
        info = self.routes.publish_info(topic)
        if info is not None and info.ok:
            return info
        default = await self._fetch_route(DEFAULT_TOPIC)
        if default is not None:
            info = self.routes.apply_default_route(topic, default)
            if info.ok:
                return info
        raise self.no_route_error(topic)

    async def subscribe_queues_or_fetch(self, topic: str) -> tuple[MessageQueue, ...]:
        queues = self.routes.subscribe_info(topic)
        if queues is None:
            await self.update_topic_route_from_nameserver(topic)
            self.topics_in_use.add(topic)
            queues = self.routes.subscribe_info(topic)
        if queues is None:
            raise self.no_route_error(topic)
        return queues

    async def unregister_consumer_group(self, group: str) -> None:
        """Async twin of :meth:`ClientInstance.unregister_consumer_group`."""
        targets, body = self.forget_consumer_group(group)
        for addr in targets:
            try:
                rq.raise_for_status(await self.http.post(f"http://{addr}/client/unregister", content=body), addr)
            except (httpx.HTTPError, ClientError) as e:
                log.debug("unregister of %s from %s failed: %s", group, addr, e)

    async def send_heartbeat_to_all_brokers(self) -> int:
        body = self.heartbeat_body()
        ok = 0
        for addr in self.heartbeat_targets():
            try:
                rq.raise_for_status(await self.http.post(f"http://{addr}/heartbeat", content=body), addr)
                ok += 1
            except (httpx.HTTPError, ClientError) as e:
                log.debug("heartbeat to %s failed: %s", addr, e)
        return ok

    async def exchange(self, method: str, addr: str, target: str, body: bytes = b"", *,
                 timeout: float | None) -> rq.Answer:
        """One data-path request to ``addr`` (``host:port``): through the SDK transport without httpx's models
        when this instance uses it, else through ``http`` (tests inject other transports).

        Raises:
            httpx.HTTPError: the request failed (callers map it with :func:`client._requests.map_transport_error`).
        """
        raw = self._raw
        if raw is not None:
            host, port = rq.split_addr(addr)
            return await raw.exchange(method, host, port, target, body, timeout=timeout)
        return await self.http.request(method, f"http://{addr}{target}", content=body, timeout=timeout)

    def __repr__(self) -> str:
        return f"AsyncClientInstance({self.namesrv_addr!r}, state={self.state.value}, refs={self.refcount})"

