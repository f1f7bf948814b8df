"""The master of a group SIGKILLed under live clients (docs/BEHAVIOUR.md 3.5, 3.6, decision 6).

* a consumer reading the group continues from its slave (``slaveReadEnable=false``: the slave serves because its
  master link is down), without losing or skipping a message; the producer moves to the other group;
* offsets committed while the master is down go to the slave, and the returning master's older offsets
  overwrite them at the next metadata sync: the group re-consumes (duplicates, never loss), as RocketMQ 4.9.3.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import pytest

from client import (
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from client.errors import ClientError
from tests.ha.support import create_topic, get_json, ha_cluster, poll_until, wait_slave_linked

pytestmark = [pytest.mark.integration, pytest.mark.ha]

BODY = b"f" * 1024


class _Sender(threading.Thread):
    """Sends one message at a time to the topic (any group) until stopped; records (start time, result)."""

    def __init__(self, p: Producer, topic: str) -> None:
        super().__init__(daemon=True, name="sender")
        self.p, self.topic = p, topic
        self.results: list[tuple[float, SendResult]] = []
        self.errors: list[ClientError] = []
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            t = time.monotonic()
            try:
                self.results.append((t, self.p.send(Message(self.topic, b"live%d-" % i + BODY))))
            except ClientError as e:
                self.errors.append(e)
            i += 1


class _Reader(threading.Thread):
    """Reads every queue of one group round robin, 32 per pull, until each reaches ``until[mq]``."""

    def __init__(self, c: PullConsumer, mqs: list[MessageQueue]) -> None:
        super().__init__(daemon=True, name="reader")
        self.c, self.mqs = c, mqs
        self.offsets = dict.fromkeys(mqs, 0)
        self.got: dict[MessageQueue, list[tuple[int, bytes]]] = defaultdict(list)
        self.first_slave_found: float | None = None
        self.errors: list[ClientError] = []
        self.until: dict[MessageQueue, int] | None = None
        self.count = 0

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.until is not None and all(self.offsets[mq] >= n for mq, n in self.until.items()):
                return
            for mq in self.mqs:
                try:
                    r = self.c.pull(mq, self.offsets[mq], max_nums=32)
                except ClientError as e:
                    self.errors.append(e)
                    continue
                if r.pull_status is PullStatus.FOUND:
                    if r.served_by_broker_id == 1 and self.first_slave_found is None:
                        self.first_slave_found = time.monotonic()
                    self.got[mq].extend((m.queue_offset, m.body) for m in r.msg_found_list)
                    self.count += len(r.msg_found_list)
                    self.offsets[mq] = r.next_begin_offset


def test_consumer_fails_over_to_the_slave_and_producer_to_the_other_group(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, broker_groups=2, slaves_per_group=1, mode="sync")
    create_topic(cluster, "Fo", queue_nums=2)
    wait_slave_linked(cluster, "broker-a")
    slave = cluster.broker("broker-a", 1)
    # A slave serves a topic only once the metadata sync brought its config (as RocketMQ's slave).
    poll_until(lambda: "Fo" in get_json(slave.addr, "/topics")["topicConfigTable"], 5, "topic Fo on the slave")
    with Producer("pg", cluster.namesrv_addr) as p, PullConsumer("cg", cluster.namesrv_addr) as c:
        mqs = [mq for mq in c.fetch_subscribe_message_queues("Fo") if mq.broker_name == "broker-a"]
        sent_a: set[bytes] = set()
        for mq in mqs:
            for start in range(0, 1500, 100):
                msgs = [Message("Fo", b"%d-%d-" % (mq.queue_id, start + j) + BODY) for j in range(100)]
                assert all(r.send_status is SendStatus.SEND_OK for r in p.send_batch(msgs, queue=mq))
                sent_a.update(m.body for m in msgs)
        sender, reader = _Sender(p, "Fo"), _Reader(c, mqs)
        sender.start()
        reader.start()
        poll_until(lambda: reader.count >= 600, 30, "the reader to read 600 messages from the master")
        killed = time.monotonic()
        cluster.kill_master("broker-a")
        dead_at = time.monotonic()  # kill_master returns once the process is gone; a send started before may land
        poll_until(lambda: reader.first_slave_found, 10, "a message served by the slave")
        assert reader.first_slave_found is not None
        failover_s = reader.first_slave_found - killed
        reader.until = {mq: get_json(slave.addr, "/offset/max", topic="Fo", queueId=mq.queue_id)["offset"]
                        for mq in mqs}
        reader.join(60)
        assert not reader.is_alive(), (reader.offsets, reader.until)
        poll_until(lambda: any(t > killed + 0.5 for t, _ in sender.results), 10, "sends after the kill")
        sender.halt.set()
        sender.join(10)
    print(f"\nconsumer failover: first message from the slave {failover_s * 1000:.0f} ms after the master's SIGKILL; "
          f"{reader.count} messages read; pull errors {len(reader.errors)}")
    assert failover_s < 3.0
    for mq in mqs:  # no message lost or skipped, none twice
        assert [o for o, _ in reader.got[mq]] == list(range(reader.until[mq])), mq
    read = {b for mq in mqs for _, b in reader.got[mq]}
    live_ok_a = {r for _, r in sender.results if r.message_queue.broker_name == "broker-a"}
    assert sent_a <= read and len(read) >= len(sent_a) + len(live_ok_a)
    after = [r for t, r in sender.results if t > dead_at]
    assert after and {r.message_queue.broker_name for r in after} == {"broker-b"}
    assert all(r.send_status is SendStatus.SEND_OK for r in after)


def test_offsets_committed_to_the_slave_are_overwritten_when_the_master_returns(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Off", queue_nums=1)
    with Producer("pg", cluster.namesrv_addr) as p:
        p.send_batch([Message("Off", b"%d" % i) for i in range(50)])
    wait_slave_linked(cluster)

    def slave_offset() -> int | None:
        return get_json(slave.addr, "/offsets")["offsetTable"].get("Off@cg", {}).get("0")

    with PullConsumer("cg", cluster.namesrv_addr) as c:
        mq = c.fetch_subscribe_message_queues("Off")[0]
        c.update_consume_offset(mq, 10)  # to the master
        poll_until(lambda: slave_offset() == 10, 5, "offset 10 synced to the slave")
        stored = master.store_dir / "config" / "consumerOffset.json"
        poll_until(lambda: json.loads(stored.read_text())["offsetTable"]["Off@cg"]["0"] == 10, 5,
                   "offset 10 persisted by the master")
        master.kill()
        c.update_consume_offset(mq, 30)  # the master is unreachable: the SDK commits to the slave
        assert slave_offset() == 30
        assert c.fetch_consume_offset(mq) == 30  # and reads it back from there
        master.start()
        t0 = time.monotonic()
        # The master's older offset replaces the slave's at the next sync (4.9.3 putAll, no reverse sync).
        poll_until(lambda: slave_offset() == 10, 10, "the master's offset 10 back on the slave")
        overwritten_after = time.monotonic() - t0
        committed = c.fetch_consume_offset(mq)
        assert committed == 10
        # The group re-reads 10..29: duplicates, nothing lost. (A first answer may be the slave's "read from the
        # master" redirect while the client still avoids the master it saw down.)
        def reread() -> PullResult | None:
            r = c.pull(mq, committed)
            return r if r.pull_status is PullStatus.FOUND else None

        r = poll_until(reread, 10, "re-read from the committed offset")
        assert [m.body for m in r.msg_found_list][:20] == [b"%d" % i for i in range(10, 30)]
    print(f"\nslave offset 30 overwritten by the returning master's 10 after {overwritten_after:.2f} s")
