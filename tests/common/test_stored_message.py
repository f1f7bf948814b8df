"""Messages decoded from stored records read their fields on first use: they must behave as plain MessageExt."""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.errors import ProtocolViolationError
from common.codec import decode_batch, decode_records, encode_batch, pack_host, write_batch_records
from common.message import Message, MessageExt

STORE_HOST = pack_host("127.0.0.1", 10911)


def _records(msgs: list[Message], topic: str = "TopicS", *, uniq: bool = True) -> bytes:
    buf = bytearray(256 * 1024)
    items = decode_batch(encode_batch(msgs, born_timestamp_ms=1_700_000_000_000,
                                      uniq_keys=[f"U{i:031d}" for i in range(len(msgs))] if uniq else None))
    offsets = write_batch_records(buf, 0, 4096, topic=topic.encode(), queue_id=3, first_queue_offset=7,
                                  items=items, born_host=pack_host("10.0.0.9", 5555),
                                  store_timestamp=1_700_000_000_123, store_host=STORE_HOST, reconsume_times=2)
    last = offsets[-1] - 4096
    return bytes(buf[: last + int.from_bytes(buf[last : last + 4], "big")])


MSGS = [Message("TopicS", b"hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}),
        Message("TopicS", b"", flag=9), Message("TopicS", b"x" * 2000, tags="TagB")]


def _fields(m: MessageExt) -> dict[str, object]:
    return {a.name: getattr(m, a.name) for a in attrs.fields(MessageExt)}


def test_fields_as_a_plain_message_ext_holds_them() -> None:
    stored = decode_records(_records(MSGS), broker_name="broker-a")
    plain = [attrs.evolve(m) for m in stored]
    assert all(type(p) is MessageExt for p in plain)
    assert [_fields(m) for m in stored] == [_fields(p) for p in plain]
    first = stored[0]
    assert (first.topic, first.body, first.tags, first.keys, first.broker_name) == (
        "TopicS", b"hello", "TagA", ("k1", "k2"), "broker-a")
    assert (first.queue_id, first.queue_offset, first.commit_log_offset) == (3, 7, 4096)
    assert (first.born_host, first.store_host, first.reconsume_times) == ("10.0.0.9:5555", "127.0.0.1:10911", 2)
    assert first.msg_id == "U" + "0" * 31 and first.properties["color"] == "red"
    assert first.offset_msg_id == "7F00000100002A9F0000000000001000"
    assert (stored[1].body, stored[1].tags, stored[1].keys, stored[1].flag) == (b"", None, (), 9)
    assert stored[2].store_size == len(_records(MSGS)) - stored[2].commit_log_offset + 4096


def test_a_record_without_properties() -> None:
    (m,) = decode_records(_records([Message("TopicS", b"bare")], uniq=False))
    assert (m.properties, m.tags, m.keys, m.body) == ({}, None, (), b"bare")
    assert m.msg_id == m.offset_msg_id == "7F00000100002A9F0000000000001000"


def test_equality_repr_hash_copy_and_pickle_match_a_plain_message_ext() -> None:
    m = decode_records(_records(MSGS))[0]
    plain = attrs.evolve(m)
    assert m == plain and plain == m
    assert [m != plain, plain != m] == [False, False]  # __ne__ both ways, not only __eq__
    assert m != attrs.evolve(m, queue_offset=8) and m != "not a message"
    assert repr(m) == repr(plain) and repr(m).startswith("MessageExt(topic='TopicS', body=b'hello'")
    for unhashable in (m, plain):  # MessageExt compares by value and holds a dict: it has no hash
        with pytest.raises(TypeError, match="unhashable"):
            hash(unhashable)
    for other in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert type(other) is MessageExt and other == m
    moved = attrs.evolve(m, topic="Elsewhere")
    assert type(moved) is MessageExt and moved.topic == "Elsewhere" and moved.body == b"hello"


def test_body_and_properties_are_read_once_and_frozen_as_before() -> None:
    m = decode_records(_records(MSGS))[0]
    assert m.properties is m.properties and m.body is m.body
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.topic = "x"  # type: ignore[misc]


def test_messages_hold_no_reference_to_the_response() -> None:
    data = bytearray(_records(MSGS))
    view = memoryview(data)
    msgs = decode_records(view, verify_crc=True)
    bodies = [m.body for m in msgs]
    view.release()
    data[:] = b"\0" * len(data)
    data.extend(b"grows")  # would raise BufferError while anything still exported the buffer
    assert [m.body for m in msgs] == bodies == [b"hello", b"", b"x" * 2000]
    assert [m.topic for m in msgs] == ["TopicS"] * 3


def test_a_bad_body_crc_is_refused_when_asked() -> None:
    data = bytearray(_records(MSGS[:1]))
    data[88] ^= 0xFF  # first body byte
    assert decode_records(bytes(data))[0].body != b"hello"
    with pytest.raises(ProtocolViolationError, match="CRC"):
        decode_records(bytes(data), verify_crc=True)


def test_a_topic_length_past_the_end_is_refused() -> None:
    data = bytearray(_records(MSGS[:1]))
    data[88 + 5] = 255  # the topic length byte after the 5-byte body: the properties would start past the end
    with pytest.raises(ProtocolViolationError, match="do not add up"):
        decode_records(bytes(data))


@settings(max_examples=300, deadline=None)
@given(at=st.integers(0, 2 * 1024), value=st.integers(0, 255), cut=st.integers(0, 3))
def test_corrupt_records_are_refused_or_read_without_error(at: int, value: int, cut: int) -> None:
    """Every field of a message that decodes can be read: the checks at decode time cover every length."""
    data = bytearray(_records(MSGS[:2]))
    data[at % len(data)] = value
    blob = bytes(data[: len(data) - cut])
    try:
        msgs = decode_records(blob)
    except ProtocolViolationError:
        return
    for m in msgs:
        _fields(m)
        repr(m)


def _outcome(data: bytes | memoryview, offset: int = 0) -> object:
    try:
        return [_fields(m) for m in decode_records(data, broker_name="b", offset=offset)]
    except ProtocolViolationError as e:
        return str(e)


@pytest.mark.parametrize("sizes", [
    [1024] * 200,  # several 64 KiB chunks, records across each boundary
    [100_000, 10, 70_000, 5],  # records larger than a chunk
    [65_536 - 200, 30, 30],  # a record that ends near a chunk's end
])
def test_a_view_decodes_as_the_same_bytes_do(sizes: list[int]) -> None:
    """A large answer is decoded from the transport's buffer (a view), in chunks: the same messages."""
    msgs = [Message("TopicS", bytes([i % 251]) * n, tags=f"T{i % 3}", keys=[f"k{i}"]) for i, n in enumerate(sizes)]
    head = b"H" * 48  # a pull answer's head before the records
    buf = bytearray(len(head) + sum(sizes) + 400 * len(sizes))
    items = decode_batch(encode_batch(msgs, born_timestamp_ms=1))
    offsets = write_batch_records(buf, len(head), 0, topic=b"TopicS", queue_id=1, first_queue_offset=0, items=items,
                                  born_host=STORE_HOST, store_timestamp=2, store_host=STORE_HOST)
    last = offsets[-1]
    data = bytes(head) + bytes(buf[len(head) : last + int.from_bytes(buf[last : last + 4], "big")])
    expected = _outcome(data, len(head))
    assert isinstance(expected, list) and len(expected) == len(sizes)
    assert _outcome(memoryview(bytearray(data)), len(head)) == expected


@settings(max_examples=150, deadline=None)
@given(at=st.integers(0, 140_000), value=st.integers(0, 255), cut=st.integers(0, 200))
def test_a_corrupt_view_is_refused_as_the_same_bytes_are(at: int, value: int, cut: int) -> None:
    msgs = [Message("TopicS", b"a" * 70_000), *([Message("TopicS", b"b" * 900)] * 60), Message("TopicS", b"c")]
    buf = bytearray(200_000)
    items = decode_batch(encode_batch(msgs, born_timestamp_ms=1))
    offsets = write_batch_records(buf, 0, 0, topic=b"TopicS", queue_id=1, first_queue_offset=0, items=items,
                                  born_host=STORE_HOST, store_timestamp=2, store_host=STORE_HOST)
    data = bytearray(buf[: offsets[-1] + int.from_bytes(buf[offsets[-1] : offsets[-1] + 4], "big")])
    data[at % len(data)] = value
    blob = bytes(data[: len(data) - cut])
    assert _outcome(memoryview(bytearray(blob))) == _outcome(blob)
