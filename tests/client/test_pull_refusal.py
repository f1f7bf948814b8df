"""A slave that refuses pulls (``slaveReadEnable=false``, master link up; decision 6) against the scripted fake
cluster: the pull consumers (sync and async alike) do not send the next pull back to it, and the consumer
engines wait before pulling a queue whose pull was refused. The same against real processes is in
``tests/ha/test_refusing_slave.py``."""

from __future__ import annotations

import asyncio

import pytest

from client import (
    AsyncGroupConsumer,
    AsyncPullConsumer,
    GroupConsumer,
    MessageQueue,
    PullConsumer,
    PullStatus,
)
from client._consume_core import NO_NEW_MIN_DELAY_S, GroupConsumerConfig, next_pull_delay_s
from client._rebalance import ProcessQueue
from client._requests import PullResult

A0, A1 = "a0:1", "a1:1"
MQ = MessageQueue("T", "broker-a", 0)


def pulled_from(fake) -> list[str]:
    return [f"{r.url.host}:{r.url.port}" for r in fake.requests if r.url.path == "/pull"]


def _check_refused(r: PullResult) -> None:
    """A pull nobody served: a value, the offset unchanged, the master suggested."""
    assert (r.pull_status, r.next_begin_offset, r.msg_found_list) == (PullStatus.NO_MATCHED_MSG, 0, [])
    assert (r.served_by_broker_id, r.suggest_which_broker_id) == (1, 0)


def test_refusing_slave_sends_the_next_pull_to_the_master(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    with PullConsumer("cg", fake.namesrv) as c:
        fake.script[A0] = ["timeout"]
        fake.script[A1] = ["refuse"]
        _check_refused(c.pull(MQ, 0))  # master timed out (marked down), the slave refused
        assert pulled_from(fake) == [A0, A1]
        # Before the fix the next pulls went to the slave (the master was down) and got the same refusal at once.
        r = c.pull(MQ, 0)
        assert (r.pull_status, r.served_by_broker_id) == (PullStatus.NO_NEW_MSG, 0)
        assert not c.client.broker_down.is_down("broker-a", 0, c.client.clock_ms())  # it answered: up again
        c.pull(MQ, 0)
        assert pulled_from(fake) == [A0, A1, A0, A0]


def test_refusal_sends_the_pull_on_to_the_master_at_once(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    with PullConsumer("cg", fake.namesrv) as c:
        c.client.broker_down.mark_down("broker-a", 0, c.client.clock_ms())
        fake.script[A1] = ["refuse"]
        r = c.pull(MQ, 0)
        assert (r.pull_status, r.served_by_broker_id) == (PullStatus.NO_NEW_MSG, 0)
        assert pulled_from(fake) == [A1, A0]
        # the master unreachable as well: the refusal is the answer (not an error), and it costs two requests
        c.client.broker_down.mark_down("broker-a", 0, c.client.clock_ms())
        fake.script[A0] = ["connect"]
        fake.script[A1] = ["refuse"]
        _check_refused(c.pull(MQ, 0))
        assert pulled_from(fake)[2:] == [A0, A1]  # the slave refused lately: the master first


def test_async_consumer_routes_refusals_as_the_sync_one(fake, async_fake_instance) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})

    async def main() -> None:
        inst = async_fake_instance(fake)
        async with AsyncPullConsumer("cg", fake.namesrv) as c:
            fake.script[A0] = ["timeout"]
            fake.script[A1] = ["refuse"]
            _check_refused(await c.pull(MQ, 0))
            r = await c.pull(MQ, 0)
            assert (r.pull_status, r.served_by_broker_id) == (PullStatus.NO_NEW_MSG, 0)
            await c.pull(MQ, 0)
            assert pulled_from(fake) == [A0, A1, A0, A0]
        await inst.release()

    asyncio.run(main())


def test_pinned_consumer_gets_the_refusal(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    with PullConsumer("cg", fake.namesrv, connect_broker_by_user=True, default_broker_id=1) as c:
        fake.script[A1] = ["refuse"]
        _check_refused(c.pull(MQ, 0))
        assert pulled_from(fake) == [A1]


# --- the engines' pacing -----------------------------------------------------------------------------------------

CFG = GroupConsumerConfig("cg", pull_delay_on_error_s=2.5, pull_suspend_s=5.0)


def result(status: PullStatus, next_begin: int, suggest: int = 0, served_by: int = 0) -> PullResult:
    return PullResult(status, next_begin, 0, 50, [], suggest, served_by)


@pytest.mark.parametrize(
    ("r", "held_s", "config", "delay"),
    [
        (result(PullStatus.FOUND, 9), 0.0, CFG, 0.0),
        (result(PullStatus.OFFSET_ILLEGAL, 3), 0.0, CFG, 0.0),
        (result(PullStatus.NO_MATCHED_MSG, 7, 0, 1), 0.0, CFG, 2.5),  # refused: as a failed pull
        (result(PullStatus.NO_MATCHED_MSG, 7, 0, 1), 0.0, GroupConsumerConfig("cg", pull_delay_on_error_s=0),
         NO_NEW_MIN_DELAY_S),                                          # ... and never at once
        (result(PullStatus.NO_MATCHED_MSG, 9, 0, 1), 0.0, CFG, 0.0),  # tag-filtered messages skipped
        (result(PullStatus.NO_NEW_MSG, 7), 0.1, CFG, NO_NEW_MIN_DELAY_S),  # not held by the broker
        (result(PullStatus.NO_NEW_MSG, 7), 4.0, CFG, 0.0),            # held (long polling)
    ],
)
def test_next_pull_delay(r, held_s, config, delay) -> None:
    assert next_pull_delay_s(r, 7, held_s, config) == delay


def test_sync_engine_waits_after_a_refused_pull(fake) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})
    fake.instance()
    with GroupConsumer("g_refuse", fake.namesrv, rebalance_interval_s=3600, pull_delay_on_error_s=2.5) as c:
        fake.script[A0] = ["connect"]
        fake.script[A1] = ["refuse"]
        assert c._engine._pull_once(ProcessQueue(MQ, 0)) == 2.5  # before the fix: 0.0, pulled again at once
        assert pulled_from(fake) == [A0, A1]


def test_async_engine_waits_after_a_refused_pull(fake, async_fake_instance) -> None:
    fake.add_topic("T", {"broker-a": {0: A0, 1: A1}})

    async def main() -> None:
        inst = async_fake_instance(fake)
        async with AsyncGroupConsumer("g_refuse", fake.namesrv, rebalance_interval_s=3600,
                                      pull_delay_on_error_s=2.5) as c:
            fake.script[A0] = ["connect"]
            fake.script[A1] = ["refuse"]
            assert await c._engine._pull_once(ProcessQueue(MQ, 0)) == 2.5
            assert pulled_from(fake) == [A0, A1]
        await inst.release()

    asyncio.run(main())

