"""The SDK side of timed delivery: ``Message(deliver_at_ms=..., delay_s=...)`` validation and the timer property
each sends (RocketMQ 5's ``TIMER_DELIVER_MS`` / ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS``)."""

from __future__ import annotations

import attrs
import pytest

from client._producer_core import check_batch
from client.errors import MessageIllegalError
from common.codec import decode_batch, encode_batch
from common.message import TIMER_MAX_DELAY_S, Message
from common.properties import decode_properties

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, None),
        ({"deliver_at_ms": NOW + 5000}, ("TIMER_DELIVER_MS", str(NOW + 5000))),
        ({"deliver_at_ms": NOW}, None),  # due now: a plain message
        ({"deliver_at_ms": NOW - 60_000}, None),  # in the past: delivered at once
        ({"deliver_at_ms": NOW + TIMER_MAX_DELAY_S * 1000}, ("TIMER_DELIVER_MS", str(NOW + TIMER_MAX_DELAY_S * 1000))),
        ({"delay_s": 30}, ("TIMER_DELAY_SEC", "30")),
        ({"delay_s": 30.0}, ("TIMER_DELAY_SEC", "30")),
        ({"delay_s": 2.5}, ("TIMER_DELAY_MS", "2500")),
        ({"delay_s": 0.0001}, ("TIMER_DELAY_MS", "1")),
        ({"delay_s": 0}, None),
        ({"delay_s": -3}, None),
    ],
)
def test_timer_property(kwargs: dict[str, float], expected: tuple[str, str] | None) -> None:
    msg = Message("T", b"x", **kwargs)  # type: ignore[arg-type]
    assert msg.timer_property(NOW) == expected
    props = decode_properties(decode_batch(encode_batch([msg], born_timestamp_ms=NOW, uniq_keys=["u"]))[0].properties)
    assert {k: v for k, v in props.items() if k.startswith("TIMER_")} == dict([expected] if expected else [])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delay_s": TIMER_MAX_DELAY_S + 1}, "beyond timerMaxDelaySec"),
        ({"delay_s": float("nan")}, "finite"),
        ({"delay_s": float("inf")}, "finite"),
        ({"delay_s": "5"}, "finite number"),
        ({"delay_s": True}, "finite number"),
        ({"deliver_at_ms": -1}, "deliver_at_ms must be"),
        ({"deliver_at_ms": 1.5}, "deliver_at_ms must be"),
        ({"deliver_at_ms": NOW, "delay_s": 1}, "one of delay_level, deliver_at_ms and delay_s"),
        ({"delay_s": 1, "delay_level": 2}, "one of delay_level"),
        ({"properties": {"TIMER_DELIVER_MS": "5"}}, "reserved"),
    ],
)
def test_bad_timers_are_refused_when_the_message_is_made(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(MessageIllegalError, match=match):
        Message("T", b"x", **kwargs)  # type: ignore[arg-type]


def test_a_deliver_time_too_far_ahead_is_refused_at_send() -> None:
    msg = Message("T", b"x", deliver_at_ms=NOW + TIMER_MAX_DELAY_S * 1000 + 1)
    with pytest.raises(MessageIllegalError, match="beyond timerMaxDelaySec"):
        encode_batch([msg], born_timestamp_ms=NOW)


def test_timed_messages_are_not_batched_and_evolve_keeps_them() -> None:
    with pytest.raises(MessageIllegalError, match="cannot be sent in a batch"):
        check_batch([Message("T", b"a"), Message("T", b"b", delay_s=5)], 1 << 20)
    assert attrs.evolve(Message("T", b"a", delay_s=5), body=b"b").timer_property(NOW) == ("TIMER_DELAY_SEC", "5")
