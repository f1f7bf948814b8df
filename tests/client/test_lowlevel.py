"""The public low-level SDK (``client.lowlevel``): its pinned surface, the producer's retry rules and the pull
consumer's read/write-split rules against the scripted fake cluster, and a round trip against real processes."""

from __future__ import annotations

import asyncio
import inspect
import random
from urllib.parse import parse_qsl

import httpx
import pytest

from client import Admin, Message, MessageQueue, PullConsumer
from client import lowlevel as ll
from client.errors import BrokerError, RouteNotFoundError, SendFailedError
from client.lowlevel import AsyncBrokerClient, BrokerClient
from common import codec
from common.codes import PullStatus, PullSysFlag, ResponseCode, SendStatus
from common.requests import PullRequestHeader, SendRequestHeader

A0, A1, B0 = "a0:1", "a1:1", "b0:1"
MQ = MessageQueue("T", "broker-a", 0)


def test_public_names_are_pinned_and_documented() -> None:
    assert ll.__all__ == [
        "DEFAULT_TOPIC", "RETRY_RESPONSE_CODES", "AsyncBrokerClient", "BrokerClient", "BrokerDownTable",
        "FaultToleranceConfig", "FindBrokerResult", "LatencyFaultTolerance", "PullNodeTable", "PullPlan",
        "PullRequestHeader", "PullTarget", "QueueSelector", "RawPullResult", "RawSendResult", "RouteCache",
        "SendAttempts", "SendRequestHeader", "SendWhere", "TopicPublishInfo", "check_batch", "default_route_for",
        "find_broker_address_in_subscribe", "group_among", "group_for_key", "is_retriable", "key_group_names",
        "may_be_stored", "plan_pull",
        "raw_pull_refused",
        "topic_route_to_publish_info", "topic_route_to_subscribe_info", "validate_message",
    ]
    for name in ll.__all__:
        obj = getattr(ll, name)
        if callable(obj):
            assert inspect.getdoc(obj), f"client.lowlevel.{name} has no docstring"
    for cls in (BrokerClient, AsyncBrokerClient):
        for name, member in inspect.getmembers(cls):
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                assert inspect.getdoc(member), f"{cls.__name__}.{name} has no docstring"


def _client(fake, **kwargs) -> BrokerClient:
    return BrokerClient(fake.namesrv, transport=httpx.MockTransport(fake.handler), **kwargs)


def _body(n: int, topic: str = "T") -> bytes:
    return codec.encode_batch([Message(topic, b"m%d" % i) for i in range(n)], born_timestamp_ms=1,
                              uniq_keys=[f"{i:032X}" for i in range(n)])


def _query(r: httpx.Request) -> dict[str, str]:
    return dict(parse_qsl(r.url.query.decode(), keep_blank_values=True))


def _addrs(fake, path: str) -> list[str]:
    return [f"{r.url.host}:{r.url.port}" for r in fake.requests if r.url.path == path]


# --- send: the producer's retry loop (docs/BEHAVIOUR.md 4.6) --------------------------------------------------------


def test_send_encoded_retries_on_the_other_broker_group(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0}, "broker-b": {0: B0}})
    fake.script[A0] = ["connect"]
    fake.script[B0] = ["connect"]
    with _client(fake, rng=random.Random(3)) as c:
        r = c.send_encoded("T", _body(3), 3, group="pg")
    sent = _addrs(fake, "/send")
    assert len(sent) == 3 and sent[0] != sent[1] and sent[2] == sent[0]  # away from the last failed group
    assert r.message_queue.broker_name == ("broker-a" if sent[2] == A0 else "broker-b")
    assert r.send_status is SendStatus.SEND_OK and len(r.reply.commit_log_offsets) == 3
    h = SendRequestHeader.from_query(_query(fake.sends()[-1]))
    assert (h.topic, h.group, h.default_topic_queue_nums) == ("T", "pg", None)


def test_send_encoded_gives_up_like_the_producer(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0}, "broker-b": {0: B0}})
    with _client(fake) as c:
        fake.script[A0] = ["connect"]
        with pytest.raises(SendFailedError):  # an explicit queue: one attempt
            c.send_encoded("T", _body(1), 1, group="pg", queue=MessageQueue("T", "broker-a", 1))
        assert len(fake.sends()) == 1
        fake.script[A0] = [int(ResponseCode.MESSAGE_ILLEGAL)] * 3
        fake.script[B0] = [int(ResponseCode.MESSAGE_ILLEGAL)] * 3
        with pytest.raises(BrokerError) as e:  # not a retried code: raised at once
            c.send_encoded("T", _body(1), 1, group="pg")
        assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and len(fake.sends()) == 2
        fake.script[A0] = [int(ResponseCode.SYSTEM_BUSY)] * 3
        fake.script[B0] = [int(ResponseCode.SYSTEM_BUSY)] * 3
        with pytest.raises(SendFailedError, match="Send \\[2\\] times"):
            c.send_encoded("T", _body(1), 1, group="pg", retries=1)
        fake.script[A0] = [int(ResponseCode.FLUSH_SLAVE_TIMEOUT)]
        fake.script[B0] = [int(ResponseCode.FLUSH_SLAVE_TIMEOUT)]
        assert c.send_encoded("T", _body(1), 1, group="pg").send_status is SendStatus.FLUSH_SLAVE_TIMEOUT


def test_send_encoded_to_a_new_topic_borrows_the_default_route(fake) -> None:
    fake.add_topic("TBW102", {"broker-a": {0: A0}}, queues=8)
    with _client(fake) as c:
        r = c.send_encoded("New", _body(2, "New"), 2, group="pg")
        with pytest.raises(RouteNotFoundError):  # a borrowed route is not the topic's route
            c.route("New")
    assert r.message_queue.topic == "New" and 0 <= r.message_queue.queue_id < 4
    assert SendRequestHeader.from_query(_query(fake.sends()[0])).default_topic_queue_nums == 4


# --- pull: the consumer's read/write split (docs/BEHAVIOUR.md 3.3, decision 6) --------------------------------------


def test_pull_raw_goes_to_the_slave_while_the_master_is_down(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.script[A0] = ["connect"]
    with _client(fake) as c:
        r = c.pull_raw(MQ, 7, group="cg", commit_offset=5)
        assert (r.status, r.served_by_broker_id, r.next_begin_offset, r.n_records) == (PullStatus.NO_NEW_MSG, 1, 7, 0)
        assert c.broker_down.down_until("broker-a", 0) is not None
        c.pull_raw(MQ, 7, group="cg")  # the master is still isolated: straight to the slave
        assert _addrs(fake, "/pull") == [A0, A1, A1]
    to_master, to_slave = [PullRequestHeader.from_query(_query(r)) for r in fake.requests if r.url.path == "/pull"][:2]
    assert to_master.sys_flag & PullSysFlag.COMMIT_OFFSET and to_master.commit_offset == 5
    assert not to_slave.sys_flag & PullSysFlag.COMMIT_OFFSET  # a slave never gets the commit offset
    assert (to_slave.group, to_slave.offset, to_slave.max_nums) == ("cg", 7, 32)


def test_pull_raw_sends_a_refused_pull_on_to_the_master_and_follows_suggestions(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    with _client(fake, clock_ms=lambda: 1_000) as c:
        c.broker_down.mark_down("broker-a", 0, 1_000)
        fake.script[A1] = ["refuse"]
        r = c.pull_raw(MQ, 0, group="cg")
        assert r.served_by_broker_id == 0 and _addrs(fake, "/pull") == [A1, A0]
        fake.pull_suggest[A0] = 1  # the master says: read from the slave
        c.pull_raw(MQ, 0, group="cg")
        assert c.pull_nodes.recalculate(MQ) == 1
        c.pull_raw(MQ, 0, group="cg")
        assert _addrs(fake, "/pull") == [A1, A0, A0, A1]


def test_pull_raw_returns_the_refusal_when_nobody_serves(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.script[A0] = ["connect"]
    fake.script[A1] = ["refuse"]
    with _client(fake) as c:
        r = c.pull_raw(MQ, 3, group="cg")
    assert (r.status, r.next_begin_offset, r.served_by_broker_id) == (PullStatus.NO_MATCHED_MSG, 3, 1)
    assert ll.raw_pull_refused(r, 3)


def test_async_twin_sends_and_pulls_by_the_same_rules(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})

    async def handler(request: httpx.Request) -> httpx.Response:
        return fake.handler(request)

    async def main() -> None:
        async with AsyncBrokerClient(fake.namesrv, transport=httpx.MockTransport(handler)) as c:
            fake.script[A0] = ["connect"]
            with pytest.raises(SendFailedError):  # broker-a is the only group: no other to retry on
                await c.send_encoded("T", _body(1), 1, group="pg", retries=0)
            r = await c.send_encoded("T", _body(2), 2, group="pg")
            assert r.message_queue.broker_name == "broker-a"
            fake.script[A0] = ["connect"]
            p = await c.pull_raw(MQ, 0, group="cg")
            assert p.served_by_broker_id == 1
            assert await c.queue_offset(A1, "max", MQ) == 101

    asyncio.run(main())
    assert _addrs(fake, "/pull") == [A0, A1]


# --- real processes -------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_round_trip_against_a_real_cluster(cluster_factory) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("Raw", queue_nums=2)
    msgs = [Message("Raw", b"raw-%d" % i, tags="A" if i % 2 else "B") for i in range(5)]
    body = codec.encode_batch(msgs, born_timestamp_ms=1, uniq_keys=[codec.UniqKeyGenerator().next() for _ in msgs])
    with BrokerClient(cluster.namesrv_addr) as c:
        sent = c.send_encoded("Raw", body, 5, group="raw-pg")
        mq = sent.message_queue
        assert sent.send_status is SendStatus.SEND_OK and sent.reply.queue_offset == 0
        got = c.pull_raw(mq, 0, group="raw-cg", max_nums=32)
        assert (got.status, got.n_records, got.next_begin_offset) == (PullStatus.FOUND, 5, 5)
        assert [m.body for m in codec.decode_records(got.records)] == [m.body for m in msgs]
        tagged = c.pull_raw(mq, 0, group="raw-cg", sub_expression="A")
        assert [m.body for m in codec.decode_records(tagged.records)] == [b"raw-1", b"raw-3"]
        master = c.broker_addrs("Raw", "broker-a")[0]
        assert c.queue_offset(master, "max", mq) == 5
        c.commit_offsets(master, "raw-cg", [(mq, 4)])
    with PullConsumer("raw-cg", cluster.namesrv_addr) as pc:
        assert pc.fetch_consume_offset(mq) == 4
