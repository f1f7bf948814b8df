"""Administration: the cluster, topics and routes, replication status, broker runtime, consumer lag, queries.

    python examples/admin_and_ha_status.py --messages 50

Everything here is also on the command line: ``splitmq cluster list``, ``splitmq topic route``,
``splitmq ha status``, ``splitmq broker runtime``, ``splitmq consumer progress``, ``splitmq msg``
(``splitmq --help``).
"""

from __future__ import annotations

import json
import sys
import time

import _common

from client import Admin, Message, Producer, PullConsumer, PullStatus

TOPIC = "AdminExampleTopic"
GROUP = "admin-example-consumer"


def show_ha(admin: Admin, broker_name: str) -> None:
    """``GET /ha`` of every member: the master's view of each slave, and each slave's view of its master link."""
    for broker_id, st in admin.ha_status(broker_name).items():
        if "error" in st:
            print(f"  {broker_name}[{broker_id}] unreachable: {st['error']}")
        elif broker_id == 0:
            print(f"  {broker_name}[0] {st['role']}: masterMaxOffset={st['masterMaxOffset']} "
                  f"push2SlaveMaxOffset={st['push2SlaveMaxOffset']} slaves={len(st['slaves'])}")
            for s in st["slaves"]:
                print(f"      slave {s['addr']}: ackOffset={s['ackOffset']} diff={s['diff']} inSync={s['inSync']}")
        else:
            c = st["client"] or {}
            print(f"  {broker_name}[{broker_id}] {st['role']}: connected={c.get('connected')} "
                  f"maxOffset={c.get('maxOffset')} master={c.get('masterAddress')}")


def main() -> int:
    args = _common.parser(__doc__, messages=40).parse_args()
    with _common.cluster(args.namesrv, broker_groups=2) as (namesrv, cluster), Admin(namesrv) as admin:
        info = admin.cluster_info()
        print("cluster:")
        for name, bd in sorted(info.broker_addr_table.items()):
            print(f"  {bd.cluster} / {name}: " + ", ".join(f"id {i} at {a}" for i, a in sorted(bd.broker_addrs.items())))

        admin.create_topic(TOPIC, queue_nums=2)  # on every master; returns once the route shows it
        route = admin.topic_route(TOPIC)
        print(f"route of {TOPIC}: " + ", ".join(f"{q.broker_name} r{q.read_queue_nums}/w{q.write_queue_nums} "
                                                f"perm {q.perm}" for q in route.queue_datas))
        print(f"topics known to the nameserver: {len(admin.topic_list())}")

        with Producer("admin-example-producer", namesrv) as producer:
            results = [producer.send(Message(TOPIC, f"order {i}".encode(), keys=[f"order-{i}"]))
                       for i in range(args.messages)]
        if cluster is not None:
            for name in cluster.group_names:
                cluster.wait_slave_caught_up(name, timeout_s=30)

        print("replication (GET /ha):")
        for name in sorted(info.broker_addr_table):
            show_ha(admin, name)

        master = info.master_addrs()[results[0].message_queue.broker_name]
        rt = admin.broker_runtime(master)
        print(f"runtime of {master}: " + json.dumps({k: rt[k] for k in (
            "role", "commitLogMaxOffset", "dispatchBehindBytes", "putTps", "topicCount")}))

        # Consume a third, commit, and look at the group's lag per queue.
        with PullConsumer(GROUP, namesrv) as consumer:
            for mq in consumer.fetch_subscribe_message_queues(TOPIC):
                want = consumer.max_offset(mq) // 3
                offset = max(consumer.fetch_consume_offset(mq), 0)
                deadline = time.monotonic() + 10
                while offset < want and time.monotonic() < deadline:
                    r = consumer.pull(mq, offset, max_nums=want - offset)
                    if r.pull_status is PullStatus.FOUND:
                        offset = r.next_begin_offset
                consumer.update_consume_offset(mq, offset)
        progress = admin.consumer_progress(GROUP, TOPIC)
        print(f"consumer progress of {GROUP}:")
        for p in progress:
            print(f"  {p.message_queue}: broker offset {p.broker_offset}, consumer offset {p.consumer_offset}, "
                  f"lag {p.lag}")

        # Find messages again: by the broker's offset msgId, by unique id, by business key.
        first = results[0]
        by_offset_id = admin.query_message(first.offset_msg_id)
        by_uniq_id = admin.query_message(first.msg_id, topic=TOPIC)
        by_key = admin.query_messages_by_key(TOPIC, "order-1")
        print(f"query by offset msgId {first.offset_msg_id}: {by_offset_id.body.decode()!r}")
        print(f"query by msgId {first.msg_id}: {by_uniq_id.body.decode()!r}")
        print(f"query by key order-1: {[m.body.decode() for m in by_key]}")

    lag = sum(p.lag for p in progress)
    print(f"admin_and_ha_status: {len(info.broker_addr_table)} broker groups, {len(progress)} queues, total lag {lag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
