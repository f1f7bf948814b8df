"""Wire models: validation of Message, the binary send/pull framings, and the error registry."""

from __future__ import annotations

import pytest

from client.errors import (
    BrokerError,
    InvalidParameterError,
    MessageIllegalError,
    ProtocolViolationError,
    TopicNotExistError,
)
from common import wire
from common.codec import pack_host
from common.codes import PullStatus, ResponseCode, SendStatus
from common.message import Message, MessageQueue
from common.properties import decode_properties, encode_properties, validate_topic


@pytest.mark.parametrize(
    "topic",
    ["x" * 128, "a/b", "../x", "has space", "", "tópico", "a.b"],
)
def test_bad_topic_names_are_rejected(topic: str) -> None:
    with pytest.raises(MessageIllegalError) as e:
        validate_topic(topic)
    assert "topic" in str(e.value)


@pytest.mark.parametrize("topic", ["a", "x" * 127, "%RETRY%g-1", "A_b-c|d"])
def test_good_topic_names_pass(topic: str) -> None:
    assert validate_topic(topic) == topic


def test_message_validates_its_fields() -> None:
    with pytest.raises(MessageIllegalError, match="body must be bytes"):
        Message("t", "text")  # type: ignore[arg-type]
    with pytest.raises(MessageIllegalError, match="reserved"):
        Message("t", b"x", properties={"TAGS": "a"})
    with pytest.raises(MessageIllegalError, match="delay_level"):
        Message("t", b"x", delay_level=-1)
    m = Message("t", b"x", keys="k1 k2", tags="A")
    assert m.keys == ("k1", "k2")


def test_properties_round_trip_and_limit() -> None:
    props = {"a": "1", "b": "two words", "ü": "ß"}
    assert decode_properties(encode_properties(props)) == props
    with pytest.raises(MessageIllegalError, match="32767"):
        encode_properties({"k": "v" * 40_000})
    with pytest.raises(MessageIllegalError, match="separator"):
        encode_properties({"k": "a\x01b"})


def test_message_queue_is_ordered_and_hashable() -> None:
    a, b = MessageQueue("t", "broker-a", 1), MessageQueue("t", "broker-b", 0)
    assert sorted([b, a]) == [a, b]
    assert len({a, MessageQueue("t", "broker-a", 1)}) == 1


def test_send_reply_round_trip() -> None:
    host = pack_host("127.0.0.1", 10911)
    data = wire.encode_send_reply(0, 3, 42, host, [100, 200, 300])
    reply = wire.decode_send_reply(data)
    assert reply == wire.SendReply(0, 3, 42, host, (100, 200, 300))
    with pytest.raises(ProtocolViolationError):
        wire.decode_send_reply(data[:-1])


def test_pull_header_round_trip_and_truncation() -> None:
    data = wire.encode_pull_header(19, 5, 0, 5, 1, 0, 0)
    assert wire.decode_pull_header(data) == wire.PullHeader(19, 5, 0, 5, 1, 0, 0)
    with pytest.raises(ProtocolViolationError, match="shorter"):
        wire.decode_pull_header(data[:10])


def test_errors_map_codes_to_classes() -> None:
    err = wire.decode_error(404, wire.encode_error(17, "topic[x] not exist", broker="1.2.3.4:5", role="SLAVE"))
    assert isinstance(err, TopicNotExistError)
    assert err.retriable and err.invalid_metadata
    assert err.broker_addr == "1.2.3.4:5" and err.broker_role == "SLAVE"
    assert "topic[x]" in str(err) and "SLAVE" in str(err)
    unknown = BrokerError.for_code(999, "odd")
    assert type(unknown) is BrokerError and unknown.code == 999
    garbage = wire.decode_error(400, b"<html>")
    assert isinstance(garbage, InvalidParameterError)
    assert wire.http_status_for_code(ResponseCode.TOPIC_NOT_EXIST) == 404


def test_status_enums_follow_rocketmq_codes() -> None:
    assert SendStatus.from_code(12) is SendStatus.FLUSH_SLAVE_TIMEOUT
    assert SendStatus.SLAVE_NOT_AVAILABLE.code == 11
    with pytest.raises(ValueError):
        SendStatus.from_code(13)
    assert PullStatus.from_code(19) is PullStatus.NO_NEW_MSG
    assert PullStatus.from_code(17) is None
