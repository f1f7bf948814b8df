"""The ACL gate on its own: authentication outcomes (never revealed to the client), white lists, the metrics
token, fail-closed routes, and the accounts file watcher keeping the last good file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from client.errors import NoPermissionError, SystemBusyError
from common.requests import parse_query
from common.signing import Credentials, authorization_header
from remoting.acl import Action, parse_acl
from remoting.acl_gate import ADMIN, OPEN, SIGNED, AclFileWatcher, AclGate, topic_arg
from remoting.router import Request

NOW = 1_700_000_000_000
FILE = """
globalWhiteRemoteAddresses = ["10.1.*.*"]
[[accounts]]
accessKey = "admin"
secretKey = "admin-secret"
admin = true
[[accounts]]
accessKey = "app"
secretKey = "app-secret"
whiteRemoteAddress = "127.0.0.1"
topicPerms = ["T=PUB"]
"""
RULES = {("POST", "/send"): topic_arg("topic", Action.PUB), ("POST", "/topic"): ADMIN, ("GET", "/any"): SIGNED,
         ("GET", "/open"): OPEN, ("GET", "/metrics"): ADMIN}
NOT_SIGNED = "request not signed / signature refused"


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def gate(clock: Clock | None = None, **kw: object) -> AclGate:
    return AclGate(parse_acl(FILE), RULES, clock_ms=clock or Clock(), tolerance_ms=1000, **kw)  # type: ignore[arg-type]


def request(method: str, target: str, body: bytes = b"", host: str = "127.0.0.1", raw: bool = True) -> Request:
    """As the Router builds it: with the query string as received (``raw=False``: without, so the gate
    canonicalises the decoded query)."""
    path, _, qs = target.partition("?")
    return Request(method, path, parse_query(qs.encode()), body, (host, 5000), qs.encode() if raw else b"",
                   host=SERVER)


#: The ``Host`` the requests of these tests are sent with (built in process: no connection, no server names, so
#: the gate checks only that the signature covers it).
SERVER = "127.0.0.1:10911"


def sign(creds: Credentials, method: str, target: str, body: bytes = b"", ts: int = NOW, nonce: str = "n1") -> bytes:
    return authorization_header(creds, method, target, body, host=SERVER, timestamp_ms=ts, nonce=nonce).encode()


APP, ADMIN_C = Credentials("app", "app-secret"), Credentials("admin", "admin-secret")


def refused(g: AclGate, req: Request, header: bytes | None) -> str:
    with pytest.raises(NoPermissionError) as e:
        g(req, header)
    return e.value.message


def test_signed_and_allowed_sets_the_principal() -> None:
    g, req = gate(), request("POST", "/send?topic=T", b"body")
    g(req, sign(APP, "POST", "/send?topic=T", b"body"))
    assert req.principal == "app"


@pytest.mark.parametrize(("header", "why"), [
    (None, "no header"),
    (b"Basic abc", "another scheme"),
    (sign(Credentials("app", "wrong-secret"), "POST", "/send?topic=T", b"body"), "wrong secret"),
    (sign(Credentials("ghost", "app-secret"), "POST", "/send?topic=T", b"body"), "unknown access key"),
    (sign(APP, "POST", "/send?topic=T", b"other body"), "another body"),
    (sign(APP, "POST", "/send?topic=U", b"body"), "another query"),
    (sign(APP, "POST", "/send?topic=T", b"body", ts=NOW - 1001), "stale"),
    (sign(APP, "POST", "/send?topic=T", b"body", ts=NOW + 1001), "from the future"),
])
def test_refusals_never_say_which_part_was_wrong(header: bytes | None, why: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert refused(gate(), request("POST", "/send?topic=T", b"body"), header) == NOT_SIGNED, why
    assert "ACL refused POST /send" in caplog.text  # the reason is logged server-side


def test_replay_is_refused() -> None:
    g = gate()
    header = sign(APP, "POST", "/send?topic=T", b"body")
    g(request("POST", "/send?topic=T", b"body"), header)
    assert refused(g, request("POST", "/send?topic=T", b"body"), header) == NOT_SIGNED


def test_replay_guard_full_is_busy_not_forgetful() -> None:
    g = gate(nonce_cache_max=1)
    g(request("POST", "/send?topic=T", b"b"), sign(APP, "POST", "/send?topic=T", b"b", nonce="a"))
    with pytest.raises(SystemBusyError, match="aclNonceCacheMax"):
        g(request("POST", "/send?topic=T", b"b"), sign(APP, "POST", "/send?topic=T", b"b", nonce="b"))


def test_account_white_remote_address_and_global_white_list() -> None:
    g = gate()
    assert refused(g, request("POST", "/send?topic=T", host="127.0.0.2"),
                   sign(APP, "POST", "/send?topic=T")) == NOT_SIGNED
    anon = request("POST", "/send?topic=Anything", host="10.1.2.3")
    g(anon, None)  # globally white-listed: no signature, any topic
    assert anon.principal is None
    assert "white-listed address 10.1.2.3 (no account) has no admin" in refused(
        g, request("POST", "/topic", host="10.1.2.3"), None)


def test_permission_refusals_name_the_permission() -> None:
    g = gate()
    assert refused(g, request("POST", "/send?topic=U"), sign(APP, "POST", "/send?topic=U")) == (
        "account app has no PUB permission on topic U")
    assert refused(g, request("POST", "/topic"), sign(APP, "POST", "/topic")) == (
        "account app has no admin permission (POST /topic needs admin)")
    g(request("POST", "/topic"), sign(ADMIN_C, "POST", "/topic"))


def test_open_routes_and_routes_without_a_rule() -> None:
    g = gate()
    g(request("GET", "/open"), None)
    assert "no ACL rule" in refused(g, request("GET", "/unlisted"), sign(ADMIN_C, "GET", "/unlisted"))


def test_metrics_token() -> None:
    g = gate(metrics_token="tok")
    g(request("GET", "/metrics"), b"Bearer tok")
    assert refused(g, request("GET", "/metrics"), b"Bearer bad") == NOT_SIGNED
    assert refused(g, request("GET", "/any"), b"Bearer tok") == NOT_SIGNED
    assert refused(gate(), request("GET", "/metrics"), b"Bearer tok") == NOT_SIGNED


def test_watcher_reloads_and_keeps_the_last_good_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(FILE)
    g = gate()
    watcher = AclFileWatcher(path, g.update)
    assert not watcher.check()  # unchanged
    path.write_text(FILE.replace('topicPerms = ["T=PUB"]', 'topicPerms = ["U=PUB"]'))
    os.utime(path, ns=(1, 1))  # a distinct stat even within the file system's time granularity
    assert watcher.check() and watcher.reloads == 1
    g(request("POST", "/send?topic=U"), sign(APP, "POST", "/send?topic=U"))
    path.write_text("accounts = [")  # broken
    with caplog.at_level(logging.ERROR):
        assert not watcher.check()
    assert watcher.failures == 1 and "keeping the last good accounts" in caplog.text and "not valid TOML" in caplog.text
    g(request("POST", "/send?topic=U"), sign(APP, "POST", "/send?topic=U", nonce="n2"))  # still the good one


def test_a_reloaded_secret_takes_effect_at_once() -> None:
    """The gate keeps each account's HMAC key and Principal between requests: a reload must drop them."""
    g = gate()
    g(request("POST", "/send?topic=T"), sign(APP, "POST", "/send?topic=T"))
    g.update(parse_acl(FILE.replace('"app-secret"', '"app-secret-2"').replace('["T=PUB"]', '["T=SUB"]')))
    assert refused(g, request("POST", "/send?topic=T"), sign(APP, "POST", "/send?topic=T", nonce="n2")) == NOT_SIGNED
    new = Credentials("app", "app-secret-2")
    assert "no PUB permission on topic T" in refused(g, request("POST", "/send?topic=T"),
                                                    sign(new, "POST", "/send?topic=T", nonce="n3"))


def test_a_reordered_query_verifies_through_the_canonical_query() -> None:
    """A proxy may reorder or re-encode the query: the string as received no longer matches what was signed, and
    the gate falls back to canonicalising the decoded arguments."""
    g = gate()
    header = sign(APP, "POST", "/send?topic=T&queueId=1")
    g(request("POST", "/send?queueId=1&topic=%54"), header)
    g(request("POST", "/send?topic=T&queueId=1", raw=False), sign(APP, "POST", "/send?topic=T&queueId=1", nonce="n2"))
    assert refused(g, request("POST", "/send?queueId=2&topic=T"), sign(APP, "POST", "/send?topic=T&queueId=1",
                                                                    nonce="n3")) == NOT_SIGNED


def test_a_reload_drops_the_permissions_and_address_checks_kept_per_peer() -> None:
    """The gate keeps, per (account, peer address), the account's checks and the permission bits it resolved: a
    reload that changes only the permissions or the white-listed address (same secret) takes effect at once, and
    a peer verified from one address says nothing about another."""
    g = gate()
    g(request("POST", "/send?topic=T"), sign(APP, "POST", "/send?topic=T"))
    assert refused(g, request("POST", "/send?topic=T", host="127.0.0.2"),
                   sign(APP, "POST", "/send?topic=T", nonce="n2")) == NOT_SIGNED
    g.update(parse_acl(FILE.replace('["T=PUB"]', '["T=SUB"]')))
    assert refused(g, request("POST", "/send?topic=T"), sign(APP, "POST", "/send?topic=T", nonce="n3")) == (
        "account app has no PUB permission on topic T")
    g.update(parse_acl(FILE.replace('whiteRemoteAddress = "127.0.0.1"', 'whiteRemoteAddress = "127.0.0.2"')))
    assert refused(g, request("POST", "/send?topic=T"), sign(APP, "POST", "/send?topic=T", nonce="n4")) == NOT_SIGNED
    g(request("POST", "/send?topic=T", host="127.0.0.2"), sign(APP, "POST", "/send?topic=T", nonce="n5"))


def test_permission_bits_kept_per_peer_are_bounded_and_still_decide() -> None:
    """Past the bound the bits start over; every answer stays the rule's (T is PUB, any other topic DENY)."""
    from remoting import acl_gate

    g = gate()
    for i in range(acl_gate._DECISIONS_MAX * 2 + 3):
        topic = "T" if i % 7 == 0 else f"U{i}"
        req, header = request("POST", f"/send?topic={topic}"), sign(APP, "POST", f"/send?topic={topic}", nonce=f"n{i}")
        if topic == "T":
            g(req, header)
        else:
            assert refused(g, req, header) == f"account app has no PUB permission on topic {topic}"
