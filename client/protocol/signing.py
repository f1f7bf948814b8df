"""Request signing of the ACL (docs/SECURITY.md): one ``Authorization`` header, HMAC-SHA256 with the secret key.

A signed request carries::

    Authorization: SPLITMQ-HMAC-SHA256 AccessKey=<ak>,Timestamp=<ms>,Nonce=<hex>,Signature=<hex>

and the signature is the HMAC-SHA256, keyed with the account's secret key, of the *string to sign*::

    SPLITMQ-HMAC-SHA256\\n<METHOD>\\n<path>\\n<sorted query>\\n<timestamp>\\n<nonce>\\n<access key>\\n<sha256(body) hex>

``<sorted query>`` is the decoded query (as :func:`client.protocol.asgi.parse_query` reads it: last value wins),
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
import os
import re
import time
from collections.abc import Generator, Mapping
from urllib.parse import quote, unquote

import attrs
import httpx

__all__ = [
    "AUTH_HEADER",
    "SCHEME",
    "Credentials",
    "SignatureError",
    "SignedAuth",
    "SigningAuth",
    "authorization_header",
    "canonical_query",
    "fresh_authorization",
    "parse_authorization",
    "signature",
    "string_to_sign",
    "verify",
]

#: The scheme word that opens the header value and the string to sign.
SCHEME = "SPLITMQ-HMAC-SHA256"
#: The header that carries the signature (lower case, as ASGI scopes and the SDK's transport write it).
AUTH_HEADER = b"authorization"
#: Longest header value :func:`parse_authorization` reads; a longer one is refused before it is split.
MAX_AUTH_HEADER_BYTES = 512
_MAX_KEY_CHARS = 128
_MAX_NONCE_CHARS = 64
_EMPTY_BODY_SHA256 = hashlib.sha256(b"").hexdigest()


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


#: Printable ASCII without space, ``,`` and ``=`` (the header's separators).
_KEY_TEXT = re.compile(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]+").fullmatch
_HEX64 = re.compile(r"[0-9a-f]{64}").fullmatch
#: What ``quote(v, safe='')`` leaves as it is: most names and values, which then skip ``quote`` (the servers verify
#: every signed request, and ``quote`` was the largest part of that cost).
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch


def _is_key_text(value: str) -> bool:
    return _KEY_TEXT(value) is not None


def _quoted(value: str) -> str:
    return value if _UNRESERVED(value) is not None else quote(value, safe="")


def canonical_query(query: Mapping[str, str]) -> str:
    """The query as it enters the string to sign: pairs sorted by name, each percent-encoded, joined by ``&``."""
    if not query:
        return ""
    return "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in sorted(query.items()))


def _query_of(target: str) -> tuple[str, dict[str, str]]:
    """Split a request target into its path and decoded query (last value wins, like the servers' parser)."""
    path, _, qs = target.partition("?")
    query: dict[str, str] = {}
    if qs:
        for field in qs.split("&"):
            if field:
                name, _, value = field.partition("=")
                if "%" in name or "+" in name:
                    name = unquote(name.replace("+", " "))
                if "%" in value or "+" in value:
                    value = unquote(value.replace("+", " "))
                query[name] = value
    return path, query


def string_to_sign(method: str, path: str, query: Mapping[str, str], timestamp_ms: int, nonce: str,
                   access_key: str, body: bytes) -> bytes:
    """The bytes the signature covers (see the module docstring)."""
    body_hash = hashlib.sha256(body).hexdigest() if body else _EMPTY_BODY_SHA256
    return "\n".join((SCHEME, method.upper(), path, canonical_query(query), str(timestamp_ms), nonce,
                      access_key, body_hash)).encode()


def signature(secret_key: str, method: str, path: str, query: Mapping[str, str], timestamp_ms: int, nonce: str,
              access_key: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of :func:`string_to_sign`, keyed with ``secret_key``."""
    msg = string_to_sign(method, path, query, timestamp_ms, nonce, access_key, body)
    return hmac.new(secret_key.encode(), msg, hashlib.sha256).hexdigest()


def authorization_header(credentials: Credentials, method: str, target: str, body: bytes, *, timestamp_ms: int,
                         nonce: str) -> str:
    """The ``Authorization`` value that signs one request.

    Args:
        credentials: the account.
        method: the HTTP method.
        target: the request target as sent, ``/path?query`` (the query percent-encoded or not).
        body: the exact body bytes sent.
        timestamp_ms: the client's wall clock, milliseconds since the epoch.
        nonce: a fresh random token (hex, at most 64 characters) for this request only.
    """
    path, query = _query_of(target)
    sig = signature(credentials.secret_key, method, path, query, timestamp_ms, nonce, credentials.access_key, body)
    return f"{SCHEME} AccessKey={credentials.access_key},Timestamp={timestamp_ms},Nonce={nonce},Signature={sig}"


def parse_authorization(value: bytes | str) -> SignedAuth:
    """Read an ``Authorization`` header value.

    Raises:
        SignatureError: the value is too long, not of this scheme, or a field is missing, repeated or malformed.
    """
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
    if scheme != SCHEME:
        raise SignatureError("authorization scheme is not " + SCHEME)
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
    return SignedAuth(ak, int(ts), nonce, sig)


def verify(auth: SignedAuth, secret_key: str, method: str, path: str, query: Mapping[str, str],
           body: bytes) -> bool:
    """Whether ``auth`` signs this request with ``secret_key`` (constant-time comparison).

    Freshness (the timestamp window) and replay (the nonce) are the caller's checks.
    """
    expected = signature(secret_key, method, path, query, auth.timestamp_ms, auth.nonce, auth.access_key, body)
    return hmac.compare_digest(expected, auth.signature)


def fresh_authorization(credentials: Credentials, method: str, target: str, body: bytes) -> str:
    """:func:`authorization_header` with the wall clock and a random 64-bit nonce (what a client sends)."""
    return authorization_header(credentials, method, target, body, timestamp_ms=int(time.time() * 1000),
                                nonce=os.urandom(8).hex())


class SigningAuth(httpx.Auth):
    """An httpx ``auth=`` that signs every request with ``credentials`` (for clients built on httpx)."""

    requires_request_body = True

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        url = request.url
        target = url.raw_path.decode("ascii")
        request.headers["Authorization"] = fresh_authorization(self.credentials, request.method, target,
                                                               request.content)
        yield request
