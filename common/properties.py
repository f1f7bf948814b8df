"""Well-known message property keys, the property string format, and name validation.

Properties travel as one UTF-8 string ``k1 \\x01 v1 \\x02 k2 \\x01 v2 \\x02``; keys and values may not contain the
two separators. Topic and group names follow RocketMQ's rules: at most 127 characters from ``[%|a-zA-Z0-9_-]``.

This module is the only reader of the format: :func:`scan_properties` takes the well-known fields out of raw
bytes in one pass (the send path, the dispatcher, key lookups), :func:`decode_properties` builds the whole map
(consumers, the retry path). Both read a string the same way: pairs split on ``\\x02``, name and value
on the first ``\\x01`` (a pair without one is a name with an empty value), empty pairs skipped, and a name given
twice keeps its last value (as RocketMQ's ``string2messageProperties`` fills a map).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from common.errors import MessageIllegalError

__all__ = [
    "DELAY",
    "KEYS",
    "MAX_PROPERTIES_BYTES",
    "MAX_TOPIC_LENGTH",
    "NO_PROPERTIES",
    "PGROUP",
    "TAGS",
    "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "TRANSACTION_CHECK_TIMES",
    "TRAN_MSG",
    "UNIQ_KEY",
    "UNIQ_PAIR",
    "WAIT",
    "PropertyScan",
    "decode_properties",
    "encode_properties",
    "scan_properties",
    "validate_group",
    "validate_topic",
]

KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"
DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"
#: Timed delivery (RocketMQ 5's timer messages): the absolute deliver time in ms since the epoch, or a delay
#: from the broker's store time in seconds / milliseconds. The broker turns the last two into the first.
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: Transactional messages (issue 17): ``TRAN_MSG=true`` marks a prepared (half) message, ``PGROUP`` names its
#: producer group (whose producers answer check-backs), ``TRANSACTION_CHECK_TIMES`` counts the broker's checks.
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

NAME_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32767
MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 255

#: Keys the SDK sets itself; a user property with one of these names is refused.
SYSTEM_KEYS = frozenset(
    {KEYS, TAGS, WAIT, DELAY, REAL_TOPIC, REAL_QID, RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME,
     MAX_RECONSUME_TIMES, UNIQ_KEY, MIN_OFFSET, MAX_OFFSET, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS}
)

_NAME_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
_SEPARATORS = re.compile("[\x01\x02]")


#: Names already checked (topics and groups repeat on every message); bounded, see _validate_name.
_VALID_NAMES: dict[tuple[str, int], set[str]] = {}
_MAX_CACHED_NAMES = 10_000


def _validate_name(kind: str, name: object, max_length: int) -> str:
    known = _VALID_NAMES.get((kind, max_length))
    if known is not None and type(name) is str and name in known:
        return name
    _check_name(kind, name, max_length)
    assert isinstance(name, str)
    if known is None:
        known = _VALID_NAMES.setdefault((kind, max_length), set())
    if len(known) < _MAX_CACHED_NAMES:
        known.add(name)
    return name


def _check_name(kind: str, name: object, max_length: int) -> None:
    if not isinstance(name, str):
        raise MessageIllegalError(f"{kind} must be a str, got {type(name).__name__}")
    if not name:
        raise MessageIllegalError(f"{kind} is empty")
    if len(name) > max_length:
        raise MessageIllegalError(f"{kind} {name[:40]!r}... is {len(name)} characters, longer than {max_length}")
    if _NAME_RE.fullmatch(name) is None:
        raise MessageIllegalError(
            f"{kind} {name!r} contains characters outside [%|a-zA-Z0-9_-]"
        )


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a legal topic name.

    Raises:
        MessageIllegalError: empty, longer than 127 characters, or a character outside ``[%|a-zA-Z0-9_-]``
            (which also rules out path tricks such as ``../x``).
    """
    return _validate_name("topic", topic, MAX_TOPIC_LENGTH)


def validate_group(group: object) -> str:
    """Return ``group`` if it is a legal consumer/producer group name (same alphabet, at most 255)."""
    return _validate_name("group", group, MAX_GROUP_LENGTH)


def encode_properties(props: Mapping[str, str]) -> bytes:
    """Encode properties as ``k\\x01v\\x02...`` UTF-8.

    Raises:
        MessageIllegalError: a key or value holds a separator, or the result exceeds 32767 bytes.
    """
    if not props:
        return b""
    parts = []
    for k, v in props.items():
        if _SEPARATORS.search(k) or _SEPARATORS.search(v):
            raise MessageIllegalError(f"property {k!r} holds a reserved separator character (\\x01 or \\x02)")
        parts.append(f"{k}\x01{v}\x02")
    data = "".join(parts).encode()
    if len(data) > MAX_PROPERTIES_BYTES:
        raise MessageIllegalError(
            f"properties are {len(data)} bytes, more than the limit of {MAX_PROPERTIES_BYTES}"
        )
    return data


def decode_properties(data: bytes | memoryview | str) -> dict[str, str]:
    """Decode a property string; tolerant of a missing trailing separator."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for item in text.split("\x02"):
        if item:
            k, _, v = item.partition("\x01")
            out[k] = v
    return out


class PropertyScan(NamedTuple):
    """The well-known fields of one property string; raw UTF-8 values, ``b""`` when absent.

    Attributes:
        tags: ``TAGS`` (the consume-queue tag code is ``codec.tags_hash`` of it, decoded).
        keys: ``KEYS``, space-separated (the index splits it on ``b" "``).
        uniq_key: ``UNIQ_CLIENT_MESSAGE_ID_KEYIDX``, the SDK's message id.
        delay_level: ``DELAY`` as a level, 0 when absent or not a decimal number.
        wait: False only when ``WAIT`` is exactly ``false`` (the producer does not wait for durability).
    """

    tags: bytes
    keys: bytes
    uniq_key: bytes
    delay_level: int
    wait: bool


#: The scan of an empty property string.
NO_PROPERTIES = PropertyScan(b"", b"", b"", 0, True)

_TAGS_B = TAGS.encode()
_KEYS_B = KEYS.encode()
_UNIQ_B = UNIQ_KEY.encode()
_DELAY_B = DELAY.encode()
_WAIT_B = WAIT.encode()
#: How the SDK's plain message's property string starts: its unique key, the only property (read without a split
#: by :func:`scan_properties` and by ``codec.decode_batch``).
UNIQ_PAIR = _UNIQ_B + b"\x01"
#: Any level with more digits is past the last level (the store clamps it); int() of thousands of digits raises.
_MAX_LEVEL_DIGITS = 9
_new_scan = tuple.__new__


def _delay_level(value: bytes) -> int:
    if not value.isdigit():  # ASCII digits only: "-1", "1.5", "" and "\xb3" are no level
        return 0
    return int(value) if len(value) <= _MAX_LEVEL_DIGITS else 10**_MAX_LEVEL_DIGITS


def scan_properties(raw: bytes) -> PropertyScan:
    """The well-known fields of a raw property string, in one pass and without decoding the rest.

    The hot path of a send (once per message, in ``codec.decode_batch``) and of dispatch (once per record); it
    never fails: malformed pairs read as the module docstring says, as :func:`decode_properties` reads them.
    """
    if not raw:
        return NO_PROPERTIES
    if raw.startswith(UNIQ_PAIR) and raw.find(b"\x02") == len(raw) - 1:
        # The SDK's plain message (codec._message_properties): its unique key alone, read without a split.
        return _new_scan(PropertyScan, (b"", b"", raw[len(UNIQ_PAIR) : -1], 0, True))
    tags = keys = uniq = b""
    delay = 0
    wait = True
    for pair in raw.split(b"\x02"):
        name, _, value = pair.partition(b"\x01")
        if name == _UNIQ_B:
            uniq = value
        elif name == _TAGS_B:
            tags = value
        elif name == _KEYS_B:
            keys = value
        elif name == _DELAY_B:
            delay = _delay_level(value)
        elif name == _WAIT_B:
            wait = value != b"false"
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (a measurable share of a 1 µs scan).
    return _new_scan(PropertyScan, (tags, keys, uniq, delay, wait))
