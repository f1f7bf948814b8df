"""PullConsumer node choice, failover and offsets against the scripted fake cluster; the public surface."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qsl

import pytest

import client
from client import AsyncPullConsumer, ClientState, MessageQueue, PullConsumer, PullStatus
from client.errors import BrokerNotFoundError, ClientClosedError, InvalidParameterError, TransportError

A0, A1 = "a0:1", "a1:1"
MQ = MessageQueue("T", "broker-a", 0)


def pulls(fake):
    return [(f"{r.url.host}:{r.url.port}", dict(parse_qsl(r.url.query.decode())))
            for r in fake.requests if r.url.path == "/pull"]


@pytest.fixture
def consumer(fake):
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    c = PullConsumer("cg", fake.namesrv)
    yield c
    c.close()


def test_suggestion_moves_next_pull_and_commit_bit_only_on_master(fake, consumer) -> None:
    assert consumer.fetch_subscribe_message_queues("T") == [MessageQueue("T", "broker-a", i) for i in range(2)]
    consumer.update_consume_offset(MQ, 5)
    fake.pull_suggest[A0] = 1
    r = consumer.pull(MQ, 0)
    assert r.pull_status is PullStatus.NO_NEW_MSG and r.suggest_which_broker_id == 1 and r.served_by_broker_id == 0
    assert consumer.pull_from_which_node_table[MQ] == 1
    assert consumer.recalculate_pull_from_which_node(MQ) == 1
    r = consumer.pull(MQ, 0)
    assert r.served_by_broker_id == 1
    (addr0, q0), (addr1, q1) = pulls(fake)
    assert addr0 == A0 and int(q0["sysFlag"]) & 0x1 and q0["commitOffset"] == "5"
    assert addr1 == A1 and not int(q1["sysFlag"]) & 0x1 and "commitOffset" not in q1
    with pytest.raises(TypeError):
        consumer.pull_from_which_node_table[MQ] = 0  # type: ignore[index]


def test_unreachable_master_marked_down_and_slave_used_at_once(fake, consumer) -> None:
    fake.script[A0] = ["connect"]
    r = consumer.pull(MQ, 0)
    assert r.served_by_broker_id == 1
    assert [a for a, _ in pulls(fake)] == [A0, A1]
    consumer.pull(MQ, 0)  # the master is isolated: straight to the slave
    assert [a for a, _ in pulls(fake)][-1] == A1
    # offsets go to the slave while the master is down
    consumer.update_consume_offset(MQ, 3)
    commits = [f"{r.url.host}:{r.url.port}" for r in fake.requests
               if r.url.path == "/offset/consumer" and r.method == "POST"]
    assert commits == [A1]
    assert consumer.max_offset(MQ) == 101  # fake answers 100 + broker id


def test_whole_group_unreachable_is_a_retriable_error(fake, consumer) -> None:
    fake.script[A0] = ["connect"]
    fake.script[A1] = ["timeout"]
    with pytest.raises(TransportError) as ei:
        consumer.pull(MQ, 0)
    assert ei.value.retriable and "broker-a" in str(ei.value)


def test_pinned_node(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    with PullConsumer("cg", fake.namesrv, connect_broker_by_user=True, default_broker_id=1) as c:
        fake.pull_suggest[A1] = 0
        c.pull(MQ, 0)
        c.pull(MQ, 0)
        assert [a for a, _ in pulls(fake)] == [A1, A1]
        assert c.recalculate_pull_from_which_node(MQ) == 1


def test_unknown_group_and_offsets(fake, consumer) -> None:
    with pytest.raises(BrokerNotFoundError, match=r"The broker\[broker-z\] not exist"):
        consumer.pull(MessageQueue("T", "broker-z", 0), 0)
    assert consumer.fetch_consume_offset(MQ) == -1
    with pytest.raises(InvalidParameterError):
        consumer.pull(MQ, -1)
    with pytest.raises(InvalidParameterError):
        consumer.pull(MQ, 0, max_nums=0)


def test_consumer_lifecycle(fake) -> None:
    c = PullConsumer("cg", fake.namesrv)
    with c:
        assert c.state is ClientState.OPENED
    c.close()
    assert c.state is ClientState.CLOSED
    with pytest.raises(ClientClosedError):
        c.pull(MQ, 0)


def test_async_consumer(fake, async_fake_instance) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})

    async def main() -> None:
        inst = async_fake_instance(fake)
        async with AsyncPullConsumer("cg", fake.namesrv) as c:
            assert await c.fetch_subscribe_message_queues("T")
            fake.script[A0] = ["connect"]
            r = await c.pull(MQ, 0)
            assert r.served_by_broker_id == 1
            assert await c.fetch_consume_offset(MQ) == -1
            await c.update_consume_offset(MQ, 2)
            assert await c.min_offset(MQ) == 101
        with pytest.raises(ClientClosedError):
            await c.pull(MQ, 0)
        await inst.release()

    asyncio.run(main())


def test_public_names_are_pinned() -> None:
    assert client.__all__ == sorted(client.__all__)
    assert client.__all__ == [
        "Admin", "AllocateMessageQueueAveragely", "AllocateMessageQueueAveragelyByCircle", "AsyncClientInstance",
        "AsyncGroupConsumer", "AsyncProducer", "AsyncPullConsumer", "AsyncTransactionProducer", "ClientConfig",
        "ClientInstance", "ClientState", "ClusterInfo", "ConsumeFromWhere", "ConsumeStatus", "Credentials", "DeliveryCallback",
        "FindBrokerResult", "GroupConsumer", "GroupConsumerConfig", "LocalTransactionState", "Message", "MessageExt",
        "MessageModel", "MessageQueue", "MessageSelector", "Producer", "PullConsumer", "PullResult", "PullStatus",
        "PushConsumer", "QueueProgress", "RebalanceListener", "SendResult", "SendStatus", "TransactionListener", "TransactionProducer",
        "TransactionSendResult", "errors",
    ]
    for name in client.__all__:
        assert getattr(client, name) is not None
    import common.errors

    assert client.errors.ClientError is common.errors.ClientError  # one tree, shared with the servers


def test_cluster_module_imports_no_server_code() -> None:
    import subprocess
    import sys

    code = "import sys, client.cluster; print(any(m.split('.')[0] in ('broker', 'nameserver') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
