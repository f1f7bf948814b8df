"""What the sync and async producers share: config, validation, the batch accumulator and the retry rules.

No I/O here. :class:`SendAttempts` is the retry loop of one send (SEMANTICS.md 4.6) without its requests; the
producers and :class:`client.lowlevel.BrokerClient` drive it. The accumulator implements automatic batching of concurrent sends as *group commit*:

* a send whose key (topic, or queue for explicit-queue sends) has nothing in flight goes out at once, alone --
  one caller never waits for a linger;
* otherwise it joins the key's pending list and waits; when the pending list has grown to a full batch and
  fewer than ``max_in_flight_per_queue`` requests are in flight, the newcomer sends it at once (a second
  request in flight then only carries a full batch: a woken sender that went out alone right after each
  completion kept batches at a third of their size);
* when a request completes, its sender takes the pending messages (up to ``batch_max_messages`` /
  ``batch_max_bytes``) as the next batch and hands the lead to the first of them, which sends it and hands on
  in turn. Batches thus grow with concurrency, and each caller gets its own SendResult from the batch's reply.

The pending bytes of all keys are bounded by ``buffer_max_bytes``: a caller that does not fit waits for room,
at most until its send timeout.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

from client._routing import FaultToleranceConfig, LatencyFaultTolerance, QueueSelector, TopicPublishInfo
from client.errors import BrokerError, ClientError, MessageIllegalError, SendFailedError
from client.protocol import codec
from client.protocol.codes import ResponseCode
from client.protocol.message import Message, MessageQueue
from client.protocol.properties import validate_group
from client.protocol.requests import SendRequestHeader

__all__ = [
    "RETRY_RESPONSE_CODES",
    "Accumulator",
    "Pending",
    "ProducerConfig",
    "SendAttempts",
    "check_batch",
    "encode_one",
    "is_retriable",
    "send_failed",
    "validate_message",
]

#: Broker codes after which the send is retried on another queue (4.9.3's set plus HEAD's SYSTEM_BUSY).
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.NO_PERMISSION, ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_BUYER_ID,
    ResponseCode.NOT_IN_CURRENT_UNIT,
})

_RESERVED_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"})


def _positive(_: Any, attribute: Any, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _non_negative(_: Any, attribute: Any, value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class ProducerConfig:
    """A producer's settings (RocketMQ ``DefaultMQProducer`` names, units last)."""

    group: str = attrs.field(validator=lambda _, __, v: validate_group(v))
    """Producer group."""
    send_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    """Total budget of one send across all its attempts."""
    retry_times_when_send_failed: int = attrs.field(default=2, validator=_non_negative)
    """Extra attempts (on other queues) after a failed one."""
    latency_fault_enable: bool = False
    """Isolate slow or failing brokers for a while (SEMANTICS.md 4.5)."""
    fault_tolerance: FaultToleranceConfig = attrs.field(factory=FaultToleranceConfig)
    """Isolation tables used when ``latency_fault_enable``."""
    max_message_size: int = attrs.field(default=codec.DEFAULT_MAX_MESSAGE_SIZE, validator=_positive)
    """Stored size limit of one message (``maxMessageSize``)."""
    batch_linger_s: float = attrs.field(default=0.0, validator=_non_negative)
    """Extra wait of a lone sender for company; 0 sends at once (batches form while requests are in flight)."""
    batch_max_messages: int = attrs.field(default=256, validator=_positive)
    """Messages in one automatic batch at most."""
    batch_max_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    """Encoded bytes in one automatic batch at most (a bigger single message goes alone)."""
    buffer_max_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    """Encoded bytes waiting in the accumulator at most (back-pressure beyond it)."""
    max_in_flight_per_queue: int = attrs.field(default=2, validator=_positive)
    """Requests in flight per topic (or per explicit queue) at most; beyond the first, only full batches."""
    close_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """Bound on waiting for in-flight sends at close."""


def validate_message(msg: object, max_message_size: int) -> Message:
    """Client-side checks before any I/O (RocketMQ ``Validators.checkMessage``).

    Raises:
        MessageIllegalError: not a Message, empty body, reserved topic, or too large.
    """
    if not isinstance(msg, Message):
        raise MessageIllegalError(f"expected a client.Message, got {type(msg).__name__}")
    if len(msg.body) == 0:
        raise MessageIllegalError(f"message body to topic {msg.topic} is empty")
    if len(msg.body) > max_message_size:
        raise MessageIllegalError(
            f"message body to topic {msg.topic} is {len(msg.body)} bytes, more than maxMessageSize {max_message_size}"
        )
    if msg.topic in _RESERVED_TOPICS:
        raise MessageIllegalError(f"topic {msg.topic} is reserved by the system and cannot be sent to")
    return msg


def encode_one(msg: Message, uniq_key: str, born_ms: int, max_message_size: int) -> bytes:
    """One send-batch item (items concatenate into a batch body)."""
    return codec.encode_batch([msg], born_timestamp_ms=born_ms, uniq_keys=[uniq_key], max_message_size=max_message_size)


class Pending:
    """One message waiting in (or leading) an automatic batch."""

    __slots__ = ("batch", "deadline", "error", "item", "lead", "result", "uniq_key", "waker")

    def __init__(self, item: bytes, uniq_key: str, deadline: float, waker: Any) -> None:
        self.item = item
        self.uniq_key = uniq_key
        self.deadline = deadline
        self.waker = waker
        self.result: Any = None
        self.error: BaseException | None = None
        self.lead = False
        self.batch: list[Pending] | None = None


class _KeyState:
    __slots__ = ("in_flight", "pending")

    def __init__(self) -> None:
        self.pending: deque[Pending] = deque()
        self.in_flight = 0


class Accumulator:
    """Group-commit state per key (see the module docstring). The caller serialises access."""

    def __init__(self, config: ProducerConfig) -> None:
        self._cfg = config
        self._keys: dict[Hashable, _KeyState] = {}
        self.pending_bytes = 0

    def has_room(self, size: int) -> bool:
        return self.pending_bytes == 0 or self.pending_bytes + size <= self._cfg.buffer_max_bytes

    def offer(self, key: Hashable, p: Pending) -> list[Pending] | None:
        """Add ``p``; returns the batch the caller must send now (``[p]``), or None when ``p`` waits."""
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = _KeyState()
        if st.in_flight == 0 and not st.pending:
            st.in_flight += 1
            return [p]
        st.pending.append(p)
        self.pending_bytes += len(p.item)
        if st.in_flight < self._cfg.max_in_flight_per_queue and len(st.pending) >= self._cfg.batch_max_messages:
            st.pending.pop()  # p leads the batch: it must come first
            self.pending_bytes -= len(p.item)
            batch = [p]
            self._fill(st, batch, len(p.item))
            st.in_flight += 1
            return batch
        return None

    def join_pending(self, key: Hashable, batch: list[Pending]) -> list[Pending]:
        """After a linger: the leader's batch plus whatever joined meanwhile, within the batch bounds."""
        st = self._keys[key]
        size = sum(len(p.item) for p in batch)
        self._fill(st, batch, size)
        return batch

    def complete(self, key: Hashable) -> list[list[Pending]]:
        """A request of ``key`` finished: the next batches to hand off (each led by its first member)."""
        st = self._keys[key]
        st.in_flight -= 1
        batches: list[list[Pending]] = []
        while st.pending and st.in_flight < self._cfg.max_in_flight_per_queue:
            batch: list[Pending] = []
            self._fill(st, batch, 0)
            st.in_flight += 1
            batch[0].lead = True
            batch[0].batch = batch
            batches.append(batch)
        if not st.pending and st.in_flight == 0:
            del self._keys[key]
        return batches

    def _fill(self, st: _KeyState, batch: list[Pending], size: int) -> None:
        cfg = self._cfg
        while st.pending and len(batch) < cfg.batch_max_messages:
            nxt = st.pending[0]
            if batch and size + len(nxt.item) > cfg.batch_max_bytes:
                break
            st.pending.popleft()
            self.pending_bytes -= len(nxt.item)
            size += len(nxt.item)
            batch.append(nxt)

    def in_flight(self) -> int:
        return sum(st.in_flight for st in self._keys.values())

    def drain(self) -> list[Pending]:
        """Every waiting message (at close): the caller fails them."""
        out: list[Pending] = []
        for st in self._keys.values():
            out.extend(st.pending)
            st.pending.clear()
        self.pending_bytes = 0
        return out


def check_batch(msgs: Sequence[Message], max_message_size: int) -> str:
    """Validate a user batch; returns its topic.

    Raises:
        MessageIllegalError: empty, mixed topics, or an invalid message.
    """
    if not msgs:
        raise MessageIllegalError("send_batch needs at least one message")
    topic = validate_message(msgs[0], max_message_size).topic
    for m in msgs:
        validate_message(m, max_message_size)
        if m.topic != topic:
            raise MessageIllegalError(f"a batch holds one topic: got {topic} and {m.topic}")
        if m.delay_level:
            raise MessageIllegalError("delayed messages cannot be sent in a batch (RocketMQ rule)")
    return topic


def send_failed(topic: str, attempts: list[tuple[str, Any]], elapsed_ms: int, timed_out: bool) -> SendFailedError:
    """The error of a send whose attempts all failed (RocketMQ's wording), or that ran out of time.

    Args:
        topic: the send's topic.
        attempts: ``(broker_name, error)`` of each failed attempt, in order.
        elapsed_ms: time spent on the send.
        timed_out: True when ``send_timeout_s`` ended the attempts.

    Returns:
        A :class:`SendFailedError` holding ``attempts``.
    """
    brokers = [b for b, _ in attempts]
    last = f"; last error: {attempts[-1][1]}" if attempts else ""
    if timed_out:
        msg = (f"send to topic {topic} ran out of send_timeout_s after {len(attempts)} attempt(s), cost "
               f"{elapsed_ms} ms, brokers sent: {brokers}{last}")
    else:
        msg = (f"Send [{len(attempts)}] times, still failed, cost [{elapsed_ms}]ms, Topic: {topic}, "
               f"BrokersSent: {brokers}{last}")
    return SendFailedError(msg, attempts=attempts)


def explicit_queue(message_queue: MessageQueue | None, topic: str) -> MessageQueue | None:
    if message_queue is None:
        return None
    if not isinstance(message_queue, MessageQueue):
        raise MessageIllegalError(f"message_queue must be a MessageQueue, got {type(message_queue).__name__}")
    if message_queue.topic != topic:
        raise MessageIllegalError(f"message to topic {topic} cannot go to queue {message_queue}")
    return message_queue


def is_retriable(err: ClientError) -> bool:
    """True when a send that failed with ``err`` is tried again on another queue (SEMANTICS.md 4.6).

    Broker answers are retried for :data:`RETRY_RESPONSE_CODES` only; other errors (a connection refused, a
    timeout) by their ``retriable`` flag.
    """
    if isinstance(err, BrokerError):
        return err.code in RETRY_RESPONSE_CODES
    return err.retriable


class SendAttempts:
    """The retry loop of one send (SEMANTICS.md 4.6) without its I/O: which queue next, when to stop, what to
    record. A driver asks :meth:`next` for the queue and time budget of each attempt, sends, and reports
    :meth:`succeeded` or :meth:`failed`; when :meth:`next` says None it raises :meth:`exhausted`.

    * queue: ``fixed`` when given (one attempt), else :class:`~client._routing.QueueSelector`'s round robin
      away from the previous failed attempt's broker (and, when fault tolerance is on, isolated brokers);
    * attempts: ``1 + retries`` at most, and none once ``deadline`` has passed;
    * a failure is retried only when :func:`is_retriable`; every attempt's latency feeds the fault table;
    * a broker that answered SERVICE_NOT_AVAILABLE (its store is not writeable: disk full, a disk error, or it is
      not a master) is not tried again in this send; when no other group has a queue, the send stops there.

    Args:
        info: the topic's writable queues.
        fixed: the explicit queue of the send, or None.
        deadline: the send's end on ``clock``.
        group: producer group named in the request.
        retries: extra attempts after a failed one (``retry_times_when_send_failed``).
        selector: the sender's round robin.
        fault: the sender's latency fault table.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, info: TopicPublishInfo, fixed: MessageQueue | None, deadline: float, *, group: str,
                 retries: int, selector: QueueSelector, fault: LatencyFaultTolerance,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.info = info
        self._fixed = fixed
        self._deadline = deadline
        self._group = group
        self._selector = selector
        self._fault = fault
        self._clock = clock
        self._left_attempts = 1 if fixed is not None else 1 + retries
        self._begin = clock()
        self._last_broker: str | None = None
        self._timed_out = False
        self._started_ms = 0
        self._unwritable: set[str] = set()
        self.attempts: list[tuple[str, ClientError]] = []
        """``(broker_name, error)`` of each failed attempt."""

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def next(self) -> tuple[MessageQueue, float] | None:
        """The queue and time budget (s) of the next attempt, or None when attempts or time ran out."""
        if self._left_attempts <= 0:
            return None
        self._left_attempts -= 1
        mq = self._fixed
        if mq is None:
            queues = self.info.message_queues
            if self._unwritable:
                queues = tuple(q for q in queues if q.broker_name not in self._unwritable)
                if not queues:
                    return None
            mq = self._selector.select(queues, self._last_broker, fault=self._fault, now_ms=self._now_ms())
        left = self._deadline - self._clock()
        if left <= 0:
            self._timed_out = True
            return None
        self._started_ms = self._now_ms()
        return mq, left

    def target(self, mq: MessageQueue) -> str:
        """Path and query of the attempt's ``POST /send`` to ``mq``."""
        info = self.info
        default_nums = sum(1 for q in info.message_queues if q.broker_name == mq.broker_name) \
            if info.from_default_topic else None
        return SendRequestHeader(mq.topic, mq.queue_id, self._group, default_topic_queue_nums=default_nums).target()

    def succeeded(self, mq: MessageQueue) -> None:
        """The attempt to ``mq`` stored the batch."""
        now = self._now_ms()
        self._fault.update_fault_item(mq.broker_name, now - self._started_ms, isolation=False, now_ms=now)

    def failed(self, mq: MessageQueue, err: ClientError) -> bool:
        """Record a failed attempt; True when another may follow (else the caller re-raises ``err``)."""
        self.attempts.append((mq.broker_name, err))
        self._last_broker = mq.broker_name
        now = self._now_ms()
        self._fault.update_fault_item(mq.broker_name, now - self._started_ms, isolation=True, now_ms=now)
        if not is_retriable(err):
            return False
        if isinstance(err, BrokerError) and err.code == ResponseCode.SERVICE_NOT_AVAILABLE:
            # The same broker cannot store it within this send; another group may. With no other group the
            # broker's own answer (code 14 and its remark) is what the user needs, not a SendFailedError.
            self._unwritable.add(mq.broker_name)
            return any(q.broker_name not in self._unwritable for q in self.info.message_queues)
        return True

    def exhausted(self) -> SendFailedError:
        """The error to raise when :meth:`next` said None."""
        return send_failed(self.info.topic, self.attempts, int((self._clock() - self._begin) * 1000),
                           self._timed_out)
