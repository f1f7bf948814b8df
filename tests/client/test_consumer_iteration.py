"""Issue 40, point 7 (consumer half): ``for`` / ``async for`` over a group consumer's messages, and the rebalance
listener (``on_queues_revoked`` / ``on_queues_assigned``) -- against a real cluster, two members where a
rebalance is involved.

Rebalances here happen when the test asks (``rebalance_now``; the period is two minutes), so the order of the
listener's calls is the test's to check, not a race's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from client import (
    AsyncGroupConsumer,
    GroupConsumer,
    MessageExt,
    MessageQueue,
    PullConsumer,
    RebalanceListener,
)
from client.cluster import LocalCluster
from tests.client.test_group_consumer import make_topic, produce
from tests.waiting import poll_until, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

NEVER_S = 120.0
FAST = {"consume_from_where": "FIRST_OFFSET", "rebalance_interval_s": NEVER_S, "pull_suspend_s": 1.0,
        "heartbeat_interval_s": 1.0}


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(broker_groups=1, slaves_per_group=0, broker_config={})


def committed(cluster: LocalCluster, group: str, queues: set[MessageQueue]) -> dict[MessageQueue, int]:
    """The group's committed offsets on the broker (-1: none)."""
    with PullConsumer(group, cluster.namesrv_addr) as pc:
        return {mq: pc.fetch_consume_offset(mq) for mq in queues}


def max_offsets(cluster: LocalCluster, queues: set[MessageQueue]) -> dict[MessageQueue, int]:
    with PullConsumer("g_probe", cluster.namesrv_addr) as pc:
        return {mq: pc.max_offset(mq) for mq in queues}


def test_a_bad_listener_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="on_queues_revoked"):
        GroupConsumer("g_bad", "127.0.0.1:1", rebalance_listener=object())


# --- iteration -------------------------------------------------------------------------------------------


def test_for_over_a_group_consumer_commits_only_finished_messages_and_ends_on_close(cluster: LocalCluster) -> None:
    make_topic(cluster, "ItSync", queues=2)
    sent = produce(cluster, "ItSync", 10)
    queues = {MessageQueue("ItSync", "broker-a", q) for q in range(2)}
    got: list[str] = []
    # An exception out of the loop (and the with block) leaves the message it was processing uncommitted.
    with pytest.raises(RuntimeError, match="handler failed"), \
            GroupConsumer("g_it_sync", cluster.namesrv_addr, auto_commit=False, **FAST) as c:
        c.subscribe("ItSync")
        for msg in c:
            got.append(msg.body.decode())
            if len(got) == 4:
                c.commit()  # in the loop body: every message returned so far, this one included
                assert sum(max(0, o) for o in committed(cluster, "g_it_sync", queues).values()) == 4
            if len(got) == 6:
                raise RuntimeError("handler failed")
    offsets = committed(cluster, "g_it_sync", queues)
    assert sum(max(0, o) for o in offsets.values()) == 5, offsets  # the sixth is not committed
    # A new member of the group starts after the five: the sixth comes again, then the rest.
    again: list[str] = []
    c = GroupConsumer("g_it_sync", cluster.namesrv_addr, **FAST).start()
    c.subscribe("ItSync")
    ended = threading.Event()

    def consume() -> None:
        for msg in c:
            again.append(msg.body.decode())
        ended.set()

    t = threading.Thread(target=consume)
    t.start()
    try:
        poll_until(lambda: len(again) >= 5, 20, f"the five not committed (got {again})")
        assert got[5] in again and set(got[:5]) | set(again) == sent and len(again) == 5, (got, again)
    finally:
        c.close()  # from another thread: the loop ends
    assert ended.wait(10), "the for loop did not end when the consumer closed"
    t.join(5)
    assert sum(committed(cluster, "g_it_sync", queues).values()) == 10


def test_async_for_commits_as_configured_survives_cancellation_and_ends_on_close(cluster: LocalCluster) -> None:
    make_topic(cluster, "ItAsync", queues=2)
    queues = {MessageQueue("ItAsync", "broker-a", q) for q in range(2)}

    async def scenario() -> None:
        c = AsyncGroupConsumer("g_it_async", cluster.namesrv_addr, auto_commit_interval_s=0.2, **FAST)
        await c.start()
        c.subscribe("ItAsync")
        got: list[str] = []
        first = asyncio.Event()

        async def consume(stop_after: int | None = None) -> None:
            async for msg in c:
                got.append(msg.body.decode())
                first.set()
                if stop_after is not None and len(got) >= stop_after:
                    break

        # Cancelled while waiting for messages that have not been sent: it takes nothing with it.
        waiting = asyncio.create_task(consume())
        await wait_until(lambda: c.assignment() == queues, 20, "both queues held")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        sent = await asyncio.to_thread(produce, cluster, "ItAsync", 12)
        # A loop that breaks after three leaves the rest in the consumer; the next loop gets them all.
        await asyncio.wait_for(consume(stop_after=3), 20)
        assert len(got) == 3
        reader = asyncio.create_task(consume())
        await wait_until(lambda: set(got) == sent, 20, f"all twelve messages (got {got})")
        assert len(got) == 12, got
        # Automatic commits (every 0.2 s) go out while the loop waits for a thirteenth: asking for it
        # acknowledged the twelfth.
        await wait_until(lambda: sum(committed(cluster, "g_it_async", queues).values()) == 12, 10,
                         "the twelve finished messages committed by the waiting loop")
        assert not reader.done()
        await c.close()  # the waiting loop ends
        await asyncio.wait_for(reader, 10)
        assert sum(committed(cluster, "g_it_async", queues).values()) == 12
        assert [m async for m in c] == []  # a closed consumer yields nothing

    asyncio.run(scenario())


# --- the rebalance listener -------------------------------------------------------------------------------


class Recorder(RebalanceListener):
    """Records each call with the group's committed offsets of those queues at that moment."""

    def __init__(self, cluster: LocalCluster, group: str, name: str) -> None:
        self.cluster, self.group, self.name = cluster, group, name
        self.calls: list[tuple[str, set[MessageQueue], dict[MessageQueue, int]]] = []
        self.fail_assigned = False

    def on_queues_revoked(self, queues: set[MessageQueue]) -> None:
        self.calls.append(("revoked", queues, committed(self.cluster, self.group, queues)))

    def on_queues_assigned(self, queues: set[MessageQueue]) -> None:
        self.calls.append(("assigned", queues, {}))
        if self.fail_assigned:
            raise RuntimeError(f"{self.name}'s listener is broken")


def drain(c: GroupConsumer, want: int, got: list[MessageExt]) -> None:
    def more() -> bool:
        got.extend(c.poll(0.1))
        return len(got) >= want
    poll_until(more, 20, f"{want} messages (got {len(got)})", interval_s=0)


def test_listener_calls_come_in_order_around_the_commits_with_two_members(cluster: LocalCluster,
                                                                          caplog: Any) -> None:
    make_topic(cluster, "RbOrder", queues=4)
    sent = produce(cluster, "RbOrder", 40)
    all_queues = {MessageQueue("RbOrder", "broker-a", q) for q in range(4)}
    ends = max_offsets(cluster, all_queues)
    group = "g_rb_order"
    a_rec, b_rec = Recorder(cluster, group, "a"), Recorder(cluster, group, "b")
    b_rec.fail_assigned = True
    # No periodic commit: the only commits are the hand-over's and close's, which the listener must follow.
    settings: dict[str, Any] = dict(FAST, auto_commit_interval_s=NEVER_S)
    a = GroupConsumer(group, cluster.namesrv_addr, instance_name="rb-a", rebalance_listener=a_rec, **settings)
    b = GroupConsumer(group, cluster.namesrv_addr, instance_name="rb-b", rebalance_listener=b_rec, **settings)
    a.subscribe("RbOrder")
    a.start()
    try:
        got: list[MessageExt] = []
        drain(a, 40, got)
        assert {m.body.decode() for m in got} == sent
        a.poll(0)  # acknowledges the last batch: every message consumed, nothing committed yet
        assert a_rec.calls == [("assigned", all_queues, {})]

        b.subscribe("RbOrder")
        b.start()
        poll_until(lambda: b.assignment(), 20, "b holding its share")
        a.rebalance_now()
        kept = a.assignment()
        revoked = all_queues - kept
        assert len(kept) == 2 and b.assignment() == revoked
        assert len(a_rec.calls) == 2, a_rec.calls
        kind, queues, at_call = a_rec.calls[1]
        # Revoked after the hand-over commit: the broker has the consumed offsets when the listener runs.
        assert (kind, queues) == ("revoked", revoked) and at_call == {mq: ends[mq] for mq in revoked}, at_call

        # b's listener raised in on_queues_assigned: logged, and b consumes on.
        assert [c[0] for c in b_rec.calls] == ["assigned"]
        assert "rebalance listener on_queues_assigned" in caplog.text and "b's listener is broken" in caplog.text
        first_ends = ends
        produce(cluster, "RbOrder", 8, start=40)
        ends = max_offsets(cluster, all_queues)
        # b started its share from offset 0 (nothing was committed when it took them): it reads them to the end.
        seen_b: set[tuple[int, int]] = set()

        def b_read_all() -> bool:
            seen_b.update((m.queue_id, m.queue_offset) for m in b.poll(0.1))
            return all((mq.queue_id, ends[mq] - 1) in seen_b for mq in revoked)
        poll_until(b_read_all, 20, "b reading its queues to the end", interval_s=0)
        assert {q for q, _ in seen_b} == {mq.queue_id for mq in revoked}
        b.poll(0)  # acknowledges b's last batch

        # b leaves: close commits, then tells b's listener; a takes the queues back at its next round.
        b.close()
        assert [c[0] for c in b_rec.calls] == ["assigned", "revoked"]
        assert b_rec.calls[1][1] == revoked
        assert b_rec.calls[1][2] == {mq: ends[mq] for mq in revoked}, b_rec.calls[1][2]
        a.rebalance_now()
        assert a.assignment() == all_queues
        assert [(c[0], c[1]) for c in a_rec.calls[2:]] == [("assigned", revoked)]
    finally:
        b.close()
        a.close()
    # a's close: every held queue, after the final commit (a polled nothing since: its kept queues stand where
    # it acknowledged them, the queues it took back where b committed them).
    kind, queues, at_call = a_rec.calls[-1]
    assert (kind, queues) == ("revoked", all_queues) and len(a_rec.calls) == 4
    assert at_call == {mq: (ends if mq in revoked else first_ends)[mq] for mq in all_queues}, at_call


def test_async_listener_coroutines_are_awaited_in_order(cluster: LocalCluster) -> None:
    """The async consumer awaits a listener whose methods are coroutines; the other member is a sync consumer."""
    make_topic(cluster, "RbAsync", queues=4)
    produce(cluster, "RbAsync", 20)
    all_queues = {MessageQueue("RbAsync", "broker-a", q) for q in range(4)}
    ends = max_offsets(cluster, all_queues)
    group = "g_rb_async"
    calls: list[tuple[str, set[MessageQueue], dict[MessageQueue, int]]] = []

    class AsyncRecorder(RebalanceListener):
        async def on_queues_revoked(self, queues: set[MessageQueue]) -> None:
            await asyncio.sleep(0)  # a coroutine that yields to the loop before it records
            calls.append(("revoked", queues, await asyncio.to_thread(committed, cluster, group, queues)))

        async def on_queues_assigned(self, queues: set[MessageQueue]) -> None:
            await asyncio.sleep(0)
            calls.append(("assigned", queues, {}))

    async def scenario() -> None:
        settings: dict[str, Any] = dict(FAST, auto_commit_interval_s=NEVER_S)
        async with AsyncGroupConsumer(group, cluster.namesrv_addr, rebalance_listener=AsyncRecorder(),
                                      **settings) as a:
            a.subscribe("RbAsync")
            n = 0
            async for _ in a:
                n += 1
                if n == 20:
                    break
            await a.poll(0)  # acknowledge the twentieth
            await wait_until(lambda: calls, 10, "the first assignment told")
            assert calls == [("assigned", all_queues, {})]
            b = GroupConsumer(group, cluster.namesrv_addr, instance_name="rb-async-b", **settings)
            b.subscribe("RbAsync")
            await asyncio.to_thread(b.start)
            try:
                await wait_until(lambda: b.assignment(), 20, "b holding its share")
                await a.rebalance_now()
                revoked = all_queues - a.assignment()
                assert len(revoked) == 2
                assert [(c[0], c[1]) for c in calls] == [("assigned", all_queues), ("revoked", revoked)]
                assert calls[1][2] == {mq: ends[mq] for mq in revoked}
            finally:
                await asyncio.to_thread(b.close)
        assert calls[-1][0] == "revoked" and calls[-1][1] == all_queues - revoked

    asyncio.run(scenario())
