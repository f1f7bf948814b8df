"""The ACL's request signature: what it covers, what breaks it, and a parser that refuses bad headers cleanly."""

from __future__ import annotations

import os
import platform

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.requests import parse_query
from common.signing import (
    Credentials,
    SignatureError,
    authorization_header,
    parse_authorization,
    verify,
)

CREDS = Credentials("app1", "s3cret")
TS = 1_700_000_000_000
HOST = "127.0.0.1:10911"


def signed(method: str = "POST", target: str = "/send?topic=T&queueId=1", body: bytes = b"abc") -> str:
    return authorization_header(CREDS, method, target, body, host=HOST, timestamp_ms=TS, nonce="00ff")


def check(header: str, method: str, target: str, body: bytes, secret: str = "s3cret", host: str = HOST) -> bool:
    path, _, qs = target.partition("?")
    return verify(parse_authorization(header), secret, method, path, parse_query(qs.encode()), body, host=host)


def test_a_signed_request_verifies_and_the_header_names_no_secret() -> None:
    header = signed()
    assert check(header, "POST", "/send?topic=T&queueId=1", b"abc")
    assert "s3cret" not in header and "s3cret" not in repr(CREDS) and "s3cret" not in str(CREDS)


@pytest.mark.parametrize(("method", "target", "body", "secret"), [
    ("GET", "/send?topic=T&queueId=1", b"abc", "s3cret"),     # another method
    ("POST", "/pull?topic=T&queueId=1", b"abc", "s3cret"),    # another path
    ("POST", "/send?topic=U&queueId=1", b"abc", "s3cret"),    # another argument value
    ("POST", "/send?topic=T&queueId=1&x=1", b"abc", "s3cret"),  # an extra argument
    ("POST", "/send?topic=T&queueId=1", b"abd", "s3cret"),    # another body
    ("POST", "/send?topic=T&queueId=1", b"abc", "other"),     # another secret
])
def test_any_change_breaks_the_signature(method: str, target: str, body: bytes, secret: str) -> None:
    assert not check(signed(), method, target, body, secret)


def test_the_signature_names_the_server_it_was_sent_to() -> None:
    """Issue 39: the same request signed for one server does not verify for another (its Host)."""
    assert check(signed(), "POST", "/send?topic=T&queueId=1", b"abc", host=HOST)
    assert not check(signed(), "POST", "/send?topic=T&queueId=1", b"abc", host="127.0.0.1:10921")


def test_argument_order_and_encoding_do_not_matter() -> None:
    header = signed("GET", "/pull?topic=A%7CB&group=g+1", b"")
    assert check(header, "GET", "/pull?group=g%201&topic=A|B", b"")


def test_the_sdk_signs_blake3_bodies_and_servers_take_both_schemes() -> None:
    from common.signing import (
        SCHEME,
        SCHEME_BLAKE3,
        SIGNING_SCHEME,
        RequestSigner,
        body_digest,
        string_to_sign,
    )

    if platform.machine() in ("x86_64", "AMD64", "aarch64", "arm64"):  # where pyproject.toml installs blake3
        assert SIGNING_SCHEME == SCHEME_BLAKE3
    b3 = signed(body=b"abc")
    assert b3.startswith(SCHEME_BLAKE3 + " ") and check(b3, "POST", "/send?topic=T&queueId=1", b"abc")
    sha = RequestSigner(CREDS, SCHEME).header("POST", "/send?topic=T&queueId=1", b"abc", TS, "00ff", HOST)
    assert sha.startswith(SCHEME + " ") and check(sha, "POST", "/send?topic=T&queueId=1", b"abc")
    # The scheme word is signed: swapping it (a downgrade to the other digest) breaks the signature.
    assert not check(SCHEME + b3[len(SCHEME_BLAKE3):], "POST", "/send?topic=T&queueId=1", b"abc")
    assert not check(SCHEME_BLAKE3 + sha[len(SCHEME):], "POST", "/send?topic=T&queueId=1", b"abc")
    # The digests are the published ones (BLAKE3's and SHA-256's of the empty input).
    assert string_to_sign("GET", "/p", {}, 1, "n", "a", b"", host=HOST, scheme=SCHEME_BLAKE3).endswith(
        b"\naf1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262")
    assert string_to_sign("GET", "/p", {}, 1, "n", "a", b"", host=HOST).endswith(
        b"\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    assert body_digest(b"", SCHEME) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert body_digest(b"abc", SCHEME_BLAKE3) == \
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"


def test_a_process_without_blake3_refuses_its_scheme_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from common import signing

    header = signed()
    monkeypatch.delitem(signing._BODY_DIGESTS, signing.SCHEME_BLAKE3)
    with pytest.raises(SignatureError, match="blake3 package"):
        parse_authorization(header)
    with pytest.raises(SignatureError, match="blake3 package"):
        parse_authorization(header.replace(",", ", "))  # the general parser too


def test_a_changed_timestamp_or_nonce_breaks_it() -> None:
    auth = parse_authorization(signed())
    for changed in (auth.__class__(auth.access_key, auth.timestamp_ms + 1, auth.nonce, auth.signature, auth.scheme),
                    auth.__class__(auth.access_key, auth.timestamp_ms, "00fe", auth.signature, auth.scheme)):
        assert not verify(changed, "s3cret", "POST", "/send", {"topic": "T", "queueId": "1"}, b"abc", host=HOST)


@pytest.mark.parametrize("value", [
    b"", b"Basic abc", b"SPLITMQ-HMAC-SHA256", b"SPLITMQ-HMAC-SHA256 AccessKey=a",
    b"SPLITMQ-HMAC-SHA256 AccessKey=a,Timestamp=1,Nonce=n,Signature=" + b"0" * 63,
    b"SPLITMQ-HMAC-SHA256 AccessKey=a,Timestamp=x,Nonce=n,Signature=" + b"0" * 64,
    b"SPLITMQ-HMAC-SHA256 AccessKey=a,AccessKey=b,Timestamp=1,Nonce=n,Signature=" + b"0" * 64,
    b"SPLITMQ-HMAC-SHA256 AccessKey=,Timestamp=1,Nonce=n,Signature=" + b"0" * 64,
    b"SPLITMQ-HMAC-SHA256 AccessKey=a,Timestamp=1,Nonce=n,Signature=" + b"G" * 64,
    b"SPLITMQ-HMAC-SHA256 AccessKey=\xff,Timestamp=1,Nonce=n,Signature=" + b"0" * 64,
    b"SPLITMQ-HMAC-SHA256 AccessKey=a,Timestamp=1,Nonce=n,Signature=" + b"0" * 64 + b",Extra=1",
    b"x" * 10_000,
])
def test_bad_headers_are_refused_with_a_signature_error(value: bytes) -> None:
    with pytest.raises(SignatureError):
        parse_authorization(value)


@given(st.binary(max_size=600))
def test_the_parser_raises_only_signature_errors(value: bytes) -> None:
    try:
        parse_authorization(value)
    except SignatureError:
        pass


@pytest.mark.parametrize(("ak", "sk"), [("", "x"), ("a b", "x"), ("a,b", "x"), ("a=b", "x"), ("a" * 129, "x"),
                                        ("é", "x"), ("a", "")])
def test_bad_credentials_are_refused_at_construction(ak: str, sk: str) -> None:
    with pytest.raises(ValueError):
        Credentials(ak, sk)


def test_the_httpx_auth_signs_what_it_sends() -> None:
    import httpx

    from common.signing import SigningAuth

    seen: list[bool] = []

    def handler(request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode()
        seen.append(check(request.headers["authorization"], request.method, target, request.content,
                          host=request.headers["host"]))
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(handler), auth=SigningAuth(CREDS)) as c:
        c.post("http://h/send", params={"topic": "a b", "queueId": "1"}, content=b"xyz")
        c.get("http://h/route?topic=T")
    assert seen == [True, True]


def _reference_canonical(query: dict[str, str]) -> str:
    """The canonical query as docs/SECURITY.md words it: each name and value through ``quote(safe='')``."""
    from urllib.parse import quote

    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(query.items()))


_QUERY_TEXT = st.text(alphabet=st.sampled_from("aAz09_.~-%&=+*|/ é\n\x00") | st.characters(exclude_categories=["Cs"]), max_size=8)


@given(st.dictionaries(_QUERY_TEXT, _QUERY_TEXT, max_size=6))
def test_the_fast_canonical_query_is_the_documented_one(query: dict[str, str]) -> None:
    from common.signing import canonical_query

    assert canonical_query(query) == _reference_canonical(query)


_RAW_FIELD = st.text(alphabet=st.sampled_from("aq1Z_.~-%2AaF7f=+*&/ "), max_size=10)  # targets are ASCII


@given(st.lists(_RAW_FIELD, max_size=6))
def test_the_signer_reads_a_raw_query_as_the_server_decodes_it(fields: list[str]) -> None:
    """The SDK canonicalises its target's query without decoding it when it is spelled canonically: the result is
    what the server gets from the decoded arguments (duplicates, stray ``%``, ``+``, extra ``=`` included)."""
    from common.signing import _split_target

    target = "/p?" + "&".join(fields) if fields else "/p"
    _, _, qs = target.partition("?")
    assert _split_target(target) == ("/p", _reference_canonical(parse_query(qs.encode())))


@given(ak=st.from_regex(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]{1,128}", fullmatch=True),
       ts=st.integers(0, 10**16 - 1), nonce=st.from_regex(r"[\x21-\x2b\x2d-\x3c\x3e-\x7e]{1,64}", fullmatch=True),
       sig=st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
def test_the_header_fast_path_reads_what_the_general_parser_reads(ak: str, ts: int, nonce: str, sig: str) -> None:
    from common.signing import _parse_general, parse_authorization_fields

    header = f"SPLITMQ-HMAC-SHA256 AccessKey={ak},Timestamp={ts},Nonce={nonce},Signature={sig}"
    assert parse_authorization_fields(header.encode()) == _parse_general(header.encode()) == (ak, ts, nonce, sig, "SPLITMQ-HMAC-SHA256")
    spaced = header.replace(",", ", ")  # another spelling: the general parser's
    assert parse_authorization_fields(spaced.encode()) == (ak, ts, nonce, sig, "SPLITMQ-HMAC-SHA256")


@given(st.lists(_RAW_FIELD, max_size=6))
def test_the_sdk_sends_the_canonical_query_and_the_server_verifies_it_as_received(fields: list[str]) -> None:
    """What the SDK sends decodes to the arguments it was asked to send; the server verifies that query string
    as received (no canonicalisation) and, reordered by a proxy, through the canonical query."""
    from common.signing import RequestSigner, hmac_key, parse_authorization_fields, verify_fields

    target = "/p?" + "&".join(fields) if fields else "/p"
    sent, header = RequestSigner(CREDS).sign("GET", target, b"", HOST)
    path, _, qs = sent.partition("?")
    query = parse_query(qs.encode())
    assert path == "/p" and query == parse_query(target.partition("?")[2].encode())
    ak, ts, nonce, sig, scheme = parse_authorization_fields(header)
    key = hmac_key("s3cret")
    assert verify_fields(key, ak, ts, nonce, sig, "GET", path, query, b"", qs, scheme, host=HOST)
    reordered = "&".join(reversed(qs.split("&")))
    assert verify_fields(key, ak, ts, nonce, sig, "GET", path, query, b"", reordered, scheme, host=HOST)
    assert verify(parse_authorization(header), "s3cret", "GET", path, query, b"", host=HOST)


def test_a_received_query_string_verifies_only_what_was_signed() -> None:
    from common.signing import hmac_key, parse_authorization_fields, verify_fields

    ak, ts, nonce, sig, scheme = parse_authorization_fields(signed("GET", "/pull?topic=T&group=g", b""))
    key = hmac_key("s3cret")
    assert verify_fields(key, ak, ts, nonce, sig, "GET", "/pull", {"group": "g", "topic": "T"}, b"", "group=g&topic=T",
                         scheme, host=HOST)
    # The raw string is only a shortcut: another received query (even one equal to what was signed, if its
    # decoding differs) does not verify.
    assert not verify_fields(key, ak, ts, nonce, sig, "GET", "/pull", {"group": "g", "topic": "U"}, b"",
                             "group=g&topic=U", scheme, host=HOST)
    assert not verify_fields(key, ak, ts, nonce, sig, "GET", "/pull", {"group": "g", "topic": "T", "x": ""}, b"",
                             "group=g&topic=T&x=", scheme, host=HOST)


@given(key=st.binary(max_size=200), msg=st.binary(max_size=300))
def test_the_set_up_hmac_key_is_hmac_sha256(key: bytes, msg: bytes) -> None:
    """Keys shorter than, as long as and longer than SHA-256's 64-byte block (hashed first), any message."""
    import hashlib
    import hmac

    from common.signing import HmacKey

    mac = HmacKey(key)
    assert mac.hexdigest(msg) == hmac.new(key, msg, hashlib.sha256).hexdigest()
    assert mac.hexdigest(msg) == mac.hexdigest(msg)  # the key's states are copied, never fed


def test_the_hmac_key_at_the_block_size_edges() -> None:
    import hashlib
    import hmac

    from common.signing import HmacKey

    for n in (0, 63, 64, 65, 128):
        key = bytes(range(n))
        assert HmacKey(key).hexdigest(b"m") == hmac.new(key, b"m", hashlib.sha256).hexdigest(), n


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_signs_with_nonces_of_its_own() -> None:
    """Nonces count from a random start per process: a child forked from a process that signed must not repeat
    its parent's next nonces (two equal requests in one millisecond would carry one signature, and the server
    would refuse the second as a replay)."""
    from common import signing

    signing._next_nonce()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next nonce and leave at once
        try:
            os.write(write_end, signing._next_nonce().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent = signing._next_nonce()
    with os.fdopen(read_end, "rb") as r:
        child = r.read().decode()
    os.waitpid(pid, 0)
    assert len(child) == 16 and child != parent


@pytest.mark.parametrize(("method", "body"), [("GET", b""), ("POST", b"a batch"), ("post", b"")])
def test_a_data_path_target_is_signed_as_any_other_target(method: str, body: bytes) -> None:
    """The signer's shortcut for the request models' targets (their query already canonical) writes the header the
    general path writes for the same request, timestamp and nonce, and sends the target unchanged."""
    from common.requests import PullRequestHeader
    from common.signing import RequestSigner, parse_authorization_fields

    target = PullRequestHeader.of("g 1", "T|x", 3, 4096, 32).target()
    sent, header = RequestSigner(CREDS).sign(method, target, body, HOST)
    _, ts, nonce, _, _ = parse_authorization_fields(header)
    assert sent is target
    assert header == authorization_header(CREDS, method, str(target), body, host=HOST, timestamp_ms=ts, nonce=nonce)
    assert check(header, method.upper(), target, body)
