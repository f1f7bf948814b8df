"""Property tests of the record codec: send batch -> stored records -> decoded messages round trip."""

from __future__ import annotations

import copy
import pickle
import random
import zlib

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client._requests import SendResult, send_results
from client.errors import MessageIllegalError
from common.codec import (
    UniqKeyGenerator,
    body_crc,
    crc32,
    create_offset_msg_id,
    decode_batch,
    decode_offset_msg_id,
    decode_records,
    encode_batch,
    encode_item,
    java_hash,
    pack_host,
    write_batch_records,
)
from common.codes import SendStatus
from common.message import Message, MessageQueue
from common.wire import SendReply

NAME = st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=20)
VALUE = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=30)
KEY = st.text(alphabet="abcdefKLM0123456789-_", min_size=1, max_size=12)
USER_PROP = st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=8).map(lambda s: "u" + s)

MESSAGE = st.builds(
    lambda body, tags, keys, props, delay, flag: Message(
        "Topic", body, tags=tags, keys=keys, properties=props, delay_level=delay, flag=flag
    ),
    st.binary(max_size=300),
    st.none() | NAME,
    st.lists(KEY, max_size=3),
    st.dictionaries(USER_PROP, VALUE, max_size=3),
    st.integers(0, 18),
    st.integers(0, 2**31 - 1),
)


@settings(max_examples=150, deadline=None)
@given(
    msgs=st.lists(MESSAGE, min_size=1, max_size=6),
    topic=NAME,
    queue_id=st.integers(0, 1000),
    first_offset=st.integers(0, 2**40),
    file_start=st.integers(0, 2**40),
    born_ts=st.integers(0, 2**45),
    store_ts=st.integers(0, 2**45),
    reconsume=st.integers(0, 16),
)
def test_batch_to_records_round_trip(
    msgs: list[Message], topic: str, queue_id: int, first_offset: int, file_start: int, born_ts: int,
    store_ts: int, reconsume: int,
) -> None:
    uniq = [f"UNIQ{i:028d}" for i in range(len(msgs))]
    body = encode_batch(msgs, born_timestamp_ms=born_ts, uniq_keys=uniq)
    items = decode_batch(body)
    assert [bytes(it.body) for it in items] == [m.body for m in msgs]
    assert [(it.tags, it.keys, it.uniq_key, it.delay_level, it.wait) for it in items] == [
        ((m.tags or "").encode(), " ".join(m.keys).encode(), u.encode(), m.delay_level, True)
        for m, u in zip(msgs, uniq, strict=True)
    ]
    buf = bytearray(64 * 1024)
    born = pack_host("10.1.2.3", 40000)
    store_host = pack_host("127.0.0.1", 10911)
    offsets = write_batch_records(buf, 16, file_start, topic=topic.encode(), queue_id=queue_id,
                                  first_queue_offset=first_offset, items=items, born_host=born,
                                  store_timestamp=store_ts, store_host=store_host, reconsume_times=reconsume)
    end = offsets[-1] - file_start + int.from_bytes(buf[offsets[-1] - file_start : offsets[-1] - file_start + 4],
                                                    "big")
    out = decode_records(bytes(buf[16:end]), verify_crc=True)
    assert len(out) == len(msgs)
    for k, (m, got) in enumerate(zip(msgs, out, strict=True)):
        assert (got.topic, got.body, got.tags, got.keys, got.flag) == (topic, m.body, m.tags, m.keys, m.flag)
        assert {p: v for p, v in got.properties.items() if p.startswith("u")} == m.properties
        assert got.msg_id == uniq[k]
        assert (got.queue_id, got.queue_offset, got.commit_log_offset) == (queue_id, first_offset + k, offsets[k])
        assert (got.born_timestamp, got.store_timestamp, got.reconsume_times) == (born_ts, store_ts, reconsume)
        assert (got.born_host, got.store_host) == ("10.1.2.3:40000", "127.0.0.1:10911")
        assert got.offset_msg_id == create_offset_msg_id(store_host, offsets[k])
        assert decode_offset_msg_id(got.offset_msg_id) == ("127.0.0.1:10911", offsets[k])


@settings(max_examples=150, deadline=None)
@given(msg=MESSAGE, born_ts=st.integers(0, 2**45), uniq=st.none() | st.just("0A0000010F2A0000000000000000ABCD"))
def test_one_item_is_the_batch_of_that_one_message(msg: Message, born_ts: int, uniq: str | None) -> None:
    """A single send's item (encode_item) is byte for byte the batch encoding of that message alone."""
    assert encode_item(msg, born_timestamp_ms=born_ts, uniq_key=uniq) == encode_batch(
        [msg], born_timestamp_ms=born_ts, uniq_keys=[uniq])


def test_one_item_too_large_for_the_broker_is_refused_as_the_batch_is() -> None:
    msg = Message("Topic", bytearray(200))  # a body that is not bytes is encoded as bytes
    assert encode_item(msg, born_timestamp_ms=1, uniq_key=None) == encode_batch([msg], born_timestamp_ms=1)
    with pytest.raises(MessageIllegalError, match=r"message 0 to topic Topic is 2\d\d bytes stored, more than "
                                                  r"maxMessageSize 200"):
        encode_item(msg, born_timestamp_ms=1, uniq_key=None, max_message_size=200)
    with pytest.raises(MessageIllegalError, match="message 0 to topic Topic"):
        encode_batch([msg], born_timestamp_ms=1, max_message_size=200)


def test_java_hash_known_values() -> None:
    assert java_hash("TagA") == 2598919
    assert java_hash("FooBar#KEY1") == -2081429752
    assert java_hash("") == 0
    assert java_hash("é") == 233


def test_msg_id_examples_of_semantics_7_4() -> None:
    assert create_offset_msg_id(pack_host("127.0.0.1", 9103), 123456) == "7F0000010000238F000000000001E240"
    assert decode_offset_msg_id("645100FA00002A9F000000489A3AA09E") == ("100.81.0.250:10911", 311825178782)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 64), seed=st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data: bytes, start: int, seed: int) -> None:
    """The fast CRC (ISA-L when installed) must give zlib's result bit for bit: stored BODYCRCs are RocketMQ's,
    and a slave checks the master's records with it. Views into a larger buffer and a running value included."""
    view = memoryview(data)[start:]
    assert crc32(view) == zlib.crc32(view)
    assert crc32(view, seed) == zlib.crc32(view, seed)
    assert body_crc(view) == zlib.crc32(view) & 0x7FFFFFFF


def test_uniq_keys_in_bulk_are_the_ids_next_would_give() -> None:
    clock = [1_700_000_000_000]
    one = UniqKeyGenerator(b"\x0a\x00\x00\x01", clock_ms=lambda: clock[0], rng=random.Random(7))
    bulk = UniqKeyGenerator(b"\x0a\x00\x00\x01", clock_ms=lambda: clock[0], rng=random.Random(7))
    assert bulk.next_many(70_000) == [one.next() for _ in range(70_000)]  # the 16-bit counter wraps on the way
    clock[0] += 40 * 86_400_000  # the next month: the time part restarts from its first instant
    assert bulk.next_many(3) == [one.next() for _ in range(3)] and bulk.next_many(0) == []


@given(phys=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=5), port=st.integers(1, 65535))
def test_send_results_carry_the_offset_msg_id_of_each_message(phys: list[int], port: int) -> None:
    host = pack_host("10.9.8.7", port)
    reply = SendReply(0, 2, 100, host, tuple(phys))
    out = send_results(reply, MessageQueue("T", "b", 2), [f"u{i}" for i in range(len(phys))])
    assert [r.offset_msg_id for r in out] == [create_offset_msg_id(host, p) for p in phys]
    assert [r.queue_offset for r in out] == list(range(100, 100 + len(phys)))


def test_send_results_read_from_the_reply_behave_as_plain_ones() -> None:
    host = pack_host("10.9.8.7", 10911)
    reply = SendReply(11, 3, 40, host, (1000, 2100))
    out = send_results(reply, MessageQueue("T", "b", 2), ["u0", "u1"])
    plain = [SendResult(SendStatus.from_code(11), f"u{i}", MessageQueue("T", "b", 3), 40 + i,
                        create_offset_msg_id(host, p)) for i, p in enumerate((1000, 2100))]
    assert [attrs.astuple(r, recurse=False) for r in out] == [attrs.astuple(r, recurse=False) for r in plain]
    assert out == plain and plain == out and [hash(r) for r in out] == [hash(r) for r in plain]
    assert [repr(r) for r in out] == [repr(r) for r in plain]
    assert out[0] != plain[1]
    for copied in (pickle.loads(pickle.dumps(out[1])), copy.copy(out[1]), copy.deepcopy(out[1])):
        assert type(copied) is SendResult and copied == plain[1]
    evolved = attrs.evolve(out[0], queue_offset=7)
    assert type(evolved) is SendResult and evolved == attrs.evolve(plain[0], queue_offset=7)
    with pytest.raises(AttributeError):
        out[0].queue_offset = 1  # type: ignore[misc]  # frozen, as a plain one
