"""Issue 39: a signature names its server, and a TLS connection is bound to the account that first signed on it.

The gate on its own, with the :class:`~remoting.router.Connection` the HTTP layer hands it: what a bound
connection lets in unsigned, and every way of abusing it that must fail -- a second account on the same
connection, a request that changes identity mid-connection, a connection reused after the accounts file changed
the account (permissions, secret, existence, address), an unsigned request on a plaintext connection, and a
signature made for another server."""

from __future__ import annotations

import pytest

from client.errors import NoPermissionError
from common.requests import parse_query
from common.signing import Credentials, authorization_header
from remoting.acl import Action, parse_acl
from remoting.acl_gate import AclGate, topic_arg
from remoting.router import Connection, Request

NOW = 1_700_000_000_000
SERVER = ("127.0.0.1", 10911)
HOST = "127.0.0.1:10911"
FILE = """
[[accounts]]
accessKey = "app"
secretKey = "app-secret"
topicPerms = ["T=PUB", "U=PUB"]
[[accounts]]
accessKey = "other"
secretKey = "other-secret"
topicPerms = ["T=PUB", "V=PUB"]
"""
APP, OTHER = Credentials("app", "app-secret"), Credentials("other", "other-secret")
RULES = {("POST", "/send"): topic_arg("topic", Action.PUB)}
NOT_SIGNED = "request not signed / signature refused"


def gate(text: str = FILE, **kw: object) -> AclGate:
    return AclGate(parse_acl(text), RULES, clock_ms=lambda: NOW, **kw)  # type: ignore[arg-type]


def conn(tls: bool = True, local: tuple[str, int] = SERVER) -> Connection:
    return Connection(("127.0.0.1", 40000), local, tls)


_nonces = iter(range(1_000_000))


def send(g: AclGate, c: Connection | None, topic: str, creds: Credentials | None = None, host: str = HOST) -> str:
    """One ``POST /send?topic=...`` through the gate: signed by ``creds`` (None: unsigned); '' when let in, else
    the refusal's message."""
    target = f"/send?topic={topic}"
    header = (authorization_header(creds, "POST", target, b"m", host=host, timestamp_ms=NOW,
                                   nonce=f"{next(_nonces):x}").encode() if creds is not None else None)
    request = Request("POST", "/send", parse_query(f"topic={topic}".encode()), b"m", ("127.0.0.1", 40000),
                      f"topic={topic}".encode(), host=host, conn=c)
    try:
        g(request, header)
    except NoPermissionError as e:
        return e.message
    assert request.principal == (c.bound[0].access_key if c is not None and c.bound is not None else
                                 creds.access_key if creds else None)
    return ""


def test_a_tls_connection_is_bound_by_its_first_signed_request_and_later_ones_go_unsigned() -> None:
    g, c = gate(), conn()
    assert send(g, c, "T") == NOT_SIGNED  # nothing bound yet: an unsigned request is refused
    assert send(g, c, "T", APP) == ""
    assert c.bound is not None and c.bound[0].access_key == "app"
    assert send(g, c, "T") == ""  # unsigned, let in as app
    assert send(g, c, "U") == ""
    # the rule still runs per request, from the bound account's permissions
    assert send(g, c, "V") == "account app has no PUB permission on topic V"
    assert send(g, c, "T", APP) == ""  # the same account may still sign


def test_a_second_account_on_a_bound_connection_is_refused_and_changes_nothing() -> None:
    g, c = gate(), conn()
    assert send(g, c, "T", APP) == ""
    refusal = send(g, c, "V", OTHER)  # OTHER may publish to V, but not on app's connection
    assert "bound to account app" in refusal and "must open a connection of its own" in refusal
    assert c.bound[0].access_key == "app"
    assert send(g, c, "V") == "account app has no PUB permission on topic V"  # still app: no identity change
    assert send(g, conn(), "V", OTHER) == ""  # on its own connection, OTHER is fine


def test_a_plaintext_connection_never_binds() -> None:
    g, c = gate(), conn(tls=False)
    assert send(g, c, "T", APP) == ""
    assert c.bound is None
    assert send(g, c, "T") == NOT_SIGNED


@pytest.mark.parametrize(("new_file", "then"), [
    # the account's permissions change: the next unsigned request is judged by the new ones
    (FILE.replace('topicPerms = ["T=PUB", "U=PUB"]', 'topicPerms = ["T=DENY", "U=PUB"]'),
     {"T": "account app has no PUB permission on topic T", "U": ""}),
    # the account is removed: the binding goes, and the request is refused
    (FILE.split("[[accounts]]\naccessKey = \"other\"")[0].replace('accessKey = "app"', 'accessKey = "gone"'),
     {"T": NOT_SIGNED, "U": NOT_SIGNED}),
    # its secret changes: a connection authenticated with the old one is not the account any more
    (FILE.replace('secretKey = "app-secret"', 'secretKey = "rotated-secret"'), {"T": NOT_SIGNED, "U": NOT_SIGNED}),
    # its address white list no longer holds the connection's peer
    (FILE.replace('accessKey = "app"', 'accessKey = "app"\nwhiteRemoteAddress = "10.9.9.9"'),
     {"T": NOT_SIGNED, "U": NOT_SIGNED}),
])
def test_a_connection_reused_after_a_reload_gets_the_accounts_file_as_it_is_now(new_file: str,
                                                                                 then: dict[str, str]) -> None:
    g, c = gate(), conn()
    assert send(g, c, "T", APP) == "" and send(g, c, "T") == ""
    g.update(parse_acl(new_file))
    assert {topic: send(g, c, topic) for topic in then} == then
    if then["U"] == NOT_SIGNED:
        assert c.bound is None  # dropped: signing again is the only way back in


def test_a_signature_for_another_server_is_refused() -> None:
    g = gate()
    assert send(g, conn(), "T", APP, host="127.0.0.1:10921") == NOT_SIGNED  # made for the broker next door
    assert send(g, conn(), "T", APP, host=HOST) == ""  # the connection's own address
    assert send(g, conn(local=("::1", 10911)), "T", APP, host="[::1]:10911") == ""
    assert send(g, conn(), "T", APP, host="localhost:10911") == ""  # loopback's name
    named = gate(server_names=("mq.example:10911",))
    assert send(named, conn(), "T", APP, host="mq.example:10911") == ""  # a name the operator configured
    assert send(named, conn(), "T", APP, host="other.example:10911") == NOT_SIGNED
