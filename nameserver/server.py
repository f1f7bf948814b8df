"""The nameserver's HTTP face: a router over :class:`~nameserver.routeinfo.RouteInfo`, and the expiry scan.

Endpoints (docs/PROTOCOL.md, "Nameserver endpoints")::

    POST /broker/register          register or refresh a broker -> {"masterAddr", "haServerAddr"}
    POST /broker/unregister        a broker's goodbye -> {}
    GET  /route?topic=T            TopicRouteData, or 404 code 17
    GET  /cluster                  brokerAddrTable, clusterAddrTable, brokerLiveTable
    GET  /topics                   {"topicList": [...]}
    POST /broker/wipe-write-perm   {"brokerName"} -> {"affected": n}
    POST /broker/add-write-perm    {"brokerName"} -> {"affected": n}
    GET  /metrics                  Prometheus text

All handlers run on the event loop thread and the table operations never await, so each request sees and
leaves the table consistent without a lock.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from common.errors import NoPermissionError, TopicNotExistError
from common.route import DataVersion, TopicConfig
from common.signing import cluster_credentials
from common.tls import server_context
from nameserver.routeinfo import RouteInfo
from remoting.acl import Account, AclConfig
from remoting.acl_gate import (
    ADMIN,
    DEFAULT_NONCE_CACHE_MAX,
    DEFAULT_TIMESTAMP_TOLERANCE_MS,
    OPEN,
    SIGNED,
    AclFileWatcher,
    AclGate,
    Principal,
    Rule,
    load_acl_file,
)
from remoting.http import HttpLimits
from remoting.router import ArgumentError, Request, Response, Router, json_response
from remoting.server import HttpServer

__all__ = [
    "METRICS_CONTENT_TYPE",
    "NAMESRV_RULES",
    "NamesrvConfig",
    "build_gate",
    "create_app",
    "format_addr",
    "run_expiry_scan",
    "serve",
    "wall_clock_ms",
]

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Longest name (cluster, broker, topic, address) accepted from a request; longer is INVALID_PARAMETER.
MAX_NAME_CHARS = 1024
#: A broker registers its whole topic table; 16 MiB is room for ~100k topics.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Bound on the graceful stop's wait for open connections.
SHUTDOWN_TIMEOUT_S = 5.0


def wall_clock_ms() -> int:
    """The nameserver's clock: epoch milliseconds (what RocketMQ puts in ``lastUpdateTimestamp``)."""
    return time.time_ns() // 1_000_000


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class NamesrvConfig:
    """Nameserver settings (RocketMQ's names in the docstrings)."""

    broker_expiry_ms: int = attrs.field(default=120_000, validator=_positive)
    """A broker not heard from for this long is removed (4.9.3: 120000)."""
    scan_interval_ms: int = attrs.field(default=10_000, validator=_positive)
    """``scanNotActiveBrokerInterval``: period of the expiry scan (4.9.3: 10000)."""
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=_positive)
    """Largest request body accepted (HTTP 413 above)."""
    http_limits: HttpLimits = attrs.field(factory=HttpLimits)
    """Header and body read deadlines, the keep-alive timeout and the cap on open connections."""
    acl_enable: bool = False
    """``--acl-enable``: requests must be signed by an account of ``acl_file`` (docs/SECURITY.md)."""
    acl_file: str = ""
    """``--acl-file``: the accounts file (TOML), re-read when it changes."""
    acl_protect_routes: bool = False
    """``--acl-protect-routes``: route, cluster and topic-list queries need a signed account too (``/route?topic=T``
    needs PUB or SUB on T); off, they stay open as in RocketMQ."""
    acl_timestamp_tolerance_ms: int = attrs.field(default=DEFAULT_TIMESTAMP_TOLERANCE_MS, validator=_positive)
    """``--acl-timestamp-tolerance-ms``: how far a signed request's timestamp may be from this clock."""
    acl_nonce_cache_max: int = attrs.field(default=DEFAULT_NONCE_CACHE_MAX, validator=_positive)
    """``--acl-nonce-cache-max``: signed requests the replay guard remembers at most."""
    acl_metrics_token: str = attrs.field(default="", repr=False)
    """``$SPLITMQ_ACL_METRICS_TOKEN``: a ``Bearer`` token that opens ``GET /metrics`` to a scraper."""
    tls_cert_file: str = ""
    """``--tls-cert``: serve TLS only, presenting this PEM certificate chain ('' = plain HTTP)."""
    tls_key_file: str = ""
    """``--tls-key``: the certificate's private key."""
    ha_auth_secret: bytes = attrs.field(default=b"", repr=False)
    """``$SPLITMQ_HA_AUTH_SECRET`` / ``--ha-auth-secret-file``: the brokers' ``haAuthSecret``. Registration,
    unregistration and write-permission changes then need the cluster account derived from it (or, with
    ``--acl-enable``, an admin account), whatever else is configured (issue 39)."""
    acl_server_names: tuple[str, ...] = ()
    """``--acl-server-name``: ``host:port`` names a client may sign for besides the address a connection arrives on
    (a DNS name, a NAT address)."""
    protected_mode: bool = True
    """``--protected-mode``: without credentials (``--acl-enable`` or the cluster secret) serve loopback peers
    only, and refuse a non-loopback ``--listen``; false serves anyone without them."""

    @property
    def has_credentials(self) -> bool:
        """``--acl-enable`` or the cluster secret: the calls that change the route table need an account."""
        return self.acl_enable or bool(self.ha_auth_secret)

    def protected_mode_refusal(self, host: str) -> str | None:
        """Why a nameserver listening on ``host`` must not start (None: it may); names the flags to set."""
        if not self.protected_mode or self.has_credentials or _is_loopback(host):
            return None
        return (f"protected mode: --listen {host} is not a loopback address, and without --acl-enable --acl-file "
                f"or the brokers' haAuthSecret (SPLITMQ_HA_AUTH_SECRET or --ha-auth-secret-file) anyone who reaches "
                f"it could register a broker under any name and redirect clients and slaves to it. Set them "
                f"(docs/SECURITY.md; `splitmq cluster up --secure` writes a complete set), listen on 127.0.0.1, or "
                f"pass --protected-mode false to serve without them")

    def __attrs_post_init__(self) -> None:
        if self.acl_enable and not self.acl_file:
            raise ValueError("--acl-enable needs --acl-file (the accounts file)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("--tls-cert and --tls-key go together")

    def tls_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None without ``--tls-cert``.

        Raises:
            TlsConfigError: a file is missing or unusable.
        """
        return server_context(self.tls_cert_file, self.tls_key_file) if self.tls_cert_file else None


# ---------------------------------------------------------------------- request parsing


def _str_field(obj: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> str:
    if key not in obj or obj[key] is None:
        raise ArgumentError(f"missing field {key!r}")
    v = obj[key]
    if not isinstance(v, str):
        raise ArgumentError(f"field {key!r} must be a string, got {type(v).__name__}")
    if not v and not allow_empty:
        raise ArgumentError(f"field {key!r} must not be empty")
    if len(v) > MAX_NAME_CHARS:
        raise ArgumentError(f"field {key!r} is longer than MAX_NAME_CHARS={MAX_NAME_CHARS}")
    return v


def _int_field(obj: Mapping[str, Any], key: str, *, default: int | None = None, lo: int = 0,
               hi: int = 2**63 - 1, where: str = "") -> int:
    v = obj.get(key)
    if v is None:
        if default is None:
            raise ArgumentError(f"missing field {where}{key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArgumentError(f"field {where}{key!r} must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ArgumentError(f"field {where}{key!r}={v} is outside [{lo}, {hi}]")
    return v


def _bool_field(obj: Mapping[str, Any], key: str, *, where: str) -> bool:
    v = obj.get(key, False)
    if not isinstance(v, bool):
        raise ArgumentError(f"field {where}{key!r} must be true or false, got {type(v).__name__}")
    return v


def _topic_configs(obj: Mapping[str, Any]) -> list[TopicConfig] | None:
    table = obj.get("topicConfigTable")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ArgumentError("field 'topicConfigTable' must be an object {topic: TopicConfig}")
    configs = []
    for name, tc in table.items():
        if not name or len(name) > MAX_NAME_CHARS:
            raise ArgumentError(f"topicConfigTable key {name[:40]!r} is not a valid topic name")
        if not isinstance(tc, dict):
            raise ArgumentError(f"topicConfigTable[{name!r}] must be an object")
        where = f"topicConfigTable[{name!r}]."
        if tc.get("topicName", name) != name:
            raise ArgumentError(f"{where}'topicName'={tc.get('topicName')!r} differs from its key")
        configs.append(TopicConfig(
            name,
            _int_field(tc, "readQueueNums", default=8, hi=65535, where=where),
            _int_field(tc, "writeQueueNums", default=8, hi=65535, where=where),
            _int_field(tc, "perm", default=6, hi=15, where=where),
            _int_field(tc, "topicSysFlag", default=0, hi=2**31 - 1, where=where),
            _bool_field(tc, "order", where=where),
        ))
    return configs


def _data_version(obj: Mapping[str, Any]) -> DataVersion:
    dv = obj.get("dataVersion")
    if dv is None:
        return DataVersion()
    if not isinstance(dv, dict):
        raise ArgumentError("field 'dataVersion' must be an object {timestamp, counter}")
    return DataVersion(_int_field(dv, "timestamp", default=0, where="dataVersion."),
                       _int_field(dv, "counter", default=0, where="dataVersion."))


# ---------------------------------------------------------------------- the app


def _route_query(principal: Principal, request: Request) -> None:
    topic = request.query.get("topic")
    if topic:
        principal.need_topic_access(topic)


def namesrv_rules(*, protect_routes: bool) -> dict[tuple[str, str], Rule]:
    """What each nameserver endpoint needs: changing the table needs admin (and, for a broker group, to be its
    owner: see ``_Owners``); queries are open unless ``protect_routes``."""
    return {
        ("POST", "/broker/register"): ADMIN,
        ("POST", "/broker/unregister"): ADMIN,
        ("POST", "/broker/wipe-write-perm"): ADMIN,
        ("POST", "/broker/add-write-perm"): ADMIN,
        ("GET", "/route"): _route_query if protect_routes else OPEN,
        ("GET", "/cluster"): SIGNED if protect_routes else OPEN,
        ("GET", "/topics"): SIGNED if protect_routes else OPEN,
        ("GET", "/metrics"): ADMIN,  # or the metrics bearer token, checked by the gate
    }


#: The rules with the default (open) queries; the table test checks they cover every route.
NAMESRV_RULES = namesrv_rules(protect_routes=False)


def build_gate(config: NamesrvConfig, clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
               ) -> AclGate | None:
    """The nameserver's ACL gate (None when ACL is off).

    Raises:
        AclFileError: the accounts file does not load.
    """
    fixed: dict[str, Account] = {}
    if config.ha_auth_secret:
        creds = cluster_credentials(config.ha_auth_secret)
        fixed[creds.access_key] = Account(creds.access_key, creds.secret_key, admin=True)
    if config.acl_enable:
        accounts = load_acl_file(config.acl_file)
        rules = namesrv_rules(protect_routes=config.acl_protect_routes)
        log.info("ACL on: %d account(s) from %s; route queries %s%s", len(accounts.accounts), config.acl_file,
                 "need an account" if config.acl_protect_routes else "open",
                 "; the brokers' cluster account accepted" if fixed else "")
    elif fixed:
        accounts = AclConfig()
        rules = {key: rule if rule is ADMIN and key[1] != "/metrics" else OPEN
                 for key, rule in namesrv_rules(protect_routes=False).items()}
        log.info("cluster secret set: registrations and write-permission changes need the brokers' cluster "
                 "account; queries and metrics stay open")
    else:
        return None
    return AclGate(accounts, rules,
                   tolerance_ms=config.acl_timestamp_tolerance_ms, nonce_cache_max=config.acl_nonce_cache_max,
                   clock_ms=clock_ms, metrics_token=config.acl_metrics_token or None,
                   server_names=config.acl_server_names, fixed_accounts=fixed)


class _Owners:
    """Which account registered each broker group (brokerName), so another account cannot take it over.

    The first account to register a name owns it while any broker of that name is registered; once the last
    one unregisters or expires, the name is free again. Entries of freed names are dropped lazily, so the table
    stays about as large as the route table.
    """

    def __init__(self, route_info: RouteInfo) -> None:
        self._ri = route_info
        self._owner: dict[str, str] = {}

    def check(self, broker_name: str, access_key: str | None, *, claim: bool) -> None:
        """Raises NoPermissionError when another account owns the live group ``broker_name``."""
        if access_key is None:  # ACL off
            return
        owner = self._owner.get(broker_name)
        live = self._ri.has_group(broker_name)
        if owner is not None and owner != access_key and live:
            raise NoPermissionError(f"account {access_key} may not register or unregister broker group "
                                    f"{broker_name}: another account owns it while its brokers are live")
        if claim and (owner is None or not live):
            self._owner[broker_name] = access_key
            if len(self._owner) > 2 * self._ri.group_count() + 64:
                self._owner = {n: a for n, a in self._owner.items() if self._ri.has_group(n) or n == broker_name}


class _Handlers:
    """The endpoint handlers, closed over one table and one clock."""

    def __init__(self, route_info: RouteInfo, clock_ms: Callable[[], int]) -> None:
        self._ri = route_info
        self._clock_ms = clock_ms
        self._owners = _Owners(route_info)

    async def register(self, req: Request) -> Response:
        body = req.json()
        cluster = _str_field(body, "clusterName")
        addr = _str_field(body, "brokerAddr")
        name = _str_field(body, "brokerName")
        broker_id = _int_field(body, "brokerId", hi=2**31 - 1)
        ha_addr = _str_field(body, "haServerAddr", allow_empty=True)
        topic_configs, data_version = _topic_configs(body), _data_version(body)
        self._owners.check(name, req.principal, claim=True)
        result = self._ri.register_broker(cluster, addr, name, broker_id, ha_addr, topic_configs, data_version,
                                          self._clock_ms())
        return json_response(result.to_json())

    async def unregister(self, req: Request) -> Response:
        body = req.json()
        cluster, addr, name = _str_field(body, "clusterName"), _str_field(body, "brokerAddr"), _str_field(body,
                                                                                                         "brokerName")
        broker_id = _int_field(body, "brokerId", hi=2**31 - 1)
        self._owners.check(name, req.principal, claim=False)
        self._ri.unregister_broker(cluster, addr, name, broker_id)
        return json_response({})

    async def route(self, req: Request) -> Response:
        topic = req.arg("topic")
        if not topic:
            raise ArgumentError("query argument 'topic' must not be empty")
        route = self._ri.get_route(topic)
        if route is None:
            raise TopicNotExistError(f"No topic route info in name server for the topic: {topic}")
        return json_response(route.to_json())

    async def cluster(self, req: Request) -> Response:
        return json_response(self._ri.cluster_info().to_json())

    async def topics(self, req: Request) -> Response:
        return json_response({"topicList": self._ri.topic_list()})

    async def wipe_write_perm(self, req: Request) -> Response:
        return json_response({"affected": self._ri.wipe_write_perm(_str_field(req.json(), "brokerName"))})

    async def add_write_perm(self, req: Request) -> Response:
        return json_response({"affected": self._ri.add_write_perm(_str_field(req.json(), "brokerName"))})


def create_app(
    route_info: RouteInfo,
    *,
    clock_ms: Callable[[], int] = wall_clock_ms,
    registry: CollectorRegistry | None = None,
    addr: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    acl: AclGate | None = None,
) -> Router:
    """The nameserver's router over ``route_info``.

    Args:
        route_info: the table the handlers read and change.
        clock_ms: the registration clock (epoch ms), injectable for tests.
        registry: where the metrics live; a fresh ``CollectorRegistry`` when ``None`` (never the global one,
            so several apps can live in one process).
        addr: this nameserver's ``host:port``, put into error answers.
        max_body_bytes: larger request bodies are refused with HTTP 413.
        acl: the ACL gate (:func:`build_gate`); None: every request is let in.

    Returns:
        The router (:meth:`Router.serve` answers a request; :class:`remoting.server.HttpServer` serves it).
    """
    registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
    Gauge("splitmq_nameserver_live_brokers", "Registered, unexpired broker addresses",
          registry=registry).set_function(route_info.live_broker_count)
    Gauge("splitmq_nameserver_topics", "Topics with a route", registry=registry).set_function(
        route_info.topic_count)
    requests = Counter("splitmq_nameserver_requests", "HTTP requests by path and status",
                       ["path", "status"], registry=registry)

    async def metrics(req: Request) -> Response:
        return Response(generate_latest(registry), 200, METRICS_CONTENT_TYPE)

    h = _Handlers(route_info, clock_ms)
    routes = {
        ("POST", "/broker/register"): h.register,
        ("POST", "/broker/unregister"): h.unregister,
        ("GET", "/route"): h.route,
        ("GET", "/cluster"): h.cluster,
        ("GET", "/topics"): h.topics,
        ("POST", "/broker/wipe-write-perm"): h.wipe_write_perm,
        ("POST", "/broker/add-write-perm"): h.add_write_perm,
        ("GET", "/metrics"): metrics,
    }
    def observe(path: str, status: int, seconds: float) -> None:
        # The router names an unknown path "other", so a scanner cannot grow the metric without bound.
        requests.labels(path=path, status=str(status)).inc()

    return Router(routes, max_body_bytes=max_body_bytes, identity=lambda: (addr, None), authorize=acl,
                  observe=observe)


# ---------------------------------------------------------------------- running


async def run_expiry_scan(
    route_info: RouteInfo, *, clock_ms: Callable[[], int], broker_expiry_ms: int, scan_interval_ms: int
) -> None:
    """Expire silent brokers every ``scan_interval_ms`` until cancelled (first scan after one interval)."""
    while True:
        await asyncio.sleep(scan_interval_ms / 1000)
        try:
            expired = route_info.scan_not_active_brokers(clock_ms(), broker_expiry_ms)
        except Exception:  # a bug in one scan must not stop expiry for the life of the process
            log.exception("expiry scan failed")
            continue
        if expired:
            log.info("expiry scan removed %d broker(s): %s", len(expired), ", ".join(expired))


def format_addr(sockname: Any) -> str:
    """``host:port`` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    sock: socket.socket,
    config: NamesrvConfig | None = None,
    *,
    route_info: RouteInfo | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
    on_ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the nameserver on an already bound, listening socket until ``stop`` is set, then stop gracefully
    (idle connections close at once, busy ones after their answer, within SHUTDOWN_TIMEOUT_S).

    Signals are the caller's (``python -m nameserver`` sets ``stop`` on SIGTERM and SIGINT).

    Args:
        sock: the listening socket (bound by the caller, so port 0 is race-free); the server closes it.
        config: expiry and body settings.
        route_info: the table to serve (a fresh one when ``None``).
        clock_ms: the registration and expiry clock.
        on_ready: called once with ``host:port`` when the server accepts connections.
        stop: set to stop; None: serve until cancelled (the stop is graceful then too).
    """
    config = config or NamesrvConfig()
    route_info = route_info if route_info is not None else RouteInfo()
    listen = format_addr(sock.getsockname())
    acl = build_gate(config, clock_ms)
    router = create_app(route_info, clock_ms=clock_ms, addr=listen, max_body_bytes=config.max_body_bytes,
                        acl=acl)
    if not config.protected_mode and not config.has_credentials:
        log.warning("SECURITY: --protected-mode false and no credentials: the nameserver on %s serves ANYONE who "
                    "reaches it -- they can register a broker under any name and redirect clients and slaves to "
                    "it. Use --acl-enable --acl-file or the brokers' haAuthSecret (docs/SECURITY.md).", listen)
    watch = (asyncio.create_task(AclFileWatcher(config.acl_file, acl.update).run())
             if acl is not None and config.acl_enable else None)
    # The ACL judges the address a connection comes from: no X-Forwarded-For header is read (a proxy's rewrite of
    # it from 127.0.0.1 would let any local peer claim a white-listed address).
    tls = config.tls_context()
    limits = config.http_limits
    if config.protected_mode and not config.has_credentials:
        limits = attrs.evolve(limits, loopback_only=True)
    server = HttpServer(router, limits, ssl=tls)
    scanner = asyncio.create_task(run_expiry_scan(
        route_info, clock_ms=clock_ms, broker_expiry_ms=config.broker_expiry_ms,
        scan_interval_ms=config.scan_interval_ms))
    try:
        await server.start(sock)
        log.info("nameserver serving on %s (brokerExpiry=%d ms, scanInterval=%d ms%s)", listen,
                 config.broker_expiry_ms, config.scan_interval_ms, ", TLS" if tls is not None else "")
        if on_ready is not None:
            on_ready(listen)
        await (stop or asyncio.Event()).wait()
    finally:
        scanner.cancel()
        if watch is not None:
            watch.cancel()
        await server.shutdown(SHUTDOWN_TIMEOUT_S)
        await asyncio.gather(scanner, return_exceptions=True)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
