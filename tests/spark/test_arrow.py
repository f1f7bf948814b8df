"""The read schema and the raw-records-to-Arrow decode path (no Spark session)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from client.errors import ProtocolViolationError
from common.codec import decode_records
from common.properties import KEYS, TAGS, UNIQ_KEY
from spark_connector.arrow import (
    decode_to_batch,
    empty_batch,
    messages_to_batch,
    read_schema,
    spark_schema,
)

Builder = Callable[..., bytes]


@pytest.mark.parametrize("include_properties", [False, True])
def test_arrow_schema_is_exactly_what_spark_expects(include_properties: bool) -> None:
    expected = to_arrow_schema(spark_schema(include_properties), timezone="UTC")
    assert read_schema(include_properties).equals(expected)
    assert empty_batch(include_properties).schema.equals(expected)
    assert spark_schema(include_properties).fieldNames()[:4] == ["topic", "brokerName", "queueId", "queueOffset"]
    assert "servedBy" in spark_schema(False).fieldNames()


def test_decode_matches_the_sdk_codec(records: Builder) -> None:
    specs = [
        {"body": b"hello", "tags": "TagA", "keys": "k1 k2", "uniq": "AB" * 16, "props": {"x": "1"}},
        {"body": b"", "flag": 3, "reconsume": 2},
        {"body": bytes(range(256)) * 4, "tags": "", "props": {"a": "", "b": "c"}},
    ]
    raw = records(specs, topic="TopicZ", queue_id=5, first_offset=40)
    batch = decode_to_batch([(raw, 1)], topic="TopicZ", broker_name="broker-b", include_properties=True)
    expected = messages_to_batch(decode_records(raw, broker_name="broker-b"), 1, include_properties=True)
    assert batch.schema.equals(read_schema(True))
    for name in batch.schema.names:
        if name == "properties":
            continue
        assert batch.column(name).equals(expected.column(name)), name
    rows = batch.to_pylist()
    assert [r["queueOffset"] for r in rows] == [40, 41, 42]
    assert rows[0]["msgId"] == "AB" * 16 and rows[0]["tags"] == "TagA" and rows[0]["keys"] == "k1 k2"
    assert rows[1]["tags"] is None and rows[1]["keys"] is None and len(rows[1]["msgId"]) == 32
    assert rows[1]["flag"] == 3 and rows[1]["reconsumeTimes"] == 2 and rows[1]["body"] == b""
    assert rows[2]["tags"] == "" and rows[2]["body"] == bytes(range(256)) * 4
    assert rows[0]["bornHost"] == "10.0.0.7:5555" and rows[0]["storeHost"] == "127.0.0.1:10911"
    assert rows[0]["bornTimestamp"].timestamp() == pytest.approx(1_700_000_000.0)
    assert dict(rows[0]["properties"])["x"] == "1"
    assert dict(rows[2]["properties"]) == {"a": "", "b": "c", "TAGS": ""}
    assert dict(rows[1]["properties"]) == {}
    assert all(r["servedBy"] == 1 and r["topic"] == "TopicZ" and r["brokerName"] == "broker-b" for r in rows)


def test_tags_keys_and_msg_id_match_the_sdk_codec_among_look_alike_properties(records: Builder) -> None:
    """The tags, keys and msgId columns are read from each properties string without a regex: a key is found
    only at the start or after a separator, never inside a longer name (``XTAGS``, ``TAGSX``), and an empty
    UNIQ_KEY falls back to the offset id, exactly as the SDK's decode reads them."""
    rnd = random.Random(36)
    names = [TAGS, KEYS, UNIQ_KEY, "X" + TAGS, TAGS + "X", "X" + KEYS, KEYS[:-1], UNIQ_KEY + "S", "a"]
    values = ["", "v", "TagA", "k1 k2", "\u00e9\u6f22", "TAGS", "AB" * 16]
    specs = []
    for _ in range(400):
        props = {rnd.choice(names): rnd.choice(values) for _ in range(rnd.randint(0, 5))}
        specs.append({"body": b"b", "props": props})
    raw = records(specs, topic="TopicP")
    batch = decode_to_batch([(raw, 0)], topic="TopicP", broker_name="broker-a")
    expected = messages_to_batch(decode_records(raw, broker_name="broker-a"), 0)
    for name in ("msgId", "tags", "keys"):
        assert batch.column(name).equals(expected.column(name)), name
    assert batch.column("tags").null_count and batch.column("keys").null_count  # absent keys are null, not ""


def test_chunks_keep_their_served_by_and_end_offset_trims(records: Builder) -> None:
    first = records([{}, {}], first_offset=0)
    second = records([{}, {}, {}], first_offset=2)
    batch = decode_to_batch([(first, 0), (second, 1)], topic="T", broker_name="a", end_offset=4)
    assert batch.column("queueOffset").to_pylist() == [0, 1, 2, 3]
    assert batch.column("servedBy").to_pylist() == [0, 0, 1, 1]


def test_tags_filter_recheck(records: Builder) -> None:
    raw = records([{"tags": "A"}, {"tags": "B"}, {}, {"tags": "C"}])
    batch = decode_to_batch([(raw, 0)], topic="T", broker_name="a", tags_filter=frozenset({"A", "C"}))
    assert batch.column("tags").to_pylist() == ["A", "C"]


def test_ipv6_hosts_take_the_generic_path(records: Builder) -> None:
    raw = records([{"tags": "A", "body": b"six"}], v6=True)
    batch = decode_to_batch([(raw, 0)], topic="T", broker_name="a")
    row = batch.to_pylist()[0]
    assert row["bornHost"] == "[::1]:5555" and row["body"] == b"six" and row["tags"] == "A"
    assert batch.schema.equals(read_schema(False))


def test_empty_and_corrupt_input(records: Builder) -> None:
    assert decode_to_batch([(b"", 0)], topic="T", broker_name="a").num_rows == 0
    raw = records([{}, {}])
    with pytest.raises(ProtocolViolationError, match="claims"):
        decode_to_batch([(raw[:-5], 0)], topic="T", broker_name="a")
    bad = bytearray(raw)
    bad[4] ^= 0xFF
    with pytest.raises(ProtocolViolationError, match="magic"):
        decode_to_batch([(bytes(bad), 0)], topic="T", broker_name="a")


def test_large_batch_round_trip(records: Builder) -> None:
    raw = records([{"body": bytes([i % 251]) * 1024, "keys": f"k{i}"} for i in range(2000)])
    batch = decode_to_batch([(raw, 0)], topic="T", broker_name="a")
    assert batch.num_rows == 2000
    assert batch.column("keys")[1999].as_py() == "k1999"
    assert batch.column("body")[7].as_py() == bytes([7]) * 1024
    assert isinstance(batch.column("body"), pa.BinaryArray)
