"""Request signing of the ACL (docs/SECURITY.md): one ``Authorization`` header, HMAC-SHA256 with the secret key.

A signed request carries::

    Authorization: SPLITMQ-HMAC-SHA256 AccessKey=<ak>,Timestamp=<ms>,Nonce=<hex>,Signature=<hex>

and the signature is the HMAC-SHA256, keyed with the account's secret key, of the *string to sign*::

    <scheme>\\n<METHOD>\\n<server>\\n<path>\\n<sorted query>\\n<timestamp>\\n<nonce>\\n<access key>\\n<digest(body) hex>

``<server>`` is the ``Host`` the request is sent with (``host:port``, the address the client dialled): it binds the
signature to the server it was meant for. A server accepts a signature only for a ``Host`` that names itself (the
address the connection arrived on, or a name it was configured with), so a request captured on one server does
not replay on another, whose replay guard never saw it (issue 39).

The scheme word, which opens both the header and the string to sign, names the body's digest:
``SPLITMQ-HMAC-SHA256`` hashes it with SHA-256 and ``SPLITMQ-HMAC-SHA256-BLAKE3`` with BLAKE3 (256 bits). Both
are collision-resistant, and the signature covers the scheme, so a changed scheme word breaks it. BLAKE3 hashes a
64 KiB batch about 3.5 times faster than SHA-256 (SHA-NI included), and the body's two passes, one on each
side, were most of what the ACL cost a ``send_batch``: the SDK signs with it wherever the ``blake3`` package is
installed (:data:`SIGNING_SCHEME`), and servers accept both.

``<sorted query>`` is the decoded query (as :func:`common.requests.parse_query` reads it: last value wins),
sorted by name, each pair re-encoded as ``quote(name)=quote(value)`` and joined with ``&``, so a proxy that
reorders or re-encodes arguments does not break a signature. The secret key never crosses the wire; the timestamp
and the nonce let the server refuse stale and replayed requests (its replay guard, not this module, keeps the
nonces it has seen).

Everything here is pure: the clock and the nonce are arguments (the SDK passes ``time.time()`` and
``os.urandom``), so tests and fuzzers drive it directly.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from urllib.parse import quote

import attrs
import httpx

from common.requests import CanonicalTarget, parse_query

try:
    import blake3 as _blake3_module
except ImportError:  # no wheel for this platform: the SDK signs with SHA-256 bodies, and refuses BLAKE3 ones
    _blake3_module = None  # type: ignore[assignment]

__all__ = [
    "AUTH_HEADER",
    "CLUSTER_ACCESS_KEY",
    "SCHEME",
    "SCHEME_BLAKE3",
    "SIGNING_SCHEME",
    "Credentials",
    "HmacKey",
    "RequestSigner",
    "SignatureError",
    "SignedAuth",
    "SigningAuth",
    "authorization_header",
    "body_digest",
    "canonical_query",
    "cluster_credentials",
    "fresh_authorization",
    "hmac_key",
    "parse_authorization",
    "parse_authorization_fields",
    "signature",
    "string_to_sign",
    "verify",
    "verify_fields",
]

#: The scheme word of signatures over the body's SHA-256 (every server accepts it).
SCHEME = "SPLITMQ-HMAC-SHA256"
#: The scheme word of signatures over the body's BLAKE3 digest (servers with the ``blake3`` package accept it).
SCHEME_BLAKE3 = "SPLITMQ-HMAC-SHA256-BLAKE3"
#: The header that carries the signature (lower case, as ASGI scopes and the SDK's transport write it).
AUTH_HEADER = b"authorization"
#: Longest header value :func:`parse_authorization` reads; a longer one is refused before it is split.
MAX_AUTH_HEADER_BYTES = 512
_MAX_KEY_CHARS = 128
_MAX_NONCE_CHARS = 64
_NONCE_MASK = (1 << 64) - 1


def _nonce_count() -> Iterator[int]:
    return itertools.count(int.from_bytes(os.urandom(8), "big"))


#: The SDK's nonces: they only need to differ (the server's replay guard remembers signatures), so one count per
#: process from a random 64-bit start serves every signer, not a getrandom() call per request. A forked child
#: starts a count of its own (else parent and child would sign two equal requests in one millisecond alike, and
#: the server would refuse the second as a replay).
_nonces = _nonce_count()


def _reseed_nonces() -> None:
    global _nonces
    _nonces = _nonce_count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_nonces)


def _next_nonce() -> str:
    return f"{next(_nonces) & _NONCE_MASK:016x}"


def _sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


#: Scheme word -> the hex digest of a body, for the schemes this process can verify.
_BODY_DIGESTS: dict[str, Callable[[bytes], str]] = {SCHEME: _sha256_hex}
if _blake3_module is not None:
    _new_blake3 = _blake3_module.blake3

    def _blake3_hex(body: bytes) -> str:
        return _new_blake3(body).hexdigest()

    _BODY_DIGESTS[SCHEME_BLAKE3] = _blake3_hex
#: Scheme word -> the digest of an empty body (most GET requests), computed once.
_EMPTY_BODY_DIGESTS = {scheme: digest(b"") for scheme, digest in _BODY_DIGESTS.items()}
#: The scheme the SDK signs with: BLAKE3 bodies where the ``blake3`` package is installed, else SHA-256.
SIGNING_SCHEME = SCHEME_BLAKE3 if SCHEME_BLAKE3 in _BODY_DIGESTS else SCHEME


def body_digest(body: bytes, scheme: str = SIGNING_SCHEME) -> str:
    """The hex digest of ``body`` that a signature of ``scheme`` covers (the SDK's scheme by default).

    Raises:
        SignatureError: an unknown scheme, or BLAKE3 without the ``blake3`` package.
    """
    digest = _BODY_DIGESTS[_known_scheme(scheme)]
    return digest(body) if body else _EMPTY_BODY_DIGESTS[scheme]


@attrs.frozen(repr=False)
class Credentials:
    """An account's access key and secret key (RocketMQ ACL's ``accessKey`` / ``secretKey``).

    Pass as ``credentials=`` to producers, consumers and :class:`client.Admin`. The secret key is never sent,
    logged or shown: ``repr`` and ``str`` print the access key only.
    """

    access_key: str = attrs.field()
    secret_key: str = attrs.field()

    @access_key.validator
    def _check_access_key(self, _attr: attrs.Attribute[str], value: str) -> None:
        if not isinstance(value, str) or not value or len(value) > _MAX_KEY_CHARS or not _is_key_text(value):
            raise ValueError(f"access key must be 1-{_MAX_KEY_CHARS} printable ASCII characters without "
                             "spaces, commas or '='")

    @secret_key.validator
    def _check_secret_key(self, _attr: attrs.Attribute[str], value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("secret key must be a non-empty string")

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=<redacted>)"

    __str__ = __repr__


#: The access key of the cluster's own account: the one every broker with ``haAuthSecret`` signs its registrations
#: with, and a nameserver that knows the secret accepts (its secret key is derived from ``haAuthSecret``).
CLUSTER_ACCESS_KEY = "splitmq-cluster"
_CLUSTER_LABEL = b"splitmq cluster account v1"


def cluster_credentials(ha_auth_secret: bytes) -> Credentials:
    """The cluster account of ``haAuthSecret`` (issue 39): brokers sign their registrations, unregistrations and
    write-permission calls with it, and a nameserver given the same secret refuses those calls without it, so an
    HA secret alone does not leave the route table open. The secret key is ``HMAC-SHA256(secret, label)``: the
    secret itself never becomes a key that crosses a process boundary."""
    if not ha_auth_secret:
        raise ValueError("the cluster account needs a non-empty haAuthSecret")
    return Credentials(CLUSTER_ACCESS_KEY, hmac.new(ha_auth_secret, _CLUSTER_LABEL, hashlib.sha256).hexdigest())


class SignatureError(ValueError):
    """The ``Authorization`` header is missing, malformed or does not verify.

    The message is for the server's log; the client is told only that the request was refused (never which part
    of a signature was wrong).
    """


@attrs.frozen
class SignedAuth:
    """The parsed ``Authorization`` header of a signed request."""

    access_key: str
    timestamp_ms: int
    nonce: str
    signature: str
    scheme: str = SCHEME
    """The scheme word, which names the body's digest (:data:`SCHEME` or :data:`SCHEME_BLAKE3`)."""


#: Printable ASCII without space, ``,`` and ``=`` (the header's separators).
_KEY_TEXT = re.compile(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]+").fullmatch
_HEX64 = re.compile(r"[0-9a-f]{64}").fullmatch
#: What ``quote(v, safe='')`` leaves as it is: most names and values, which then skip ``quote`` (the servers verify
#: every signed request, and ``quote`` was the largest part of that cost).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch
#: A character ``quote(v, safe='')`` would escape, other than the canonical query's own separators ``&`` and ``=``.
_ESCAPED = re.compile(r"[^A-Za-z0-9_.~&=-]")
#: ``quote``'s escape of each ASCII character (one byte in UTF-8, upper-case hex as ``quote`` writes it).
_ASCII_ESCAPES = {chr(c): f"%{c:02X}" for c in range(128)}
#: The header as the SDK writes it (fields in this order, no spaces): one regex match reads it; any other spelling
#: :func:`parse_authorization` accepts goes through its general parser.
_KEY_CLASS = r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_SDK_HEADER = re.compile(rf"({SCHEME}(?:-BLAKE3)?) AccessKey=({_KEY_CLASS}{{1,{_MAX_KEY_CHARS}}}),Timestamp=([0-9]{{1,16}}),"
                         rf"Nonce=({_KEY_CLASS}{{1,{_MAX_NONCE_CHARS}}}),Signature=([0-9a-f]{{64}})").fullmatch


def _is_key_text(value: str) -> bool:
    return _KEY_TEXT(value) is not None


def _quoted(value: str) -> str:
    return value if _UNRESERVED(value) is not None else quote(value, safe="")


def _escape(match: re.Match[str]) -> str:
    return _ASCII_ESCAPES[match.group()]


def canonical_query(query: Mapping[str, str]) -> str:
    """The query as it enters the string to sign: pairs sorted by name, each percent-encoded, joined by ``&``."""
    if not query:
        return ""
    items = sorted(query.items())
    joined = "&".join([f"{k}={v}" for k, v in items])
    n = len(items)
    if joined.count("=") == n and joined.count("&") == n - 1 and joined.isascii():
        # No name or value holds a separator, and each character is one byte: escaping the joined string once is
        # escaping each name and value (one C-level pass instead of a quote() per field).
        return _ESCAPED.sub(_escape, joined)
    return "&".join([f"{_quoted(k)}={_quoted(v)}" for k, v in items])


#: ``%XX`` as :func:`canonical_query` writes it: upper-case hex of an ASCII character ``quote`` escapes.
_CANONICAL_ESCAPE = r"(?:[01][0-9A-F]|2[0-9A-CF]|3[A-F]|40|5[B-E]|60|7[B-DF])"
#: A ``%`` that does not open such an escape.
_OTHER_ESCAPE = re.compile(rf"%(?!{_CANONICAL_ESCAPE})").search
#: A query as the SDK writes them: ``name=value`` fields, each with one ``=``, names of unreserved characters and
#: values of unreserved characters and ``%`` escapes.
_PLAIN_QUERY = re.compile(r"[A-Za-z0-9_.~-]+=[A-Za-z0-9_.~%-]*(?:&[A-Za-z0-9_.~-]+=[A-Za-z0-9_.~%-]*)*").fullmatch
#: The names of such a query's fields, in order.
_FIELD_NAMES = re.compile(r"([^&=]+)=[^&]*").findall


def _split_target(target: str) -> tuple[str, str]:
    """``(path, canonical query)`` of a request target.

    A :class:`~common.requests.CanonicalTarget` (the SDK's sends and pulls) is taken as it is. Another
    query already spelled canonically, as the SDK writes them (``name=value`` fields with plain names, values of
    unreserved characters and canonical escapes), is its own canonical query when its names are distinct and
    sorted, as the SDK's request models write them (:meth:`~common.requests.PullRequestHeader.to_query`);
    with distinct names in another order it only needs its fields sorted by name: each field's ``=`` becomes a
    ``\x00`` for the sort, which orders ``name\x00value`` strings as ``(name, value)`` pairs. Every check runs in
    C (no Python loop over the fields). Any other query is decoded and re-encoded by :func:`canonical_query`.
    """
    path, _, qs = target.partition("?")
    if type(target) is CanonicalTarget:
        return path, qs
    if qs and _PLAIN_QUERY(qs) is not None and ("%" not in qs or _OTHER_ESCAPE(qs) is None):
        names = _FIELD_NAMES(qs)
        ordered = sorted(set(names))
        if ordered == names:
            return path, qs
        if len(ordered) == len(names):
            return path, "&".join(sorted(qs.replace("=", "\x00").split("&"))).replace("\x00", "=")
    # Decoded as the servers decode what they receive (a target outside ASCII as its UTF-8 bytes).
    return path, canonical_query(parse_query(qs.encode()))


def _to_sign(scheme: str, method: str, host: str, path: str, query: str, timestamp_ms: int, nonce: str,
             access_key: str, body_hash: str) -> bytes:
    """The string to sign (the module docstring), its parts given: the one place that spells it."""
    return (f"{scheme}\n{method}\n{host}\n{path}\n{query}\n{timestamp_ms}\n{nonce}\n{access_key}\n"
            f"{body_hash}").encode()


def _known_scheme(scheme: str) -> str:
    if scheme not in _BODY_DIGESTS:
        if scheme == SCHEME_BLAKE3:
            raise SignatureError(f"{SCHEME_BLAKE3} needs the blake3 package, which this process lacks")
        raise SignatureError("authorization scheme is not " + SCHEME)
    return scheme


def string_to_sign(method: str, path: str, query: Mapping[str, str], timestamp_ms: int, nonce: str,
                   access_key: str, body: bytes, *, host: str, scheme: str = SCHEME) -> bytes:
    """The bytes the signature covers (see the module docstring); ``host`` is the request's ``Host``."""
    return _to_sign(_known_scheme(scheme), method.upper(), host, path, canonical_query(query), timestamp_ms, nonce,
                    access_key, body_digest(body, scheme))


#: SHA-256's block size, and the key pads of HMAC (RFC 2104) as ``bytes.translate`` tables.
_SHA256_BLOCK = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


class HmacKey:
    """HMAC-SHA256 (RFC 2104) with one secret key, its two padded key blocks hashed once.

    Each MAC copies the two SHA-256 states set up here (what ``hmac.new`` would hash again per request) and runs
    as six C calls: a copy of an ``hmac.HMAC`` set up once did the same work through four Python frames of the
    ``hmac`` module (``copy``, ``update``, ``hexdigest``, ``_current``), which cost more than the MAC of a small
    string itself. ``tests/protocol/test_signing.py`` checks it against ``hmac.new`` for keys of every length.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: bytes) -> None:
        if len(secret) > _SHA256_BLOCK:
            secret = hashlib.sha256(secret).digest()
        secret = secret.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(secret.translate(_IPAD))
        self._outer = hashlib.sha256(secret.translate(_OPAD))

    def hexdigest(self, msg: bytes) -> str:
        """The hex HMAC-SHA256 of ``msg``."""
        inner = self._inner.copy()
        inner.update(msg)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


def hmac_key(secret_key: str) -> HmacKey:
    """The HMAC-SHA256 key of ``secret_key``, set up once per account (:func:`verify_fields` and
    :class:`RequestSigner` sign with it)."""
    return HmacKey(secret_key.encode())


def signature(secret_key: str, method: str, path: str, query: Mapping[str, str], timestamp_ms: int, nonce: str,
              access_key: str, body: bytes, *, host: str, scheme: str = SCHEME) -> str:
    """The hex HMAC-SHA256 of :func:`string_to_sign`, keyed with ``secret_key``."""
    msg = string_to_sign(method, path, query, timestamp_ms, nonce, access_key, body, host=host, scheme=scheme)
    return hmac.new(secret_key.encode(), msg, hashlib.sha256).hexdigest()


def authorization_header(credentials: Credentials, method: str, target: str, body: bytes, *, host: str,
                         timestamp_ms: int, nonce: str) -> str:
    """The ``Authorization`` value that signs one request.

    Args:
        credentials: the account.
        method: the HTTP method.
        target: the request target as sent, ``/path?query`` (the query percent-encoded or not).
        body: the exact body bytes sent.
        host: the ``Host`` header sent (``host:port`` of the server dialled).
        timestamp_ms: the client's wall clock, milliseconds since the epoch.
        nonce: a fresh random token (hex, at most 64 characters) for this request only.
    """
    return RequestSigner.of(credentials).header(method, target, body, timestamp_ms, nonce, host)


def parse_authorization_fields(value: bytes | str) -> tuple[str, int, str, str, str]:
    """``(access key, timestamp ms, nonce, signature hex, scheme)`` of an ``Authorization`` header value: what
    :func:`parse_authorization` reads, without building a :class:`SignedAuth` (the servers' per-request path).

    Raises:
        SignatureError: as :func:`parse_authorization`.
    """
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    m = _SDK_HEADER(text)  # the SDK's spelling, bounded in length by the pattern itself
    if m is not None:
        scheme, ak, ts, nonce, sig = m.groups()
        if scheme in _BODY_DIGESTS:
            return ak, int(ts), nonce, sig, scheme
    return _parse_general(value)  # (which names what is wrong, e.g. a scheme this process cannot verify)


def parse_authorization(value: bytes | str) -> SignedAuth:
    """Read an ``Authorization`` header value.

    Raises:
        SignatureError: the value is too long, not of a known scheme (or of one whose digest this process lacks),
            or a field is missing, repeated or malformed.
    """
    return SignedAuth(*parse_authorization_fields(value))


def _parse_general(value: bytes | str) -> tuple[str, int, str, str, str]:
    """Any spelling of the header (spaces after commas, fields in any order), checked field by field."""
    if isinstance(value, bytes):
        if len(value) > MAX_AUTH_HEADER_BYTES:
            raise SignatureError("authorization header too long")
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            raise SignatureError("authorization header is not ASCII") from None
    else:
        text = value
        if len(text) > MAX_AUTH_HEADER_BYTES or not text.isascii():
            raise SignatureError("authorization header too long or not ASCII")
    scheme, _, rest = text.strip().partition(" ")
    _known_scheme(scheme)
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, val = part.strip().partition("=")
        if not eq or name in fields:
            raise SignatureError("authorization field malformed or repeated")
        fields[name] = val
    if fields.keys() != {"AccessKey", "Timestamp", "Nonce", "Signature"}:
        raise SignatureError("authorization needs exactly AccessKey, Timestamp, Nonce and Signature")
    ak, ts, nonce, sig = fields["AccessKey"], fields["Timestamp"], fields["Nonce"], fields["Signature"]
    if not ak or len(ak) > _MAX_KEY_CHARS or not _is_key_text(ak):
        raise SignatureError("access key malformed")
    if not ts.isdigit() or len(ts) > 16:
        raise SignatureError("timestamp malformed")
    if not nonce or len(nonce) > _MAX_NONCE_CHARS or not _is_key_text(nonce):
        raise SignatureError("nonce malformed")
    if _HEX64(sig) is None:
        raise SignatureError("signature malformed")
    return ak, int(ts), nonce, sig, scheme


def verify_fields(key: HmacKey, access_key: str, timestamp_ms: int, nonce: str, signature_hex: str, method: str,
                  path: str, query: Mapping[str, str], body: bytes, raw_query: str | None = None,
                  scheme: str = SCHEME, *, host: str) -> bool:
    """Whether ``signature_hex`` signs this request with the account's ``key`` (:func:`hmac_key`; constant-time
    comparison). What :func:`verify` does, with the fields of :func:`parse_authorization_fields`.

    ``raw_query``, the query string exactly as received (``query`` is its decoding), is tried first as the
    canonical query: the SDK sends its query in canonical spelling and order (:meth:`RequestSigner.sign`), so this
    usually verifies without canonicalising ``query``. ``scheme`` is the header's scheme word (it names the body's
    digest); ``host`` the request's ``Host`` (the caller checks it names this server). It is sound: a signature covers a canonical query, and a
    received string equal to one decodes to the same arguments (decoding inverts the canonical encoding), so no
    request is accepted that its signer did not sign. Otherwise (another client, a proxy that reordered or
    re-encoded the query) ``query`` is canonicalised as usual.
    """
    body_hash = body_digest(body, scheme)
    method = method.upper()
    if raw_query is not None and "\n" not in raw_query:
        msg = _to_sign(scheme, method, host, path, raw_query, timestamp_ms, nonce, access_key, body_hash)
        if hmac.compare_digest(key.hexdigest(msg), signature_hex):
            return True
        if raw_query == (canonical := canonical_query(query)):
            return False
    else:
        canonical = canonical_query(query)
    msg = _to_sign(scheme, method, host, path, canonical, timestamp_ms, nonce, access_key, body_hash)
    return hmac.compare_digest(key.hexdigest(msg), signature_hex)


def verify(auth: SignedAuth, secret_key: str, method: str, path: str, query: Mapping[str, str],
           body: bytes, *, host: str) -> bool:
    """Whether ``auth`` signs this request with ``secret_key`` (constant-time comparison).

    Freshness (the timestamp window) and replay (the nonce) are the caller's checks.
    """
    return verify_fields(hmac_key(secret_key), auth.access_key, auth.timestamp_ms, auth.nonce, auth.signature,
                         method, path, query, body, scheme=auth.scheme, host=host)


class RequestSigner:
    """Signs requests as one account: the HMAC key is set up once and the header's fixed part written once.

    :meth:`of` shares one signer per :class:`Credentials` (a bounded cache); the SDK's clients keep theirs.
    ``scheme`` names the body's digest (the module docstring); the default is :data:`SIGNING_SCHEME`.
    """

    __slots__ = ("_access_key", "_digest", "_empty", "_key", "_prefix", "_scheme")

    _cache: dict[Credentials, RequestSigner] = {}
    _cache_lock = threading.Lock()
    _CACHE_MAX = 64

    def __init__(self, credentials: Credentials, scheme: str = SIGNING_SCHEME) -> None:
        self._access_key = credentials.access_key
        self._key = hmac_key(credentials.secret_key)
        self._scheme = _known_scheme(scheme)
        self._prefix = f"{scheme} AccessKey={credentials.access_key},Timestamp="
        self._digest = _BODY_DIGESTS[scheme]
        self._empty = _EMPTY_BODY_DIGESTS[scheme]

    @classmethod
    def of(cls, credentials: Credentials) -> RequestSigner:
        """The shared signer of ``credentials``."""
        signer = cls._cache.get(credentials)
        if signer is None:
            signer = cls(credentials)
            with cls._cache_lock:
                if len(cls._cache) >= cls._CACHE_MAX:
                    cls._cache.clear()
                cls._cache[credentials] = signer
        return signer

    @property
    def access_key(self) -> str:
        """The account that signs."""
        return self._access_key

    def header(self, method: str, target: str, body: bytes, timestamp_ms: int, nonce: str, host: str) -> str:
        """The ``Authorization`` value (see :func:`authorization_header`)."""
        path, canonical = _split_target(target)
        return self._header(method, host, path, canonical, body, timestamp_ms, nonce)

    def _header(self, method: str, host: str, path: str, canonical: str, body: bytes, timestamp_ms: int,
                nonce: str) -> str:
        msg = _to_sign(self._scheme, method.upper(), host, path, canonical, timestamp_ms, nonce, self._access_key,
                       self._digest(body) if body else self._empty)  # the body's only pass
        return f"{self._prefix}{timestamp_ms},Nonce={nonce},Signature={self._key.hexdigest(msg)}"

    def fresh(self, method: str, target: str, body: bytes, host: str) -> str:
        """:meth:`header` with the wall clock and a fresh 64-bit nonce (what a client sends)."""
        return self.header(method, target, body, time.time_ns() // 1_000_000, _next_nonce(), host)

    def sign(self, method: str, target: str, body: bytes, host: str) -> tuple[str, str]:
        """``(target to send, Authorization value)`` of a fresh signature (wall clock, fresh nonce).

        The target to send carries the canonical query itself (the same arguments, sorted by name and spelled
        canonically), which lets the server verify the query string as received (:func:`verify_fields`) without
        canonicalising it again.
        """
        path, canonical = _split_target(target)
        header = self._header(method, host, path, canonical, body, time.time_ns() // 1_000_000, _next_nonce())
        # The canonical query decodes to the same arguments as the target's (decoding inverts the encoding); a
        # CanonicalTarget (every send and pull) already is that string.
        if type(target) is CanonicalTarget or not canonical:
            return target, header
        return f"{path}?{canonical}", header


def fresh_authorization(credentials: Credentials, method: str, target: str, body: bytes, host: str) -> str:
    """:func:`authorization_header` with the wall clock and a random 64-bit nonce (what a client sends); ``host``
    is the ``Host`` header the request goes with."""
    return RequestSigner.of(credentials).fresh(method, target, body, host)


class SigningAuth(httpx.Auth):
    """An httpx ``auth=`` that signs every request with ``credentials`` (for clients built on httpx)."""

    requires_request_body = True

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        url = request.url
        target = url.raw_path.decode("ascii")
        request.headers["Authorization"] = fresh_authorization(self.credentials, request.method, target,
                                                               request.content, request.headers["Host"])
        yield request
