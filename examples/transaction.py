"""Transactional messages: a message is delivered only if the local transaction that goes with it commits.

    python examples/transaction.py --messages 6

Each message is first stored as a *half* message that no consumer can see; the producer then runs its local
transaction and commits or rolls back. Here message i commits when i % 3 == 0, rolls back when i % 3 == 1, and
answers ``UNKNOW`` when i % 3 == 2: the broker then checks back with the producer group after
``transactionTimeOut`` and the check commits it. This example starts brokers with
``transactionCheckInterval=500`` and ``transactionTimeOut=1000`` so the check comes within seconds (RocketMQ's
defaults are 60 s and 6 s).
"""

from __future__ import annotations

import sys
import time

import _common

from client import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    PullConsumer,
    PullStatus,
    TransactionProducer,
)

TOPIC = "TransactionExampleTopic"


class Orders:
    """The application's side: what each local transaction decided, and the answer to the broker's checks."""

    def __init__(self) -> None:
        self.decided: dict[str, LocalTransactionState] = {}
        self.checks = 0

    def execute_local_transaction(self, msg: Message, arg: int) -> LocalTransactionState:
        state = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                 LocalTransactionState.UNKNOW)[arg % 3]
        print(f"  local transaction of {msg.body.decode():<10} -> {state.value}")
        return state

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checks += 1
        print(f"  broker checks {msg.body.decode():<10} (not decided yet) -> COMMIT_MESSAGE")
        return LocalTransactionState.COMMIT_MESSAGE


def main() -> int:
    args = _common.parser(__doc__, messages=6).parse_args()
    config = {"transactionCheckInterval": "500", "transactionTimeOut": "1000"}
    with _common.cluster(args.namesrv, slaves_per_group=0, broker_config=config) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=1)
        with PullConsumer("transaction-consumer", namesrv) as consumer:
            (mq,) = consumer.fetch_subscribe_message_queues(TOPIC)
            offset = consumer.max_offset(mq)
            orders = Orders()
            expected: set[str] = set()
            with TransactionProducer("transaction-producer", namesrv, orders, topics=[TOPIC],
                                     check_poll_s=1.0) as producer:
                for i in range(args.messages):
                    sent = producer.send_message_in_transaction(Message(TOPIC, f"order #{i}".encode()), i)
                    if i % 3 != 1:
                        expected.add(f"order #{i}")
                    print(f"sent {sent.msg_id}: {sent.local_transaction_state.value}")
                got: set[str] = set()
                deadline = time.monotonic() + 30
                while got != expected and time.monotonic() < deadline:
                    r = consumer.pull(mq, offset, max_nums=32, suspend_timeout_s=2.0)
                    if r.pull_status is PullStatus.FOUND:
                        for m in r.msg_found_list:
                            got.add(m.body.decode())
                            print(f"  consumed {m.body.decode()}")
                    offset = r.next_begin_offset
    rolled_back = args.messages - len(expected)
    print(f"transaction: {len(got)} of {len(expected)} committed messages consumed, {rolled_back} rolled back "
          f"never seen, {orders.checks} answered check(s)")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
