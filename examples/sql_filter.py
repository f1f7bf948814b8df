"""SQL92 property filters: the broker returns only the messages whose properties match an expression.

    python examples/sql_filter.py --messages 60

Producers put user properties on messages; a consumer subscribes with ``MessageSelector.sql(...)`` (RocketMQ's
SQL92 grammar: AND OR NOT, comparisons, BETWEEN, IN, IS NULL, string and numeric literals, TAGS as a property).
The broker evaluates the expression before it returns a message, so what does not match never crosses the
network. Brokers need ``enablePropertyFilter=true`` (the local cluster of this example sets it).
"""

from __future__ import annotations

import sys
import time

import _common

from client import Admin, ConsumeFromWhere, GroupConsumer, Message, MessageSelector, Producer

TOPIC = "SqlFilterExampleTopic"
SELECTOR = MessageSelector.sql("region = 'EU' AND amount BETWEEN 100 AND 500")


def order(i: int) -> Message:
    region = ("EU", "US", "ASIA")[i % 3]
    return Message(TOPIC, f"order {i}".encode(), tags="Order", properties={"region": region, "amount": str(i * 10)})


def main() -> int:
    args = _common.parser(__doc__, messages=60).parse_args()
    with _common.cluster(args.namesrv, slaves_per_group=0) as (namesrv, _cluster):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=2)
        orders = [order(i) for i in range(args.messages)]
        with Producer("sql-filter-producer", namesrv) as producer:
            for first in range(0, len(orders), 32):
                producer.send_batch(orders[first:first + 32])
        want = {m.body for m in orders if m.properties["region"] == "EU" and 100 <= int(m.properties["amount"]) <= 500}
        print(f"produced {len(orders)} orders; {len(want)} match {SELECTOR.expression!r}")

        got: set[bytes] = set()
        with GroupConsumer("sql-filter-consumer", namesrv, consume_from_where=ConsumeFromWhere.FIRST_OFFSET) as c:
            c.subscribe(TOPIC, SELECTOR)
            deadline = time.monotonic() + 30
            while got < want and time.monotonic() < deadline:
                for m in c.poll(timeout_s=0.5):
                    print(f"  {m.body.decode():<10} region={m.properties['region']:<4} amount={m.properties['amount']}")
                    got.add(m.body)

    print(f"sql_filter: {len(got)} of {len(want)} matching messages consumed, {len(got - want)} others")
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
