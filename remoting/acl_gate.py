"""The servers' ACL gate: authenticate a request, then check its route's rule (docs/SECURITY.md).

:class:`AclGate` is the ``authorize`` hook of :class:`remoting.router.Router`. For each request it

1. finds the route's rule (a route without one is refused: a new endpoint cannot be left open by mistake);
2. on a metrics path, lets ``Authorization: Bearer <aclMetricsToken>`` in (scrapers cannot sign);
3. authenticates: a signed request's account must exist, be allowed from the peer's address, verify
   (:func:`common.signing.verify`) and pass the :class:`~remoting.acl.ReplayGuard`; an unsigned
   request is let in only from a ``globalWhiteRemoteAddresses`` address, as an anonymous principal that holds
   every topic and group permission but never ``admin`` (RocketMQ's global white list, minus admin);
4. runs the rule, which asks the :class:`Principal` for the permissions the request needs (not for an admin
   account, which holds them all: rules check permissions only, and a body they cannot read is the handler's
   error too).

A refusal is ``NO_PERMISSION`` (HTTP 403). The client learns the missing permission, or only that the request
was not signed or its signature refused; the real reason (unknown key, bad signature, stale, replayed) goes to
the server's log, at most one line a second.

:class:`AclFileWatcher` re-reads the accounts file when its stat changes; a broken file keeps the last good one.

What stays the same between two requests until a reload is kept, and dropped by the reload: each account's HMAC
key, and for each (account, peer address) that has signed a request, its :class:`Principal` (the account found,
its address allowed) and the permission bits it resolved per topic and group. Every signed request is still
verified, checked against the replay guard and its time window, and its route's rule run.

**The server a signature is for.** A signature covers the request's ``Host`` (:mod:`common.signing`), and the
gate accepts it only when that ``Host`` names this server: the address the connection arrived on
(:attr:`remoting.router.Connection.local_names`) or one of ``server_names`` (the address the server advertises,
and names an operator adds for DNS or NAT). A request captured at another server, whose replay guard is not this
one's, is refused (issue 39).

**Connections bound by TLS.** On a TLS connection the first signed request that verifies binds the connection to
its account (:attr:`remoting.router.Connection.bound`); later requests on it may come unsigned, and are let in as
that account -- TLS guarantees they come from the same peer, unaltered -- with their route's rule run per request
from the principal's cached decisions. So the data path pays no HMAC, no body digest and no replay-guard entry
per request where the channel already protects it. What cannot happen on a bound connection:

* a request signed by *another* account is refused (a connection is one account's, for its whole life);
* after the accounts file is reloaded, the next unsigned request finds the account again in the new file: gone,
  a changed secret, or an address no longer allowed drop the binding and refuse the request; otherwise the new
  permissions apply from that request on (the principal is rebuilt, its cached decisions with it).

Plaintext connections never bind: every request is signed and verified.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from common.errors import NoPermissionError, SystemBusyError
from common.signing import (
    HmacKey,
    SignatureError,
    hmac_key,
    parse_authorization_fields,
    verify_fields,
)
from remoting.acl import (
    MAX_ACL_FILE_BYTES,
    Account,
    AclConfig,
    AclFileError,
    Action,
    Refusal,
    ReplayGuard,
    group_allowed,
    group_of_topic,
    parse_acl,
    topic_allowed,
)
from remoting.router import Connection, Request

__all__ = [
    "ADMIN",
    "DEFAULT_NONCE_CACHE_MAX",
    "DEFAULT_TIMESTAMP_TOLERANCE_MS",
    "OPEN",
    "SIGNED",
    "AclFileWatcher",
    "AclGate",
    "Principal",
    "Rule",
    "all_of",
    "group_arg",
    "json_strings",
    "load_acl_file",
    "topic_arg",
]

log = logging.getLogger(__name__)

#: ``aclTimestampToleranceMs``: how far a signed request's timestamp may be from the server's clock.
DEFAULT_TIMESTAMP_TOLERANCE_MS = 30_000
#: ``aclNonceCacheMax``: signatures remembered by the replay guard (~80 bytes each).
DEFAULT_NONCE_CACHE_MAX = 1_000_000
#: What a client is told when its request is not signed or its signature is refused (never which part).
NOT_SIGNED = "request not signed / signature refused"
_BEARER = b"bearer "
_LOG_EVERY_S = 1.0
#: Principals cached per (access key, peer address) before the cache starts over.
_PRINCIPALS_MAX = 4096
#: Topics (and, apart, groups) whose permission bits one Principal keeps before it starts over.
_DECISIONS_MAX = 128


class Principal:
    """Who sent a request: an account, or an anonymous peer of the global white list.

    The gate keeps one per (account, peer address) until the accounts file is reloaded, so each keeps the
    permission bits it resolved per topic and per group (:func:`topic_allowed` and :func:`group_allowed` decide; the
    bits only save asking them again), at most :data:`_DECISIONS_MAX` of each.
    """

    __slots__ = ("_groups", "_topics", "access_key", "account", "admin", "host")

    def __init__(self, account: Account | None, host: str) -> None:
        self.account = account
        self.access_key = account.access_key if account is not None else None
        self.admin = account is not None and account.admin
        self.host = host
        self._topics: dict[str, int] = {}
        self._groups: dict[str, int] = {}

    def _who(self) -> str:
        return f"account {self.access_key}" if self.access_key else f"white-listed address {self.host} (no account)"

    @staticmethod
    def _bits(cache: dict[str, int], allowed: Callable[[Account, str, Action], bool], account: Account,
              name: str) -> int:
        """The actions ``allowed`` grants ``account`` on ``name``, asked once and kept in ``cache`` (bounded)."""
        bits = cache.get(name)
        if bits is None:
            if len(cache) >= _DECISIONS_MAX:
                cache.clear()
            bits = cache[name] = sum(a for a in Action if allowed(account, name, a))
        return bits

    def _topic_bits(self, account: Account, topic: str) -> int:
        return self._bits(self._topics, topic_allowed, account, topic)

    def _group_bits(self, account: Account, group: str) -> int:
        return self._bits(self._groups, group_allowed, account, group)

    def need_admin(self, what: str) -> None:
        """Raises NoPermissionError unless the principal is an admin account."""
        if not self.admin:
            raise NoPermissionError(f"{self._who()} has no admin permission ({what} needs admin)")

    def need_topic(self, topic: str, action: Action) -> None:
        """Raises NoPermissionError unless the principal may do ``action`` on ``topic``."""
        account = self.account
        if account is not None and not self._topic_bits(account, topic) & action:
            group = group_of_topic(topic)
            if group is not None:
                raise NoPermissionError(f"{self._who()} has no SUB permission on group {group} (topic {topic} is "
                                        "that group's)")
            raise NoPermissionError(f"{self._who()} has no {action.name} permission on topic {topic}")

    def need_topic_access(self, topic: str) -> None:
        """Raises NoPermissionError unless the principal holds PUB or SUB on ``topic`` (a producer or a consumer
        of it, e.g. to read its route)."""
        account = self.account
        if account is not None and not self._topic_bits(account, topic):
            raise NoPermissionError(f"{self._who()} has neither PUB nor SUB permission on topic {topic}")

    def need_group(self, group: str, action: Action = Action.SUB) -> None:
        """Raises NoPermissionError unless the principal may act as ``group``."""
        account = self.account
        if account is not None and not self._group_bits(account, group) & action:
            raise NoPermissionError(f"{self._who()} has no {action.name} permission on group {group}")


#: A route's rule: raises NoPermissionError (or ArgumentError for a request it cannot read) to refuse.
Rule = Callable[[Principal, Request], None]


def OPEN(principal: Principal, request: Request) -> None:
    """Anyone may, signed or not (the gate does not authenticate these routes at all)."""


def SIGNED(principal: Principal, request: Request) -> None:
    """Any authenticated principal (or white-listed peer) may."""


def ADMIN(principal: Principal, request: Request) -> None:
    """Only an admin account may."""
    principal.need_admin(f"{request.method} {request.path}")


def topic_arg(name: str, action: Action) -> Rule:
    """The topic in query argument ``name`` needs ``action`` (a missing argument is the handler's error)."""
    def rule(principal: Principal, request: Request) -> None:
        topic = request.query.get(name)
        if topic is not None:
            principal.need_topic(topic, action)
    return rule


def group_arg(name: str) -> Rule:
    """The group in query argument ``name`` needs SUB."""
    def rule(principal: Principal, request: Request) -> None:
        group = request.query.get(name)
        if group is not None:
            principal.need_group(group)
    return rule


def all_of(*rules: Rule) -> Rule:
    """Every one of ``rules``."""
    def rule(principal: Principal, request: Request) -> None:
        for r in rules:
            r(principal, request)
    return rule


def json_strings(obj: Any, *path: str) -> Iterable[str]:
    """The strings at ``path`` in a JSON body, where ``"[]"`` walks a list (``"consumerGroups", "[]", "group"``).

    Values of another type are skipped: the handler refuses the body with the precise error.
    """
    items = [obj]
    for step in path:
        nxt: list[Any] = []
        for it in items:
            if step == "[]":
                if isinstance(it, list):
                    nxt.extend(it)
            elif isinstance(it, dict) and step in it:
                nxt.append(it[step])
        items = nxt
    return [it for it in items if isinstance(it, str)]


class AclGate:
    """Authenticates and authorizes each request of one server (the Router's ``authorize`` hook).

    Args:
        config: the accounts (replaced by :meth:`update` on reload).
        rules: ``{(method, path): rule}``; a route with no rule is refused.
        tolerance_ms: ``aclTimestampToleranceMs``.
        nonce_cache_max: ``aclNonceCacheMax``.
        clock_ms: the wall clock in epoch ms (injected in tests).
        metrics_token: ``aclMetricsToken``: a ``Bearer`` token that opens ``metrics_paths`` (None: admin only).
        metrics_paths: the paths the token opens.
        server_names: ``host:port`` names of this server a signature may be for, besides the local address of the
            connection it came on (the advertised address; DNS names and NAT addresses an operator adds).
        fixed_accounts: accounts that hold whatever the accounts file says (the cluster account of
            ``haAuthSecret``, :func:`common.signing.cluster_credentials`); a file account of the same access key
            is replaced by it.
    """

    def __init__(self, config: AclConfig, rules: Mapping[tuple[str, str], Rule], *,
                 tolerance_ms: int = DEFAULT_TIMESTAMP_TOLERANCE_MS, nonce_cache_max: int = DEFAULT_NONCE_CACHE_MAX,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 metrics_token: str | None = None, metrics_paths: frozenset[str] = frozenset({"/metrics"}),
                 server_names: Iterable[str] = (), fixed_accounts: Mapping[str, Account] | None = None) -> None:
        self._generation = 0
        self._fixed = dict(fixed_accounts or {})
        self.config = config  # (the setter also sets up the caches)
        self.server_names = frozenset(server_names)
        """``Host`` values that name this server besides the address a connection arrived on."""
        self._rules = dict(rules)
        self._guard = ReplayGuard(tolerance_ms, nonce_cache_max)
        self._clock_ms = clock_ms
        self._token = metrics_token.encode() if metrics_token else None
        self._metrics_paths = metrics_paths
        self._logged_at = -1e9
        self._suppressed = 0
        # Per-account state, built on first use and dropped with the accounts file it came from (the config setter):
        # the HMAC key set up once (hmac_key), and for each (access key, peer address) that has sent a verified
        # request, its Principal and that key -- the account and its whiteRemoteAddress were checked for that pair
        # then, and cannot change before the next reload.
        self._keys: dict[str, HmacKey] = {}
        self._peers: dict[tuple[str, str], tuple[Principal, HmacKey]] = {}

    @property
    def config(self) -> AclConfig:
        """The accounts in force; setting it (:meth:`update`) drops every cached key, principal and decision."""
        return self._config

    @config.setter
    def config(self, config: AclConfig) -> None:
        if self._fixed:
            config = AclConfig({**config.accounts, **self._fixed}, config.global_white)
        self._config = config
        self._keys = {}
        self._peers = {}
        self._generation += 1  # connections bound before find their account again (_bound_principal)

    def update(self, config: AclConfig) -> None:
        """Use a newly loaded accounts file from the next request on."""
        self.config = config

    @property
    def rules(self) -> Mapping[tuple[str, str], Rule]:
        return self._rules

    def __call__(self, request: Request, header: bytes | None) -> None:
        rule = self._rules.get((request.method, request.path))
        if rule is None:  # fail closed: a route added without a rule is nobody's
            self._refused(request, None, "route has no ACL rule")
            raise NoPermissionError(f"{request.method} {request.path} has no ACL rule; refused")
        if rule is OPEN:
            return
        conn = request.conn
        if header is None and conn is not None and conn.bound is not None:
            principal = self._bound_principal(request, conn)
        else:
            host = request.client[0] if request.client else ""
            if request.path in self._metrics_paths and header is not None and header[:7].lower() == _BEARER:
                if self._token is not None and hmac.compare_digest(header[7:].strip(), self._token):
                    return
                self._refused(request, None, "wrong or unconfigured metrics bearer token")
                raise NoPermissionError(NOT_SIGNED)
            principal = self._authenticate(request, header, host)
            if conn is not None and conn.tls and principal.account is not None:
                self._bind(request, conn, principal)
        request.principal = principal.access_key
        if principal.admin:
            return  # an admin holds every permission a rule asks for (``admin`` is one switch): nothing to check
        try:
            rule(principal, request)
        except NoPermissionError as e:
            self._refused(request, principal.access_key, e.message)
            raise

    def _bind(self, request: Request, conn: Connection, principal: Principal) -> None:
        """Tie a TLS connection to the account whose signed request just verified on it; a connection bound to
        another account refuses it (one account per connection, for its whole life)."""
        bound = conn.bound
        if bound is not None and bound[0].access_key != principal.access_key:
            why = (f"this TLS connection is bound to account {bound[0].access_key}; account "
                   f"{principal.access_key} must open a connection of its own")
            self._refused(request, principal.access_key, why)
            raise NoPermissionError(why)
        conn.bound = (principal, self._generation)

    def _bound_principal(self, request: Request, conn: Connection) -> Principal:
        """The principal of an unsigned request on a bound TLS connection. After a reload of the accounts file the
        account is looked up again: gone, another secret or an address it no longer allows drop the binding (the
        request is refused; the client signs again, or cannot), else the new permissions apply from now on."""
        principal, generation = conn.bound
        if generation == self._generation:
            return principal
        old = principal.account
        account = self.config.accounts.get(principal.access_key)
        host = conn.client[0]
        if (account is None or old is None or account.secret_key != old.secret_key
                or (account.white_remote_address is not None and not account.white_remote_address.matches(host))):
            conn.bound = None
            self._refused(request, principal.access_key, "the accounts file was reloaded and no longer holds this "
                                                         "TLS connection's account as it was; it must sign again")
            raise NoPermissionError(NOT_SIGNED)
        principal = Principal(account, host)
        conn.bound = (principal, self._generation)
        return principal

    def _names_this_server(self, server: str, conn: Connection | None) -> bool:
        """Whether a signature made for ``Host: server`` is for this server (see the module docstring). A request
        built in process (no connection) is checked against ``server_names`` alone, when there are any."""
        if server in self.server_names:
            return True
        if conn is not None:
            return server in conn.local_names
        return not self.server_names

    def _authenticate(self, request: Request, header: bytes | None, host: str) -> Principal:
        if header is None:
            config = self.config
            if config.global_white and config.globally_white(host):
                return Principal(None, host)
            self._refused(request, None, "no Authorization header")
            raise NoPermissionError(NOT_SIGNED)
        try:
            access_key, timestamp_ms, nonce, sig, scheme = parse_authorization_fields(header)
        except SignatureError as e:
            self._refused(request, None, str(e))
            raise NoPermissionError(NOT_SIGNED) from None
        if not self._names_this_server(request.host, request.conn):
            self._refused(request, access_key, f"signed for another server (Host {request.host[:80]!r})")
            raise NoPermissionError(NOT_SIGNED)
        peer = self._peers.get((access_key, host))
        principal, key = peer if peer is not None else self._account_of(request, access_key, host)
        if not verify_fields(key, access_key, timestamp_ms, nonce, sig, request.method, request.path, request.query,
                             request.body, request.raw_query.decode("latin-1"), scheme, host=request.host):
            self._refused(request, access_key, "signature does not verify")
            raise NoPermissionError(NOT_SIGNED)
        refusal = self._guard.admit(timestamp_ms, sig, self._clock_ms())
        if refusal is not None:
            self._refused(request, access_key, refusal.value)
            if refusal is Refusal.FULL:
                raise SystemBusyError(f"too many signed requests in the replay window (aclNonceCacheMax="
                                      f"{self._guard.max_entries}); try again shortly")
            raise NoPermissionError(NOT_SIGNED)
        if peer is None:  # remembered only once it has signed a request: no unverified peer fills the cache
            peers = self._peers
            if len(peers) >= _PRINCIPALS_MAX:  # bounded: peers come and go
                peers.clear()
            peers[(access_key, host)] = (principal, key)
        return principal

    def _account_of(self, request: Request, access_key: str, host: str) -> tuple[Principal, HmacKey]:
        """The Principal and HMAC key of ``access_key`` sending from ``host`` (not yet verified), or the refusal:
        an unknown key, or a peer outside the account's whiteRemoteAddress."""
        account = self.config.accounts.get(access_key)
        if account is None:
            self._refused(request, access_key, "unknown access key")
            raise NoPermissionError(NOT_SIGNED)
        if account.white_remote_address is not None and not account.white_remote_address.matches(host):
            self._refused(request, access_key, f"peer {host} outside the account's whiteRemoteAddress")
            raise NoPermissionError(NOT_SIGNED)
        keys = self._keys
        key = keys.get(access_key)
        if key is None:
            key = keys[access_key] = hmac_key(account.secret_key)
        return Principal(account, host), key

    def _refused(self, request: Request, access_key: str | None, reason: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < _LOG_EVERY_S:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more refusals not logged)" if self._suppressed else ""
        self._logged_at, self._suppressed = now, 0
        log.warning("ACL refused %s %s from %s (access key %s): %s%s", request.method, request.path,
                    request.client[0] if request.client else "?", access_key or "-", reason, more)


def load_acl_file(path: str | os.PathLike[str]) -> AclConfig:
    """Read and parse the accounts file at ``path``.

    Raises:
        AclFileError: unreadable, too large or invalid; the message names the file and the field.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_ACL_FILE_BYTES + 1)
    except OSError as e:
        raise AclFileError(f"cannot read accounts file {p}: {e.strerror or e}") from None
    return parse_acl(data, str(p))


class AclFileWatcher:
    """Re-reads the accounts file when its stat (mtime, size, inode) changes, every ``poll_s``.

    A file that no longer loads keeps the last good accounts in force and logs why (once per change).

    Args:
        path: the accounts file.
        on_load: given each newly loaded configuration.
        poll_s: the stat period (off the data path: one ``stat`` call).
    """

    def __init__(self, path: str | os.PathLike[str], on_load: Callable[[AclConfig], None], *,
                 poll_s: float = 1.0) -> None:
        self.path = Path(path)
        self._on_load = on_load
        self.poll_s = poll_s
        self._stat = self._stat_now()
        self.reloads = 0
        """Successful reloads so far."""
        self.failures = 0
        """Reloads that failed (the last good accounts were kept)."""

    def _stat_now(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def check(self) -> bool:
        """Reload if the file changed; True when new accounts were loaded."""
        stat = self._stat_now()
        if stat == self._stat:
            return False
        self._stat = stat
        try:
            config = load_acl_file(self.path)
        except AclFileError as e:
            self.failures += 1
            log.error("accounts file changed but does not load; keeping the last good accounts: %s", e)
            return False
        self._on_load(config)
        self.reloads += 1
        log.info("accounts file %s reloaded: %d account(s)", self.path, len(config.accounts))
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.check()
            except Exception:  # one bad round must not end the watch
                log.exception("accounts file watch failed")
