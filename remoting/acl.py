"""The ACL's pure core (docs/SECURITY.md): the accounts file, the permission decision and the replay guard.

No I/O here: :func:`parse_acl` reads the file's *text*, the decision functions read an :class:`AclConfig`, and the
:class:`ReplayGuard` is given the time. The servers' HTTP gate (:mod:`remoting.acl_gate`) and the file
watcher are built on it; both the broker and the nameserver use it, so it lives in the servers' runtime.

The accounts file is TOML with RocketMQ ``plain_acl.yml``'s field names::

    globalWhiteRemoteAddresses = ["10.10.*.*"]   # unsigned requests from these skip signing (never admin)
    [[accounts]]
    accessKey = "app1"
    secretKey = "..."
    admin = false
    whiteRemoteAddress = "192.168.1.*"           # the account is accepted only from matching addresses
    defaultTopicPerm = "DENY"                    # DENY | PUB | SUB | PUB|SUB   (absent: DENY)
    defaultGroupPerm = "SUB"                     # (absent: DENY)
    topicPerms = ["TopicA=PUB|SUB", "TopicB=DENY"]
    groupPerms = ["GroupA=SUB"]

The decision (RocketMQ's ``PlainPermissionManager.checkPerm``, simplified where noted):

- an ``admin`` account may do everything (RocketMQ lets an admin without resource lists do everything, and
  checks an admin's explicit lists; here ``admin`` is one switch, so it is easy to reason about);
- a topic named ``%RETRY%G`` or ``%DLQ%G`` is group ``G``'s: reading or writing it needs SUB on the group, as a
  consumer sends messages back to its retry topic (RocketMQ keeps group permissions under the retry topic name);
- otherwise the resource's entry in ``topicPerms`` / ``groupPerms`` decides, else the account's default; a
  permission allows an action when it holds the action's bit (``DENY`` holds none).
"""

from __future__ import annotations

import enum
import ipaddress
import tomllib
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "MAX_ACL_FILE_BYTES",
    "Account",
    "AclConfig",
    "AclFileError",
    "Action",
    "AddressPattern",
    "Refusal",
    "ReplayGuard",
    "group_allowed",
    "group_of_topic",
    "parse_acl",
    "parse_perm",
    "topic_allowed",
]

#: Largest accounts file read; a bigger one is refused (a file of accounts is kilobytes).
MAX_ACL_FILE_BYTES = 1 << 20
#: RocketMQ's minimum secret key length (``AclUtils``): shorter secrets are refused at load.
MIN_SECRET_KEY_CHARS = 6
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

_PERM_DENY = 1
_PERM_PUB = 2
_PERM_SUB = 4
_PERMS = {"DENY": _PERM_DENY, "PUB": _PERM_PUB, "SUB": _PERM_SUB, "PUB|SUB": _PERM_PUB | _PERM_SUB,
          "SUB|PUB": _PERM_PUB | _PERM_SUB}
_ACCOUNT_KEYS = frozenset({"accessKey", "secretKey", "admin", "whiteRemoteAddress", "defaultTopicPerm",
                           "defaultGroupPerm", "topicPerms", "groupPerms"})
_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts"})
_MAX_NAME_CHARS = 255


class AclFileError(ValueError):
    """The accounts file is not valid; the message names the field (``accounts[1].topicPerms[0]``)."""


class Action(enum.IntEnum):
    """What a request does to a resource (the permission bit it needs)."""

    PUB = _PERM_PUB
    SUB = _PERM_SUB


def parse_perm(text: str) -> int:
    """``DENY | PUB | SUB | PUB|SUB`` (spaces ignored, any case) to its bits; ValueError naming the choices."""
    perm = _PERMS.get(text.replace(" ", "").upper())
    if perm is None:
        raise ValueError(f"{text!r} is not one of DENY, PUB, SUB, PUB|SUB")
    return perm


# ---------------------------------------------------------------------- addresses


def _segment_matcher(seg: str) -> frozenset[int] | None:
    """The octet values one dotted segment allows (None = any): ``*``, ``n``, ``a-b`` or ``{a,b,c}``."""
    if seg == "*":
        return None
    if seg.startswith("{") and seg.endswith("}"):
        values = [_octet(v) for v in seg[1:-1].split(",")]
        return frozenset(values)
    lo_s, dash, hi_s = seg.partition("-")
    if dash:
        lo, hi = _octet(lo_s), _octet(hi_s)
        if lo > hi:
            raise ValueError(f"range {seg!r} runs backwards")
        return frozenset(range(lo, hi + 1))
    return frozenset({_octet(seg)})


def _octet(text: str) -> int:
    text = text.strip()
    if not text.isdigit() or len(text) > 3 or int(text) > 255:
        raise ValueError(f"{text!r} is not an octet 0-255")
    return int(text)


@attrs.frozen
class AddressPattern:
    """A RocketMQ white-list address pattern: ``*``, an exact IPv4/IPv6 address, or dotted IPv4 segments each
    ``*``, ``n``, ``a-b`` or ``{a,b,c}`` (``192.168.1.*``, ``10.0.0.1-20``, ``10.0.{1,2}.*``)."""

    text: str
    """The pattern as written."""
    segments: tuple[frozenset[int] | None, ...] | None
    """Per-octet allowed values (None: any) for an IPv4 pattern; None for ``*`` and IPv6."""
    exact: str | None
    """The normalised address of an exact IPv6 pattern."""

    @classmethod
    def parse(cls, text: str) -> AddressPattern:
        """Raises ValueError naming what is wrong with ``text``."""
        text = text.strip()
        if text == "*":
            return cls(text, None, None)
        if ":" in text:
            try:
                return cls(text, None, str(ipaddress.IPv6Address(text)))
            except ValueError:
                raise ValueError(f"{text!r} is not an IPv6 address") from None
        parts = text.split(".")
        if len(parts) != 4:
            raise ValueError(f"{text!r} is not '*', an IPv6 address or four dotted IPv4 segments")
        return cls(text, tuple(_segment_matcher(p) for p in parts), None)

    def matches(self, host: str) -> bool:
        """Whether the peer address ``host`` (as the server saw it) matches."""
        if self.segments is None:
            if self.exact is None:
                return True
            try:
                return str(ipaddress.IPv6Address(host)) == self.exact
            except ValueError:
                return False
        parts = host.split(".")
        if len(parts) != 4:
            return False
        for part, allowed in zip(parts, self.segments, strict=True):
            if allowed is None:
                continue
            if not part.isdigit() or len(part) > 3 or int(part) not in allowed:
                return False
        return True


# ---------------------------------------------------------------------- accounts


@attrs.frozen(repr=False)
class Account:
    """One account of the accounts file (the secret key never appears in ``repr``)."""

    access_key: str
    secret_key: str
    admin: bool = False
    white_remote_address: AddressPattern | None = None
    """When set, the account is accepted only from matching peer addresses."""
    default_topic_perm: int = _PERM_DENY
    default_group_perm: int = _PERM_DENY
    topic_perms: Mapping[str, int] = attrs.field(factory=dict)
    group_perms: Mapping[str, int] = attrs.field(factory=dict)

    def __repr__(self) -> str:
        return f"Account(access_key={self.access_key!r}, admin={self.admin}, secret_key=<redacted>)"

    def topic_perm(self, topic: str) -> int:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> int:
        return self.group_perms.get(group, self.default_group_perm)


@attrs.frozen
class AclConfig:
    """A loaded accounts file."""

    accounts: Mapping[str, Account] = attrs.field(factory=dict)
    """By access key."""
    global_white: tuple[AddressPattern, ...] = ()
    """``globalWhiteRemoteAddresses``: unsigned requests from these are let in without an account (never admin)."""

    def globally_white(self, host: str) -> bool:
        return any(p.matches(host) for p in self.global_white)


def group_of_topic(topic: str) -> str | None:
    """``G`` for ``%RETRY%G`` and ``%DLQ%G``, else None."""
    if topic.startswith(RETRY_PREFIX):
        return topic[len(RETRY_PREFIX):]
    if topic.startswith(DLQ_PREFIX):
        return topic[len(DLQ_PREFIX):]
    return None


def topic_allowed(account: Account, topic: str, action: Action) -> bool:
    """Whether ``account`` may do ``action`` on ``topic`` (retry and DLQ topics follow their group's SUB)."""
    if account.admin:
        return True
    if topic[:1] == "%":
        group = group_of_topic(topic)
        if group is not None:
            return bool(account.group_perm(group) & _PERM_SUB)
    return bool(account.topic_perm(topic) & action)


def group_allowed(account: Account, group: str, action: Action = Action.SUB) -> bool:
    """Whether ``account`` may act as (consume with, commit offsets of, ...) ``group``."""
    return account.admin or bool(account.group_perm(group) & action)


# ---------------------------------------------------------------------- the file


def parse_acl(text: str | bytes, source: str = "accounts file") -> AclConfig:
    """Read an accounts file's content.

    Args:
        text: the TOML text (bytes are decoded as UTF-8).
        source: the file's name, put into every error.

    Raises:
        AclFileError: not TOML, a field of the wrong type or value, a repeated access key or resource; the
            message names ``source`` and the field.
    """
    if len(text) > MAX_ACL_FILE_BYTES:
        raise AclFileError(f"{source}: larger than {MAX_ACL_FILE_BYTES} bytes (MAX_ACL_FILE_BYTES)")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise AclFileError(f"{source}: not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AclFileError(f"{source}: not valid TOML: {e}") from None
    except RecursionError:
        raise AclFileError(f"{source}: not valid TOML: nested too deeply") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise AclFileError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; "
                           f"expected {', '.join(sorted(_TOP_KEYS))}")
    white = tuple(_address(f"{source}: globalWhiteRemoteAddresses[{i}]", v)
                  for i, v in enumerate(_list(doc, "globalWhiteRemoteAddresses", source)))
    raw_accounts = _list(doc, "accounts", source)
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        where = f"{source}: accounts[{i}]"
        if not isinstance(raw, dict):
            raise AclFileError(f"{where} must be a table ([[accounts]]), got {_type(raw)}")
        account = _account(raw, where)
        if account.access_key in accounts:
            raise AclFileError(f"{where}.accessKey {account.access_key!r} is repeated")
        accounts[account.access_key] = account
    return AclConfig(accounts, white)


def _type(v: object) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a float", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    v = obj.get(key, [])
    if not isinstance(v, list):
        raise AclFileError(f"{where}: {key} must be an array, got {_type(v)}")
    return v


def _string(obj: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = obj.get(key, default)
    if v is None:
        raise AclFileError(f"{where}.{key} is missing")
    if not isinstance(v, str):
        raise AclFileError(f"{where}.{key} must be a string, got {_type(v)}")
    return v


def _address(where: str, v: object) -> AddressPattern:
    if not isinstance(v, str):
        raise AclFileError(f"{where} must be a string, got {_type(v)}")
    try:
        return AddressPattern.parse(v)
    except ValueError as e:
        raise AclFileError(f"{where}: {e}") from None


def _perm_field(obj: Mapping[str, Any], key: str, where: str) -> int:
    try:
        return parse_perm(_string(obj, key, where, "DENY"))
    except ValueError as e:
        raise AclFileError(f"{where}.{key}: {e}") from None


def _resource_perms(obj: Mapping[str, Any], key: str, where: str) -> dict[str, int]:
    perms: dict[str, int] = {}
    for j, entry in enumerate(_list(obj, key, f"{where}.{key}")):
        at = f"{where}.{key}[{j}]"
        if not isinstance(entry, str):
            raise AclFileError(f"{at} must be a string NAME=PERM, got {_type(entry)}")
        name, eq, perm = entry.rpartition("=")
        name = name.strip()
        if not eq or not name or len(name) > _MAX_NAME_CHARS:
            raise AclFileError(f"{at}: {entry[:80]!r} is not NAME=PERM (NAME 1-{_MAX_NAME_CHARS} characters)")
        if name in perms:
            raise AclFileError(f"{at}: {name!r} is repeated")
        try:
            perms[name] = parse_perm(perm)
        except ValueError as e:
            raise AclFileError(f"{at}: {e}") from None
    return perms


def _account(raw: Mapping[str, Any], where: str) -> Account:
    unknown = sorted(set(raw) - _ACCOUNT_KEYS)
    if unknown:
        raise AclFileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                           f"expected {', '.join(sorted(_ACCOUNT_KEYS))}")
    access_key = _string(raw, "accessKey", where)
    if (not access_key or len(access_key) > 128 or not access_key.isascii() or not access_key.isprintable()
            or any(c in access_key for c in " ,=")):
        raise AclFileError(f"{where}.accessKey must be 1-128 printable ASCII characters without spaces, "
                           "commas or '='")
    secret_key = _string(raw, "secretKey", where)
    if len(secret_key) < MIN_SECRET_KEY_CHARS:
        raise AclFileError(f"{where}.secretKey (account {access_key!r}) must be at least "
                           f"{MIN_SECRET_KEY_CHARS} characters")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise AclFileError(f"{where}.admin must be true or false, got {_type(admin)}")
    white = raw.get("whiteRemoteAddress")
    pattern = None if white is None or white == "" else _address(f"{where}.whiteRemoteAddress", white)
    return Account(access_key, secret_key, admin, pattern,
                   _perm_field(raw, "defaultTopicPerm", where), _perm_field(raw, "defaultGroupPerm", where),
                   _resource_perms(raw, "topicPerms", where), _resource_perms(raw, "groupPerms", where))


# ---------------------------------------------------------------------- replay guard


class Refusal(enum.Enum):
    """Why :meth:`ReplayGuard.admit` refused a request."""

    STALE = "timestamp outside aclTimestampToleranceMs of the server's clock"
    REPLAYED = "replayed request (signature seen before)"
    FULL = "replay guard full (aclNonceCacheMax)"


class ReplayGuard:
    """Refuses signed requests that are stale, from the future, or seen before (bounded memory).

    A request is fresh when ``|now - timestamp| <= tolerance_ms`` (``aclTimestampToleranceMs``). Each admitted
    request's signature (its first 64 bits: the HMAC covers timestamp, nonce and body, so equal signatures mean
    the same request) is remembered in a bucket per :data:`BUCKETS_PER_WINDOW`-th of ``tolerance_ms`` of
    timestamps; a bucket is dropped whole once every timestamp in it is stale, so forgetting costs nothing per
    request, and a signature is held at most ``tolerance_ms`` plus one bucket's width after its timestamp (with
    buckets a window wide, it was up to twice the window: half as many signatures again, in memory and towards
    the cap). At most ``max_entries`` (``aclNonceCacheMax``) signatures are held: past that, new requests are
    refused (never forgotten early, which would open a replay window) until buckets age out.
    """

    #: Buckets per ``tolerance_ms`` of timestamps.
    BUCKETS_PER_WINDOW = 8

    def __init__(self, tolerance_ms: int, max_entries: int) -> None:
        if tolerance_ms <= 0 or max_entries <= 0:
            raise ValueError("tolerance_ms and max_entries must be > 0")
        self.tolerance_ms = tolerance_ms
        self.max_entries = max_entries
        self._width = max(1, tolerance_ms // self.BUCKETS_PER_WINDOW)
        self._buckets: dict[int, set[int]] = {}
        self._size = 0
        self._expired_at = -1

    def __len__(self) -> int:
        return self._size

    def admit(self, timestamp_ms: int, signature_hex: str, now_ms: int) -> Refusal | None:
        """None when the request is fresh and new (it is now remembered), else why it is refused."""
        tol = self.tolerance_ms
        if timestamp_ms < now_ms - tol or timestamp_ms > now_ms + tol:
            return Refusal.STALE
        width = self._width
        current = now_ms // width
        if current != self._expired_at:  # once a bucket's width: drop the buckets whose timestamps are all stale
            self._expired_at = current
            for b in [b for b in self._buckets if (b + 1) * width <= now_ms - tol]:
                self._size -= len(self._buckets.pop(b))
        key = int(signature_hex[:16], 16)
        bucket = self._buckets.get(timestamp_ms // width)
        if bucket is not None and key in bucket:
            return Refusal.REPLAYED
        if self._size >= self.max_entries:
            return Refusal.FULL
        if bucket is None:
            bucket = self._buckets[timestamp_ms // width] = set()
        bucket.add(key)
        self._size += 1
        return None
