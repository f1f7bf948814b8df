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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from client._consumer import PullConsumer
from client._producer import Producer
from client._requests import SendResult
from client.cli._common import client_config, namesrv_of, open_admin, split_keys
from client.cli._output import Output, fmt_body, fmt_time_ms
from common.codes import PullStatus, SendStatus
from common.errors import ClientError, QueryNotFoundError, RouteNotFoundError, TopicNotExistError
from common.message import Message, MessageExt, MessageQueue

__all__ = ["cmd_consume", "cmd_msg_query", "cmd_produce", "message_json"]

#: Messages asked for per pull.
PULL_BATCH = 32
#: Pause between rounds over the queues when none had anything new (doubling up to the max).
IDLE_PAUSE_MIN_S = 0.02
IDLE_PAUSE_MAX_S = 0.5
#: How often the ``--count`` progress line is rewritten.
PROGRESS_EVERY_S = 0.2
#: ``--count``: messages and bytes per ``send_batch`` request (the broker's maxMessageSize bounds a batch at 4 MiB).
BATCH_MSGS_MAX = 256
BATCH_BYTES_MAX = 256 * 1024
#: Queues per broker group of a topic ``produce --create`` creates (as ``topic create``'s default).
CREATE_QUEUES = 8
#: ``produce``'s exit code when every message was stored but at least one without what its master promises:
#: SLAVE_NOT_AVAILABLE (no slave in sync), FLUSH_SLAVE_TIMEOUT (the slave did not confirm in time) or
#: FLUSH_DISK_TIMEOUT (SYNC_FLUSH did not finish in time). The message is on the master (no resend needed, a
#: resend would duplicate it) but not yet on its replica or disk: a script must not take it for SEND_OK.
EXIT_STORED_NOT_REPLICATED = 3


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


def _batch_len(size: int) -> int:
    """Messages per ``send_batch`` of ``--count``: up to BATCH_MSGS_MAX, and about BATCH_BYTES_MAX per request."""
    return max(1, min(BATCH_MSGS_MAX, BATCH_BYTES_MAX // max(size, 1)))


class _Unsafe:
    """Counts messages stored with a status other than SEND_OK, by status (shared by the sending threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_status: dict[str, int] = {}

    def note(self, r: SendResult) -> None:
        if r.send_status is SendStatus.SEND_OK:
            return
        with self._lock:
            self.by_status[r.send_status.name] = self.by_status.get(r.send_status.name, 0) + 1

    def exit_code(self, out: Output, total: int) -> int:
        """0 when every message got SEND_OK; else a warning line and :data:`EXIT_STORED_NOT_REPLICATED`."""
        if not self.by_status:
            return 0
        n = sum(self.by_status.values())
        statuses = ", ".join(f"{k} x{v}" for k, v in sorted(self.by_status.items()))
        out.warn(f"{n} of {total} msgs stored on the master without their replica or disk flush ({statuses}); "
                 f"exit code {EXIT_STORED_NOT_REPLICATED}: do not resend them (that would duplicate), check the "
                 f"slaves ('splitmq cluster list', 'splitmq broker status')")
        return EXIT_STORED_NOT_REPLICATED


class _Generated:
    """``--count N``: ``threads`` threads each send batches (one ``send_batch`` request, one queue) of generated
    messages until N are sent; the first error stops every thread.

    One message per request costs a round trip and a broker append each, about 1,600 msgs/s; a batch of a few
    hundred KiB amortises both, as ``send_batch`` does for the SDK (``python -m benchmarks cli`` measures both).
    """

    def __init__(self, producer: Producer, msg_of: Callable[[int], Message], count: int, threads: int,
                 batch_len: int) -> None:
        self._producer = producer
        self.unsafe = _Unsafe()
        self._msg_of = msg_of
        self._count = count
        self._batch_len = batch_len
        self._lock = threading.Lock()
        self._next = 0
        self.sent = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        batches = -(-count // batch_len)
        self.threads = [threading.Thread(target=self._work, daemon=True, name=f"splitmq-produce-{i}")
                        for i in range(min(threads, batches))]

    def _claim(self) -> range:
        with self._lock:
            first = self._next
            self._next = min(self._count, first + self._batch_len)
            return range(first, self._next)

    def _work(self) -> None:
        while not self.stop.is_set():
            todo = self._claim()
            if not todo:
                return
            try:
                if len(todo) == 1:  # a body near maxMessageSize would not fit a batch's envelope
                    results = [self._producer.send(self._msg_of(todo[0]))]
                else:
                    results = self._producer.send_batch([self._msg_of(i) for i in todo])
                for r in results:
                    self.unsafe.note(r)
            except Exception as e:  # handed to the main thread, which reports it
                with self._lock:
                    self.error = self.error or e
                self.stop.set()
                return
            with self._lock:
                self.sent += len(todo)


def _produce_generated(args: argparse.Namespace, producer: Producer, out: Output) -> int:
    keys = split_keys(args.keys)
    gen = _Generated(producer, lambda i: Message(args.topic, _payload(i, args.size), tags=args.tags, keys=keys),
                     args.count, args.threads, _batch_len(args.size))
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
    out.end_progress()
    secs = max(time.monotonic() - started, 1e-9)
    rate = gen.sent / secs
    if out.json_mode:
        out.json({"sent": gen.sent, "seconds": round(secs, 3), "msgsPerSecond": round(rate, 1)}, compact=True)
    else:
        out.line(f"sent {gen.sent} msgs in {secs:.2f} s ({rate:.1f} msgs/s)")
    if gen.error is not None:
        raise gen.error
    return 130 if interrupted else gen.unsafe.exit_code(out, gen.sent)


def _ensure_topic(args: argparse.Namespace, out: Output) -> None:
    """The topic must exist; with ``--create`` a missing one is created first (on every master, like
    ``topic create``). Without this check a typo would create a topic on brokers with autoCreateTopicEnable=true
    (off by default): the SDK sends a message for a topic the nameserver does not know through the ``TBW102``
    route, and such a broker creates it."""
    with open_admin(args) as adm:
        try:
            adm.topic_route(args.topic)
            return
        except RouteNotFoundError:
            if not args.create:
                raise ClientError(f"topic {args.topic} does not exist: check its name, or create it with "
                                  f"'splitmq topic create -t {args.topic}' or pass --create") from None
        adm.create_topic(args.topic, queue_nums=CREATE_QUEUES)
        out.info(f"created topic {args.topic} ({CREATE_QUEUES} queues per broker group, --create)")


def cmd_produce(args: argparse.Namespace, out: Output) -> int:
    """``produce -t TOPIC`` from args / stdin / ``--file`` (one line per message), or ``--count N --size B``."""
    if args.count is not None and (args.bodies or args.file):
        args.leaf.error("--count generates the bodies; do not also give BODY arguments or --file")
    if args.count is None and not args.bodies and not args.file:
        args.leaf.error("nothing to send: give BODY arguments, '-' for stdin, --file F, or --count N")
    _ensure_topic(args, out)
    producer = Producer(args.group, namesrv_of(args), send_timeout_s=args.timeout, client_config=client_config(args))
    try:
        if args.count is not None:
            return _produce_generated(args, producer, out)
        keys = split_keys(args.keys)
        n = 0
        unsafe = _Unsafe()
        for body in _bodies(args):
            r = producer.send(Message(args.topic, body, tags=args.tags, keys=keys))
            n += 1
            unsafe.note(r)
            if out.json_mode:
                out.json(_result_json(r), compact=True)
            else:
                out.line(_result_line(r))
        out.info(f"sent {n} msgs")
        return unsafe.exit_code(out, n)
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
        self.unsynced: dict[str, TopicNotExistError] = {}
        """``--from-slave``: broker groups whose slave does not know the topic yet, with its last answer."""

    def remaining(self) -> int | None:
        return None if self.args.count is None else self.args.count - self.printed

    def pull_once(self, mq: MessageQueue) -> bool:
        """One pull of ``mq``; True when it printed a message."""
        left = self.remaining()
        try:
            res = self.consumer.pull(mq, self.offsets[mq], min(PULL_BATCH, left or PULL_BATCH), self.args.subexpr,
                                     timeout_s=self.args.timeout)
        except TopicNotExistError as e:
            if not (self.args.from_slave and e.broker_role == "SLAVE"):
                raise
            # The master has the topic (the route came from it) but the slave copies its master's topics only
            # every slaveMetadataSyncInterval: a topic created a moment ago is not there yet. Ask again later.
            self.unsynced[mq.broker_name] = e
            return False
        self.unsynced.pop(mq.broker_name, None)
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
                if self.unsynced:
                    names = ", ".join(sorted(self.unsynced))
                    raise ClientError(f"the slave of {names} still does not know topic {self.args.topic} after "
                                      f"{self.args.timeout:g} s (it copies its master's topics every "
                                      f"slaveMetadataSyncInterval ms): try again, raise --timeout, or drop "
                                      f"--from-slave")
                return f"no new message for {self.args.timeout:g} s"
            # Polling, not long polling: one parked pull per queue in turn would delay the other queues.
            time.sleep(min(pause, idle_deadline - now))
            pause = min(pause * 2, IDLE_PAUSE_MAX_S)


def _check_slaves_read(args: argparse.Namespace, consumer: PullConsumer, queues: list[MessageQueue],
                       out: Output) -> None:
    """``--from-slave``: fail before the first pull when a group's slave will not serve reads.

    A slave with ``slaveReadEnable=false`` answers a pull by sending the consumer back to its master while its
    master is up (docs/HA.md), so ``--from-slave`` would print messages read off the master under a flag that
    promised the slave. The slave's own ``GET /runtime`` says so in one request per group, before any pull: the
    cheapest signal that does not depend on the group's traffic. A group without a slave, or one that does not
    answer, gets a warning (the pull goes to another member, and ``served-by`` shows which).

    Raises:
        ClientError: a slave has ``slaveReadEnable=false``; names the key to set.
    """
    off: list[str] = []
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
                off.append(f"{name}[1] ({addr})")
    if off:
        raise ClientError(f"--from-slave: slave reads are off on {', '.join(off)}: set slaveReadEnable=true in "
                          f"the broker group's broker.properties (master and slaves; 'splitmq cluster up' sets it) "
                          f"and restart it, or drop --from-slave")


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
            _check_slaves_read(args, consumer, queues, out)
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
