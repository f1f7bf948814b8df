"""Driver-side offset resolution, the HTTP client against a mock transport, and sink schema checks."""

from __future__ import annotations

import json

import httpx
import pytest
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

from client.errors import BrokerConnectError, TopicNotExistError
from common import wire
from common.codes import PullStatus
from common.message import MessageQueue
from common.route import BrokerData, QueueData, TopicRouteData
from spark_connector.offsets import QueueKey
from spark_connector.options import OptionError, SinkOptions, parse_source_options
from spark_connector.resolve import fetch_offsets, queue_keys, resolve_end, resolve_start
from spark_connector.sink import APPEND_ONLY, check_sink_schema, make_batch_writer
from spark_connector.transport import BrokerClient

from .conftest import build_records

ROUTE = TopicRouteData(
    (QueueData("broker-a", 2, 2), QueueData("broker-b", 1, 1), QueueData("broker-c", 3, 3, perm=2)),
    (BrokerData("C", "broker-a", {0: "a0:1", 1: "a1:1"}), BrokerData("C", "broker-b", {1: "b1:1"}),
     BrokerData("C", "broker-c", {0: "c0:1"})),
)
A0, A1, B0 = QueueKey("T", "broker-a", 0), QueueKey("T", "broker-a", 1), QueueKey("T", "broker-b", 0)


class FakeOffsets:
    """min = 2, max = 10 (master) / 8 (slave), search = 5; members listed in ``down`` refuse connections."""

    def __init__(self, down: frozenset[str] | set[str] = frozenset()) -> None:
        self.down = down
        self.asked: list[tuple[str, str]] = []

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        return ROUTE

    def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None) -> int:
        self.asked.append((addr, kind))
        if addr in self.down:
            raise BrokerConnectError("refused", broker_addr=addr)
        return {"min": 2, "max": 10 if addr.endswith("0:1") else 8, "search": 5}[kind]


def test_queue_keys_skip_unreadable_groups() -> None:
    assert queue_keys(ROUTE, "T") == [A0, A1, B0]


def test_offsets_come_from_the_master_else_a_slave() -> None:
    c = FakeOffsets(down={"a0:1"})
    assert fetch_offsets(c, ROUTE, [A0, A1, B0], "max") == {A0: 8, A1: 8, B0: 8}
    assert ("a1:1", "max") in c.asked
    with pytest.raises(BrokerConnectError):
        fetch_offsets(FakeOffsets(down={"a0:1", "a1:1"}), ROUTE, [A0], "max")


def test_resolve_start_and_end_specs() -> None:
    c = FakeOffsets()
    keys = [A0, A1, B0]
    o = parse_source_options({"nameserver": "h:1", "topic": "T", "startingOffsets": '{"T":{"broker-a":{"0":4,"1":-1}}}',
                              "endingOffsets": '{"T":{"broker-a":{"0":7,"1":99}}}'}, streaming=False)
    assert resolve_start(c, ROUTE, keys, o) == {A0: 4, A1: 10, B0: 2}
    assert resolve_end(c, ROUTE, keys, o) == {A0: 7, A1: 10, B0: 8}
    ts = parse_source_options({"nameserver": "h:1", "topic": "T", "startingTimestamp": "1",
                               "endingTimestamp": "2"}, streaming=False)
    assert resolve_start(c, ROUTE, keys, ts) == {A0: 5, A1: 5, B0: 5}
    assert resolve_end(c, ROUTE, keys, ts) == {A0: 5, A1: 5, B0: 5}


def test_resolve_start_rejects_expired_or_unknown_queues() -> None:
    c = FakeOffsets()
    expired = parse_source_options({"nameserver": "h:1", "topic": "T",
                                    "startingOffsets": '{"T":{"broker-a":{"0":1}}}'}, streaming=False)
    with pytest.raises(OptionError, match="expired"):
        resolve_start(c, ROUTE, [A0], expired)
    lenient = parse_source_options({"nameserver": "h:1", "topic": "T", "failOnDataLoss": "false",
                                    "startingOffsets": '{"T":{"broker-a":{"0":1}}}'}, streaming=False)
    assert resolve_start(c, ROUTE, [A0], lenient) == {A0: 2}
    unknown = parse_source_options({"nameserver": "h:1", "topic": "T",
                                    "startingOffsets": '{"T":{"broker-z":{"0":1}}}'}, streaming=False)
    with pytest.raises(OptionError, match="broker-z"):
        resolve_start(c, ROUTE, [A0], unknown)


def _mock_client(handler: httpx.MockTransport) -> BrokerClient:
    return BrokerClient("ns1:1;ns2:1", transport=handler)


def test_client_pull_keeps_records_raw_and_maps_errors() -> None:
    raw = build_records([{"tags": "A"}, {}], topic="T", first_offset=3)

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/pull" and req.url.host == "good":
            assert req.url.params["maxBytes"] == "100" and req.url.params["subExpression"] == "A || B"
            return httpx.Response(200, content=wire.encode_pull_header(0, 5, 0, 9, 1, 0, 2) + raw)
        if req.url.path == "/pull":
            return httpx.Response(404, content=wire.encode_error(17, "topic[T] not exist"))
        if req.url.host == "ns1":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json=ROUTE.to_json())

    c = _mock_client(httpx.MockTransport(handle))
    r = c.pull("good:1", A0, 3, max_nums=32, max_bytes=100, sub_expression="A || B", group="g", timeout_s=1)
    assert (r.status, r.next_begin_offset, r.suggest_which_broker_id, r.n_records) == (PullStatus.FOUND, 5, 1, 2)
    assert bytes(r.records) == raw
    with pytest.raises(TopicNotExistError):
        c.pull("bad:1", A0, 3, max_nums=32, max_bytes=100, sub_expression="*", group="g", timeout_s=1)
    assert c.broker_addrs("T", "broker-a") == {0: "a0:1", 1: "a1:1"}  # ns1 down: ns2 answers
    c.close()


def test_client_offsets_and_commit() -> None:
    seen: list[dict[str, object]] = []

    def handle(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            seen.append(json.loads(req.content))
            return httpx.Response(200, json={"updated": 1})
        return httpx.Response(200, json={"offset": 42})

    c = _mock_client(httpx.MockTransport(handle))
    assert c.queue_offset("a0:1", "search", A0.message_queue, timestamp_ms=7) == 42
    c.commit_offsets("a0:1", "grp", [(A0.message_queue, 5)])
    assert seen == [{"group": "grp", "offsets": [{"topic": "T", "queueId": 0, "offset": 5}]}]


def _schema(*fields: StructField) -> StructType:
    return StructType(list(fields))


def test_sink_schema_checks() -> None:
    opts = SinkOptions(nameserver="h:1", topic="T")
    check_sink_schema(_schema(StructField("body", StringType()), StructField("queueId", IntegerType()),
                              StructField("properties", MapType(StringType(), StringType()))), opts)
    with pytest.raises(OptionError, match="no column 'value'"):
        check_sink_schema(_schema(StructField("body", BinaryType()), StructField("value", BinaryType())), opts)
    with pytest.raises(OptionError, match="body"):
        check_sink_schema(_schema(StructField("tags", StringType())), opts)
    with pytest.raises(OptionError, match="queueId"):
        check_sink_schema(_schema(StructField("body", BinaryType()), StructField("queueId", StringType())), opts)
    with pytest.raises(OptionError, match="topic"):
        check_sink_schema(_schema(StructField("body", BinaryType())), SinkOptions(nameserver="h:1"))
    with pytest.raises(OptionError, match='mode\\("append"\\)') as e:
        make_batch_writer({"nameserver": "h:1", "topic": "T"}, _schema(StructField("body", BinaryType())), True)
    assert str(e.value) == APPEND_ONLY
