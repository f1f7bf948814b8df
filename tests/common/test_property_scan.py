"""The one property scanner: ``scan_properties`` reads the well-known fields as ``decode_properties`` reads the
whole map (docs/BEHAVIOUR.md 7.1 property string), and a decoded send batch carries them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.codec import (
    BATCH_FIXED_SIZE,
    BATCH_ITEM_HEAD,
    BATCH_MAGIC,
    batch_item,
    body_crc,
    decode_batch,
    encode_batch,
)
from common.message import Message
from common.properties import (
    DELAY,
    KEYS,
    NO_PROPERTIES,
    TAGS,
    UNIQ_KEY,
    UNIQ_PAIR,
    WAIT,
    PropertyScan,
    decode_properties,
    scan_properties,
)

_NAMES = [TAGS, KEYS, UNIQ_KEY, DELAY, WAIT, "XTAGS", "TAGSX", "user", ""]
_VALUES = ["", "false", "true", "False", "3", "0", "-1", "1.5", "12345678901", "\u00b3", "a b  c", "é", "TagA"]
#: Pieces of a property string, malformed ones included: stray separators and bytes that are not UTF-8.
PIECE = st.sampled_from([n.encode() for n in _NAMES] + [v.encode() for v in _VALUES]
                        + [b"\x01", b"\x02", b"\x02\x02", b"\xff", b"\xe2\x82", b"\xc3"])
RAW = st.lists(PIECE, max_size=14).map(b"".join)


def _expected_level(value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        return 0
    return int(value) if len(value) <= 9 else 10**9


@settings(max_examples=400, deadline=None)
@given(raw=RAW)
def test_scan_agrees_with_the_full_decode(raw: bytes) -> None:
    scan = scan_properties(raw)
    props = decode_properties(raw)

    def text(value: bytes) -> str:
        return value.decode("utf-8", "replace")

    assert text(scan.tags) == props.get(TAGS, "")
    assert text(scan.keys) == props.get(KEYS, "")
    assert text(scan.uniq_key) == props.get(UNIQ_KEY, "")
    assert scan.delay_level == _expected_level(props.get(DELAY, ""))
    assert scan.wait is (props.get(WAIT) != "false")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", NO_PROPERTIES),
        (b"TAGS\x01A\x02KEYS\x01k1 k2\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01U\x02", (b"A", b"k1 k2", b"U", 0, True)),
        (b"TAGS\x01A\x02TAGS\x01B", (b"B", b"", b"", 0, True)),  # last value wins; no trailing separator
        (b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01U\x01V\x02", (b"", b"", b"U\x01V", 0, True)),  # the SDK's plain message
        (b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01U\x02TAGS\x01A", (b"A", b"", b"U", 0, True)),
        (b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01U", (b"", b"", b"U", 0, True)),
        (b"XTAGS\x01A\x02user\x01TAGS\x01B\x02", (b"", b"", b"", 0, True)),  # a name must be the whole name
        (b"TAGS\x01a\x01b\x02", (b"a\x01b", b"", b"", 0, True)),  # the value runs to the next \x02
        (b"DELAY\x013\x02WAIT\x01false\x02", (b"", b"", b"", 3, False)),
        (b"DELAY\x01-1\x02WAIT\x01False\x02", (b"", b"", b"", 0, True)),  # only exactly "false" skips the wait
        (b"DELAY\x01\xc2\xb3\x02", (b"", b"", b"", 0, True)),  # "³" is a digit to str.isdigit, not to us
        (b"DELAY\x01" + b"9" * 5000 + b"\x02", (b"", b"", b"", 10**9, True)),  # past every level, no ValueError
        (b"DELAY\x012\x02DELAY\x01x\x02", (b"", b"", b"", 0, True)),
        (b"WAIT\x02TAGS\x02", (b"", b"", b"", 0, True)),  # names without a value: empty values
    ],
)
def test_scan_examples(raw: bytes, expected: tuple[bytes, bytes, bytes, int, bool]) -> None:
    scan = scan_properties(raw)
    assert isinstance(scan, PropertyScan)
    assert scan == expected


def test_decoded_batch_items_carry_their_scanned_properties() -> None:
    msgs = [Message("T", b"a", tags="TagA", keys=("k1", "k2"), delay_level=4), Message("T", b"bb"),
            Message("T", b"", properties={"u": "v"})]
    items = decode_batch(encode_batch(msgs, born_timestamp_ms=7, uniq_keys=["U1", None, "U3"]))
    got = [(it.tags, it.keys, it.uniq_key, it.delay_level, it.wait) for it in items]
    assert got == [(b"TagA", b"k1 k2", b"U1", 4, True), (b"", b"", b"", 0, True), (b"", b"", b"U3", 0, True)]
    assert all(tuple(it[6:]) == scan_properties(bytes(it.properties)) for it in items)


def test_batch_item_built_in_the_broker_reads_its_properties() -> None:
    item = batch_item(b"body", b"DELAY\x012\x02WAIT\x01false\x02", flag=3, born_timestamp=9)
    assert (item.flag, item.sys_flag, item.born_timestamp, item.body_crc) == (3, 0, 9, body_crc(b"body"))
    assert (bytes(item.body), item.delay_level, item.wait) == (b"body", 2, False)


def _batch_of(props_list: list[bytes]) -> bytes:
    """A send body whose items carry exactly these raw property strings (malformed ones included)."""
    out = []
    for props in props_list:
        body = b"b"
        size = BATCH_FIXED_SIZE + len(body) + len(props)
        out.append(BATCH_ITEM_HEAD.pack(size, BATCH_MAGIC, body_crc(body), 0, 0, 1, len(body)) + body
                   + len(props).to_bytes(2, "big") + props)
    return b"".join(out)


_PLAIN = st.builds(lambda v, tail: UNIQ_PAIR + v + tail,
                   st.binary(max_size=40), st.sampled_from([b"\x02", b"", b"\x02\x02", b"\x02TAGS\x01A", b"\x01"]))


@settings(max_examples=300, deadline=None)
@given(props_list=st.lists(st.one_of(RAW, _PLAIN), min_size=1, max_size=6))
def test_a_decoded_batch_reads_each_item_as_scan_properties_does(props_list: list[bytes]) -> None:
    """decode_batch reads the SDK's plain message (its unique key alone) without calling scan_properties: the
    same fields, whatever the property string."""
    items = decode_batch(_batch_of(props_list))
    assert [tuple(it[6:]) for it in items] == [tuple(scan_properties(p)) for p in props_list]
