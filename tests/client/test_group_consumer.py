"""GroupConsumer (lite pull in a group): argument errors, and against real servers -- three instances share
an 8-queue topic disjointly, and a killed instance's queues move to the others with nothing lost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client import Admin, Message, Producer
from client._async_group_consumer import AsyncGroupConsumer
from client._group_consumer import GroupConsumer
from client.cluster import LocalCluster
from client.errors import ClientClosedError, ClientError, InvalidParameterError
from common.message import MessageQueue
from tests.waiting import poll_until, wait_until

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 1.0
#: A killed client leaves its group after its announced heartbeat timeout: two heartbeat periods.
EXPIRE_MS = int(2 * INTERVAL_S * 1000)


def test_poll_before_start_and_bad_timeout() -> None:
    c = GroupConsumer("g_unit", "127.0.0.1:1")
    with pytest.raises(ClientClosedError, match="start it first"):
        c.poll(0)
    with pytest.raises(InvalidParameterError, match="timeout_s"):
        c.poll(-1)
    with pytest.raises(ValueError, match="exclusive"):
        c.subscribe("T")
        c.assign([MessageQueue("T", "a", 0)])


def test_one_consumer_per_group_per_instance() -> None:
    a = GroupConsumer("g_dup", "127.0.0.1:1", instance_name="dup", rebalance_interval_s=60)
    a.start()
    try:
        b = GroupConsumer("g_dup", "127.0.0.1:1", instance_name="dup")
        with pytest.raises(ClientError, match="already has a consumer"):
            b.start()
        with pytest.raises(ClientError, match="already started"):
            a.start()
    finally:
        a.close()
    a.close()  # idempotent
    with pytest.raises(ClientClosedError):
        a.start()


def test_rebalance_hands_over_with_committed_offsets(fake: Any) -> None:
    """Against a scripted broker: queues that leave are committed at their consumed offset first; queues that
    arrive start from the committed offset (none here: LAST_OFFSET -> the queue's max offset, 100)."""
    fake.add_topic("GcFake", {"a": {0: "a0:1"}}, queues=4)
    ids: list[str] = []
    inner = fake.handler

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/consumer/ids":
            return httpx.Response(200, json={"clientIds": list(ids)})
        return inner(request)

    fake.handler = handler
    fake.instance()
    c = GroupConsumer("g_fake", fake.namesrv, rebalance_interval_s=3600, pull_suspend_s=0)
    c.subscribe("GcFake")
    c.start()
    try:
        me = c.client.client_id
        q = [MessageQueue("GcFake", "a", i) for i in range(4)]
        ids[:] = [me, "~later"]
        c.rebalance_now()
        assert c.assignment() == {q[0], q[1]}
        ids[:] = [me]
        c.rebalance_now()
        assert c.assignment() == set(q)
        ids[:] = ["0-earlier", me]
        c.rebalance_now()
        assert c.assignment() == {q[2], q[3]}
        commits = [json.loads(r.content) for r in fake.requests
                   if r.url.path == "/offset/consumer" and r.method == "POST"]
        handed = {(o["queueId"], o["offset"]) for body in commits for o in body["offsets"]}
        assert {(0, 100), (1, 100)} <= handed, commits
    finally:
        c.close()


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(broker_groups=1, slaves_per_group=0, broker_config={})


def make_topic(cluster: LocalCluster, topic: str, queues: int = 8) -> None:
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=queues)


def produce(cluster: LocalCluster, topic: str, n: int, start: int = 0) -> set[str]:
    with Producer("p_" + topic, cluster.namesrv_addr) as p:
        for i in range(start, start + n):
            p.send(Message(topic, f"m{i}".encode()))
    return {f"m{i}" for i in range(start, start + n)}


@pytest.mark.integration
def test_three_instances_hold_disjoint_queues_covering_all(cluster: LocalCluster) -> None:
    make_topic(cluster, "GcShare")
    sent = produce(cluster, "GcShare", 80)
    consumers = [GroupConsumer("g_share", cluster.namesrv_addr, instance_name=f"share{i}",
                               consume_from_where="FIRST_OFFSET", rebalance_interval_s=INTERVAL_S,
                               heartbeat_interval_s=INTERVAL_S, pull_suspend_s=INTERVAL_S) for i in range(3)]
    got: Counter[str] = Counter()
    try:
        for c in consumers:
            c.subscribe("GcShare")
            c.start()
        deadline = time.monotonic() + 20
        while True:
            for c in consumers:
                got.update(m.body.decode() for m in c.poll(0.05))
            shares = [c.assignment() for c in consumers]
            flat = [q for s in shares for q in s]
            if set(got) >= sent and len(flat) == 8 and len(set(flat)) == 8 and all(shares):
                break
            assert time.monotonic() < deadline, f"shares {shares}, consumed {len(got)} of {len(sent)}"
        assert sorted(len(s) for s in shares) == [2, 3, 3]
        for c in consumers:
            c.commit()
        committed = sum(consumers[0].committed(MessageQueue("GcShare", "broker-a", q)) for q in range(8))
        assert committed == len(sent)
    finally:
        for c in consumers:
            c.close()


class Member:
    """One group-consumer subprocess and what it printed."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.client.group_member", cluster.namesrv_addr,
                                      group, topic, str(INTERVAL_S)], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                                     cwd=ROOT, env=env, text=True)
        self.msgs: list[str] = []
        self.held: set[int] = set()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            with self.lock:
                if kind == "MSG":
                    self.msgs.append(rest)
                elif kind == "ASSIGN":
                    self.held = {int(q) for q in rest.split(",") if q}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.reader.join(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float, info: Callable[[], str]) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} not within {timeout_s} s: {info()}")
        time.sleep(0.05)  # polling subprocess output with a deadline
    return time.monotonic() - start


@pytest.fixture
def members() -> Iterator[list[Member]]:
    made: list[Member] = []
    yield made
    for m in made:
        m.cleanup()


@pytest.mark.integration
@pytest.mark.slow
def test_killed_instance_hands_its_queues_over_nothing_lost(cluster: LocalCluster, members: list[Member]) -> None:
    make_topic(cluster, "GcKill")
    sent = produce(cluster, "GcKill", 120)
    members.extend(Member(cluster, "g_kill", "GcKill") for _ in range(3))

    def info() -> str:
        return f"held {[sorted(m.held) for m in members]}; consumed {len(set(consumed()))} of {len(sent)}"

    def consumed() -> list[str]:
        return [x for m in members for x in m.msgs]

    def cover(ms: list[Member]) -> bool:
        flat = [q for m in ms for q in m.held]
        return sorted(flat) == list(range(8)) and all(m.held for m in ms)

    wait_for("three-way split", lambda: cover(members), 30, info)
    victim, survivors = members[0], members[1:]
    lost_queues = set(victim.held)
    victim.kill()
    more = produce(cluster, "GcKill", 120, start=120)
    bound = EXPIRE_MS / 1000 + 2 * INTERVAL_S + 3.0  # expiry + heartbeat + rebalance period + margin
    took = wait_for("hand-over of the killed instance's queues", lambda: cover(survivors), bound, info)
    assert lost_queues <= survivors[0].held | survivors[1].held
    wait_for("every message consumed", lambda: set(consumed()) >= sent | more, 20, info)
    counts = Counter(consumed())
    duplicates = sum(n - 1 for n in counts.values())
    print(f"hand-over took {took:.2f} s; {duplicates} duplicates of {len(sent | more)} messages")
    assert duplicates <= len(sent | more)  # re-delivery of what was in flight, never more than once each


@pytest.mark.integration
def test_async_consumer_polls_commits_seeks_and_pauses(cluster: LocalCluster) -> None:
    make_topic(cluster, "GcAsync", queues=2)
    sent = produce(cluster, "GcAsync", 20)

    async def scenario() -> None:
        async with AsyncGroupConsumer("g_async", cluster.namesrv_addr, consume_from_where="FIRST_OFFSET",
                                      rebalance_interval_s=INTERVAL_S, heartbeat_interval_s=INTERVAL_S,
                                      pull_suspend_s=INTERVAL_S) as c:
            c.subscribe("GcAsync")
            got: list[str] = []
            deadline = time.monotonic() + 20
            while set(got) < sent:
                got += [m.body.decode() for m in await c.poll(0.2)]
                assert time.monotonic() < deadline, f"consumed {len(got)} of {len(sent)}"
            await c.commit()
            q0 = MessageQueue("GcAsync", "broker-a", 0)
            assert await c.pull_consumer.fetch_consume_offset(q0) == await c.pull_consumer.max_offset(q0)
            c.pause([MessageQueue("GcAsync", "broker-a", 1)])
            await c.seek_to_begin(q0)
            again = await c.poll(5)
            assert again and all(m.queue_id == 0 for m in again)
            with pytest.raises(InvalidParameterError, match="not assigned"):
                await c.seek(MessageQueue("GcAsync", "broker-a", 9), 0)

    asyncio.run(scenario())


def test_closing_a_group_or_push_consumer_leaves_other_clients_working(cluster: LocalCluster) -> None:
    """Clients of one process share a client instance; closing a GroupConsumer (or a PushConsumer, built on it)
    released that instance twice and closed it under a PullConsumer created before it (found by docs/GUIDE.md:
    the next pull failed with "transport is closed")."""
    from client import ConsumeStatus, PullConsumer, PushConsumer
    from common.codes import PullStatus

    make_topic(cluster, "SharedInstance", queues=2)
    ns = cluster.namesrv_addr
    with PullConsumer("shared-pull", ns) as puller, Producer("shared-prod", ns) as producer:
        mq = puller.fetch_subscribe_message_queues("SharedInstance")[0]
        group = GroupConsumer("shared-group", ns, pull_suspend_s=0.5)
        group.subscribe("SharedInstance")
        group.start()
        group.close()
        push = PushConsumer("shared-push", ns, lambda msgs: ConsumeStatus.CONSUME_SUCCESS, pull_suspend_s=0.5)
        push.subscribe("SharedInstance")
        with push:
            pass
        sent = producer.send(Message("SharedInstance", b"still here"), mq)
        r = puller.pull(mq, offset=sent.queue_offset, max_nums=1)
        assert r.pull_status is PullStatus.FOUND and r.msg_found_list[0].body == b"still here"


#: Long enough that only an out-of-period rebalance can pass the tests below in time (the async consumer also
#: woke for each auto commit: that interval is as long).
NEVER_S = 120.0


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_subscribed_topic_created_late_is_taken_up_soon_not_a_period_later(cluster: LocalCluster,
                                                                             kind: str) -> None:
    """A round that cannot allocate a subscribed topic looks again about a second later (the gap doubling up to
    the period), not a whole ``rebalance_interval_s`` later: when the brokers do not list this client yet (its
    first heartbeat went out before it knew any route), and when the topic has no route yet. The async
    consumer's copy of the rebalance lacked both (the sync one's ``_rebalance_soon``): it held nothing for a
    whole period, and a topic created after it subscribed waited for the next period.

    ``GcLateA`` sorts before ``GcLateB``: once the consumer holds B's queues, a round has already missed A, and
    no other round is due for ``NEVER_S``."""
    make_topic(cluster, "GcLateB", queues=2)
    settings: dict[str, Any] = {"rebalance_interval_s": NEVER_S, "auto_commit_interval_s": NEVER_S,
                                "consume_from_where": "FIRST_OFFSET"}

    def topics_held(held: set[MessageQueue]) -> Counter[str]:
        return Counter(mq.topic for mq in held)

    if kind == "sync":
        with GroupConsumer("g_late_sync", cluster.namesrv_addr, **settings) as c:
            c.subscribe("GcLateA")
            c.subscribe("GcLateB")
            poll_until(lambda: topics_held(c.assignment())["GcLateB"] == 2, 15, "B's queues held")
            make_topic(cluster, "GcLateA", queues=2)
            poll_until(lambda: topics_held(c.assignment())["GcLateA"] == 2, 15, "A's queues held soon after")
        return

    async def scenario() -> None:
        async with AsyncGroupConsumer("g_late_async", cluster.namesrv_addr, **settings) as a:
            a.subscribe("GcLateA")
            a.subscribe("GcLateB")
            await wait_until(lambda: topics_held(a.assignment())["GcLateB"] == 2, 15, "B's queues held")
            await asyncio.to_thread(make_topic, cluster, "GcLateA", 2)
            await wait_until(lambda: topics_held(a.assignment())["GcLateA"] == 2, 15, "A's queues held soon after")

    asyncio.run(scenario())
