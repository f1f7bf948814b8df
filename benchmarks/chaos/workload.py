"""The chaos workload: producers and consumers of one topic spread over every broker group, through the SDK's
public API only.

* :class:`ProducerThread`: sends numbered messages (:func:`benchmarks.chaos.ledger.body_of`) one after the other,
  with ``send_batch`` (one request per batch) or ``send`` (several threads sharing a :class:`~client.Producer`,
  whose concurrent sends the SDK batches itself), paced at a rate, and writes every outcome in the
  :class:`~benchmarks.chaos.ledger.Ledger`. The SDK's own retries stay on (they are what a user gets);
  the ledger's attempt counter sees each of them.
* :class:`Consumers`: one :class:`~client.AsyncPullConsumer` on its own thread and event loop, one coroutine per
  queue, each pulling its queue from offset 0 wherever the SDK's read split sends it (the master, or a slave when
  the consumer is behind or the master is down); it records the key at every queue offset it is served, the
  offsets it was moved to, and when it last made progress.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from array import array
from collections.abc import Callable

import attrs

from benchmarks.chaos.ledger import Ledger, Location, body_of, key_of
from client import AsyncPullConsumer, Message, MessageQueue, Producer, PullStatus, SendResult, SendStatus
from client.errors import ClientError
from common.codec import decode_offset_msg_id

__all__ = ["ConsumedQueue", "Consumers", "ProducerThread"]

log = logging.getLogger(__name__)

#: Marks an offset a consumer was never served (it was moved past it).
GAP = -2


class ProducerThread(threading.Thread):
    """Sends numbered messages until :attr:`halt` is set; never raises (a crash is kept in :attr:`crash`).

    Args:
        index: producer number (the key's ``PPPP``).
        producer: the SDK producer (may be shared with other threads).
        topic: the topic.
        ledger: where outcomes go.
        group_index: broker name -> group number of :class:`~benchmarks.chaos.ledger.Location`.
        batch: messages per ``send_batch`` call; 1 sends each with ``send``.
        rate: messages per second at most (pacing, so a long run does not fill the disks).
        pad: body bytes after the key.
    """

    def __init__(self, index: int, producer: Producer, topic: str, ledger: Ledger, group_index: dict[str, int], *,
                 batch: int, rate: float, pad: bytes) -> None:
        super().__init__(name=f"chaos-producer-{index}", daemon=True)
        self.index = index
        self.producer = producer
        self.topic = topic
        self.ledger = ledger
        self.group_index = group_index
        self.batch = batch
        self.rate = rate
        self.pad = pad
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            sent = 0
            while not self.halt.is_set():
                due = t0 + sent / self.rate
                if self.halt.wait(max(0.0, due - time.monotonic())):  # pacing the load
                    return
                self._send_one_call()
                sent += self.batch
        except BaseException as e:  # kept for the report: a harness bug must not pass for a clean run
            self.crash = e
            log.exception("producer %d crashed", self.index)

    def _send_one_call(self) -> None:
        first = self.ledger.reserve(self.index, self.batch)
        msgs = [Message(self.topic, body_of(self.index, first + i, self.pad)) for i in range(self.batch)]
        try:
            results = self.producer.send_batch(msgs) if self.batch > 1 else [self.producer.send(msgs[0])]
        except ClientError as e:
            self.ledger.outcome(type(e).__name__, self.batch)
            return
        for i, r in enumerate(results):
            self._record(first + i, r)

    def _record(self, seq: int, r: SendResult) -> None:
        if r.send_status is not SendStatus.SEND_OK:
            self.ledger.outcome(r.send_status.value)
            return
        mq = r.message_queue
        where = Location(self.group_index[mq.broker_name], mq.queue_id, r.queue_offset)
        self.ledger.ack(self.index, seq, where, decode_offset_msg_id(r.offset_msg_id)[1])


@attrs.define
class ConsumedQueue:
    """What one consumer coroutine saw of its queue."""

    mq: MessageQueue
    offset: int = 0
    """Next offset to pull."""
    keys: array[int] = attrs.field(factory=lambda: array("q"))
    """Key served at each queue offset (``GAP`` where the consumer was moved past an offset)."""
    last_progress: float = attrs.field(factory=time.monotonic)
    """Monotonic time the offset last advanced."""
    reread_mismatches: int = 0
    """Offsets served twice with different keys."""
    moves: int = 0
    """Answers that moved the offset without serving messages (OFFSET_ILLEGAL and the like)."""
    gaps: int = 0
    """Offsets skipped."""
    errors: int = 0
    """Pulls that failed (every member unreachable)."""
    from_slave: int = 0
    """Messages a slave served."""
    done: bool = False

    def take(self, queue_offset: int, key: int) -> None:
        """Record the key served at ``queue_offset``."""
        keys = self.keys
        if queue_offset < len(keys):
            if keys[queue_offset] != key and keys[queue_offset] != GAP:
                self.reread_mismatches += 1
            keys[queue_offset] = key
            return
        if queue_offset > len(keys):
            self.gaps += queue_offset - len(keys)
            keys.extend([GAP] * (queue_offset - len(keys)))
        keys.append(key)


class Consumers:
    """One async pull consumer reading every queue of the topic (see the module docstring).

    Args:
        namesrv_addr: the nameservers.
        mqs: the queues.
        group: consumer group.
        deadline_s: bound on the whole life of the consumer thread.
    """

    def __init__(self, namesrv_addr: str, mqs: list[MessageQueue], group: str, deadline_s: float) -> None:
        self.namesrv_addr = namesrv_addr
        self.queues = {mq: ConsumedQueue(mq) for mq in mqs}
        self.group = group
        self.targets: dict[MessageQueue, int] | None = None
        """Set once production stopped: each coroutine ends once its offset reaches its queue's target."""
        self.abort = threading.Event()
        self.crash: BaseException | None = None
        self._deadline = time.monotonic() + deadline_s
        self._thread = threading.Thread(target=self._main, name="chaos-consumers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread; True when it ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def finished(self) -> bool:
        """Every queue reached its target."""
        return all(q.done for q in self.queues.values())

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:  # kept for the report
            self.crash = e
            log.exception("consumers crashed")

    async def _run(self) -> None:
        async with AsyncPullConsumer(self.group, self.namesrv_addr) as c:
            await asyncio.gather(*(self._consume(c, q) for q in self.queues.values()))

    def _stop_now(self, q: ConsumedQueue) -> bool:
        if self.abort.is_set() or time.monotonic() > self._deadline:
            return True
        targets = self.targets
        if targets is not None and q.offset >= targets.get(q.mq, 0):
            q.done = True
            return True
        return False

    async def _consume(self, c: AsyncPullConsumer, q: ConsumedQueue) -> None:
        while not self._stop_now(q):
            try:
                r = await c.pull(q.mq, q.offset, max_nums=256, timeout_s=3.0, suspend_timeout_s=0.5)
            except ClientError:
                q.errors += 1
                await asyncio.sleep(0.05)  # back off from a cluster with no member of this group up
                continue
            if r.pull_status is PullStatus.FOUND and r.msg_found_list:
                for m in r.msg_found_list:
                    q.take(m.queue_offset, key_of(m.body))
                if r.served_by_broker_id != 0:
                    q.from_slave += len(r.msg_found_list)
            elif r.next_begin_offset != q.offset:
                q.moves += 1
            if r.next_begin_offset > q.offset:
                q.last_progress = time.monotonic()
            q.offset = r.next_begin_offset


class StallMonitor:
    """Samples how long each consumer has been behind the messages of its queue without progress.

    A queue stalls while a message beyond its consumer's offset exists and the offset does not move; the stall
    is measured from the later of the two (the message's arrival, the last progress).

    Args:
        consumers: the consumers.
        high: ``mq -> 1 + highest offset known to exist`` (acknowledged, or seen on the master).
        clock: monotonic seconds.
    """

    def __init__(self, consumers: Consumers, high: Callable[[MessageQueue], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._consumers = consumers
        self._high = high
        self._clock = clock
        self._behind_since: dict[MessageQueue, float | None] = dict.fromkeys(consumers.queues)
        self.longest: dict[MessageQueue, float] = dict.fromkeys(consumers.queues, 0.0)
        """Longest stall of each queue, seconds."""

    def sample(self) -> None:
        now = self._clock()
        for mq, q in self._consumers.queues.items():
            if q.offset >= self._high(mq):
                self._behind_since[mq] = None
                continue
            since = self._behind_since[mq]
            if since is None:
                since = self._behind_since[mq] = now
            stall = now - max(since, q.last_progress)
            if stall > self.longest[mq]:
                self.longest[mq] = stall
