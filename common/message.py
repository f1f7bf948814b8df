"""Message models: what a producer sends, what a consumer gets, and where it lives.

All three are frozen attrs classes. ``MessageExt`` is built by the codec from stored bytes; users never
construct one by hand except in tests.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from common.errors import MessageIllegalError
from common.properties import (
    SYSTEM_KEYS,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    validate_topic,
)

__all__ = [
    "MAX_UNIQ_KEY_LENGTH",
    "TIMER_MAX_DELAY_S",
    "Message",
    "MessageExt",
    "MessageQueue",
    "any_resend_state",
    "forget_resend",
    "keep_for_resend",
    "resend_state",
]

#: Highest delay level accepted by the SDK; the broker clamps to its own ``messageDelayLevel`` count.
MAX_DELAY_LEVEL = 64
#: Longest timed delivery the SDK sends: the broker's default ``timerMaxDelaySec`` (7 days). A broker configured
#: lower refuses what is beyond its own bound with MESSAGE_ILLEGAL.
TIMER_MAX_DELAY_S = 7 * 24 * 3600
#: Longest unique key a caller may give a message (``Message.uniq_key``); the SDK's own are 32 characters.
MAX_UNIQ_KEY_LENGTH = 128


def _to_keys(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    keys = tuple(value)
    for k in keys:
        if not isinstance(k, str) or not k or any(c.isspace() for c in k):
            raise MessageIllegalError(f"message key {k!r} must be a non-empty str without white space")
    return keys


def _to_properties(value: Mapping[str, str] | None) -> dict[str, str]:
    if not value:
        return {}
    props = dict(value)
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise MessageIllegalError(f"property {k!r}: keys and values must be str")
        if not k:
            raise MessageIllegalError("property with an empty name")
        if k in SYSTEM_KEYS:
            raise MessageIllegalError(f"property {k!r} is reserved by the SDK; use the Message field instead")
    return props


def _check_body(_: Any, attribute: Any, value: object) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise MessageIllegalError(f"message body must be bytes, got {type(value).__name__}")


def _check_topic(_: Any, attribute: Any, value: object) -> None:
    validate_topic(value)


def _check_tags(_: Any, attribute: Any, value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value or "\x01" in value or "\x02" in value):
        raise MessageIllegalError(f"tags {value!r} must be a non-empty str without separators")


def _check_delay(_: Any, attribute: Any, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= MAX_DELAY_LEVEL:
        raise MessageIllegalError(f"delay_level must be an int in [0, {MAX_DELAY_LEVEL}], got {value!r}")


def _check_uniq_key(value: object) -> None:
    if (type(value) is not str or not 0 < len(value) <= MAX_UNIQ_KEY_LENGTH or not value.isprintable()
            or any(c.isspace() for c in value)):
        raise MessageIllegalError(f"uniq_key must be a str of 1 to {MAX_UNIQ_KEY_LENGTH} printable characters "
                                  f"without white space, got {value!r:.80}")


def _check_deliver_at(_: Any, attribute: Any, value: object) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise MessageIllegalError(f"deliver_at_ms must be an int of ms since the epoch (>= 0), got {value!r}")


def _check_delay_s(_: Any, attribute: Any, value: object) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise MessageIllegalError(f"delay_s must be a finite number of seconds, got {value!r}")
    if value > TIMER_MAX_DELAY_S:  # type: ignore[operator]
        raise MessageIllegalError(f"delay_s {value} is beyond timerMaxDelaySec ({TIMER_MAX_DELAY_S} s)")


@attrs.frozen(hash=False)
class Message:
    """A message to send."""

    topic: str = attrs.field(validator=_check_topic)  # type: ignore[assignment]
    """Destination topic: at most 127 characters of ``[%|a-zA-Z0-9_-]``."""
    body: bytes = attrs.field(validator=_check_body)  # type: ignore[assignment]
    """Payload; stored as is (no compression)."""
    tags: str | None = attrs.field(default=None, kw_only=True, validator=_check_tags)
    """One tag used for broker-side filtering (``TagA || TagB`` subscriptions)."""
    keys: tuple[str, ...] = attrs.field(default=(), kw_only=True, converter=_to_keys)
    """Business keys, indexed by the broker for queries; a str is split on white space."""
    properties: dict[str, str] = attrs.field(factory=dict, kw_only=True, converter=_to_properties)
    """User properties (system names such as ``TAGS`` are reserved)."""
    delay_level: int = attrs.field(default=0, kw_only=True, validator=_check_delay)
    """0 for immediate delivery; 1..18 select ``messageDelayLevel`` (1s 5s 10s 30s 1m ... 2h)."""
    flag: int = attrs.field(default=0, kw_only=True)
    """RocketMQ's opaque user flag (int32)."""
    deliver_at_ms: int | None = attrs.field(default=None, kw_only=True)
    """Timed delivery (RocketMQ 5 timer message): consumers see the message from this time on (ms since the
    epoch); a time already past delivers at once, one more than ``TIMER_MAX_DELAY_S`` ahead is refused at send."""
    delay_s: float | None = attrs.field(default=None, kw_only=True)
    """Timed delivery after this many seconds from the broker's store time (any value, not only the 18 levels);
    0 or less delivers at once, more than ``TIMER_MAX_DELAY_S`` is refused."""
    uniq_key: str | None = attrs.field(default=None, kw_only=True)
    """The message's unique key (the ``UNIQ_KEY`` property, ``SendResult.msg_id``), chosen by the caller: 1 to
    ``MAX_UNIQ_KEY_LENGTH`` printable characters without white space. None lets the SDK give it one (32 hex
    characters). An idempotent producer stores a key once within the broker's duplicate window: two messages
    with one key are one message (docs/GUIDE.md, "Idempotent sends")."""
    _resend: tuple[str, str | None] | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """The SDK's own key of a send of this object that did not end in SEND_OK, and the broker group that may hold
    it: an idempotent producer sends the object again with them (:func:`resend_state`)."""

    def __attrs_post_init__(self) -> None:
        # The timer fields and the key are checked here, not by field validators: a message without them (nearly
        # every one) then pays two tests, not three validator calls per construction.
        if self.uniq_key is not None:
            _check_uniq_key(self.uniq_key)
        at, delay = self.deliver_at_ms, self.delay_s
        if at is None and delay is None:
            return
        _check_deliver_at(self, None, at)
        _check_delay_s(self, None, delay)
        if self.delay_level or (at is not None and delay is not None):
            raise MessageIllegalError("a message takes one of delay_level, deliver_at_ms and delay_s")

    def timer_property(self, now_ms: int) -> tuple[str, str] | None:
        """The timer property this message is sent with at ``now_ms`` (the producer clock), or None when it is
        due at once (no timer, or a time already past).

        Integral ``delay_s`` travels as ``TIMER_DELAY_SEC``, a fractional one as ``TIMER_DELAY_MS`` (both
        measured by the broker from its store time, so a skewed producer clock does not matter);
        ``deliver_at_ms`` travels as ``TIMER_DELIVER_MS``.

        Raises:
            MessageIllegalError: ``deliver_at_ms`` is more than ``TIMER_MAX_DELAY_S`` after ``now_ms``.
        """
        if self.deliver_at_ms is not None:
            ahead_ms = self.deliver_at_ms - now_ms
            if ahead_ms <= 0:
                return None
            if ahead_ms > TIMER_MAX_DELAY_S * 1000:
                raise MessageIllegalError(
                    f"deliver_at_ms {self.deliver_at_ms} is {ahead_ms / 1000:.0f} s ahead, beyond timerMaxDelaySec "
                    f"({TIMER_MAX_DELAY_S} s)")
            return TIMER_DELIVER_MS, str(self.deliver_at_ms)
        delay = self.delay_s
        if delay is None or delay <= 0:
            return None
        if float(delay).is_integer():
            return TIMER_DELAY_SEC, str(int(delay))
        return TIMER_DELAY_MS, str(max(1, round(delay * 1000)))


def resend_state(msg: Message) -> tuple[str, str | None] | None:
    """``(key, broker group or None)`` of the last send of ``msg`` by an idempotent producer that did not end in
    SEND_OK (None: there was none, or it was acknowledged since). The producer sends ``msg`` again under that key,
    to that group, where the broker answers with the first copy's result if it stored one."""
    return msg._resend


_RESEND = operator.attrgetter("_resend")


def any_resend_state(msgs: Iterable[Message]) -> bool:
    """Whether any of ``msgs`` has a :func:`resend_state` (read in C: a batch's common case is none)."""
    return any(map(_RESEND, msgs))


def keep_for_resend(msg: Message, key: str, group: str | None) -> None:
    """Remember that a send of ``msg`` under the SDK's ``key`` did not end in SEND_OK and may be stored in
    ``group`` (None: in no group, as far as the producer knows). Thread-safe: one assignment."""
    object.__setattr__(msg, "_resend", (key, group))


def forget_resend(msg: Message, key: str) -> None:
    """A send of ``msg`` under ``key`` ended in SEND_OK: its next send is a new message with a new key (a message
    built once and sent many times, each acknowledged, stays many messages)."""
    state = msg._resend
    if state is not None and state[0] == key:
        object.__setattr__(msg, "_resend", None)


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker group; frozen, hashable and ordered."""

    topic: str
    """Topic name."""
    broker_name: str
    """Broker group (``brokerName``) holding the queue."""
    queue_id: int
    """Queue index within the broker group."""

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@attrs.frozen(hash=False)
class MessageExt:
    """A stored message as a consumer sees it."""

    topic: str
    """Topic the message was stored under."""
    body: bytes
    """Payload."""
    tags: str | None
    """The ``TAGS`` property, if any."""
    keys: tuple[str, ...]
    """The ``KEYS`` property split on spaces."""
    properties: dict[str, str]
    """Every property of the record, system ones included (RocketMQ's ``getProperties``)."""
    broker_name: str
    """Broker group the message was pulled from."""
    queue_id: int
    """Queue id within the broker group."""
    queue_offset: int
    """Logical offset in the consume queue."""
    commit_log_offset: int
    """Physical offset of the record in the commit log (identical on master and slaves)."""
    msg_id: str
    """The client-generated unique id (``UNIQ_KEY``), or the offset msgId when absent."""
    offset_msg_id: str
    """Broker msgId: store host + commit-log offset, 32 hex characters for IPv4."""
    born_timestamp: int
    """Producer clock, ms since the epoch."""
    store_timestamp: int
    """Broker clock when stored, ms since the epoch."""
    born_host: str
    """``ip:port`` of the producer as the broker saw it."""
    store_host: str
    """``ip:port`` of the master that stored it."""
    reconsume_times: int
    """How many times the message was sent back for retry."""
    store_size: int
    """Size of the whole stored record in bytes."""
    flag: int = 0
    """User flag."""
    sys_flag: int = 0
    """Record SYSFLAG bits."""
    body_crc: int = 0
    """CRC32 of the body as stored (masked to 31 bits, as RocketMQ)."""
