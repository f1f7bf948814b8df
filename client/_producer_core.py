"""What the sync and async producers share: config, validation, the batch accumulator and the retry rules.

No I/O here. :class:`SendAttempts` is the retry loop of one send (docs/BEHAVIOUR.md 4.6) without its requests; the
producers and :class:`client.lowlevel.BrokerClient` drive it. For the producers it also rides through a change of
a broker group's master (issue 12): when the group's master is gone and no other group can take the message, the
send re-reads the route until a new master registers, within its deadline (see :class:`SendAttempts`). The
accumulator implements automatic batching of concurrent sends as *group commit*:

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

import enum
import functools
import random
import time
import zlib
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

from client._routing import FaultToleranceConfig, LatencyFaultTolerance, QueueSelector, TopicPublishInfo
from common import codec
from common.codes import Perm, ResponseCode
from common.errors import (
    AccessDeniedError,
    BrokerConnectError,
    BrokerError,
    BrokerNotFoundError,
    ClientError,
    InvalidParameterError,
    MessageIllegalError,
    ProtocolViolationError,
    SendFailedError,
    TransportError,
)
from common.message import Message, MessageQueue
from common.properties import validate_group
from common.requests import SendRequestHeader

__all__ = [
    "MASTER_POLL_S",
    "RETRY_RESPONSE_CODES",
    "SAME_MASTER_RETRY_S",
    "Accumulator",
    "MasterVerdict",
    "MessageQueueSelector",
    "Pending",
    "ProducerConfig",
    "SendAttempts",
    "SendWhere",
    "Sharding",
    "check_batch",
    "encode_one",
    "group_for_key",
    "is_retriable",
    "lost_master",
    "may_be_stored",
    "select_by_hash",
    "send_failed",
    "sharding_hash",
    "validate_message",
]

#: Broker codes after which the send is retried on another queue (4.9.3's set plus HEAD's SYSTEM_BUSY).
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.NO_PERMISSION, ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_BUYER_ID,
    ResponseCode.NOT_IN_CURRENT_UNIT,
})

#: Bounds of the pause between two route reads of a send waiting for a new master (uniformly drawn, so the
#: producers of a big fleet do not ask the nameservers in step after a failover).
MASTER_POLL_S = (0.1, 0.2)

#: While the route still names the master address that failed, the send tries that address again at most this
#: often (an attempt of its budget): a master restarted at its own address, or a leader elected again, never
#: changes the route.
SAME_MASTER_RETRY_S = 1.0

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
    """Isolate slow or failing brokers for a while (docs/BEHAVIOUR.md 4.5)."""
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
    send_async_threads: int = attrs.field(default=16, validator=_positive)
    """Threads of ``Producer.send_async`` (started at its first call): its sends in flight at most."""
    idempotent: bool = True
    """Each message is stored once within the broker's duplicate window, whatever retries and re-sends of it
    happen (docs/GUIDE.md, "Idempotent sends"): its sends carry ``SysFlag.IDEMPOTENT``, a retry after an attempt
    that may have stored it stays in that broker group (waiting there for a new master), and a ``Message`` sent
    again after a send that did not end in SEND_OK keeps its key and group."""


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


def encode_one(msg: Message, uniq_key: str, born_ms: int, max_message_size: int, sys_flag: int = 0) -> bytes:
    """One send-batch item (items concatenate into a batch body)."""
    return codec.encode_item(msg, born_timestamp_ms=born_ms, uniq_key=uniq_key, max_message_size=max_message_size,
                             sys_flag=sys_flag)


class Pending:
    """One message waiting in (or leading) an automatic batch."""

    __slots__ = ("batch", "deadline", "error", "group", "item", "lead", "msg", "result", "uniq_key", "waker")

    def __init__(self, item: bytes, uniq_key: str, deadline: float, waker: Any) -> None:
        self.item = item
        self.uniq_key = uniq_key
        self.deadline = deadline
        self.waker = waker
        self.result: Any = None
        self.error: BaseException | None = None
        self.lead = False
        self.batch: list[Pending] | None = None
        self.msg: Message | None = None
        """The message (its key and group are kept on it when the send does not end in SEND_OK)."""
        self.group: str | None = None
        """After a failure: the group that may hold the message (an idempotent send's pinned group)."""


class SendWhere:
    """Where a failed send's attempts went: the group that may hold its messages (the pinned group of an
    idempotent send, :attr:`SendAttempts.pinned`), or None."""

    __slots__ = ("group",)

    def __init__(self) -> None:
        self.group: str | None = None


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
        if m.delay_level or m.deliver_at_ms is not None or m.delay_s is not None:
            raise MessageIllegalError("delayed and timed messages cannot be sent in a batch (RocketMQ rule)")
    return topic


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


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
    head = f"send to topic {topic} failed after {_attempts(len(attempts))} in {elapsed_ms} ms"
    if timed_out:
        msg = f"{head}: send_timeout_s ran out; brokers sent: {brokers}{last}"
    else:  # RocketMQ's wording follows, for those who search their logs for it
        msg = f"{head} (Send [{len(attempts)}] times, still failed); brokers sent: {brokers}{last}"
    return SendFailedError(msg, attempts=attempts)


def explicit_queue(message_queue: MessageQueue | None, topic: str) -> MessageQueue | None:
    if message_queue is None:
        return None
    if not isinstance(message_queue, MessageQueue):
        raise MessageIllegalError(f"message_queue must be a MessageQueue, got {type(message_queue).__name__}")
    if message_queue.topic != topic:
        raise MessageIllegalError(f"message to topic {topic} cannot go to queue {message_queue}")
    return message_queue


#: RocketMQ's ``MessageQueueSelector``: ``selector(queues, msg, arg)`` returns the queue of ``msg``, one of
#: ``queues`` (the topic's writable queues, in the same order in every producer).
MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def sharding_hash(key: str) -> int:
    """The stable hash of a sharding key: CRC-32 of its UTF-8 bytes (an unsigned 32-bit integer).

    Python's ``hash()`` of a str is salted per process, so two producers would put one key on two queues; CRC-32
    is the same everywhere. (RocketMQ's Java ``SelectMessageQueueByHash`` uses ``abs(String.hashCode())``; a
    topic fed by Java and Python producers with the same keys needs a selector that reproduces that.)
    """
    return zlib.crc32(key.encode("utf-8"))


def select_by_hash(queues: Sequence[MessageQueue], msg: Message, key: Any) -> MessageQueue:
    """The selector behind ``sharding_key`` (RocketMQ's ``SelectMessageQueueByHash``):
    ``queues[sharding_hash(key) % len(queues)]``, so a key keeps its queue while the count of writable queues
    does not change."""
    return queues[sharding_hash(str(key)) % len(queues)]


@attrs.frozen
class Sharding:
    """How an ordered send picks its queue: a selector and the argument it is called with."""

    selector: MessageQueueSelector
    """``selector(queues, msg, arg) -> MessageQueue``."""
    arg: Any
    """The selector's third argument (the sharding key for :func:`select_by_hash`)."""

    @classmethod
    def of(cls, queue: MessageQueue | None, sharding_key: str | None, selector: MessageQueueSelector | None,
           arg: Any) -> Sharding | None:
        """The sharding of a send's arguments, or None when the send names neither a key nor a selector.

        Raises:
            InvalidParameterError: a key that is not a non-empty str, a selector that is not callable, both a key
                and a selector, or either with an explicit queue.
        """
        if sharding_key is None and selector is None:
            return None
        if queue is not None:
            raise InvalidParameterError("send to an explicit queue or by sharding_key / selector, not both")
        if sharding_key is not None:
            if selector is not None:
                raise InvalidParameterError("give a sharding_key or a selector, not both")
            if not isinstance(sharding_key, str) or not sharding_key:
                raise InvalidParameterError(f"sharding_key must be a non-empty str, got {sharding_key!r:.60}")
            return cls(select_by_hash, sharding_key)
        if not callable(selector):
            raise InvalidParameterError(f"selector must be callable, got {type(selector).__name__}")
        return cls(selector, arg)

    def choose(self, info: TopicPublishInfo, msg: Message) -> MessageQueue:
        """The queue of ``msg`` among the topic's writable queues.

        Raises:
            InvalidParameterError: the selector returned something that is not one of the queues it was given.
        """
        queues = list(info.message_queues)
        mq = self.selector(queues, msg, self.arg)
        if mq not in info.message_queues:
            raise InvalidParameterError(f"the queue selector returned {mq!r:.80}, not one of the {len(queues)} "
                                        f"writable queues of topic {info.topic} it was given")
        return mq


def is_retriable(err: ClientError) -> bool:
    """True when a send that failed with ``err`` is tried again on another queue (docs/BEHAVIOUR.md 4.6).

    Broker answers are retried for :data:`RETRY_RESPONSE_CODES` only; other errors (a connection refused, a
    timeout) by their ``retriable`` flag.
    """
    if isinstance(err, AccessDeniedError):  # the ACL: every broker would say the same
        return False
    if isinstance(err, BrokerError):
        return err.code in RETRY_RESPONSE_CODES
    return err.retriable


def lost_master(err: ClientError) -> bool:
    """True when ``err`` says that the attempt's group has no master at the address tried (issue 12).

    That is a broker answering SERVICE_NOT_AVAILABLE as a ``SLAVE`` (a follower, or a leader that stepped down),
    a connection refused, reset or not opened in time (the master's process is gone), or no master address in
    the route at all. A connection lost after the request went out counts too: the broker may have stored the
    message, and it is sent again as RocketMQ does (a duplicate has the same ``UNIQ_KEY``).

    A read timeout does not count: the master was reached and may only be slow, and the attempt already used
    what was left of the send's deadline (each attempt's timeout is the time left). SERVICE_NOT_AVAILABLE from a
    master (disk full, a disk error) does not count either: the master is there, its store is not writeable.
    """
    if isinstance(err, BrokerError):
        return err.code == ResponseCode.SERVICE_NOT_AVAILABLE and err.broker_role == "SLAVE"
    return isinstance(err, BrokerConnectError | BrokerNotFoundError)


def may_be_stored(err: ClientError) -> bool:
    """True when an attempt that failed with ``err`` may have stored the message (issue 38): its answer was lost
    or came after the store. An idempotent send's next attempts then go to the same broker group, whose duplicate
    window alone can tell.

    That is a request that may have left (a reset connection, no answer in time: ``request_sent``), an answer we
    cannot read, and the codes a broker answers after an append: SYSTEM_BUSY and SYSTEM_ERROR (DLedger's quorum
    wait timed out), SERVICE_NOT_AVAILABLE from a ``SLAVE`` (a leader that stepped down while it waited; a
    follower refusing says the same, and the retry then waits for the group's new leader). Not stored: no
    connection made, no address in the route, any other code (a refusal before the store).
    """
    if isinstance(err, BrokerError):
        return err.code in _AFTER_APPEND_CODES or (err.code == ResponseCode.SERVICE_NOT_AVAILABLE
                                                   and err.broker_role == "SLAVE")
    if isinstance(err, TransportError):
        return err.request_sent
    return isinstance(err, ProtocolViolationError)


_AFTER_APPEND_CODES = frozenset({ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY})


def group_for_key(info: TopicPublishInfo, key: str) -> str | None:
    """The broker group a caller's key goes to: ``crc32(key)`` over the names of every group in the topic's route
    that has write permission, master or not (so an outage does not move keys), sorted; None when there is none.
    A replay of the key from any producer lands where the first send did while the topic's groups stay the
    same, so that group's duplicate window sees it. A caller placing many keys takes :func:`key_group_names`
    once and :func:`group_among` per key."""
    return group_among(key_group_names(info), key)


def key_group_names(info: TopicPublishInfo) -> list[str]:
    """The groups :func:`group_for_key` hashes keys over, sorted: every group with write permission in the
    route, master or not (else the groups of its writable queues)."""
    return sorted({qd.broker_name for qd in info.route.queue_datas if Perm.writeable(qd.perm)}) or sorted(
        {q.broker_name for q in info.message_queues})


def group_among(names: Sequence[str], key: str) -> str | None:
    """The group of :func:`key_group_names` ``names`` that ``key`` goes to; None when there is none."""
    return names[zlib.crc32(key.encode("utf-8")) % len(names)] if names else None


def master_gone(topic: str, lost: dict[str, set[str]], attempts: list[tuple[str, Any]], elapsed_ms: int,
                route_reads: int) -> SendFailedError:
    """The error of a send that waited for a new master until its deadline.

    Args:
        topic: the send's topic.
        lost: each group whose master was lost in this send, with the addresses that failed.
        attempts: ``(broker_name, error)`` of each failed attempt, in order.
        elapsed_ms: time spent on the send.
        route_reads: how many times the route was read while waiting.

    Returns:
        A :class:`SendFailedError` holding ``attempts``.
    """
    groups = ", ".join(f"{name} (tried {', '.join(sorted(addrs)) or 'no address'})"
                       for name, addrs in sorted(lost.items()))
    names = " / ".join(sorted(lost))
    last = f"; last error: {attempts[-1][1]}" if attempts else ""
    msg = (f"send to topic {topic} failed after {_attempts(len(attempts))} in {elapsed_ms} ms: the master of broker "
           f"group {groups} changed or was unreachable, and no new master registered at the nameserver within "
           f"send_timeout_s ({route_reads} route read(s)). Check that {names} has a running master registered with "
           f"the nameservers (splitmq cluster list; splitmq topic route -t {topic}), or raise send_timeout_s to "
           f"ride out a longer election{last}")
    return SendFailedError(msg, attempts=attempts)


class MasterVerdict(enum.Enum):
    """What a send waiting for a new master does after a route read (:meth:`SendAttempts.route_read`)."""

    RETRY = "retry"
    """A lost group has a master to try now: its address changed, or the same address is due again."""
    POLL = "poll"
    """Pause :meth:`SendAttempts.poll_pause_s`, then read the route again."""
    GIVE_UP = "give up"
    """The deadline passed: raise :meth:`SendAttempts.exhausted`."""


@functools.lru_cache(maxsize=4096)
def send_target(topic: str, queue_id: int, group: str, default_topic_queue_nums: int | None) -> str:
    """Path and query of a ``POST /send`` (:meth:`SendRequestHeader.target`), built once per queue: a producer
    sends to the same few queues again and again, and building it cost a few µs of every send."""
    return SendRequestHeader(topic, queue_id, group, default_topic_queue_nums=default_topic_queue_nums).target()


class SendAttempts:
    """The retry loop of one send (docs/BEHAVIOUR.md 4.6) without its I/O: which queue next, when to stop, what to
    record. A driver asks :meth:`next` for the queue and time budget of each attempt, sends, and reports
    :meth:`succeeded` or :meth:`failed`; when :meth:`next` says None it raises :meth:`exhausted`.

    * queue: ``fixed`` when given (one attempt), else :class:`~client._routing.QueueSelector`'s round robin
      away from the previous failed attempt's broker (and, when fault tolerance is on, isolated brokers);
    * attempts: ``1 + retries`` at most, and none once ``deadline`` has passed;
    * a failure is retried only when :func:`is_retriable`; every attempt's latency feeds the fault table;
    * a broker that answered SERVICE_NOT_AVAILABLE (its store is not writeable: disk full, a disk error, or it is
      not a master) is not tried again in this send; when no other group has a queue, the send stops there.

    With ``await_master`` (the producers; not for an explicit queue) a send also rides through a change of a
    group's master. When an attempt fails because the group has no master at the address tried
    (:func:`lost_master`) and no other group can take the message (every other one lost its master too or is
    not writeable), :meth:`failed` says stop and sets :attr:`awaiting`. The driver then reads the topic's route
    at once and reports each read to :meth:`route_read`, pausing :meth:`poll_pause_s` (0.1-0.2 s) between
    reads, until the verdict is RETRY (the next :meth:`next` gives a queue of that group) or GIVE_UP (the
    deadline passed; :meth:`exhausted` says that no new master registered). A group is retried as soon as its
    master address differs from every one that failed in this send, and the same address again every
    ``same_master_retry_s``, because a master restarted at its address or a leader elected again leaves the route
    as it was.

    The budget (issue 40): a send makes at most ``1 + retries`` attempts, as RocketMQ, counting the attempts on
    an address that failed before in this send; the wait itself uses none. The one exception is a master address
    the route names for the first time in this send (a new master or leader): it is tried at once, with an
    attempt beyond the budget, because the attempts spent on the old master say nothing of it. So the attempts
    are bounded by ``1 + retries`` plus the number of new masters that register within the deadline; with every
    master refusing and no change in the route, a send makes exactly ``1 + retries`` attempts and then waits
    for a new master until its deadline. An address that failed is tried again (it may have restarted there, or
    been elected again) with the attempts left spread over the time left, at least ``same_master_retry_s``
    apart.

    With ``idempotent`` (issue 38) an attempt that may have stored the message (:func:`may_be_stored`) pins the
    send to its group: :attr:`pinned` is set, every later attempt goes to a queue of that group, and a lost
    master there makes the send wait for the group's new master (with ``await_master``) even when other groups
    could take it -- only that group's duplicate window can tell a retry from a new message. ``pinned`` given at
    the start (a message sent again, a caller's key) pins it from the first attempt; a pinned group without a
    writable queue in the route is waited for like a lost master.

    Args:
        info: the topic's writable queues.
        fixed: the explicit queue of the send, or None.
        deadline: the send's end on ``clock``.
        group: producer group named in the request.
        retries: extra attempts after a failed one (``retry_times_when_send_failed``).
        selector: the sender's round robin.
        fault: the sender's latency fault table.
        clock: monotonic seconds (injected by tests).
        await_master: wait for a new master as above (else a lost master is one more retriable failure).
        rand: uniform random source in [0, 1) for the pause between route reads (injected by tests).
        poll_s: bounds of the pause between route reads.
        same_master_retry_s: the least pause before an address that failed is tried again while the route still
            names it.
        idempotent: pin the send to a group that may hold it (above).
        pinned: the group the send is pinned to from the start (None: none yet).
    """

    def __init__(self, info: TopicPublishInfo, fixed: MessageQueue | None, deadline: float, *, group: str,
                 retries: int, selector: QueueSelector, fault: LatencyFaultTolerance,
                 clock: Callable[[], float] = time.monotonic, await_master: bool = False,
                 rand: Callable[[], float] = random.random, poll_s: tuple[float, float] = MASTER_POLL_S,
                 same_master_retry_s: float = SAME_MASTER_RETRY_S, idempotent: bool = False,
                 pinned: str | None = None) -> None:
        self.info = info
        self._idempotent = idempotent
        self.pinned = None if fixed is not None else pinned
        """The group every attempt goes to (None: any): one that may hold the message (``idempotent``)."""
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
        self._await_master = await_master and fixed is None
        self._rand = rand
        self._poll_s = poll_s
        self._same_master_retry_s = same_master_retry_s
        self._lost: dict[str, set[str]] = {}
        self._resume: tuple[str, str] | None = None
        self._attempt_addr: str | None = None
        self._same_retry_at = 0.0
        self._gave_up = False
        self.route_reads = 0
        """Route reads reported to :meth:`route_read`."""
        self.awaiting: str | None = None
        """The group whose lost master made :meth:`failed` stop, until the next :meth:`next`; None otherwise."""
        self.attempts: list[tuple[str, ClientError]] = []
        """``(broker_name, error)`` of each failed attempt."""

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def next(self) -> tuple[MessageQueue, float] | None:
        """The queue and time budget (s) of the next attempt, or None when attempts or time ran out (or, with
        :attr:`awaiting` set, when the pinned group has no writable queue in the route yet)."""
        self.awaiting = None
        mq = self._pick()
        if mq is None:
            return None
        left = self._deadline - self._clock()
        if left <= 0:
            self._timed_out = True
            return None
        self._started_ms = self._now_ms()
        return mq, left

    def _pick(self) -> MessageQueue | None:
        self._attempt_addr = None
        if self._resume is not None:
            (name, self._attempt_addr), self._resume = self._resume, None
            queues = tuple(q for q in self.info.message_queues if q.broker_name == name)
            return self._selector.select(queues, None, fault=self._fault, now_ms=self._now_ms())
        if self._left_attempts <= 0:
            return None
        self._left_attempts -= 1
        if self._fixed is not None:
            return self._fixed
        queues = self.info.message_queues
        if self.pinned is not None:
            name = self.pinned
            queues = tuple(q for q in queues if q.broker_name == name)
            if not queues:  # the group has no master in the route (yet): wait for one, as for a lost master
                self._left_attempts += 1
                if self._await_master:
                    self._lost.setdefault(name, set())
                    self.awaiting = name
                return None
            return self._selector.select(queues, None, fault=self._fault, now_ms=self._now_ms())
        if self._unwritable:
            queues = tuple(q for q in queues if q.broker_name not in self._unwritable)
            if not queues:
                return None
        return self._selector.select(queues, self._last_broker, fault=self._fault, now_ms=self._now_ms())

    def target(self, mq: MessageQueue) -> str:
        """Path and query of the attempt's ``POST /send`` to ``mq``."""
        info = self.info
        default_nums = sum(1 for q in info.message_queues if q.broker_name == mq.broker_name) \
            if info.from_default_topic else None
        return send_target(mq.topic, mq.queue_id, self._group, default_nums)

    def succeeded(self, mq: MessageQueue) -> None:
        """The attempt to ``mq`` stored the batch."""
        now = self._now_ms()
        self._fault.update_fault_item(mq.broker_name, now - self._started_ms, isolation=False, now_ms=now)

    def failed(self, mq: MessageQueue, err: ClientError) -> bool:
        """Record a failed attempt; True when another may follow (else the caller re-raises ``err``, unless
        :attr:`awaiting` says to wait for a new master)."""
        name = mq.broker_name
        self.attempts.append((name, err))
        self._last_broker = name
        now = self._now_ms()
        self._fault.update_fault_item(name, now - self._started_ms, isolation=True, now_ms=now)
        if not is_retriable(err):
            return False
        if self._idempotent and self.pinned is None and self._fixed is None and may_be_stored(err):
            self.pinned = name
        if self.pinned is not None:
            if self._await_master and lost_master(err):  # only this group's window can tell: wait for it
                self._lost.setdefault(name, set()).update(a for a in (err.broker_addr, self._attempt_addr) if a)
                self.awaiting = name
                self._same_retry_at = self._same_retry_due()
                return False
            return True
        if self._await_master and lost_master(err):
            # The address the error names, and the one this attempt was resumed on: were the broker to name
            # itself otherwise than the route does, the route's address must still count as tried.
            self._lost.setdefault(name, set()).update(a for a in (err.broker_addr, self._attempt_addr) if a)
            if not any(q.broker_name not in self._lost and q.broker_name not in self._unwritable
                       for q in self.info.message_queues):
                self.awaiting = name
                self._same_retry_at = self._same_retry_due()
                return False
        if isinstance(err, BrokerError) and err.code == ResponseCode.SERVICE_NOT_AVAILABLE:
            # The same broker cannot store it within this send; another group may. With no other group the
            # broker's own answer (code 14 and its remark) is what the user needs, not a SendFailedError.
            self._unwritable.add(name)
            return any(q.broker_name not in self._unwritable for q in self.info.message_queues)
        return True

    def route_read(self, master_of: Callable[[str], str | None], info: TopicPublishInfo | None
                   ) -> MasterVerdict:
        """What a send waiting for a new master does after reading the route.

        Args:
            master_of: a group's master address in the route just read (None: no master registered).
            info: the topic's writable queues in that route (None: as before).

        Returns:
            RETRY (:meth:`next` then gives a queue of the group to try), POLL, or GIVE_UP.
        """
        self.route_reads += 1
        if info is not None:
            self.info = info
        now = self._clock()
        for name in sorted(self._lost):
            addr = master_of(name)
            tried = self._lost[name]
            again = addr in tried
            if addr is None or (again and (now < self._same_retry_at or self._left_attempts <= 0)):
                continue
            if not any(q.broker_name == name for q in self.info.message_queues):
                continue  # the route lists no writable queue of the group (yet)
            if again:
                self._left_attempts -= 1  # the same master again: one of the send's attempts
            else:
                self._fault.remove(name)  # an isolation earned by the old master says nothing of the new one
            self._unwritable.discard(name)
            self._resume = (name, addr)
            return MasterVerdict.RETRY
        if now >= self._deadline:
            self._gave_up = True
            return MasterVerdict.GIVE_UP
        return MasterVerdict.POLL

    def _same_retry_due(self) -> float:
        """When an address that failed may be tried again while the route still names it: the attempts left are
        spread over the time left (the last one well before the deadline), at least ``same_master_retry_s`` apart,
        so that a master restarted at its address late in the send is still tried."""
        now = self._clock()
        gap = (self._deadline - now) / (self._left_attempts + 1)
        return now + max(self._same_master_retry_s, gap)

    @property
    def resuming(self) -> tuple[str, str] | None:
        """The group and master address the next attempt goes to after a RETRY verdict, else None."""
        return self._resume

    def poll_pause_s(self) -> float:
        """The pause before the next route read: drawn from ``poll_s``, never past the deadline."""
        lo, hi = self._poll_s
        return max(0.0, min(lo + (hi - lo) * self._rand(), self._deadline - self._clock()))

    def exhausted(self) -> SendFailedError:
        """The error to raise when :meth:`next` said None, or :meth:`route_read` said GIVE_UP."""
        elapsed_ms = int((self._clock() - self._begin) * 1000)
        if self._lost and (self._gave_up or (self._timed_out and self.route_reads)):
            return master_gone(self.info.topic, self._lost, self.attempts, elapsed_ms, self.route_reads)
        return send_failed(self.info.topic, self.attempts, elapsed_ms, self._timed_out)
