"""Well-known message property keys, the property string format, and name validation.

Properties travel as one UTF-8 string ``k1 \\x01 v1 \\x02 k2 \\x01 v2 \\x02``; keys and values may not contain the
two separators. Topic and group names follow RocketMQ's rules: at most 127 characters from ``[%|a-zA-Z0-9_-]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from client.errors import MessageIllegalError

__all__ = [
    "DELAY",
    "KEYS",
    "MAX_PROPERTIES_BYTES",
    "MAX_TOPIC_LENGTH",
    "TAGS",
    "UNIQ_KEY",
    "WAIT",
    "decode_properties",
    "encode_properties",
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

NAME_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32767
MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 255

#: Keys the SDK sets itself; a user property with one of these names is refused.
SYSTEM_KEYS = frozenset(
    {KEYS, TAGS, WAIT, DELAY, REAL_TOPIC, REAL_QID, RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME,
     MAX_RECONSUME_TIMES, UNIQ_KEY, MIN_OFFSET, MAX_OFFSET}
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
