"""The ACL's pure core: the accounts file loader (tables and fuzz), the permission decision, the replay guard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting.acl import (
    Account,
    AclFileError,
    Action,
    AddressPattern,
    Refusal,
    ReplayGuard,
    group_allowed,
    parse_acl,
    parse_perm,
    topic_allowed,
)

PUB, SUB = Action.PUB, Action.SUB

FILE = """
globalWhiteRemoteAddresses = ["10.10.*.*", "192.168.0.{1,2}"]

[[accounts]]
accessKey = "admin"
secretKey = "admin-secret"
admin = true

[[accounts]]
accessKey = "app1"
secretKey = "app1-secret"
whiteRemoteAddress = "127.0.0.1-9"
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["TopicA=PUB|SUB", "TopicB=DENY", "TopicP=PUB", "TopicS=SUB"]
groupPerms = ["GroupA=SUB", "GroupD=DENY"]

[[accounts]]
accessKey = "wide"
secretKey = "wide-secret"
defaultTopicPerm = "PUB|SUB"
"""

ACL = parse_acl(FILE, "plain_acl.toml")
ADMIN, APP1, WIDE = ACL.accounts["admin"], ACL.accounts["app1"], ACL.accounts["wide"]


@pytest.mark.parametrize(("account", "topic", "action", "allowed"), [
    (ADMIN, "Anything", PUB, True),               # admin may do everything
    (ADMIN, "%DLQ%Any", SUB, True),
    (APP1, "TopicA", PUB, True),                  # explicit PUB|SUB
    (APP1, "TopicA", SUB, True),
    (APP1, "TopicB", PUB, False),                 # explicit DENY
    (APP1, "TopicB", SUB, False),
    (APP1, "TopicP", PUB, True),                  # PUB-only
    (APP1, "TopicP", SUB, False),
    (APP1, "TopicS", SUB, True),                  # SUB-only
    (APP1, "TopicS", PUB, False),
    (APP1, "Other", PUB, False),                  # default topic perm DENY
    (APP1, "%RETRY%GroupA", SUB, True),           # retry topic follows the group's SUB
    (APP1, "%RETRY%GroupA", PUB, True),           # a consumer sends back to its retry topic
    (APP1, "%DLQ%GroupA", SUB, True),             # DLQ topic likewise
    (APP1, "%RETRY%GroupD", SUB, False),          # the group is denied
    (APP1, "%DLQ%GroupD", PUB, False),
    (APP1, "%RETRY%Unlisted", SUB, True),         # default group perm SUB
    (WIDE, "Other", PUB, True),                   # default topic perm PUB|SUB
    (WIDE, "%RETRY%G", SUB, False),               # default group perm absent = DENY
])
def test_topic_decision_table(account: Account, topic: str, action: Action, allowed: bool) -> None:
    assert topic_allowed(account, topic, action) is allowed


@pytest.mark.parametrize(("account", "group", "allowed"), [
    (ADMIN, "G", True), (APP1, "GroupA", True), (APP1, "GroupD", False), (APP1, "Other", True),
    (WIDE, "G", False),
])
def test_group_decision_table(account: Account, group: str, allowed: bool) -> None:
    assert group_allowed(account, group) is allowed


@pytest.mark.parametrize(("pattern", "host", "matches"), [
    ("*", "1.2.3.4", True), ("*", "::1", True),
    ("10.10.*.*", "10.10.3.4", True), ("10.10.*.*", "10.11.3.4", False),
    ("192.168.0.{1,2}", "192.168.0.2", True), ("192.168.0.{1,2}", "192.168.0.3", False),
    ("127.0.0.1-9", "127.0.0.9", True), ("127.0.0.1-9", "127.0.0.10", False),
    ("127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "127.0.0.2", False), ("127.0.0.1", "::1", False),
    ("::1", "0:0::1", True), ("::1", "127.0.0.1", False), ("10.0.0.1", "not-an-ip", False),
])
def test_address_patterns(pattern: str, host: str, matches: bool) -> None:
    assert AddressPattern.parse(pattern).matches(host) is matches


def test_white_lists_and_redaction() -> None:
    assert ACL.globally_white("10.10.0.1") and ACL.globally_white("192.168.0.1")
    assert not ACL.globally_white("127.0.0.1")
    assert APP1.white_remote_address is not None and APP1.white_remote_address.matches("127.0.0.3")
    assert ADMIN.white_remote_address is None
    assert "admin-secret" not in repr(ACL) and "app1-secret" not in repr(APP1)


@pytest.mark.parametrize(("text", "names"), [
    ("accounts = 3", "accounts must be an array"),
    ("[[accounts]]\nsecretKey='abcdefg'", "accounts[0].accessKey is missing"),
    ("[[accounts]]\naccessKey=1\nsecretKey='abcdefg'", "accounts[0].accessKey must be a string"),
    ("[[accounts]]\naccessKey='a b'\nsecretKey='abcdefg'", "accounts[0].accessKey must be 1-128"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abc'", "accounts[0].secretKey (account 'a') must be at least 6"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\nadmin='yes'", "accounts[0].admin must be true or false"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\ndefaultTopicPerm='ALL'",
     "accounts[0].defaultTopicPerm: 'ALL' is not one of"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\ntopicPerms=['T']", "accounts[0].topicPerms[0]: 'T' is not"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\ngroupPerms=[1]", "accounts[0].groupPerms[0] must be a string"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\ntopicPerms=['T=PUB','T=SUB']", "'T' is repeated"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\nwhiteRemoteAddress='1.2.3'",
     "accounts[0].whiteRemoteAddress: '1.2.3' is not"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\nsecretkey='x'", "accounts[0]: unknown key(s) 'secretkey'"),
    ("[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'\n[[accounts]]\naccessKey='a'\nsecretKey='abcdefg'",
     "accounts[1].accessKey 'a' is repeated"),
    ("globalWhiteRemoteAddresses = ['10.0.0.300']", "globalWhiteRemoteAddresses[0]: '300' is not an octet"),
    ("acounts = []", "unknown key(s) 'acounts'"),
    ("accounts = [", "not valid TOML"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_bad_files_name_the_field(text: str | bytes, names: str) -> None:
    with pytest.raises(AclFileError) as e:
        parse_acl(text, "acl.toml")
    assert names in str(e.value) and str(e.value).startswith("acl.toml")


def test_perm_spellings() -> None:
    assert parse_perm("pub | sub") == parse_perm("PUB|SUB") == 6
    with pytest.raises(ValueError, match="DENY, PUB, SUB"):
        parse_perm("READ")


_scalars = st.one_of(st.integers(), st.booleans(), st.text(max_size=20), st.floats(allow_nan=False))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["accessKey", "secretKey", "admin", "topicPerms", "groupPerms", "whiteRemoteAddress",
                     "defaultTopicPerm", "x"]), inner, max_size=4), max_leaves=12)


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.encode("unicode_escape").decode().replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["accounts", "globalWhiteRemoteAddresses"]), _values, max_size=2))
def test_fuzz_typed_documents_load_or_fail_clearly(doc: dict[str, object]) -> None:
    text = "\n".join(f"{k} = {_toml(v)}" for k, v in doc.items())
    try:
        parse_acl(text)
    except AclFileError as e:
        assert str(e).startswith("accounts file")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_fuzz_garbage_loads_or_fails_clearly(data: bytes | str) -> None:
    try:
        parse_acl(data)
    except AclFileError:
        pass


def test_replay_guard_refuses_stale_future_and_replayed() -> None:
    guard = ReplayGuard(tolerance_ms=1000, max_entries=10)
    now = 1_000_000
    sig = "ab" * 32
    assert guard.admit(now - 1001, sig, now) is Refusal.STALE
    assert guard.admit(now + 1001, sig, now) is Refusal.STALE
    assert guard.admit(now - 1000, sig, now) is None
    assert guard.admit(now - 1000, sig, now) is Refusal.REPLAYED
    assert guard.admit(now - 1000, sig, now + 1) is Refusal.STALE  # a replay after the window is stale anyway
    assert guard.admit(now - 1000, "cd" * 32, now) is None  # another request, same timestamp
    assert len(guard) == 2


def test_replay_guard_is_bounded_and_forgets_only_stale_entries() -> None:
    guard = ReplayGuard(tolerance_ms=1000, max_entries=3)
    now = 10_000
    for i in range(3):
        assert guard.admit(now, f"{i:016x}" + "0" * 48, now) is None
    assert guard.admit(now, f"{9:016x}" + "0" * 48, now) is Refusal.FULL  # at the cap: refused, nothing forgotten early
    assert guard.admit(now, f"{0:016x}" + "0" * 48, now + 999) is Refusal.REPLAYED
    later = now + 2000  # every remembered timestamp is now stale, so its bucket goes
    assert guard.admit(later, f"{9:016x}" + "0" * 48, later) is None
    assert len(guard) == 1


def test_replay_guard_forgets_a_signature_one_bucket_after_its_timestamp_goes_stale() -> None:
    """A signature is held until its timestamp is stale plus at most one bucket (an eighth of the window), not for
    a second window: memory and the cap count the requests of about one window."""
    guard = ReplayGuard(tolerance_ms=8000, max_entries=10)  # buckets of 1000 ms
    t = 100_500
    assert guard.admit(t, "ab" * 32, t) is None
    assert guard.admit(t + 8000, "cd" * 32, t + 8000) is None  # t still fresh (at the edge): both held
    assert len(guard) == 2
    assert guard.admit(t, "ab" * 32, t + 8001) is Refusal.STALE  # t is stale now ...
    assert len(guard) == 2
    assert guard.admit(t + 9000, "ef" * 32, t + 9000) is None  # ... and its bucket [100000, 101000) gone
    assert len(guard) == 2


@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(-3000, 3000), st.integers(0, 5)), max_size=60))
def test_replay_guard_admits_each_fresh_request_once(steps: list[tuple[int, int, int]]) -> None:
    """Against a model that remembers everything: whatever the clock and timestamps do, a fresh request is
    admitted exactly when it was not admitted before (the buckets forget only what is stale)."""
    guard = ReplayGuard(tolerance_ms=2000, max_entries=1000)
    seen: set[tuple[int, int]] = set()
    now = 50_000
    for advance, offset, n in steps:
        now += advance % 700
        ts = now + offset
        sig = f"{ts:08x}{n:08x}" + "0" * 48
        got = guard.admit(ts, sig, now)
        if abs(ts - now) > 2000:
            assert got is Refusal.STALE
        elif (ts, n) in seen:
            assert got is Refusal.REPLAYED
        else:
            assert got is None
            seen.add((ts, n))
