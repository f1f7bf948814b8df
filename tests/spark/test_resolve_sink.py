"""Driver-side offset resolution, the HTTP client against a mock transport, and sink schema checks."""

from __future__ import annotations

import json

import httpx
import pytest
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

from client.errors import BrokerConnectError, RouteNotFoundError, TopicNotExistError
from common import wire
from common.codes import PullStatus
from common.message import MessageQueue
from common.route import BrokerData, QueueData, TopicRouteData
from spark_connector.errors import ClusterUnreachableError, DataLossError
from spark_connector.offsets import QueueKey
from spark_connector.options import OptionError, SinkOptions, parse_source_options
from spark_connector.resolve import (
    ClusterView,
    cluster_view,
    fetch_offsets,
    fetch_state,
    queue_keys,
    resolve_end,
    resolve_start,
    route_snapshot,
)
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
        if topic != "T":
            raise RouteNotFoundError(f"No route info of this topic: {topic}")
        return ROUTE

    def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None) -> int:
        self.asked.append((addr, kind))
        if addr in self.down:
            raise BrokerConnectError("refused", broker_addr=addr)
        if kind == "search" and timestamp_ms is not None and timestamp_ms >= 1000:
            return 3  # the per-queue searches of the tests below
        return {"min": 2, "max": 10 if addr.endswith("0:1") else 8, "search": 5}[kind]

    def group_identity(self, addr: str) -> str | None:
        return f"id-{addr[0]}"


def test_queue_keys_skip_unreadable_groups() -> None:
    assert queue_keys(ROUTE, "T") == [A0, A1, B0]


def test_offsets_come_from_the_master_else_a_slave() -> None:
    c = FakeOffsets(down={"a0:1"})
    assert fetch_offsets(c, ROUTE, [A0, A1, B0], "max") == {A0: 8, A1: 8, B0: 8}
    assert ("a1:1", "max") in c.asked
    with pytest.raises(BrokerConnectError):
        fetch_offsets(FakeOffsets(down={"a0:1", "a1:1"}), ROUTE, [A0], "max")
    state = fetch_state(FakeOffsets(down={"a0:1"}), route_snapshot(ROUTE), [A0, A1, B0])
    assert state.maxs == {A0: 8, A1: 8, B0: 8} and state.mins == {A0: 2, A1: 2, B0: 2}
    assert state.from_master == set()  # broker-a's slave answered, broker-b has no master in the route
    assert state.identities == {"broker-a": "id-a", "broker-b": "id-b"}
    assert fetch_state(FakeOffsets(), route_snapshot(ROUTE), [A0]).from_master == {"broker-a"}


def _view(keys: list[QueueKey]) -> ClusterView:
    return ClusterView(("T",), keys, route_snapshot(ROUTE))


def _resolved(options: dict[str, str], keys: list[QueueKey] | None = None) -> tuple[dict[QueueKey, int], ...]:
    c = FakeOffsets()
    view = _view(keys or [A0, A1, B0])
    o = parse_source_options({"nameserver": "h:1", "topic": "T", **options}, streaming=False)
    state = fetch_state(c, view.brokers, view.keys)
    return resolve_start(c, view, o, state), resolve_end(c, view, o, state)


def test_resolve_start_and_end_specs() -> None:
    start, end = _resolved({"startingOffsets": '{"T":{"broker-a":{"0":4,"1":-1}}}',
                            "endingOffsets": '{"T":{"broker-a":{"0":7,"1":-1}}}'})
    assert start == {A0: 4, A1: 10, B0: 2}
    assert end == {A0: 7, A1: 10, B0: 8}
    assert _resolved({"startingTimestamp": "1", "endingTimestamp": "2"}) == ({A0: 5, A1: 5, B0: 5},) * 2
    per_queue = _resolved({"startingOffsetsByTimestamp": '{"T":{"broker-a":{"1":1000}}}',
                           "startingOffsets": '{"T":{"broker-a":{"0":6}}}',
                           "endingOffsetsByTimestamp": '{"T":{"broker-b":{"0":2000}}}'})
    assert per_queue == ({A0: 6, A1: 3, B0: 2}, {A0: 10, A1: 10, B0: 3})


@pytest.mark.parametrize(("options", "match", "lenient"), [
    ({"startingOffsets": '{"T":{"broker-a":{"0":1}}}'},
     r"^option startingOffsets: T@broker-a:0 starts at 1, below its min offset 2 \(expired\)\. Set failOnDataLoss=false",
     ({A0: 2}, {A0: 10})),
    ({"startingOffsets": '{"T":{"broker-a":{"0":11}}}'},
     r"^option startingOffsets: T@broker-a:0 starts at 11, beyond its max offset 10\. Set failOnDataLoss=false to "
     r"start such queues at their earliest offset still there, or change startingOffsets$",
     ({A0: 2}, {A0: 10})),
    ({"endingOffsets": '{"T":{"broker-a":{"0":99}}}'},
     r"^option endingOffsets: T@broker-a:0 ends at 99, beyond its max offset 10\.", ({A0: 2}, {A0: 10})),
    ({"endingOffsets": '{"T":{"broker-a":{"0":1}}}'},
     r"^option endingOffsets: T@broker-a:0 ends at 1, below its min offset 2", ({A0: 2}, {A0: 2})),
])
def test_offsets_outside_a_queue_are_data_loss_in_batch_too(options: dict[str, str], match: str,
                                                            lenient: tuple[dict[QueueKey, int], ...]) -> None:
    with pytest.raises(DataLossError, match=match):
        _resolved(options, [A0])
    assert _resolved({**options, "failOnDataLoss": "false"}, [A0]) == lenient


def test_json_options_must_name_queues_of_the_read() -> None:
    with pytest.raises(OptionError, match="broker-z"):
        _resolved({"startingOffsets": '{"T":{"broker-z":{"0":1}}}'})
    with pytest.raises(OptionError, match="names topic 'U'"):
        _resolved({"startingOffsetsByTimestamp": '{"U":{"broker-a":{"0":1}}}'})


def test_cluster_view_of_topics_and_patterns() -> None:
    c = FakeOffsets()
    pattern = parse_source_options({"nameserver": "h:1", "subscribePattern": "T|%RETRY%T|X"}, streaming=True)
    view = cluster_view(c, pattern, refresh=True, list_topics=lambda: ["T", "%RETRY%T", "TBW102", "Y"])
    assert view.topics == ("T",) and view.keys == [A0, A1, B0] and set(view.brokers) == {"broker-a", "broker-b",
                                                                                          "broker-c"}
    missing = parse_source_options({"nameserver": "h:1", "subscribe": "T,U"}, streaming=True)
    with pytest.raises(ClusterUnreachableError, match=r"^topic U has no route \(the nameserver does not know it\)"):
        cluster_view(c, missing, refresh=True, list_topics=lambda: ["T"])

    def down() -> list[str]:
        raise BrokerConnectError("connect to h:1 failed", broker_addr="h:1")

    with pytest.raises(ClusterUnreachableError, match="no nameserver of option nameserver=h:1 answers"):
        cluster_view(c, missing, refresh=True, list_topics=down)


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
