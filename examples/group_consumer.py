"""Consumer groups: two instances share a topic's queues, ``poll`` messages, commit; one leaves, the other takes over.

    python examples/group_consumer.py --messages 200

``GroupConsumer`` is RocketMQ's lite pull consumer: ``subscribe``, then ``poll`` in a loop. Every instance of a
group reads the group's live members from the brokers (they come from the client heartbeats) and takes its
share of the queues (AllocateMessageQueueAveragely); offsets are committed to the brokers automatically, so
an instance that takes a queue over starts where the previous holder stopped.

Two instances in one process need their own client identity: ``instance_name`` gives each its own. The short
``rebalance_interval_s`` / ``heartbeat_interval_s`` make the hand-over quick (RocketMQ's defaults: 20 s / 30 s).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import _common

from client import Admin, GroupConsumer, Message, Producer

TOPIC = "GroupExampleTopic"
GROUP = "group-example"
FAST: dict[str, Any] = {
    "rebalance_interval_s": 1.0,
    "heartbeat_interval_s": 1.0,
    "pull_suspend_s": 1.0,  # long-polling hold (default 5 s); close() waits for a held pull to come back
    "consume_from_where": "FIRST_OFFSET",  # a new group starts at the oldest message, not at the end
}


def produce(namesrv: str, n: int, tag: str) -> set[str]:
    with Producer("group-example-producer", namesrv) as producer:
        return {producer.send(Message(TOPIC, f"{tag} {i}".encode())).msg_id for i in range(n)}


def wait_split(consumers: dict[str, GroupConsumer], queues: int, timeout_s: float = 30) -> None:
    """Until the instances hold every queue between them, each its own share."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = [c.assignment() for c in consumers.values()]
        if sum(map(len, held)) == queues and len(set().union(*held)) == queues and all(held):
            return
        for c in consumers.values():
            c.rebalance_now()
        time.sleep(0.2)  # members become visible with their next heartbeat; poll with a deadline
    raise SystemExit(f"queues not shared within {timeout_s} s: {[len(c.assignment()) for c in consumers.values()]}")


def poll_until(consumers: dict[str, GroupConsumer], wanted: set[str], got: Counter[str]) -> None:
    deadline = time.monotonic() + 30
    while wanted and time.monotonic() < deadline:
        for name, c in consumers.items():
            for msg in c.poll(timeout_s=0.1):  # the next poll acknowledges this batch; auto commit sends it
                got[name] += 1
                wanted.discard(msg.msg_id)


def main() -> int:
    args = _common.parser(__doc__, messages=100).parse_args()
    with _common.cluster(args.namesrv) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=4)
        consumers = {name: GroupConsumer(GROUP, namesrv, instance_name=name, **FAST) for name in ("A", "B")}
        for c in consumers.values():
            c.subscribe(TOPIC)
            c.start()
        try:
            wait_split(consumers, 4)
            for name, c in consumers.items():
                print(f"instance {name} holds {sorted(str(mq) for mq in c.assignment())}")

            wanted = produce(namesrv, args.messages, "first")
            got: Counter[str] = Counter()
            poll_until(consumers, wanted, got)
            print(f"first round: {dict(got)} messages per instance, {len(wanted)} missing")
            missing = len(wanted)

            consumers.pop("B").close()  # commits what B consumed and leaves the group
            print("instance B left the group")
            wait_split(consumers, 4)
            print(f"instance A now holds {len(consumers['A'].assignment())} queues")
            wanted = produce(namesrv, args.messages, "second")
            got2: Counter[str] = Counter()
            poll_until(consumers, wanted, got2)
            print(f"second round: {dict(got2)} messages per instance, {len(wanted)} missing")
            missing += len(wanted)
        finally:
            for c in consumers.values():
                c.close()

    print(f"group_consumer: {2 * args.messages - missing} of {2 * args.messages} messages consumed by the group")
    return 0 if missing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
