"""Delayed messages: send with ``delay_level`` and measure when each message becomes consumable.

    python examples/delayed_message.py --messages 9

A message with ``delay_level=k`` is parked by the master in ``SCHEDULE_TOPIC_XXXX`` and put back into its real
topic once level k's delay (the k-th entry of the broker's ``messageDelayLevel``) has passed; consumers see it
only then. RocketMQ's default levels are ``1s 5s 10s 30s 1m ... 2h``; this example starts brokers with
``messageDelayLevel=1s 2s 3s`` so it runs in seconds. (With ``--namesrv``, the brokers' own levels apply.)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import _common

from client import Admin, Message, Producer, PullConsumer, PullStatus

TOPIC = "DelayExampleTopic"
LEVELS = "1s 2s 3s"


def main() -> int:
    args = _common.parser(__doc__, messages=6).parse_args()
    with _common.cluster(args.namesrv, broker_config={"messageDelayLevel": LEVELS}) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=1)
        with PullConsumer("delay-consumer", namesrv) as consumer:
            (mq,) = consumer.fetch_subscribe_message_queues(TOPIC)
            offset = consumer.max_offset(mq)  # only what arrives from now on

            sent_at: dict[str, float] = {}
            with Producer("delay-producer", namesrv) as producer:
                for i in range(args.messages):
                    level = 1 + i % 3
                    msg = Message(TOPIC, f"level {level} #{i}".encode(), delay_level=level)
                    sent_at[producer.send(msg).msg_id] = time.monotonic()
            print(f"sent {args.messages} messages with delay levels 1..3 at once")

            arrivals: dict[int, list[float]] = defaultdict(list)
            deadline = time.monotonic() + 60
            while sum(map(len, arrivals.values())) < args.messages and time.monotonic() < deadline:
                # Long polling: the broker answers as soon as a delayed message lands in the queue.
                r = consumer.pull(mq, offset, max_nums=32, suspend_timeout_s=5.0)
                now = time.monotonic()
                if r.pull_status is PullStatus.FOUND:
                    for m in r.msg_found_list:
                        waited = now - sent_at.get(m.msg_id, now)
                        level = int(m.body.split()[1])
                        arrivals[level].append(waited)
                        print(f"  {m.body.decode():<14} consumable after {waited:5.2f} s")
                offset = r.next_begin_offset

    print(f"{'level':>6}{'messages':>10}{'min s':>8}{'max s':>8}")
    for level in sorted(arrivals):
        waits = arrivals[level]
        print(f"{level:>6}{len(waits):>10}{min(waits):>8.2f}{max(waits):>8.2f}")
    got = sum(map(len, arrivals.values()))
    print(f"delayed_message: {got} of {args.messages} delayed messages arrived after their delay")
    return 0 if got == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
