"""Issue 17 item 3's acceptance: ordered sends by key and orderly consumption with broker queue locks, on a real
LocalCluster (two broker groups on loopback).

10,000 messages over 50 keys (``ORDERLY_MESSAGES`` scales the count; the keys and the three instances stay), sent
with ``sharding_key`` by 5 threads while three instances of one orderly push-consumer group join and leave: A
starts, B joins at 20 % consumed, C at 40 %, A leaves at 60 %, B at 80 %, and C finishes. Checked:

* each key's messages are consumed in send order, each exactly once (graceful hand-overs commit before they
  unlock, so the next owner starts after the last message consumed) -- none lost;
* no queue is consumed by two instances at once: every callback records (instance, queue, start, end), and the
  intervals of one queue never overlap;
* every instance took part (the hand-overs really happened).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from client import Admin, Message, MessageExt, Producer
from client._push_consumer import ConsumeStatus, PushConsumer
from client.cluster import LocalCluster
from common.message import MessageQueue

KEYS = 50
MESSAGES = int(os.environ.get("ORDERLY_MESSAGES", "10000"))
SENDERS = 5
TOPIC = "OrderedAcceptance"
GROUP = "g_ordered_acceptance"
FAST = {"rebalance_interval_s": 0.5, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
        "consume_from_where": "FIRST_OFFSET"}


class Record:
    """What the callbacks saw, from several threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.intervals: dict[MessageQueue, list[tuple[float, float, str]]] = defaultdict(list)
        self.per_instance: dict[str, int] = defaultdict(int)
        self.consumed = 0
        self.changed = threading.Condition(self.lock)

    def listener(self, name: str) -> Callable[[list[MessageExt]], ConsumeStatus]:
        def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
            start = time.monotonic()
            pairs = [m.body.decode().split(":") for m in msgs]
            time.sleep(0.0005)  # the work of a callback: gives each interval a width an overlap would show in
            end = time.monotonic()
            mq = MessageQueue(msgs[0].topic, msgs[0].broker_name, msgs[0].queue_id)
            with self.lock:
                for key, seq in pairs:
                    self.by_key[key].append(int(seq))
                self.intervals[mq].append((start, end, name))
                self.per_instance[name] += len(msgs)
                self.consumed += len(msgs)
                self.changed.notify_all()
            return ConsumeStatus.CONSUME_SUCCESS

        return on_messages

    def wait_consumed(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while self.consumed < n:
                left = deadline - time.monotonic()
                assert left > 0, f"{self.consumed} of {n} consumed within {timeout_s} s; per instance " \
                                 f"{dict(self.per_instance)}"
                self.changed.wait(left)


def overlaps(intervals: dict[MessageQueue, list[tuple[float, float, str]]]) -> list[str]:
    out = []
    for mq, spans in intervals.items():
        spans = sorted(spans)
        for (s1, e1, n1), (s2, e2, n2) in itertools.pairwise(spans):
            if s2 < e1:
                out.append(f"{mq}: {n1} [{s1:.6f}, {e1:.6f}] and {n2} [{s2:.6f}, {e2:.6f}]")
    return out


def describe(key: str, seqs: list[int], per_key: int) -> str:
    """Where a key's consumed sequence first departs from 0, 1, ..., per_key - 1."""
    at = next((i for i, (a, b) in enumerate(zip(seqs, range(per_key), strict=False)) if a != b), len(seqs))
    return f"{key}: {len(seqs)} consumed, first break at position {at}: {seqs[max(0, at - 2):at + 3]}"


def send_all(namesrv: str, errors: list[BaseException]) -> None:
    """Sender ``t`` owns keys ``t, t + SENDERS, ...`` and sends each key's messages in sequence."""
    per_key = MESSAGES // KEYS

    def sender(t: int) -> None:
        try:
            with Producer(f"pg_ordered_{t}", namesrv) as p:
                keys = range(t, KEYS, SENDERS)
                for seq in range(per_key):
                    for k in keys:
                        p.send(Message(TOPIC, f"key{k}:{seq}".encode()), sharding_key=f"key{k}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=sender, args=(t,), name=f"sender-{t}") for t in range(SENDERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)


@pytest.mark.integration
@pytest.mark.slow
def test_ordered_keys_with_instances_joining_and_leaving(cluster_factory: Callable[..., LocalCluster]) -> None:
    assert MESSAGES % KEYS == 0
    cluster = cluster_factory(broker_groups=2, slaves_per_group=0,
                              broker_config={"flushConsumerOffsetInterval": "500", "messageIndexEnable": "false"})
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(TOPIC, queue_nums=8)  # 8 queues on each of the two groups: 16 queues, 50 keys
    rec = Record()
    began = time.monotonic()

    def consumer(name: str) -> PushConsumer:
        c = PushConsumer(GROUP, cluster.namesrv_addr, rec.listener(name), orderly=True, consume_thread_nums=8,
                         consume_message_batch_max_size=4, instance_name=name, **FAST)  # type: ignore[arg-type]
        c.subscribe(TOPIC)
        return c.start()

    errors: list[BaseException] = []
    producer = threading.Thread(target=send_all, args=(cluster.namesrv_addr, errors), name="producers")
    consumers = {"A": consumer("A")}
    try:
        producer.start()
        rec.wait_consumed(MESSAGES * 20 // 100, 45)
        consumers["B"] = consumer("B")
        rec.wait_consumed(MESSAGES * 40 // 100, 45)
        consumers["C"] = consumer("C")
        rec.wait_consumed(MESSAGES * 60 // 100, 45)
        consumers.pop("A").close()
        rec.wait_consumed(MESSAGES * 80 // 100, 45)
        consumers.pop("B").close()
        producer.join(60)
        assert not errors, f"sends failed: {errors[:3]}"
        rec.wait_consumed(MESSAGES, 45)
    finally:
        for c in consumers.values():
            c.close()
    elapsed = time.monotonic() - began

    per_key = MESSAGES // KEYS
    wrong = [describe(k, seqs, per_key) for k, seqs in sorted(rec.by_key.items()) if seqs != list(range(per_key))]
    bad = overlaps(rec.intervals)
    assert len(rec.by_key) == KEYS, f"{len(rec.by_key)} keys consumed"
    assert not wrong and not bad, (f"{len(wrong)} keys not consumed exactly once in send order, e.g. {wrong[:3]}; "
                                   f"{len(bad)} overlapping callbacks on one queue, e.g. {bad[:3]}")
    assert set(rec.per_instance) == {"A", "B", "C"}, dict(rec.per_instance)
    print(f"ordered acceptance: {MESSAGES} messages, {KEYS} keys, per instance {dict(rec.per_instance)}, "
          f"{elapsed:.1f} s")
