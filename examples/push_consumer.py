"""Push consumer: a callback per batch on a worker pool, and a failed message retried through the broker.

    python examples/push_consumer.py --messages 100

``PushConsumer`` pulls for you (same group machinery as ``GroupConsumer``) and calls your function with
batches of messages on ``consume_thread_nums`` worker threads. The function returns a ``ConsumeStatus``:
``CONSUME_SUCCESS``, or ``RECONSUME_LATER`` to have the batch delivered again later -- the broker stores a
copy in ``%RETRY%<group>`` with a delay that grows with each attempt (level ``3 + reconsumeTimes``), and after
``max_reconsume_times`` attempts moves it to ``%DLQ%<group>``. Anything else returned (``None``...) counts as
a failure, never as a success.

Here every message whose number is a multiple of 10 fails once. The brokers run with short delay levels so the
retry comes back within seconds (with the default levels the first retry waits 10 s).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

import _common

from client import Admin, ConsumeStatus, Message, MessageExt, Producer, PushConsumer

TOPIC = "PushExampleTopic"
GROUP = "push-example"
LEVELS = " ".join(["1s"] * 18)  # every delay level is 1 s: retries come back after 1 s


def main() -> int:
    args = _common.parser(__doc__, messages=50).parse_args()
    n = args.messages
    done = threading.Event()
    lock = threading.Lock()
    consumed: set[int] = set()
    attempts: Counter[int] = Counter()

    def say(line: str) -> None:
        with lock:  # callbacks run on several threads
            print(line, flush=True)

    def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        """Runs on a worker thread; may run concurrently for different queues."""
        for m in msgs:
            i = int(m.body.split()[1])
            with lock:
                attempts[i] += 1
            if i % 10 == 0 and m.reconsume_times == 0:
                say(f"  message {i}: failing it on purpose, the broker will deliver it again")
                return ConsumeStatus.RECONSUME_LATER
            if m.reconsume_times:
                say(f"  message {i}: redelivered (reconsume_times={m.reconsume_times}), consumed")
            with lock:
                consumed.add(i)
                if len(consumed) == n:
                    done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with _common.cluster(args.namesrv, broker_config={"messageDelayLevel": LEVELS}) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=4)
        consumer = PushConsumer(GROUP, namesrv, on_messages, consume_thread_nums=4,
                                consume_from_where="FIRST_OFFSET",
                                # The retry topic %RETRY%<group> appears with the first failure; a short
                                # rebalance period picks its queue up quickly (default 20 s).
                                rebalance_interval_s=1.0, pull_suspend_s=1.0)
        consumer.subscribe(TOPIC)  # subscribe before start
        start = time.monotonic()
        with consumer:
            with Producer("push-example-producer", namesrv) as producer:
                for i in range(n):
                    producer.send(Message(TOPIC, f"message {i}".encode()))
            ok = done.wait(60)
        print(f"consumed {len(consumed)} of {n} in {time.monotonic() - start:.1f} s; "
              f"callback errors: {consumer.callback_errors}")

    retried = sorted(i for i, k in attempts.items() if k > 1)
    print(f"push_consumer: {len(consumed)} of {n} messages consumed, {len(retried)} after a retry")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
