"""A transaction-producer process for the "producer killed mid-transaction" test.

Usage: ``python -m tests.client.txn_member NAMESRV GROUP TOPIC MODE``:

* ``hang``: sends one transactional message ``killed-1`` whose local transaction prints ``PREPARED <msg id>``
  and then never returns (the parent SIGKILLs this process there);
* ``answer``: a producer of the group that sends nothing and answers every check with COMMIT_MESSAGE, printing
  ``CHECKED <transaction id> <check times>``; prints ``READY`` once started, exits when stdin closes.
"""

from __future__ import annotations

import sys
import threading
import time

from client import LocalTransactionState, Message, MessageExt, TransactionProducer


class _Listener:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        print("PREPARED", arg, flush=True)
        time.sleep(300)  # bound: the parent kills us long before
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        print("CHECKED", msg.msg_id, msg.properties.get("TRANSACTION_CHECK_TIMES"), flush=True)
        return LocalTransactionState.COMMIT_MESSAGE


def main(argv: list[str]) -> int:
    namesrv, group, topic, mode = argv
    with TransactionProducer(group, namesrv, _Listener(), topics=[topic], check_poll_s=1.0) as producer:
        if mode == "hang":
            producer.send_message_in_transaction(Message(topic, b"killed-1"), "killed-1")
            return 1
        print("READY", flush=True)
        done = threading.Event()

        def wait_for_stdin_eof() -> None:
            sys.stdin.read()
            done.set()

        threading.Thread(target=wait_for_stdin_eof, daemon=True).start()
        done.wait(120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
