"""Option parsing and validation (no Spark)."""

from __future__ import annotations

import logging

import pytest

from client import Credentials
from spark_connector.offsets import EARLIEST, LATEST, QueueKey
from spark_connector.options import OptionError, parse_sink_options, parse_source_options, redacted
from spark_connector.transport import close_pool, pooled_client

BASE = {"nameserver": "127.0.0.1:9876", "topic": "TopicA"}


def test_defaults_for_batch_and_stream() -> None:
    b = parse_source_options(BASE, streaming=False)
    assert (b.starting_offsets, b.ending_offsets, b.pull_from, b.pull_batch_size) == (EARLIEST, LATEST, "auto", 1024)
    assert (b.pull_max_bytes, b.pull_concurrency) == (4 << 20, 4)
    assert b.fail_on_data_loss and b.slave_fallback and not b.include_properties
    assert (b.max_batch_rows, b.max_batch_bytes, b.pull_timeout_s, b.pull_retries) == (4096, 8 << 20, 10.0, 3)
    s = parse_source_options(BASE, streaming=True)
    assert s.starting_offsets == LATEST and s.streaming


def test_keys_arrive_lower_cased_and_values_as_strings() -> None:
    o = parse_source_options(
        {"nameserver": "a:1,b:2", "topic": "T", "pullfrom": "SLAVE", "maxoffsetspertrigger": "100",
         "failondataloss": "false", "includeproperties": "true", "client.auth.token": "x"},
        streaming=True,
    )
    assert o.nameserver == "a:1;b:2"
    assert o.pull_from == "slave" and o.max_offsets_per_trigger == 100
    assert not o.fail_on_data_loss and o.include_properties
    assert dict(o.client) == {"auth.token": "x"}


def test_namesrvaddr_alias() -> None:
    assert parse_source_options({"namesrvAddr": "h:9876", "topic": "T"}, streaming=False).nameserver == "h:9876"


@pytest.mark.parametrize(
    ("options", "streaming", "names"),
    [
        ({"topic": "T"}, False, "nameserver"),
        ({"nameserver": "h:1"}, False, "topic is required"),
        ({**BASE, "nameserver": "nohost"}, False, "nameserver"),
        ({**BASE, "topic": "bad topic!"}, False, "topic"),
        ({**BASE, "endingOffsets": "latest"}, True, "endingOffsets"),
        ({**BASE, "endingTimestamp": "5"}, True, "endingTimestamp"),
        ({**BASE, "startingOffsets": "latest"}, False, "startingOffsets"),
        ({**BASE, "startingOffsets": "nonsense"}, False, "startingOffsets"),
        ({**BASE, "startingOffsets": "{bad json"}, False, "startingOffsets"),
        ({**BASE, "startingOffsets": '{"T":{"b":{"x":1}}}'}, False, "startingOffsets"),
        ({**BASE, "endingOffsets": '{"TopicA":{"b":{"0":-2}}}'}, False, "endingOffsets"),
        ({**BASE, "minPartitions": "0"}, False, "minPartitions"),
        ({**BASE, "maxRecordsPerPartition": "-3"}, False, "maxRecordsPerPartition"),
        ({**BASE, "maxOffsetsPerTrigger": "abc"}, True, "maxOffsetsPerTrigger"),
        ({**BASE, "maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger"),
        ({**BASE, "pullFrom": "replica"}, False, "pullFrom"),
        ({**BASE, "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({**BASE, "commitOffsetsToBroker": "true"}, True, "group"),
        ({**BASE, "pullBatchSize": ""}, False, "pullBatchSize"),
        ({**BASE, "pullConcurrency": "0"}, False, "pullConcurrency"),
        ({**BASE, "pullConcurrency": "65"}, False, "pullConcurrency"),
        ({**BASE, "pullMaxBytes": "100"}, False, "pullMaxBytes"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], streaming: bool, names: str) -> None:
    with pytest.raises(OptionError, match=names):
        parse_source_options(options, streaming=streaming)


def test_schema_time_parse_accepts_either_mode() -> None:
    o = parse_source_options({**BASE, "startingOffsets": "latest", "maxOffsetsPerTrigger": "5"}, streaming=None)
    assert o.starting_offsets == LATEST and o.max_offsets_per_trigger == 5


def test_json_offsets_are_parsed() -> None:
    o = parse_source_options(
        {**BASE, "startingOffsets": '{"TopicA":{"broker-a":{"0":5,"1":-2}}}',
         "endingOffsets": '{"TopicA":{"broker-a":{"0":9,"1":-1}}}'},
        streaming=False,
    )
    assert o.starting_offsets == {QueueKey("TopicA", "broker-a", 0): 5, QueueKey("TopicA", "broker-a", 1): -2}
    assert o.ending_offsets == {QueueKey("TopicA", "broker-a", 0): 9, QueueKey("TopicA", "broker-a", 1): -1}


def test_an_unknown_source_option_fails_naming_the_nearest(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(OptionError, match=r"^unknown rocketmq source option startingofset \(did you mean "
                                          r"startingOffsets\?\): remove it or fix its name"):
        parse_source_options({**BASE, "startingofset": "earliest"}, streaming=None)
    with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers"):
        parse_source_options({**BASE, "kafka.bootstrap.servers": "h:1"}, streaming=False)
    with caplog.at_level(logging.WARNING, logger="spark_connector.options"):  # the sink only warns
        parse_sink_options({"nameserver": "h:1", "sendtimeout": "5"})
    assert "sendtimeout" in caplog.text


def test_topic_subscribe_and_pattern() -> None:
    one = parse_source_options(BASE, streaming=False)
    assert (one.topics, one.topic_pattern, one.topic) == (("TopicA",), None, "TopicA")
    many = parse_source_options({"nameserver": "h:1", "subscribe": " B, A ,C"}, streaming=True)
    assert many.topics == ("A", "B", "C") and many.describe_topics() == "topics A, B, C"
    pattern = parse_source_options({"nameserver": "h:1", "subscribePattern": "Orders-.*"}, streaming=True)
    assert pattern.topics == () and pattern.topic_pattern == "Orders-.*"
    for bad, match in [({"topic": "A", "subscribe": "B"}, "topic and subscribe"),
                       ({"subscribe": " , "}, "subscribe names no topic"),
                       ({"subscribe": "A,A"}, "twice"),
                       ({"subscribe": "A,b c"}, "subscribe"),
                       ({"subscribePattern": "("}, "not a regular expression"),
                       ({"topic": "A,B"}, "use option subscribe"),
                       ({}, "topic is required")]:
        with pytest.raises(OptionError, match=match):
            parse_source_options({"nameserver": "h:1", **bad}, streaming=False)


def test_timestamps_per_queue() -> None:
    o = parse_source_options({**BASE, "startingOffsetsByTimestamp": '{"TopicA":{"broker-a":{"0":1000,"1":5}}}',
                              "endingOffsetsByTimestamp": '{"TopicA":{"broker-b":{"2":9000}}}'}, streaming=False)
    assert o.starting_offsets_by_timestamp == {QueueKey("TopicA", "broker-a", 0): 1000,
                                               QueueKey("TopicA", "broker-a", 1): 5}
    assert o.ending_offsets_by_timestamp == {QueueKey("TopicA", "broker-b", 2): 9000}
    for bad in ('{"TopicA":{"b":{"0":-1}}}', '{"TopicA":{"b":{"0":"x"}}}', "[1]", "{nope"):
        with pytest.raises(OptionError, match="startingOffsetsByTimestamp"):
            parse_source_options({**BASE, "startingOffsetsByTimestamp": bad}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsetsByTimestamp is for batch"):
        parse_source_options({**BASE, "endingOffsetsByTimestamp": '{"TopicA":{"b":{"0":1}}}'}, streaming=True)


def test_trigger_limits() -> None:
    o = parse_source_options({**BASE, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "100",
                              "maxTriggerDelay": "30s"}, streaming=True)
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger, o.max_trigger_delay_ms) == (10, 100, 30_000)
    assert parse_source_options({**BASE, "minOffsetsPerTrigger": "1"}, streaming=True).max_trigger_delay_ms == 900_000
    for value, ms in (("250ms", 250), ("2m", 120_000), ("1h", 3_600_000), ("75", 75)):
        got = parse_source_options({**BASE, "minOffsetsPerTrigger": "1", "maxTriggerDelay": value}, streaming=True)
        assert got.max_trigger_delay_ms == ms
    for bad, match in [({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger=10"),
                       ({"maxTriggerDelay": "5s"}, "maxTriggerDelay only bounds"),
                       ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, "maxTriggerDelay must be"),
                       ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger")]:
        with pytest.raises(OptionError, match=match):
            parse_source_options({**BASE, **bad}, streaming=True)
    with pytest.raises(OptionError, match="minOffsetsPerTrigger is for streaming"):
        parse_source_options({**BASE, "minOffsetsPerTrigger": "1"}, streaming=False)


def test_include_headers_is_the_properties_column_and_sql_subscriptions_parse() -> None:
    assert parse_source_options({**BASE, "includeHeaders": "true"}, streaming=False).include_properties
    assert parse_source_options({**BASE, "includeHeaders": "true", "includeProperties": "true"},
                                streaming=False).include_properties
    with pytest.raises(OptionError, match="disagree"):
        parse_source_options({**BASE, "includeHeaders": "true", "includeProperties": "false"}, streaming=False)
    sql = parse_source_options({**BASE, "expressionType": "sql92", "subExpression": "a > 5"}, streaming=True)
    assert (sql.expression_type, sql.sub_expression) == ("SQL92", "a > 5")
    with pytest.raises(OptionError, match="not an SQL92 filter"):
        parse_source_options({**BASE, "expressionType": "SQL92", "subExpression": "a >"}, streaming=False)
    with pytest.raises(OptionError, match="TAG or SQL92"):
        parse_source_options({**BASE, "expressionType": "regex"}, streaming=False)
    assert not parse_source_options({**BASE, "filterPushdown": "false"}, streaming=False).filter_pushdown


def test_sink_options() -> None:
    s = parse_sink_options({"nameserver": "h:1", "sendtimeoutms": "500", "retries": "0"}, app_name="my app")
    assert s.topic is None and s.send_timeout_s == 0.5 and s.retries == 0
    assert s.producer_group == "spark-producer-my_app"
    with pytest.raises(OptionError, match="nameserver"):
        parse_sink_options({"topic": "T"})
    with pytest.raises(OptionError, match="producerGroup"):
        parse_sink_options({"nameserver": "h:1", "producerGroup": "a b"})


def test_sink_writes_are_idempotent_unless_turned_off() -> None:
    assert parse_sink_options({"nameserver": "h:1"}).idempotent
    assert not parse_sink_options({"nameserver": "h:1", "idempotent": "false"}).idempotent
    with pytest.raises(OptionError, match="option idempotent must be true or false"):
        parse_sink_options({"nameserver": "h:1", "idempotent": "maybe"})


SECRET = "s3cr3t-never-shown"


def test_access_and_secret_key_become_credentials_for_source_and_sink() -> None:
    o = parse_source_options({**BASE, "accesskey": "reader", "secretkey": SECRET}, streaming=False)
    s = parse_sink_options({"nameserver": "h:1", "accessKey": "writer", "secretKey": SECRET})
    assert o.credentials == Credentials("reader", SECRET)
    assert s.credentials == Credentials("writer", SECRET)
    assert parse_source_options(BASE, streaming=False).credentials is None
    for shown in (repr(o), str(o), repr(s)):  # the options objects are what a plan or a log line would print
        assert SECRET not in shown
    assert "reader" in repr(o) and "writer" in repr(s)


@pytest.mark.parametrize("given, missing", [
    ({"accessKey": "a"}, "secretKey"),
    ({"secretKey": SECRET}, "accessKey"),
    ({"accessKey": "a", "secretKey": ""}, "secretKey"),
    ({"accessKey": "a b", "secretKey": SECRET}, "accessKey"),
])
def test_a_half_or_bad_account_is_an_option_error_without_the_secret(given: dict[str, str], missing: str) -> None:
    with pytest.raises(OptionError, match=missing) as e:
        parse_source_options({**BASE, **given}, streaming=False)
    assert SECRET not in str(e.value)
    with pytest.raises(OptionError, match=missing):
        parse_sink_options({"nameserver": "h:1", **given})


def test_the_data_source_repr_and_redacted_hide_the_secret() -> None:
    shown = redacted({"nameserver": "h:1", "SecretKey": SECRET, "accessKey": "a"})
    assert shown == {"nameserver": "h:1", "SecretKey": "<redacted>", "accessKey": "a"}
    pytest.importorskip("pyspark")
    from spark_connector.source import RocketMQDataSource

    ds = RocketMQDataSource({"nameserver": "h:1", "topic": "T", "secretkey": SECRET})
    assert SECRET not in repr(ds) and "<redacted>" in repr(ds)


def test_pooled_clients_are_per_account() -> None:
    a, b = Credentials("a", SECRET), Credentials("b", SECRET)
    try:
        ca, cb = pooled_client("127.0.0.1:1", None, a), pooled_client("127.0.0.1:1", None, b)
        cn = pooled_client("127.0.0.1:1")
        assert len({id(ca), id(cb), id(cn)}) == 3
        assert pooled_client("127.0.0.1:1", None, Credentials("a", SECRET)) is ca
    finally:
        close_pool()
