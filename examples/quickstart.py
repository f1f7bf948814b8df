"""Quick start: create a topic, send messages, read them back with a pull consumer, commit the offsets.

    python examples/quickstart.py                      # starts a throw-away local cluster
    python examples/quickstart.py --namesrv 127.0.0.1:9876 --messages 100
"""

from __future__ import annotations

import sys
import time

import _common

from client import Admin, Message, Producer, PullConsumer, PullStatus

TOPIC = "QuickStartTopic"


def main() -> int:
    args = _common.parser(__doc__, messages=20).parse_args()
    with _common.cluster(args.namesrv) as (namesrv, _):
        # Topics can be auto-created on first send; creating one says how many queues each broker group gets.
        with Admin(namesrv) as admin:
            groups = admin.create_topic(TOPIC, queue_nums=4)
            print(f"topic {TOPIC}: 4 queues on {', '.join(groups)}")

        # A producer sends to masters only, spreading messages over the queues round robin.
        with Producer("quickstart-producer", namesrv) as producer:
            for i in range(args.messages):
                sent = producer.send(Message(TOPIC, f"hello {i}".encode(), tags="TagA", keys=[f"order-{i}"]))
                if i < 3:
                    print(f"sent {sent.msg_id} -> {sent.message_queue} offset {sent.queue_offset} "
                          f"({sent.send_status.name})")

        # A pull consumer reads each queue from an offset of your choice and commits where it got to.
        received = 0
        with PullConsumer("quickstart-consumer", namesrv) as consumer:
            queues = consumer.fetch_subscribe_message_queues(TOPIC)
            # Where this group got to last time (-1: never committed -> start at 0).
            offsets = {mq: max(consumer.fetch_consume_offset(mq), 0) for mq in queues}
            deadline = time.monotonic() + 30
            while received < args.messages and time.monotonic() < deadline:
                for mq in queues:
                    result = consumer.pull(mq, offsets[mq], max_nums=32)
                    if result.pull_status is not PullStatus.FOUND:
                        continue  # NO_NEW_MSG: nothing (yet) in this queue; the broker indexes new messages async
                    for msg in result.msg_found_list:
                        if received < 3:
                            print(f"received {msg.body.decode()!r} tags={msg.tags} keys={list(msg.keys)} "
                                  f"from {mq} offset {msg.queue_offset}")
                        received += 1
                    offsets[mq] = result.next_begin_offset
            for mq, offset in offsets.items():
                consumer.update_consume_offset(mq, offset)  # a restart of this group resumes here

    print(f"quickstart: sent {args.messages}, received {received}")
    return 0 if received >= args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
