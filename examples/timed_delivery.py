"""Timed delivery (RocketMQ 5 timer messages): any delay, or an exact time, not only the 18 delay levels.

    python examples/timed_delivery.py --messages 6

``Message(..., delay_s=2.5)`` is consumable 2.5 s after the broker stored it; ``Message(..., deliver_at_ms=t)``
from time ``t`` (ms since the epoch). The master parks such a message in the system topic
``rmq_sys_wheel_timer`` and puts it back under its topic at its time; the delivered copy keeps
``TIMER_DELIVER_MS``, so a consumer can see how late it became visible (by the broker's clock). Delays up to
``timerMaxDelaySec`` (7 days by default) are accepted.
"""

from __future__ import annotations

import sys
import time

import _common

from client import Admin, Message, Producer, PullConsumer, PullStatus

TOPIC = "TimedExampleTopic"


def main() -> int:
    args = _common.parser(__doc__, messages=6).parse_args()
    with _common.cluster(args.namesrv) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=1)
        with PullConsumer("timed-consumer", namesrv) as consumer:
            (mq,) = consumer.fetch_subscribe_message_queues(TOPIC)
            offset = consumer.max_offset(mq)  # only what arrives from now on
            with Producer("timed-producer", namesrv) as producer:
                for i in range(args.messages):
                    if i % 2:
                        msg = Message(TOPIC, f"#{i} in {0.5 + i * 0.4:.1f} s".encode(), delay_s=0.5 + i * 0.4)
                    else:  # an absolute time, by the producer's clock
                        at = time.time_ns() // 1_000_000 + 500 + i * 400
                        msg = Message(TOPIC, f"#{i} at {at}".encode(), deliver_at_ms=at)
                    producer.send(msg)
            print(f"sent {args.messages} timed messages, due 0.5 s to {0.5 + (args.messages - 1) * 0.4:.1f} s from now")

            on_time = got = 0
            deadline = time.monotonic() + 30
            while got < args.messages and time.monotonic() < deadline:
                r = consumer.pull(mq, offset, max_nums=32, suspend_timeout_s=5.0)  # answered as soon as one lands
                if r.pull_status is PullStatus.FOUND:
                    for m in r.msg_found_list:
                        late_ms = m.store_timestamp - int(m.properties["TIMER_DELIVER_MS"])
                        got += 1
                        on_time += 0 <= late_ms <= 1000
                        print(f"  {m.body.decode():<24} visible {late_ms:4d} ms after its time")
                offset = r.next_begin_offset

    print(f"timed_delivery: {on_time} of {args.messages} timed messages arrived within 1 s of their time")
    return 0 if on_time == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
