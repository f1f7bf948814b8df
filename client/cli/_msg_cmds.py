"""Messages: ``msg query`` (by msgId or key), ``produce`` and ``consume``.

``consume`` prints one line per message (queue, offset, the member that served the pull, tags, keys, body), or
one JSON object per line with ``--json``. It starts each queue at the group's committed offset (else the queue's
end; ``--from-beginning``: its min offset), and commits what it printed unless ``--no-commit``.
"""

from __future__ import annotations

import argparse
import base64
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from client._consumer import PullConsumer
from client._producer import Producer
from client._requests import SendResult
from client.cli._common import client_config, namesrv_of, open_admin, split_keys
from client.cli._output import Output, fmt_body, fmt_time_ms
from client.errors import ClientError, QueryNotFoundError
from client.protocol.codes import PullStatus
from client.protocol.message import Message, MessageExt, MessageQueue

__all__ = ["cmd_consume", "cmd_msg_query", "cmd_produce", "message_json"]

#: Messages asked for per pull.
PULL_BATCH = 32
#: Pause between rounds over the queues when none had anything new (doubling up to the max).
IDLE_PAUSE_MIN_S = 0.02
IDLE_PAUSE_MAX_S = 0.5
#: How often the ``--count`` progress line is rewritten.
PROGRESS_EVERY_S = 0.2


def message_json(m: MessageExt, *, served_by: int | None = None) -> dict[str, Any]:
    """A message as a JSON-ready dict (body decoded as UTF-8 with replacement, plus base64 for exact bytes)."""
    d: dict[str, Any] = {
        "topic": m.topic, "brokerName": m.broker_name, "queueId": m.queue_id, "queueOffset": m.queue_offset,
        "msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "tags": m.tags, "keys": list(m.keys),
        "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp, "bornHost": m.born_host,
        "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times, "commitLogOffset": m.commit_log_offset,
        "storeSize": m.store_size, "properties": dict(m.properties),
        "body": m.body.decode("utf-8", "replace"), "bodyBase64": base64.b64encode(m.body).decode(),
    }
    if served_by is not None:
        d["servedBy"] = served_by
    return d


# --- msg query -----------------------------------------------------------------------------------------------


def _print_message(m: MessageExt, out: Output, max_body: int) -> None:
    out.kv([
        ("msgId", m.msg_id), ("offsetMsgId", m.offset_msg_id), ("topic", m.topic), ("tags", m.tags),
        ("keys", " ".join(m.keys) or None), ("queue", f"{m.broker_name}/{m.queue_id}"),
        ("queueOffset", m.queue_offset), ("commitLogOffset", m.commit_log_offset),
        ("bornTimestamp", fmt_time_ms(m.born_timestamp)), ("storeTimestamp", fmt_time_ms(m.store_timestamp)),
        ("bornHost", m.born_host), ("storeHost", m.store_host), ("reconsumeTimes", m.reconsume_times),
        ("storeSize", m.store_size),
        ("properties", " ".join(f"{k}={v}" for k, v in sorted(m.properties.items())) or None),
        ("body", fmt_body(m.body, max_body)),
    ])


def cmd_msg_query(args: argparse.Namespace, out: Output) -> int:
    """``msg query --id MSG_ID [-t TOPIC]`` or ``msg query --key KEY -t TOPIC``."""
    if args.key is not None and not args.topic:
        args.leaf.error("--key needs -t/--topic")
    with open_admin(args) as adm:
        if args.id is not None:
            msgs = [adm.query_message(args.id.strip(), topic=args.topic)]
        else:
            msgs = adm.query_messages_by_key(args.topic, args.key)
            if not msgs:
                raise QueryNotFoundError(f"no message with key {args.key} in topic {args.topic}")
    if out.json_mode:
        out.json({"messages": [message_json(m) for m in msgs]})
        return 0
    for i, m in enumerate(msgs):
        if i:
            out.line()
        _print_message(m, out, args.max_body)
    return 0


# --- produce -------------------------------------------------------------------------------------------------


def _lines(stream: Iterable[str]) -> Iterator[bytes]:
    for line in stream:
        text = line.rstrip("\r\n")
        if text:  # an empty body is refused by the broker; blank lines are skipped
            yield text.encode()


def _bodies(args: argparse.Namespace) -> Iterator[bytes]:
    """Bodies from the positional args (``-`` = stdin lines), then from ``--file`` lines, lazily."""
    for b in args.bodies:
        if b == "-":
            yield from _lines(sys.stdin)
        else:
            yield b.encode()
    if args.file:
        with open(args.file, encoding="utf-8", errors="surrogateescape") as f:
            yield from _lines(f)


def _result_line(r: SendResult) -> str:
    mq = r.message_queue
    return (f"sent status={r.send_status.name} queue={mq.broker_name}/{mq.queue_id} offset={r.queue_offset} "
            f"msgId={r.msg_id} offsetMsgId={r.offset_msg_id}")


def _result_json(r: SendResult) -> dict[str, Any]:
    mq = r.message_queue
    return {"status": r.send_status.name, "topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id,
            "queueOffset": r.queue_offset, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id}


def _payload(i: int, size: int) -> bytes:
    head = f"{i:012d}:".encode()
    return (head + b"x" * max(0, size - len(head)))[:size]


class _Generated:
    """``--count N`` sends from ``threads`` threads (the producer batches concurrent sends); stops at the first error."""

    def __init__(self, producer: Producer, msg_of: Any, count: int, threads: int) -> None:
        self._producer = producer
        self._msg_of = msg_of
        self._count = count
        self._lock = threading.Lock()
        self._next = 0
        self.sent = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._work, daemon=True, name=f"splitmq-produce-{i}")
                        for i in range(min(threads, count))]

    def _work(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                i = self._next
                self._next += 1
            if i >= self._count:
                return
            try:
                self._producer.send(self._msg_of(i))
            except Exception as e:  # handed to the main thread, which reports it
                with self._lock:
                    self.error = self.error or e
                self.stop.set()
                return
            with self._lock:
                self.sent += 1


def _produce_generated(args: argparse.Namespace, producer: Producer, out: Output) -> int:
    keys = split_keys(args.keys)
    gen = _Generated(producer, lambda i: Message(args.topic, _payload(i, args.size), tags=args.tags, keys=keys),
                     args.count, args.threads)
    started = time.monotonic()
    interrupted = False
    for t in gen.threads:
        t.start()
    try:
        while alive := [t for t in gen.threads if t.is_alive()]:
            alive[0].join(PROGRESS_EVERY_S)
            out.progress(f"sent {gen.sent}/{args.count}")
    except KeyboardInterrupt:
        interrupted = True
        gen.stop.set()
        for t in gen.threads:  # each in-flight send ends within its send timeout
            t.join(2 * args.timeout)
    out.progress(f"sent {gen.sent}/{args.count}")  # the final count: the last threads may end between two lines
    out.end_progress()
    secs = max(time.monotonic() - started, 1e-9)
    rate = gen.sent / secs
    if out.json_mode:
        out.json({"sent": gen.sent, "seconds": round(secs, 3), "msgsPerSecond": round(rate, 1)}, compact=True)
    else:
        out.line(f"sent {gen.sent} msgs in {secs:.2f} s ({rate:.1f} msgs/s)")
    if gen.error is not None:
        raise gen.error
    return 130 if interrupted else 0


def cmd_produce(args: argparse.Namespace, out: Output) -> int:
    """``produce -t TOPIC`` from args / stdin / ``--file`` (one line per message), or ``--count N --size B``."""
    if args.count is not None and (args.bodies or args.file):
        args.leaf.error("--count generates the bodies; do not also give BODY arguments or --file")
    if args.count is None and not args.bodies and not args.file:
        args.leaf.error("nothing to send: give BODY arguments, '-' for stdin, --file F, or --count N")
    producer = Producer(args.group, namesrv_of(args), send_timeout_s=args.timeout, client_config=client_config(args))
    try:
        if args.count is not None:
            return _produce_generated(args, producer, out)
        keys = split_keys(args.keys)
        n = 0
        for body in _bodies(args):
            r = producer.send(Message(args.topic, body, tags=args.tags, keys=keys))
            n += 1
            if out.json_mode:
                out.json(_result_json(r), compact=True)
            else:
                out.line(_result_line(r))
        out.info(f"sent {n} msgs")
        return 0
    finally:
        producer.close()


# --- consume -------------------------------------------------------------------------------------------------


def _start_offset(consumer: PullConsumer, mq: MessageQueue, from_beginning: bool) -> int:
    if from_beginning:
        return consumer.min_offset(mq)
    committed = consumer.fetch_consume_offset(mq)
    return committed if committed >= 0 else consumer.max_offset(mq)


def _message_line(m: MessageExt, served_by: int, max_body: int) -> str:
    keys = ",".join(m.keys) or "-"
    return (f"queue={m.broker_name}/{m.queue_id} offset={m.queue_offset} served-by={served_by} "
            f"tags={m.tags or '-'} keys={keys} body={fmt_body(m.body, max_body)}")


class _Consume:
    """The consume loop's state: where each queue stands, what is printed, what is left to commit."""

    def __init__(self, args: argparse.Namespace, consumer: PullConsumer, out: Output) -> None:
        self.args = args
        self.consumer = consumer
        self.out = out
        self.printed = 0
        self.offsets: dict[MessageQueue, int] = {}
        self.dirty: set[MessageQueue] = set()

    def remaining(self) -> int | None:
        return None if self.args.count is None else self.args.count - self.printed

    def pull_once(self, mq: MessageQueue) -> bool:
        """One pull of ``mq``; True when it printed a message."""
        left = self.remaining()
        res = self.consumer.pull(mq, self.offsets[mq], min(PULL_BATCH, left or PULL_BATCH), self.args.subexpr,
                                 timeout_s=self.args.timeout)
        next_offset = res.next_begin_offset
        shown = 0
        if res.pull_status is PullStatus.FOUND:
            for m in res.msg_found_list:
                if left is not None and shown >= left:
                    next_offset = m.queue_offset  # not printed: the next run starts here
                    break
                if self.out.json_mode:
                    self.out.json(message_json(m, served_by=res.served_by_broker_id), compact=True)
                else:
                    self.out.line(_message_line(m, res.served_by_broker_id, self.args.max_body))
                shown += 1
        self.printed += shown
        if next_offset != self.offsets[mq]:
            self.offsets[mq] = next_offset
            self.dirty.add(mq)
        return shown > 0

    def commit(self) -> None:
        if self.args.no_commit:
            return
        for mq in sorted(self.dirty, key=lambda q: (q.broker_name, q.queue_id)):
            self.consumer.update_consume_offset(mq, self.offsets[mq])
        self.dirty.clear()

    def run(self, queues: list[MessageQueue]) -> str:
        """Pull round-robin until ``--count`` or ``--timeout`` seconds without a message; returns why it stopped."""
        idle_deadline = time.monotonic() + self.args.timeout
        pause = IDLE_PAUSE_MIN_S
        while True:
            got = False
            for mq in queues:
                if self.remaining() == 0:
                    break
                got = self.pull_once(mq) or got
            self.commit()
            if self.remaining() == 0:
                return f"reached --count {self.args.count}"
            now = time.monotonic()
            if got:
                idle_deadline, pause = now + self.args.timeout, IDLE_PAUSE_MIN_S
                continue
            if now >= idle_deadline:
                return f"no new message for {self.args.timeout:g} s"
            # Polling, not long polling: one parked pull per queue in turn would delay the other queues.
            time.sleep(min(pause, idle_deadline - now))
            pause = min(pause * 2, IDLE_PAUSE_MAX_S)


def _warn_unreadable_slaves(args: argparse.Namespace, consumer: PullConsumer, queues: list[MessageQueue],
                            out: Output) -> None:
    """``--from-slave``: say up front when a group has no slave 1, or one that sends reads back to its master."""
    with open_admin(args) as adm:
        for name in sorted({mq.broker_name for mq in queues}):
            addr = (consumer.client.routes.broker_addrs(name) or {}).get(1)
            if addr is None:
                out.warn(f"broker group {name} has no slave with id 1 in the route; its pulls go to another member")
                continue
            try:
                readable = adm.broker_runtime(addr).get("slaveReadEnable")
            except ClientError as e:
                out.warn(f"could not ask slave {name}[1] for its runtime: {e}")
                continue
            if readable is False:
                out.warn(f"slave {name}[1] ({addr}) has slaveReadEnable=false: while its master is up it serves no "
                         f"messages (start the brokers with slaveReadEnable=true)")


def cmd_consume(args: argparse.Namespace, out: Output) -> int:
    """``consume -t TOPIC``: print messages until ``--count`` or ``--timeout`` seconds without a new one."""
    broker_id = 1 if args.from_slave else 0
    consumer = PullConsumer(args.group, namesrv_of(args), connect_broker_by_user=args.from_slave,
                            default_broker_id=broker_id, client_config=client_config(args),
                            pull_timeout_s=args.timeout)
    state = _Consume(args, consumer, out)
    try:
        queues = sorted(consumer.fetch_subscribe_message_queues(args.topic),
                        key=lambda q: (q.broker_name, q.queue_id))
        if args.from_slave:
            _warn_unreadable_slaves(args, consumer, queues, out)
        for mq in queues:
            state.offsets[mq] = _start_offset(consumer, mq, args.from_beginning)
        try:
            why = state.run(queues)
        except KeyboardInterrupt:
            why = "interrupted"
        try:
            state.commit()
        except ClientError as e:
            out.warn(f"could not commit the offsets of group {args.group}: {e}")
        out.info(f"consumed {state.printed} msgs ({why})")
        return 130 if why == "interrupted" else 0
    finally:
        consumer.close()
