"""``Producer`` and ``AsyncProducer``: two thin I/O shells over :mod:`client._producer_core`.

Every send is an operation of ``_ProducerBase`` (:func:`client._ops.send_op` underneath), run by the client
instance's ``drive``; only the waits of automatic batching (a Condition, or futures on the loop) and the pause
between two route reads of a send waiting for a new master (``time.sleep`` or ``asyncio.sleep``) are twins.

Sends go to masters only. A send picks a queue with :class:`~client._routing.QueueSelector` (avoiding the broker
of the previous failed attempt, and isolated brokers when latency fault tolerance is on), retries retryable
failures within ``send_timeout_s`` (docs/BEHAVIOUR.md 4.6), waits within it for a new master when its group's master
is gone and no other group can take the message (:class:`~client._producer_core.SendAttempts`), and returns a :class:`SendResult` also for codes 10/11/12
(stored, not fully durable). Concurrent sends to one topic are batched automatically (see ``_producer_core``).

Ordered sends (``sharding_key=`` or ``selector=``/``arg=``, RocketMQ's ``send(msg, selector, arg)``): the queue
is chosen once, from the topic's writable queues in the route (groups by name, ids ascending: the same list in
every producer), then the message goes to that queue as an explicit-queue send -- one attempt, never retried on
another queue, as RocketMQ's orderly send, because a retry elsewhere would put the key's later messages ahead of
earlier ones in another queue. When the master of the key's queue is down the send fails (the caller decides
whether to retry it); once the nameserver drops that master from the route (its unregistration, or the broker
expiry), the writable queue count shrinks and keys re-hash over the queues left, so a key's order holds within
each stretch of an unchanged route, as with RocketMQ's ``SelectMessageQueueByHash``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import operator
import threading
import time
from collections.abc import Generator, Hashable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from client import _requests as rq
from client._conditions import CountedCondition
from client._delivery import AsyncSendFuture, DeliveryCallback, SendFuture, check_callback, outcome_of, report
from client._instance import (
    AsyncClientInstance,
    ClientConfig,
    ClientInstance,
    ClientState,
    _InstanceCore,
    with_credentials,
)
from client._lifecycle import AsyncLifecycle, SyncLifecycle
from client._metrics import ClientMetrics
from client._ops import send_op
from client._producer_core import (
    Accumulator,
    MasterVerdict,
    MessageQueueSelector,
    Pending,
    ProducerConfig,
    SendAttempts,
    SendWhere,
    Sharding,
    check_batch,
    encode_one,
    explicit_queue,
    group_for_key,
    validate_message,
)
from client._requests import Answer, Exchange, Op, SendResult
from client._routing import (
    DEFAULT_TOPIC,
    LatencyFaultTolerance,
    QueueSelector,
    TopicPublishInfo,
    normalize_namesrv_addr,
)
from client.tracing import ProducerSpan, start_send
from common import codec
from common.codes import SendStatus, SysFlag
from common.errors import ClientClosedError, ClientError, RequestTimeoutError, SendFailedError
from common.message import (
    Message,
    MessageQueue,
    any_resend_state,
    forget_resend,
    keep_for_resend,
    resend_state,
)
from common.signing import Credentials

__all__ = ["AsyncProducer", "Producer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Pause(NamedTuple):
    """A pause a send operation asks its driver for: the wait between two route reads for a new master."""

    seconds: float


#: An operation that may also yield a :class:`_Pause` (run by ``Producer._run`` / ``AsyncProducer._run``).
_PausingOp = Generator[Exchange | _Pause, Answer, T]


class _Stretches(Generic[T]):
    """Runs a pausing operation as plain operations (:data:`client._requests.Op`), one per stretch between
    two pauses.

    The instances' ``drive`` makes requests and nothing else; a send waiting for a new master must also sleep
    between route reads. Each :meth:`stretch` forwards the operation's requests until it asks for a pause (the
    stretch returns the seconds) or ends (the stretch returns None and :attr:`value` holds its result); the
    driver sleeps its own way in between.
    """

    def __init__(self, op: _PausingOp[T]) -> None:
        self._op = op
        self.value: T

    def stretch(self) -> Op[float | None]:
        op = self._op
        try:
            req = next(op)
            while not isinstance(req, _Pause):
                try:
                    answer = yield req
                except BaseException as e:  # a failed request (or an interruption) goes on to the operation
                    req = op.throw(e)
                else:
                    req = op.send(answer)
            return req.seconds
        except StopIteration as stop:
            self.value = stop.value
            return None


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


_IDEMPOTENT = int(SysFlag.IDEMPOTENT)
_UNIQ_KEY = operator.attrgetter("uniq_key")


def _abandon(batch: list[Pending]) -> None:
    """Members left without an outcome (the leader was interrupted) get an error instead of None."""
    for p in batch:
        if p.result is None and p.error is None:
            p.error = SendFailedError("send abandoned: the thread or task sending its batch was interrupted")


def _live_members(batch: list[Pending], topic: str) -> list[Pending]:
    """The members still within their send timeout; the others get their timeout error now."""
    now = time.monotonic()
    for p in batch:
        if p.deadline <= now:
            p.error = RequestTimeoutError(f"send to {topic} waited past send_timeout_s in the accumulator")
    return [p for p in batch if p.deadline > now]


class _ProducerBase:
    """State and operations shared by both producers: config, selection, fault table, unique ids, accumulator,
    and every send as an operation (:data:`client._requests.Op`) the instance's ``drive`` runs."""

    _kind = "producer"

    def __init__(self, group: str, namesrv_addr: str, *, client_config: ClientConfig | None,
                 start_index: int | None, **kwargs: Any) -> None:
        self.config = ProducerConfig(group, **kwargs)
        self.namesrv_addr = normalize_namesrv_addr(namesrv_addr)  # a bad address fails here, not at a send
        self._client_config = client_config
        self._selector = QueueSelector(start_index=start_index)
        self._fault = LatencyFaultTolerance(enabled=self.config.latency_fault_enable,
                                            config=self.config.fault_tolerance)
        self._uniq = codec.UniqKeyGenerator()
        self._acc = Accumulator(self.config)
        self._state = ClientState.UNOPENED
        self._metrics = ClientMetrics("producer", self.config.group)
        self._metrics.fault = self._fault

    def stats(self) -> dict[str, Any]:
        """This producer's metrics as plain dicts: sends by topic and status, errors by type, send latency,
        route refreshes and broker isolations (docs/METRICS.md). Cheap: it copies counters."""
        return self._metrics.snapshot()

    @property
    def state(self) -> ClientState:
        """UNOPENED until the first use (or ``start``), then OPENED, then CLOSED."""
        return self._state

    @property
    def group(self) -> str:
        """The producer group."""
        return self.config.group

    def _key_of(self, msg: Message) -> tuple[str, str | None]:
        """The message's key and the group its send is pinned to: the caller's key, else (idempotent) the key and
        group of its last send that did not end in SEND_OK, else a new key."""
        if self.config.idempotent:
            state = resend_state(msg)
            if state is not None:
                return state
        return msg.uniq_key or self._uniq.next(), None

    def _prepare(self, msg: Message, span: ProducerSpan | None = None) -> tuple[bytes, str, str | None]:
        """The message encoded as a send-batch item (carrying the send's trace context when it has a span), its
        key, and the group its send is pinned to."""
        msg = validate_message(msg, self.config.max_message_size)
        uniq, pin = self._key_of(msg)
        flag = _IDEMPOTENT if self.config.idempotent else 0
        wire = msg if span is None else span.stamp(msg)
        return encode_one(wire, uniq, int(time.time() * 1000), self.config.max_message_size, flag), uniq, pin

    def _needs_key_group(self, msg: Message, queue: MessageQueue | None) -> bool:
        """An idempotent send of a caller's key goes to the key's group (:func:`group_for_key`), unless the
        message names its queue or its last send already went to a group."""
        if not self.config.idempotent or getattr(msg, "uniq_key", None) is None or queue is not None:
            return False  # (not a Message: the send refuses it before any I/O)
        state = resend_state(msg)
        return state is None or state[1] is None

    def _key_group_op(self, core: _InstanceCore, msg: Message) -> Op[str | None]:
        """The group of a caller's key among the topic's groups."""
        info = yield from core.publish_info_op(msg.topic)
        assert msg.uniq_key is not None
        return group_for_key(info, msg.uniq_key)

    def _admit(self, msg: Message, queue: MessageQueue | None, waker: Any, key_group: str | None = None,
               span: ProducerSpan | None = None) -> tuple[Hashable, MessageQueue | None, str | None, Pending]:
        """A message of ``send``: its batching key, explicit queue, the group it is pinned to, and its place in a
        batch (pinned messages are batched per group)."""
        item, uniq, pin = self._prepare(msg, span)
        pin = pin or key_group
        fixed = explicit_queue(queue, msg.topic)
        key: Hashable = fixed if fixed is not None else (msg.topic, pin) if pin is not None else msg.topic
        me = Pending(item, uniq, time.monotonic() + self.config.send_timeout_s, waker)
        me.msg = msg
        return key, fixed, pin, me

    def _select_op(self, core: _InstanceCore, msg: Message, sharding: Sharding) -> Op[MessageQueue]:
        """The queue of an ordered send: the selector's pick among the topic's writable queues."""
        validate_message(msg, self.config.max_message_size)  # the selector sees a valid message only
        info = yield from core.publish_info_op(msg.topic)
        return sharding.choose(info, msg)

    def _select_batch_op(self, core: _InstanceCore, msgs: Sequence[Message], sharding: Sharding
                         ) -> Op[MessageQueue]:
        """The one queue of an ordered batch (the selector is asked with the batch's first message)."""
        topic = check_batch(msgs, self.config.max_message_size)
        info = yield from core.publish_info_op(topic)
        return sharding.choose(info, msgs[0])

    def _outcome(self, me: Pending) -> SendResult:
        if me.msg is not None:
            self._settle(me.msg, me.uniq_key, me.result if me.error is None else None, me.group)
        if me.error is not None:
            raise me.error
        result: SendResult = me.result
        return result

    def _settle(self, msg: Message, key: str, result: SendResult | None, group: str | None) -> None:
        """Idempotent: a send of ``msg`` under ``key`` ended in SEND_OK (its next send is a new message), or not
        (the next send of the object is a re-send: same key, same group)."""
        if not self.config.idempotent:
            return
        if result is not None and result.send_status is SendStatus.SEND_OK:
            forget_resend(msg, key)
        else:
            keep_for_resend(msg, key, result.message_queue.broker_name if result is not None else group)

    def _attempts(self, info: TopicPublishInfo, fixed: MessageQueue | None, deadline: float,
                  pin: str | None = None) -> SendAttempts:
        cfg = self.config
        return SendAttempts(info, fixed, deadline, group=cfg.group, retries=cfg.retry_times_when_send_failed,
                            selector=self._selector, fault=self._fault, await_master=True,
                            idempotent=cfg.idempotent, pinned=pin)

    # --- operations ---

    def _send_op(self, core: _InstanceCore, topic: str, body: bytes, uniq_keys: list[str],
                 fixed: MessageQueue | None, deadline: float, pin: str | None = None,
                 where: SendWhere | None = None) -> _PausingOp[list[SendResult]]:
        metrics = self._metrics
        began = time.perf_counter() if metrics.on else 0.0
        run: SendAttempts | None = None
        try:
            run = self._attempts((yield from core.publish_info_op(topic)), fixed, deadline, pin)
            while True:
                try:
                    mq, reply = yield from send_op(core, run, body, len(uniq_keys))
                except ClientError:
                    if run.awaiting is None:
                        raise
                else:
                    results = rq.send_results(reply, mq, uniq_keys)
                    if metrics.on and results:
                        # ``_name_``: the member's plain attribute (``.name`` is a Python-level descriptor).
                        metrics.sent(topic, results[0].send_status._name_, len(results), began)
                    return results
                # Out of the except block: a deadline error raised by the wait is not chained to the attempt's
                # error (the attempts it holds say what failed).
                yield from self._await_master_op(core, run)
        except Exception as e:
            if metrics.on:
                metrics.send_failed(topic, e, len(uniq_keys), began)
            if where is not None and run is not None:
                where.group = run.pinned
            raise

    def _await_master_op(self, core: _InstanceCore, run: SendAttempts) -> _PausingOp[None]:
        """Read the route at once, then every 0.1-0.2 s, until a lost group has a master to try (returns) or the
        send's deadline passes (raises).

        Raises:
            SendFailedError: no new master registered within the deadline.
            ClientClosedError: the producer or its client instance was closed meanwhile.
        """
        topic, group = run.info.topic, run.awaiting
        log.info("send to %s: the master of %s is gone (%s); reading the route until a new master registers",
                 topic, group, run.attempts[-1][1] if run.attempts else "none in the route")
        while True:
            yield from core.update_route_op(topic)
            if run.info.from_default_topic:  # the topic is not in the nameserver yet: its groups come from TBW102
                default = yield from core.fetch_route_op(DEFAULT_TOPIC)
                if default is not None:
                    core.routes.apply_default_route(topic, default)
            verdict = run.route_read(core.find_broker_address_in_publish, core.publish_info(topic))
            if verdict is MasterVerdict.RETRY:
                log.info("send to %s: trying %s after %d route read(s)", topic, run.resuming, run.route_reads)
                return
            if verdict is MasterVerdict.GIVE_UP:
                raise run.exhausted()
            if self._state is not ClientState.OPENED:
                raise ClientClosedError(f"producer {self.group} closed while a send to {topic} waited for a new "
                                        f"master of {group}")
            yield _Pause(run.poll_pause_s())

    def _batch_op(self, core: _InstanceCore, topic: str, fixed: MessageQueue | None, pin: str | None,
                  batch: list[Pending]) -> _PausingOp[None]:
        """Send the members of an automatic batch still within their timeout; each gets its result or error."""
        live = _live_members(batch, topic)
        if not live:
            return
        if len(live) == 1:  # a lone send (one thread): no join, no scans
            body, keys, deadline = live[0].item, [live[0].uniq_key], live[0].deadline
        else:
            body, keys, deadline = b"".join([p.item for p in live]), [p.uniq_key for p in live], min(
                p.deadline for p in live)
        where = SendWhere()
        try:
            results = yield from self._send_op(core, topic, body, keys, fixed, deadline, pin, where)
        except Exception as e:  # an interruption (BaseException) leaves the members to _abandon
            for p in live:
                p.error = e
                p.group = where.group
            return
        for p, r in zip(live, results, strict=True):
            p.result = r

    def _send_batch_op(self, core: _InstanceCore, msgs: Sequence[Message], queue: MessageQueue | None,
                       span: ProducerSpan | None = None) -> _PausingOp[list[SendResult]]:
        cfg = self.config
        topic = check_batch(msgs, cfg.max_message_size)
        fixed = explicit_queue(queue, topic)
        pin: str | None = None
        # Messages with a key of their own (a caller's, or one kept by an idempotent re-send) are looked at one by
        # one; a batch of new messages (the common case, two passes in C to tell) takes new keys at once.
        tracked = any(map(_UNIQ_KEY, msgs)) or (cfg.idempotent and any_resend_state(msgs))
        if not tracked:
            keys = self._uniq.next_many(len(msgs))
        elif cfg.idempotent:  # keys kept by re-sent messages; the batch goes to the first group one was sent to
            chosen = [self._key_of(m) for m in msgs]
            keys = [k for k, _ in chosen]
            pin = next((g for _, g in chosen if g is not None), None)
            if pin is None and fixed is None and msgs[0].uniq_key is not None:
                pin = yield from self._key_group_op(core, msgs[0])
        else:
            keys = [m.uniq_key or self._uniq.next() for m in msgs]
        wire = msgs if span is None else [span.stamp(m) for m in msgs]
        body = codec.encode_batch(wire, born_timestamp_ms=int(time.time() * 1000), uniq_keys=keys,
                                  max_message_size=cfg.max_message_size, sys_flag=_IDEMPOTENT if cfg.idempotent else 0)
        where = SendWhere()
        try:
            results = yield from self._send_op(core, topic, body, keys, fixed,
                                               time.monotonic() + cfg.send_timeout_s, pin, where)
        except Exception:
            for m, k in zip(msgs, keys, strict=True):
                self._settle(m, k, None, where.group)
            raise
        if cfg.idempotent and (tracked or results[0].send_status is not SendStatus.SEND_OK):
            for m, k, r in zip(msgs, keys, results, strict=True):
                self._settle(m, k, r, None)
        return results

    def _oneway_op(self, core: _InstanceCore, msg: Message, queue: MessageQueue | None,
                   span: ProducerSpan | None = None) -> _PausingOp[None]:
        """One attempt; a failure to send is logged, not raised (invalid messages and a closed client are)."""
        item, uniq, pin = self._prepare(msg, span)
        fixed = explicit_queue(queue, msg.topic)
        deadline = time.monotonic() + self.config.send_timeout_s
        try:
            if fixed is None:
                info = yield from core.publish_info_op(msg.topic)
                queues = info.message_queues
                if pin is not None:
                    queues = tuple(q for q in queues if q.broker_name == pin) or queues
                fixed = self._selector.select(queues, None, fault=self._fault, now_ms=_now_ms())
            yield from self._send_op(core, msg.topic, item, [uniq], fixed, deadline)
        except ClientClosedError:
            raise
        except ClientError as e:  # BrokerError included: a oneway send reports nothing
            log.debug("oneway send to %s failed: %s", msg.topic, e)


class Producer(SyncLifecycle, _ProducerBase):
    """A synchronous producer; safe to share between threads (their concurrent sends are batched together).

    Args:
        group: producer group.
        namesrv_addr: ``host:port`` of the nameservers, ``;``-separated.
        send_timeout_s: total budget of one send across its attempts.
        retry_times_when_send_failed: extra attempts after a failed one.
        latency_fault_enable: isolate slow/failing brokers (off by default, as RocketMQ).
        client_config: settings of the shared client instance (used when this producer creates it).
        credentials: the account that signs every request (``client.Credentials``); None: unsigned.
        start_index: first round-robin index (random when None; tests pin it).
        **kwargs: more :class:`~client._producer_core.ProducerConfig` fields (``batch_max_messages``...).
    """

    _sleep = staticmethod(time.sleep)
    """The pause of a send waiting for a new master (the twins' only difference in :meth:`_run`)."""

    def __init__(self, group: str, namesrv_addr: str, *, send_timeout_s: float = 3.0,
                 retry_times_when_send_failed: int = 2, latency_fault_enable: bool = False,
                 client_config: ClientConfig | None = None, start_index: int | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, client_config=with_credentials(client_config, credentials),
                         start_index=start_index,
                         send_timeout_s=send_timeout_s, retry_times_when_send_failed=retry_times_when_send_failed,
                         latency_fault_enable=latency_fault_enable, **kwargs)
        self._lock = threading.Lock()
        self._room = CountedCondition(self._lock)
        self._client: ClientInstance | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._outstanding: set[concurrent.futures.Future[SendResult]] = set()
        """``send_async`` sends not yet reported to their callback."""
        self._reported = threading.Condition(self._lock)
        self._reporting = threading.local()
        """``.future``: the send whose ``on_delivery`` this thread runs (a flush there does not wait for it)."""

    def _attach(self, client: ClientInstance) -> None:
        client.register_producer(self.group)
        self._metrics.bind(client)

    def close(self) -> None:
        """Wait for the ``send_async`` sends under way and for in-flight sends (each at most ``close_timeout_s``),
        fail waiting sends, release the client. A ``send_async`` that had not started yet is reported to its
        ``on_delivery`` as a ``ClientClosedError``."""
        self.flush(self.config.close_timeout_s)
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._state is not ClientState.OPENED:
                self._state = ClientState.CLOSED
                return
            self._state = ClientState.CLOSED
            for p in self._acc.drain():
                p.error = ClientClosedError(f"producer {self.group} closed before the message was sent")
                p.waker.set()
            self._room.notify_all()
            deadline = time.monotonic() + self.config.close_timeout_s
            while self._acc.in_flight() and time.monotonic() < deadline:
                self._room.wait(deadline - time.monotonic())
        client = self._client
        if client is not None:
            client.unregister_producer(self.group)
            client.release()

    def send(self, msg: Message, queue: MessageQueue | None = None, *,
             message_queue: MessageQueue | None = None, sharding_key: str | None = None,
             selector: MessageQueueSelector | None = None, arg: Any = None) -> SendResult:
        """Send one message to a master; batched with concurrent sends of the same topic (or queue).

        Args:
            msg: the message.
            queue: send to this queue only (one attempt, no retry), as RocketMQ's ``send(msg, mq)``.
            message_queue: keyword spelling of ``queue``.
            sharding_key: an ordered send: every message of the key goes to the queue
                ``crc32(key) % (writable queues of the topic)`` (:func:`~client._producer_core.select_by_hash`),
                with one attempt and no retry on another queue, as RocketMQ's ``send(msg, selector, arg)``.
            selector: an ordered send with your own ``selector(queues, msg, arg) -> MessageQueue`` (RocketMQ's
                ``MessageQueueSelector``), called with the topic's writable queues; one attempt, no retry.
            arg: the selector's third argument.

        Returns:
            The SendResult (status SEND_OK, or FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE).

        Raises:
            MessageIllegalError: the message is invalid (checked before any I/O).
            SendFailedError: every attempt failed, or the send timeout ran out.
            BrokerError: a broker refused the message with a code that is not retried.
            InvalidParameterError: a bad sharding key or selector, or one given with a queue.
            ClientClosedError: the producer is closed.
        """
        span = start_send((msg,), self.group)
        if span is None:
            return self._send(msg, queue or message_queue, sharding_key, selector, arg, None)
        try:
            result = self._send(msg, queue or message_queue, sharding_key, selector, arg, span)
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded((result,))
        return result

    def _send(self, msg: Message, queue: MessageQueue | None, sharding_key: str | None,
              selector: MessageQueueSelector | None, arg: Any, span: ProducerSpan | None) -> SendResult:
        """:meth:`send` within its trace span (``span``: None when the application traces nothing)."""
        client = self._ensure_open()
        sharding = Sharding.of(queue, sharding_key, selector, arg)
        if sharding is not None:
            queue = client.drive(self._select_op(client, msg, sharding))
        key_group = client.drive(self._key_group_op(client, msg)) if self._needs_key_group(msg, queue) else None
        key, fixed, pin, me = self._admit(msg, queue, None, key_group, span)
        with self._lock:
            self._wait_room(len(me.item), me.deadline)
            batch = self._acc.offer(key, me)
            if batch is None:  # it waits: its waker exists before a leader (who needs this lock) can set it
                me.waker = threading.Event()
        if batch is None:
            if not me.waker.wait(max(0.0, me.deadline - time.monotonic()) + self.config.send_timeout_s):
                raise RequestTimeoutError(f"send to {msg.topic} got no result within 2 x send_timeout_s")
            if not me.lead:
                return self._outcome(me)
            batch = me.batch
            assert batch is not None
        elif self.config.batch_linger_s > 0:
            time.sleep(self.config.batch_linger_s)
            with self._lock:
                batch = self._acc.join_pending(key, batch)
        self._lead(client, key, msg.topic, fixed, pin, batch)
        return self._outcome(me)

    def send_async(self, msg: Message, on_delivery: DeliveryCallback | None = None,
                   queue: MessageQueue | None = None, *, message_queue: MessageQueue | None = None,
                   sharding_key: str | None = None, selector: MessageQueueSelector | None = None,
                   arg: Any = None) -> SendFuture:
        """Send without waiting: :meth:`send` runs on one of the producer's ``send_async_threads`` threads
        (concurrent ones are batched together), as RocketMQ's ``send(msg, SendCallback)`` and confluent-kafka's
        ``produce(..., on_delivery=)``.

        Args:
            msg: the message.
            on_delivery: called once, on a producer thread, as ``on_delivery(None, result)`` when the message is
                stored and ``on_delivery(error, None)`` when not (every error :meth:`send` raises; a
                ``ClientClosedError`` when :meth:`close` came first). Keep it short: it holds a send thread.
            queue, message_queue, sharding_key, selector, arg: as for :meth:`send`.

        Returns:
            A future of the :class:`SendResult` (``.result(timeout)`` re-raises the send's error).

        Raises:
            MessageIllegalError: the message is invalid (checked at once, before it is queued).
            InvalidParameterError: a bad ``on_delivery``, sharding key or selector.
            ClientClosedError: the producer is closed.
        """
        callback = check_callback(on_delivery)
        self._ensure_open()
        validate_message(msg, self.config.max_message_size)
        Sharding.of(queue or message_queue, sharding_key, selector, arg)
        topic = msg.topic
        with self._lock:
            if self._state is not ClientState.OPENED:
                raise self._closed_error()
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.config.send_async_threads, thread_name_prefix=f"splitmq-send-{self.group}")
            fut = self._executor.submit(contextvars.copy_context().run, self.send, msg, queue, message_queue=message_queue,
                                        sharding_key=sharding_key, selector=selector, arg=arg)
            self._outstanding.add(fut)

        def delivered(done: concurrent.futures.Future[SendResult]) -> None:
            self._reporting.future = done
            try:
                report(callback, topic, *outcome_of(done, self.group))
            finally:  # flush returns once the callbacks ran, not only the sends
                self._reporting.future = None
                with self._lock:
                    self._outstanding.discard(done)
                    self._reported.notify_all()

        fut.add_done_callback(delivered)
        return fut

    def flush(self, timeout: float | None = None) -> int:
        """Wait for the ``send_async`` sends under way (confluent-kafka's ``flush``), at most ``timeout`` seconds
        (None: until they end); returns how many are still under way."""
        mine = getattr(self._reporting, "future", None)  # called from a callback: not waiting for itself
        with self._lock:
            self._reported.wait_for(lambda: not self._outstanding.difference((mine,)), timeout)
            return len(self._outstanding.difference((mine,)))

    def _wait_room(self, size: int, deadline: float) -> None:
        while not self._acc.has_room(size):
            if self._state is not ClientState.OPENED:
                raise ClientClosedError(f"producer {self.group} is closed")
            left = deadline - time.monotonic()
            if left <= 0 or not self._room.wait(left):
                raise RequestTimeoutError(
                    f"send waited send_timeout_s={self.config.send_timeout_s} for room in the accumulator "
                    f"(buffer_max_bytes={self.config.buffer_max_bytes})"
                )

    def _lead(self, client: ClientInstance, key: Hashable, topic: str, fixed: MessageQueue | None,
              pin: str | None, batch: list[Pending]) -> None:
        """Send ``batch``, deliver each member's result, then hand the lead of the next batches on."""
        try:
            self._run(client, self._batch_op(client, topic, fixed, pin, batch))
        finally:
            self._hand_on(key, batch)

    def _run(self, client: ClientInstance, op: _PausingOp[T]) -> T:
        """``client.drive`` for an operation that may pause (a send waiting for a new master)."""
        stretches = _Stretches(op)
        while (pause := client.drive(stretches.stretch())) is not None:
            self._sleep(pause)
        return stretches.value

    def _hand_on(self, key: Hashable, batch: list[Pending]) -> None:
        _abandon(batch)
        with self._lock:
            nexts = self._acc.complete(key)
            self._room.notify_all()
        for p in batch[1:]:  # batch[0] is this thread, the leader
            p.waker.set()
        for nb in nexts:
            nb[0].waker.set()

    def send_batch(self, msgs: Sequence[Message], queue: MessageQueue | None = None, *,
                   message_queue: MessageQueue | None = None, sharding_key: str | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None) -> list[SendResult]:
        """Send messages of one topic as one request to one queue (retried whole on another queue, unless the
        queue is explicit or chosen by ``sharding_key`` / ``selector``: see :meth:`send`; the whole batch goes to
        the key's queue, its messages in order).

        Returns:
            One SendResult per message, in order, each with its own queue offset and offset msgId.
        """
        client = self._ensure_open()
        queue = queue or message_queue
        sharding = Sharding.of(queue, sharding_key, selector, arg)
        if sharding is not None:
            queue = client.drive(self._select_batch_op(client, msgs, sharding))
        span = start_send(msgs, self.group)
        if span is None:
            return self._run(client, self._send_batch_op(client, msgs, queue))
        try:
            results = self._run(client, self._send_batch_op(client, msgs, queue, span))
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded(results)
        return results

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        """One attempt, no result: the broker's answer is read (keep-alive) but not reported."""
        client = self._ensure_open()
        span = start_send((msg,), self.group)
        if span is None:
            return self._run(client, self._oneway_op(client, msg, queue))
        try:
            self._run(client, self._oneway_op(client, msg, queue, span))
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded(())


class AsyncProducer(AsyncLifecycle, _ProducerBase):
    """The asyncio twin of :class:`Producer` (same arguments; methods are coroutines; ``async with``)."""

    _sleep = staticmethod(asyncio.sleep)
    """See :attr:`Producer._sleep`."""

    def __init__(self, group: str, namesrv_addr: str, *, send_timeout_s: float = 3.0,
                 retry_times_when_send_failed: int = 2, latency_fault_enable: bool = False,
                 client_config: ClientConfig | None = None, start_index: int | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        super().__init__(group, namesrv_addr, client_config=with_credentials(client_config, credentials),
                         start_index=start_index,
                         send_timeout_s=send_timeout_s, retry_times_when_send_failed=retry_times_when_send_failed,
                         latency_fault_enable=latency_fault_enable, **kwargs)
        self._client: AsyncClientInstance | None = None
        self._room_waiters: list[asyncio.Future[None]] = []
        self._idle: asyncio.Event | None = None
        self._outstanding: set[asyncio.Task[SendResult]] = set()
        """See :attr:`Producer._outstanding`."""
        self._reported: asyncio.Event | None = None

    def _attach(self, client: AsyncClientInstance) -> None:
        client.register_producer(self.group)
        self._metrics.bind(client)

    async def close(self) -> None:
        """See :meth:`Producer.close`."""
        await self.flush(self.config.close_timeout_s)
        if self._state is not ClientState.OPENED:
            self._state = ClientState.CLOSED
            return
        self._state = ClientState.CLOSED
        for p in self._acc.drain():
            if not p.waker.done():
                p.waker.set_exception(ClientClosedError(f"producer {self.group} closed before the message was sent"))
        self._wake_room()
        if self._acc.in_flight():
            self._idle = asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), self.config.close_timeout_s)
            except TimeoutError:
                log.warning("producer %s closed with sends still in flight", self.group)
        client = self._client
        if client is not None:
            client.unregister_producer(self.group)
            await client.release()

    def _wake_room(self) -> None:
        waiters, self._room_waiters = self._room_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def send(self, msg: Message, queue: MessageQueue | None = None, *,
                   message_queue: MessageQueue | None = None, sharding_key: str | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None) -> SendResult:
        """See :meth:`Producer.send`."""
        span = start_send((msg,), self.group)
        if span is None:
            return await self._send(msg, queue or message_queue, sharding_key, selector, arg, None)
        try:
            result = await self._send(msg, queue or message_queue, sharding_key, selector, arg, span)
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded((result,))
        return result

    async def _send(self, msg: Message, queue: MessageQueue | None, sharding_key: str | None,
                    selector: MessageQueueSelector | None, arg: Any, span: ProducerSpan | None
                    ) -> SendResult:
        """See :meth:`Producer._send`."""
        client = self._ensure_open()
        loop = asyncio.get_running_loop()
        sharding = Sharding.of(queue, sharding_key, selector, arg)
        if sharding is not None:
            queue = await client.drive(self._select_op(client, msg, sharding))
        key_group = await client.drive(self._key_group_op(client, msg)) if self._needs_key_group(msg, queue) else None
        key, fixed, pin, me = self._admit(msg, queue, loop.create_future(), key_group, span)
        if not self._acc.has_room(len(me.item)):  # the common case skips a coroutine call
            await self._wait_room(len(me.item), me.deadline, loop)
        batch = self._acc.offer(key, me)
        if batch is None:
            # Every lead ends within its send deadline (requests are bounded by it), so this wait is bounded.
            lead = await me.waker
            if lead is None:
                return self._outcome(me)
            batch = lead
        else:
            # One turn of the loop even without a linger: senders woken by the last reply are runnable now and
            # join this batch instead of waiting a whole round trip behind a batch of one.
            await asyncio.sleep(self.config.batch_linger_s)
            batch = self._acc.join_pending(key, batch)
        await self._lead(client, key, msg.topic, fixed, pin, batch)
        return self._outcome(me)

    def send_async(self, msg: Message, on_delivery: DeliveryCallback | None = None,
                   queue: MessageQueue | None = None, *, message_queue: MessageQueue | None = None,
                   sharding_key: str | None = None, selector: MessageQueueSelector | None = None,
                   arg: Any = None) -> AsyncSendFuture:
        """Send without waiting (aiokafka's ``send`` returning a future): :meth:`send` as a task of the running
        loop. ``on_delivery(error, result)`` is called once, on the loop, with the outcome; see
        :meth:`Producer.send_async`. Call it from a coroutine (it needs the running loop); ``await`` the task
        for the :class:`SendResult`.

        Raises:
            MessageIllegalError: the message is invalid (checked at once).
            InvalidParameterError: a bad ``on_delivery``, sharding key or selector.
            ClientClosedError: the producer is closed.
        """
        callback = check_callback(on_delivery)
        loop = asyncio.get_running_loop()
        self._ensure_open()
        validate_message(msg, self.config.max_message_size)
        Sharding.of(queue or message_queue, sharding_key, selector, arg)
        topic = msg.topic
        task = loop.create_task(self.send(msg, queue, message_queue=message_queue, sharding_key=sharding_key,
                                          selector=selector, arg=arg))
        self._outstanding.add(task)

        def delivered(done: asyncio.Task[SendResult]) -> None:
            try:
                report(callback, topic, *outcome_of(done, self.group))
            finally:
                self._outstanding.discard(done)
                if not self._outstanding and self._reported is not None:
                    self._reported.set()

        task.add_done_callback(delivered)
        return task

    async def flush(self, timeout: float | None = None) -> int:
        """See :meth:`Producer.flush`."""
        if self._outstanding:
            if self._reported is None or self._reported.is_set():
                self._reported = asyncio.Event()
            try:
                await asyncio.wait_for(self._reported.wait(), timeout)
            except TimeoutError:
                pass
        return len(self._outstanding)

    async def _wait_room(self, size: int, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        while not self._acc.has_room(size):
            left = deadline - time.monotonic()
            fut: asyncio.Future[None] = loop.create_future()
            self._room_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, max(0.0, left))
            except TimeoutError:
                raise RequestTimeoutError(
                    f"send waited send_timeout_s={self.config.send_timeout_s} for room in the accumulator "
                    f"(buffer_max_bytes={self.config.buffer_max_bytes})"
                ) from None
            if self._state is not ClientState.OPENED:
                raise ClientClosedError(f"producer {self.group} is closed")

    async def _lead(self, client: AsyncClientInstance, key: Hashable, topic: str, fixed: MessageQueue | None,
                    pin: str | None, batch: list[Pending]) -> None:
        """See :meth:`Producer._lead`."""
        try:
            await self._run(client, self._batch_op(client, topic, fixed, pin, batch))
        finally:
            self._hand_on(key, batch)

    async def _run(self, client: AsyncClientInstance, op: _PausingOp[T]) -> T:
        """See :meth:`Producer._run`."""
        stretches = _Stretches(op)
        while (pause := await client.drive(stretches.stretch())) is not None:
            await self._sleep(pause)
        return stretches.value

    def _hand_on(self, key: Hashable, batch: list[Pending]) -> None:
        _abandon(batch)
        nexts = self._acc.complete(key)
        self._wake_room()
        for p in batch[1:]:  # batch[0] is this coroutine, the leader
            if not p.waker.done():
                p.waker.set_result(None)
        for nb in nexts:
            if not nb[0].waker.done():
                nb[0].waker.set_result(nb)
        if self._idle is not None and not self._acc.in_flight():
            self._idle.set()

    async def send_batch(self, msgs: Sequence[Message], queue: MessageQueue | None = None, *,
                         message_queue: MessageQueue | None = None, sharding_key: str | None = None,
                         selector: MessageQueueSelector | None = None, arg: Any = None) -> list[SendResult]:
        """See :meth:`Producer.send_batch`."""
        client = self._ensure_open()
        queue = queue or message_queue
        sharding = Sharding.of(queue, sharding_key, selector, arg)
        if sharding is not None:
            queue = await client.drive(self._select_batch_op(client, msgs, sharding))
        span = start_send(msgs, self.group)
        if span is None:
            return await self._run(client, self._send_batch_op(client, msgs, queue))
        try:
            results = await self._run(client, self._send_batch_op(client, msgs, queue, span))
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded(results)
        return results

    async def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        """See :meth:`Producer.send_oneway`."""
        client = self._ensure_open()
        span = start_send((msg,), self.group)
        if span is None:
            return await self._run(client, self._oneway_op(client, msg, queue))
        try:
            await self._run(client, self._oneway_op(client, msg, queue, span))
        except BaseException as e:
            span.failed(e)
            raise
        span.succeeded(())
