"""Ordered messages: every message of a key on one queue, consumed in order by an orderly push-consumer group.

    python examples/ordered.py --messages 200

``send(msg, sharding_key="order-42")`` puts every message of the key on one queue (crc32 of the key modulo the
topic's writable queues), so the key's messages are stored in the order they were sent. ``PushConsumer(...,
orderly=True)`` consumes each queue with one callback at a time, in offset order, and locks its queues on their
master, so two instances of the group never consume one queue at once -- not even while a second instance joins
and the queues are divided again, as happens here half way through.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import _common

from client import Admin, ConsumeStatus, Message, MessageExt, Producer, PushConsumer

TOPIC = "OrderedExampleTopic"
GROUP = "ordered-example"
KEYS = [f"order-{i}" for i in range(10)]


def main() -> int:
    args = _common.parser(__doc__, messages=200).parse_args()
    n = args.messages - args.messages % len(KEYS)
    lock = threading.Lock()
    seen: dict[str, list[int]] = defaultdict(list)  # key -> the steps consumed, in consumption order
    by_instance: dict[str, int] = defaultdict(int)
    done = threading.Event()
    half = threading.Event()

    def listener(instance: str) -> Callable[[list[MessageExt]], ConsumeStatus]:
        def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
            with lock:
                for m in msgs:
                    key, step = m.body.decode().split(" step ")
                    seen[key].append(int(step))
                by_instance[instance] += len(msgs)
                total = sum(by_instance.values())
            if total >= n // 2:
                half.set()
            if total >= n:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS
        return on_messages

    def consumer(instance: str) -> PushConsumer:
        c = PushConsumer(GROUP, namesrv, listener(instance), orderly=True, instance_name=instance,
                         consume_from_where="FIRST_OFFSET", rebalance_interval_s=1.0, pull_suspend_s=1.0)
        c.subscribe(TOPIC)
        return c.start()

    with _common.cluster(args.namesrv, slaves_per_group=0) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=4)
        first = consumer("first")
        second = None
        try:
            with Producer("ordered-example-producer", namesrv) as producer:
                steps = n // len(KEYS)
                for step in range(steps):
                    if step == steps // 2:
                        half.wait(30)
                        second = consumer("second")
                        deadline = time.monotonic() + 15
                        while not second.assignment() and time.monotonic() < deadline:
                            time.sleep(0.05)  # the second instance takes over its share of the queues
                        print(f"  half consumed: a second instance joined and took queues "
                              f"{sorted(q.queue_id for q in second.assignment())}")
                    for key in KEYS:
                        r = producer.send(Message(TOPIC, f"{key} step {step}".encode()), sharding_key=key)
                        if step == 0:
                            print(f"  {key} -> queue {r.message_queue.queue_id}")
            ok = done.wait(60)
        finally:
            first.close()
            if second is not None:
                second.close()

    in_order = sum(1 for key in KEYS if seen[key] == list(range(n // len(KEYS))))
    print(f"consumed per instance: {dict(by_instance)}")
    print(f"ordered: {sum(by_instance.values())} of {n} messages consumed, {in_order} of {len(KEYS)} keys in "
          f"send order")
    return 0 if ok and in_order == len(KEYS) else 1


if __name__ == "__main__":
    sys.exit(main())
