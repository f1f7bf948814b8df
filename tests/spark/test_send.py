"""The sink's data path without Spark or a network: row encoding and validation, chunking, the sender."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from client.errors import BrokerError, MessageIllegalError, SendFailedError
from common.codec import UniqKeyGenerator, decode_batch
from common.codes import ResponseCode, SysFlag
from common.message import MessageQueue
from common.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from common.requests import SendRequestHeader, parse_query
from common.route import BrokerData, QueueData, TopicRouteData
from common.wire import encode_error, encode_send_reply, http_status_for_code
from spark_connector.send import Chunk, ChunkBuilder, ItemEncoder, RowKeys, Sender, encode_columns
from spark_connector.transport import BrokerClient

ROUTE = TopicRouteData(
    (QueueData("broker-a", 2, 2), QueueData("broker-b", 2, 2)),
    (BrokerData("C", "broker-a", {0: "a0:1", 1: "a1:1"}), BrokerData("C", "broker-b", {0: "b0:1"})),
)
DEFAULT_ROUTE = TopicRouteData(
    (QueueData("broker-a", 8, 8),), (BrokerData("C", "broker-a", {0: "a0:1"}),),
)


def encode(columns: dict[str, list[Any]], *, topic: str | None = "T", max_messages: int = 512,
           max_message_size: int = 4 << 20) -> list[Chunk]:
    n = len(columns["body"])
    enc = ItemEncoder(uniq=UniqKeyGenerator(), clock_ms=lambda: 1_700_000_000_000, max_message_size=max_message_size)
    builder = ChunkBuilder(max_messages=max_messages)
    chunks = list(encode_columns(columns, n, topic_option=topic, encoder=enc, builder=builder,
                                 queue_of=lambda row, t, qid, broker: MessageQueue(t, broker or "broker-a", qid)))
    return chunks + builder.finish()


def test_rows_become_send_batch_items_with_sdk_properties() -> None:
    chunks = encode({"body": [b"one", "two"], "tags": ["TagA", None], "keys": ["k1  k2", None],
                     "properties": [[("color", "red")], None]})
    assert len(chunks) == 1 and chunks[0].messages == 2 and chunks[0].queue is None
    items = decode_batch(chunks[0].body, verify_crc=True)
    assert [bytes(i.body) for i in items] == [b"one", b"two"]
    first, second = (decode_properties(i.properties) for i in items)
    assert (first[TAGS], first[KEYS], first["color"]) == ("TagA", "k1 k2", "red")
    assert set(second) == {UNIQ_KEY}
    assert len(first[UNIQ_KEY]) == 32 and first[UNIQ_KEY] != second[UNIQ_KEY]
    assert items[0].born_timestamp == 1_700_000_000_000


def test_rows_group_by_topic_and_queue_and_cut_at_the_message_cap() -> None:
    chunks = encode({"body": [b"x"] * 7, "topic": ["A", "B", "A", "A", "B", "A", "A"],
                     "queueId": [None, None, 1, None, None, None, None]}, topic=None, max_messages=2)
    got = sorted((c.topic, c.queue.queue_id if c.queue else -1, c.messages) for c in chunks)
    assert got == [("A", -1, 2), ("A", -1, 2), ("A", 1, 1), ("B", -1, 2)]


@pytest.mark.parametrize(
    ("columns", "topic", "match"),
    [
        ({"body": [None]}, "T", "row 0: body is null"),
        ({"body": [b"ok", b""]}, "T", "row 1: body is empty"),
        ({"body": [b"x"], "topic": [None]}, None, "row 0: topic is null"),
        ({"body": [b"x"]}, "bad topic", "row 0: .*characters outside"),
        ({"body": [b"x"]}, "TBW102", "row 0: .*reserved"),
        ({"body": [b"x"], "tags": ["a\x01b"]}, "T", "row 0: tags .*separator"),
        ({"body": [b"x"], "keys": ["k\x02"]}, "T", "row 0: keys .*separator"),
        ({"body": [b"x"], "properties": [[("KEYS", "v")]]}, "T", "row 0: property 'KEYS' is reserved"),
        ({"body": [b"x"], "properties": [[("p", "v\x01")]]}, "T", "row 0: property value .*separator"),
        ({"body": [b"x" * 300]}, "T", "row 0: .*more than maxMessageSize 256"),
        ({"body": [b"x"], "properties": [[("p", "v" * 40_000)]]}, "T", "row 0: properties are .* bytes"),
    ],
)
def test_bad_rows_are_rejected_naming_the_row(columns: dict[str, list[Any]], topic: str | None, match: str) -> None:
    with pytest.raises(MessageIllegalError, match=match):
        encode(columns, topic=topic, max_message_size=256)


_BROKER_OF = {"a0:1": "broker-a", "b0:1": "broker-b"}
_REFUSE = -1


class FakeBrokers:
    """A nameserver (``ns:1``) and two masters behind an ``httpx.MockTransport``: the sender runs the SDK's
    low-level client, its routing and its retry loop, against them. ``fail`` maps a master's address to
    :data:`_REFUSE` (connection refused) or a broker error code, answered ``times`` times."""

    def __init__(self, fail: dict[str, int] | None = None, times: int = 1_000_000,
                 known: frozenset[str] = frozenset({"T"}), reply_code: int = 0) -> None:
        self.fail = fail or {}
        self.reply_code = reply_code
        self.times = times
        self.known = known
        self.sent: list[tuple[str, MessageQueue, int | None]] = []
        self.lock = threading.Lock()
        self.client = BrokerClient("ns:1", transport=httpx.MockTransport(self.handle))

    def handle(self, req: httpx.Request) -> httpx.Response:
        query = parse_query(req.url.query)
        if req.url.path == "/route":
            topic = query["topic"]
            if topic == "TBW102":
                return httpx.Response(200, json=DEFAULT_ROUTE.to_json())
            if topic not in self.known:
                return httpx.Response(404, content=encode_error(17, f"No topic route info in name server for {topic}"))
            return httpx.Response(200, json=ROUTE.to_json())
        assert req.url.path == "/send"
        addr = f"{req.url.host}:{req.url.port}"
        h = SendRequestHeader.from_query(query)
        assert h.group == "G"
        with self.lock:
            self.sent.append((addr, MessageQueue(h.topic, _BROKER_OF[addr], h.queue_id), h.default_topic_queue_nums))
            code = self.fail.get(addr)
            if code is not None and self.times > 0:
                self.times -= 1
                if code == _REFUSE:
                    raise httpx.ConnectError("refused")
                return httpx.Response(http_status_for_code(code), content=encode_error(code, "bad batch"))
        n = len(decode_batch(req.content))
        return httpx.Response(200, content=encode_send_reply(self.reply_code, h.queue_id, 0, b"\x7f\x00\x00\x01\x00\x00\x00\x01",
                                                             tuple(range(n))))


def chunk(queue: MessageQueue | None = None, n: int = 3, topic: str = "T") -> Chunk:
    built = encode({"body": [b"m"] * n}, topic=topic)[0]
    return Chunk(topic, queue, built.body, built.messages)


def sender(brokers: FakeBrokers, *, retries: int = 2, concurrency: int = 1) -> Sender:
    return Sender(brokers.client, "G", send_timeout_s=5.0, retries=retries, concurrency=concurrency)


def test_queues_go_round_robin_over_the_masters_writable_queues() -> None:
    c = FakeBrokers()
    s = sender(c)
    for _ in range(8):
        s.submit(chunk())
    s.flush()
    queues = [(mq.broker_name, mq.queue_id) for _, mq, _ in c.sent]
    assert sorted(set(queues)) == [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
    assert all(queues.count(q) == 2 for q in set(queues))
    assert {addr for addr, _, _ in c.sent} == {"a0:1", "b0:1"}  # masters only


def test_a_failed_send_is_retried_on_another_broker_group() -> None:
    c = FakeBrokers(fail={"a0:1": _REFUSE})
    s = sender(c)
    for _ in range(4):
        s.submit(chunk())
    s.flush()
    stored = [mq.broker_name for addr, mq, _ in c.sent if addr == "b0:1"]
    assert len(stored) == 4  # every chunk ended on broker-b
    with pytest.raises(SendFailedError):
        sender(FakeBrokers(fail={a: _REFUSE for a in ("a0:1", "b0:1")}), retries=1).submit(chunk())


def test_explicit_queue_gets_one_attempt_and_non_retriable_errors_raise_at_once() -> None:
    c = FakeBrokers(fail={"a0:1": _REFUSE})
    with pytest.raises(SendFailedError):
        sender(c).submit(chunk(MessageQueue("T", "broker-a", 1)))
    assert len(c.sent) == 1
    illegal = int(ResponseCode.MESSAGE_ILLEGAL)
    c = FakeBrokers(fail={"a0:1": illegal, "b0:1": illegal})
    with pytest.raises(BrokerError, match="bad batch"):
        sender(c).submit(chunk())
    assert len(c.sent) == 1


def test_unknown_topic_borrows_the_default_route_like_the_sdk() -> None:
    c = FakeBrokers(known=frozenset())
    s = sender(c)
    s.submit(chunk(topic="NewTopic"))
    s.flush()
    addr, mq, nums = c.sent[0]
    assert addr == "a0:1" and mq.topic == "NewTopic" and 0 <= mq.queue_id < 4 and nums == 4
    assert s.queues("NewTopic") == [MessageQueue("NewTopic", "broker-a", i) for i in range(4)]


def test_concurrent_sends_all_complete_and_a_failure_surfaces_at_flush() -> None:
    c = FakeBrokers()
    s = sender(c, concurrency=3)
    for _ in range(20):
        s.submit(chunk())
    s.flush()
    s.close()
    assert len(c.sent) == 20 and s.requests == 20
    bad = FakeBrokers(fail={a: _REFUSE for a in ("a0:1", "b0:1")}, times=1_000)
    s = sender(bad, concurrency=3, retries=0)
    with pytest.raises(SendFailedError):
        for _ in range(5):
            s.submit(chunk())
        s.flush()
    s.close()


def test_stored_but_not_durable_batches_are_counted() -> None:
    s = sender(FakeBrokers(reply_code=int(ResponseCode.FLUSH_DISK_TIMEOUT)))
    s.submit(chunk(n=3))
    s.submit(chunk(n=2))
    assert (s.requests, s.not_durable) == (2, 5)


# --- idempotent writes: deterministic keys, the key's group, the idempotent bit ------------------------------------

def keyed_chunks(columns: dict[str, list[Any]], *, prefix: str = "q1-0-1-", first_row: int = 0,
                 max_messages: int = 512) -> list[Chunk]:
    from client.lowlevel import topic_route_to_publish_info
    from spark_connector.sink import KeyGroups

    info = topic_route_to_publish_info("T", ROUTE)
    enc = ItemEncoder(uniq=UniqKeyGenerator(), clock_ms=lambda: 1_700_000_000_000, idempotent=True)
    builder = ChunkBuilder(max_messages=max_messages)
    keys = RowKeys(prefix, KeyGroups(lambda _topic: info))
    n = len(columns["body"])
    chunks = list(encode_columns(columns, n, topic_option="T", encoder=enc, builder=builder,
                                 queue_of=lambda row, t, qid, broker: MessageQueue(t, broker or "broker-a", qid),
                                 row_keys=keys, first_row=first_row))
    return chunks + builder.finish()


def _items(chunks: list[Chunk]) -> dict[str, tuple[str | None, int]]:
    """Each item's key -> (the chunk's pinned group, its sys flag)."""
    out = {}
    for c in chunks:
        for item in decode_batch(c.body):
            out[decode_properties(item.properties)[UNIQ_KEY]] = (c.group, item.sys_flag)
    return out


def test_idempotent_rows_get_keys_from_their_task_and_index_and_go_to_their_keys_group() -> None:
    from client.lowlevel import group_for_key, topic_route_to_publish_info

    info = topic_route_to_publish_info("T", ROUTE)
    got = _items(keyed_chunks({"body": [b"m"] * 40}, first_row=0x100))
    assert sorted(got) == sorted(f"q1-0-1-{i:x}" for i in range(0x100, 0x128))
    assert {flag for _, flag in got.values()} == {int(SysFlag.IDEMPOTENT)}
    assert all(group == group_for_key(info, key) for key, (group, _) in got.items())
    assert {group for group, _ in got.values()} == {"broker-a", "broker-b"}  # the keys spread over both groups
    # the same rows again (a replayed task): the same keys in the same groups, whatever the chunking
    assert _items(keyed_chunks({"body": [b"m"] * 40}, first_row=0x100, max_messages=7)) == got
    # a row with its own queue keeps it, with its deterministic key
    fixed = keyed_chunks({"body": [b"m"] * 2, "queueId": [1, None]})
    assert [(c.queue, c.group is None) for c in fixed if c.queue is not None] == [
        (MessageQueue("T", "broker-a", 1), True)]


def test_row_key_prefixes_must_stay_within_the_key_rules() -> None:
    with pytest.raises(ValueError, match="printable"):
        RowKeys("a b-", lambda t, k: None)
    with pytest.raises(ValueError, match="110"):
        RowKeys("x" * 111, lambda t, k: None)


def test_an_idempotent_sender_pins_each_chunk_to_its_group() -> None:
    c = FakeBrokers()
    s = Sender(c.client, "G", send_timeout_s=5.0, retries=2, concurrency=1, idempotent=True)
    chunks = keyed_chunks({"body": [b"m"] * 64}, max_messages=4)
    for chunk in chunks:
        s.submit(chunk)
    s.flush()
    assert [mq.broker_name for _, mq, _ in c.sent] == [ch.group for ch in chunks]
    assert {ch.group for ch in chunks} == {"broker-a", "broker-b"}
