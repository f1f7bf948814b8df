"""A group-consumer process for the hand-over tests: prints what it holds and what it consumes.

Usage: ``python -m tests.client.group_member NAMESRV GROUP TOPIC INTERVAL_S``. Lines on stdout:
``ASSIGN <queue ids comma-separated>`` whenever the held set changes, ``MSG <body>`` per consumed message.
"""

from __future__ import annotations

import sys
import time

from client._group_consumer import GroupConsumer


def main(argv: list[str]) -> int:
    namesrv, group, topic, interval = argv[0], argv[1], argv[2], float(argv[3])
    consumer = GroupConsumer(group, namesrv, consume_from_where="FIRST_OFFSET", rebalance_interval_s=interval,
                             heartbeat_interval_s=interval, pull_suspend_s=interval, auto_commit_interval_s=interval)
    consumer.subscribe(topic)
    consumer.start()
    held: list[int] = []
    print("READY", consumer.client.client_id, flush=True)
    deadline = time.monotonic() + 300  # bound: the parent kills or closes us long before
    try:
        while time.monotonic() < deadline:
            msgs = consumer.poll(0.2)
            for m in msgs:
                print("MSG", m.body.decode(), flush=True)
            now = sorted(q.queue_id for q in consumer.assignment())
            if now != held:
                held = now
                print("ASSIGN", ",".join(map(str, held)), flush=True)
            if sys.stdin.closed:
                break
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
