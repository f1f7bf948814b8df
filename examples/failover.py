"""Failover: kill the master with SIGKILL and keep consuming from its slave.

    python examples/failover.py --messages 400
    python examples/failover.py --namesrv 127.0.0.1:9876      # you kill broker-a's master when asked

Reads survive a dead master: the slave holds a byte-identical copy of the commit log, and a slave whose HA link
to its master is down serves pulls itself (even with ``slaveReadEnable=false``). The SDK notices the dead master
on the first failed connection, marks it down for a few seconds and pulls from the slave; consumer offsets are
committed to the slave meanwhile. Writes need a master: sends fail until it is back (or go to other broker
groups when there are some).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import _common

from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.errors import ClientError

TOPIC = "FailoverTopic"
GROUP = "failover-consumer"
#: Slaves copy topics and consumer offsets from the master every second (default 10 s), so the slave knows
#: where the group got to when the master dies.
BROKER_CONFIG = {"slaveMetadataSyncInterval": "1000"}
ROLE = {0: "master", 1: "slave"}


def consume(consumer: PullConsumer, offsets: dict[MessageQueue, int], limit: int, label: str) -> int:
    """Pull every queue from ``offsets`` until ``limit`` messages per queue or the end; returns messages read."""
    got = 0
    for mq, start in sorted(offsets.items()):
        offset = start
        deadline = time.monotonic() + 30
        while offset - start < limit and time.monotonic() < deadline:
            try:
                # Long polling: at the end of the queue the broker holds the pull up to 1 s for new messages.
                r = consumer.pull(mq, offset, max_nums=min(32, limit - (offset - start)), suspend_timeout_s=1.0)
            except ClientError as e:
                if not e.retriable:
                    raise
                print(f"  {label}: {mq} pull failed ({type(e).__name__}), retrying")
                time.sleep(0.2)
                continue
            if r.pull_status is PullStatus.NO_NEW_MSG:
                break
            if r.pull_status is PullStatus.FOUND:
                print(f"  {label}: {mq} @{offset:<4} {len(r.msg_found_list):>2} msgs served by "
                      f"{ROLE.get(r.served_by_broker_id, r.served_by_broker_id)}")
                got += len(r.msg_found_list)
            offset = r.next_begin_offset
        consumer.update_consume_offset(mq, offset)  # to the master, or to the slave while the master is down
        offsets[mq] = offset
    return got


def wait_offsets_on_slave(slave_addr: str, offsets: dict[MessageQueue, int], timeout_s: float = 30) -> None:
    """Until the slave's copy of the consumer offsets (``GET /offsets``) shows what the group committed."""
    want = {str(mq.queue_id): off for mq, off in offsets.items()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{slave_addr}/offsets", timeout=5) as resp:
            table = json.loads(resp.read())["offsetTable"].get(f"{TOPIC}@{GROUP}", {})
        if all(table.get(q) == off for q, off in want.items()):
            return
        time.sleep(0.1)  # the slave syncs every slaveMetadataSyncInterval; poll with a deadline
    raise SystemExit(f"the slave did not copy the offsets {want} within {timeout_s} s")


def wait_master_gone(admin: Admin, addr: str, timeout_s: float = 120) -> None:
    print(f"kill the master of broker-a ({addr}) now; waiting up to {timeout_s:.0f} s")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            admin.broker_runtime(addr)
        except ClientError:
            return
        time.sleep(0.5)
    raise SystemExit("the master is still up")


def main() -> int:
    args = _common.parser(__doc__, messages=200).parse_args()
    with _common.cluster(args.namesrv, broker_config=BROKER_CONFIG) as (namesrv, cluster), \
            Admin(namesrv) as admin:
        admin.create_topic(TOPIC, queue_nums=2)
        with Producer("failover-producer", namesrv) as producer:
            for first in range(0, args.messages, 50):
                producer.send_batch([Message(TOPIC, f"msg {i}".encode())
                                     for i in range(first, min(args.messages, first + 50))])
        print(f"produced {args.messages} messages to {TOPIC}")

        with PullConsumer(GROUP, namesrv) as consumer:
            offsets = {mq: max(consumer.fetch_consume_offset(mq), 0)
                       for mq in consumer.fetch_subscribe_message_queues(TOPIC)}
            half = args.messages // (2 * len(offsets))
            before = consume(consumer, offsets, half, "before")
            master_addr = admin.cluster_info().master_addrs()["broker-a"]

            if cluster is not None:
                cluster.wait_slave_caught_up("broker-a", timeout_s=30)
                wait_offsets_on_slave(cluster.broker("broker-a", 1).addr, offsets)
                cluster.kill_master("broker-a")
                print("killed broker-a's master (SIGKILL)")
            else:
                wait_master_gone(admin, master_addr)
            killed_at = time.monotonic()

            try:
                with Producer("failover-producer", namesrv, send_timeout_s=1.0) as producer:
                    producer.send(Message(TOPIC, b"while the master is down"))
                print("a send succeeded (another broker group took it)")
            except ClientError as e:
                print(f"a send fails while broker-a has no master, as expected: {type(e).__name__}")

            # The slave's view of the group's offsets, copied from the master before it died.
            on_slave = {str(mq): consumer.fetch_consume_offset(mq) for mq in offsets}
            print(f"committed offsets as the slave knows them: {on_slave}")
            after = consume(consumer, offsets, args.messages, "after")
            print(f"read the rest from the slave within {time.monotonic() - killed_at:.2f} s of the kill")

        if cluster is not None:
            cluster.broker("broker-a", 0).start()  # same store, same ports
            with Producer("failover-producer", namesrv) as producer:
                result = producer.send(Message(TOPIC, b"the master is back"))
            print(f"restarted the master; sends work again ({result.send_status.name})")

    print(f"failover: read {before} messages before the kill and {after} after it from the slave, "
          f"{before + after} of {args.messages}")
    return 0 if before + after >= args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
