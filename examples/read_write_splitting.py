"""Read/write splitting: a consumer that falls behind is moved from the master to the slave, pull by pull.

    python examples/read_write_splitting.py --messages 400

Every pull answer carries ``suggestWhichBrokerId``: the broker's advice for the next pull of that queue. The
master suggests the slave (id 1) when the consumer reads data that is probably no longer in the master's page
cache -- more than ``accessMessageInMemoryMaxRatio`` % of its memory (RAM, or its memory cgroup's limit when
smaller) behind the newest message -- and the slave has
``slaveReadEnable=true``. The SDK remembers the advice per queue (``pull_from_which_node_table``), so the next
pull goes to the slave, and the master's memory and disk stay free for producers.

On a real machine a consumer has to lag by gigabytes to count as slow; this example starts brokers with
``accessMessageInMemoryMaxRatio=0`` so that every consumer does. (With ``--namesrv``, the brokers' own
settings apply.)
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import _common

from client import Admin, Message, Producer, PullConsumer, PullStatus
from client.errors import TopicNotExistError

TOPIC = "SplitExampleTopic"
BROKER_CONFIG = {
    "accessMessageInMemoryMaxRatio": "0",  # every consumer counts as slow
    "slaveReadEnable": "true",  # slaves may serve reads
    "slaveMetadataSyncInterval": "1000",  # slaves copy the master's topic table every second (default 10 s)
}
ROLE = {0: "master", 1: "slave"}


def main() -> int:
    args = _common.parser(__doc__, messages=200).parse_args()
    with _common.cluster(args.namesrv, broker_config=BROKER_CONFIG) as (namesrv, cluster):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=2)
        with Producer("split-producer", namesrv) as producer:
            for first in range(0, args.messages, 50):
                producer.send_batch([Message(TOPIC, f"msg {i}".encode().ljust(512, b"."))
                                     for i in range(first, min(args.messages, first + 50))])
        if cluster is not None:
            # The slave can only serve what it has; a slave behind would answer "not found yet".
            cluster.wait_slave_caught_up("broker-a", timeout_s=30)
        print(f"produced {args.messages} messages; the slave has caught up")

        served_by: Counter[int] = Counter()
        with PullConsumer("split-slow-consumer", namesrv) as consumer:
            for mq in consumer.fetch_subscribe_message_queues(TOPIC):
                offset = 0
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    asked = consumer.recalculate_pull_from_which_node(mq)
                    try:
                        r = consumer.pull(mq, offset, max_nums=16, suspend_timeout_s=0.5)  # long poll at the end
                    except TopicNotExistError:
                        # A new topic reaches the slave with its next metadata sync from the master.
                        print(f"pull {mq} @{offset:<4} asked {ROLE.get(asked, asked):<6} -> the slave does not know the topic yet")
                        time.sleep(0.2)
                        continue
                    print(f"pull {mq} @{offset:<4} asked {ROLE.get(asked, asked):<6} -> {r.pull_status.name:<13}"
                          f"{len(r.msg_found_list):>3} msgs served by {ROLE.get(r.served_by_broker_id, '?'):<6} "
                          f"next: {ROLE.get(r.suggest_which_broker_id, '?')}")
                    if r.pull_status is PullStatus.FOUND:
                        served_by[r.served_by_broker_id] += len(r.msg_found_list)
                    elif r.pull_status is PullStatus.NO_NEW_MSG:
                        break
                    offset = r.next_begin_offset
                    time.sleep(0.01)  # a slow consumer: it does some work per batch
            # A consumer that caught up is sent back to the master (the group's brokerId) for fresh data.
            table = {str(mq): ROLE.get(bid, bid) for mq, bid in sorted(consumer.pull_from_which_node_table.items())}
            print(f"pull_from_which_node_table: {table}")

    total = sum(served_by.values())
    print(f"read_write_splitting: read {total} messages, {served_by[0]} from the master, {served_by[1]} from the slave")
    return 0 if total >= args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
