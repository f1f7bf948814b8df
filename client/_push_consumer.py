"""``PushConsumer``: a callback per batch on a bounded worker pool, with retries through the broker.

Pulling, rebalancing and offsets are :class:`client._group_consumer.SyncEngine`'s; this module adds the
consume side (RocketMQ ``ConsumeMessageConcurrentlyService`` / ``ConsumeMessageOrderlyService``):

* the callback gets a list of at most ``consume_message_batch_max_size`` messages and must return a
  :class:`ConsumeStatus`; anything else (``None``, ``True``...) is an :class:`InvalidConsumeStatusError`,
  logged and counted, and the batch is treated as RECONSUME_LATER -- never silently as success;
* a queue's offset advances only past messages that are done (consumed, or handed back for retry), so a slow
  callback holds its queue's commit back, and flow control pauses the queue's pulls when its cache is full;
* RECONSUME_LATER (clustering): each message goes back with ``POST /consumer/sendback`` to the master of its
  broker group; the broker stores it in ``%RETRY%<group>`` with a growing delay, or in ``%DLQ%<group>`` after
  ``max_reconsume_times``. When that fails the consumer produces the copy to ``%RETRY%<group>`` itself
  (docs/BEHAVIOUR.md 8.3); when even that fails the message is consumed again here after 5 s;
* orderly: one callback at a time per queue, in offset order; a failed batch is retried in place after
  ``suspend_current_queue_time_s``, and sent to the DLQ after ``max_reconsume_times``. In clustering mode a
  queue is also locked on its master before it is consumed (RocketMQ's orderly protocol, :mod:`client._orderly`):
  consumed only while the lock is fresh, handed over after its running callback ends and its offset is
  committed, unlocked on close -- so two instances of a group never consume one queue at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import httpx

from client import _requests as rq
from client._consume_core import GroupConsumerConfig
from client._group_consumer import SyncEngine
from client._instance import ClientConfig, ClientInstance, ClientState, with_credentials
from client._rebalance import MessageModel, ProcessQueue, retry_topic
from client.tracing import process_span
from common import codec
from common.errors import BrokerNotFoundError, ClientError, InvalidParameterError
from common.message import Message, MessageExt, MessageQueue
from common.properties import (
    KEYS,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
)
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["ConsumeStatus", "InvalidConsumeStatusError", "PushConsumer", "check_consume_status",
           "retry_message_properties"]

log = logging.getLogger(__name__)

#: RocketMQ's ``maxReconsumeTimes = -1`` means 16.
DEFAULT_MAX_RECONSUME_TIMES = 16
_LOCAL_RETRY_DELAY_S = 5.0  # submitConsumeRequestLater
_DROPPED_SYSTEM_KEYS = frozenset({TAGS, KEYS, "DELAY", "REAL_TOPIC", "REAL_QID", "WAIT"})


class ConsumeStatus(enum.Enum):
    """What a push callback returns for its batch."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    """Every message of the batch is consumed."""
    RECONSUME_LATER = "RECONSUME_LATER"
    """Consume the whole batch again later (through the retry topic in clustering mode)."""


class InvalidConsumeStatusError(ClientError, TypeError):
    """A push callback returned something that is not a :class:`ConsumeStatus`."""


def check_consume_status(result: object) -> ConsumeStatus:
    """``result`` if it is a ConsumeStatus.

    Raises:
        InvalidConsumeStatusError: anything else (the message names the type and value).
    """
    if isinstance(result, ConsumeStatus):
        return result
    raise InvalidConsumeStatusError(
        f"the consume callback returned {type(result).__name__} {result!r:.60}; it must return "
        "ConsumeStatus.CONSUME_SUCCESS or ConsumeStatus.RECONSUME_LATER"
    )


def retry_message_properties(msg: MessageExt, max_reconsume_times: int) -> dict[str, str]:
    """Properties of the copy a consumer produces to ``%RETRY%<group>`` when the send-back RPC failed."""
    props = {k: v for k, v in msg.properties.items() if k not in _DROPPED_SYSTEM_KEYS}
    props.setdefault(RETRY_TOPIC, msg.topic)
    props.setdefault(ORIGIN_MESSAGE_ID, msg.msg_id)
    props[RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    return props


@attrs.frozen
class _RetryCopy:
    """What ``codec.encode_batch`` reads of a Message, with system properties a user Message may not hold."""

    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    delay_level: int
    flag: int


class PushConsumer:
    """A push consumer (RocketMQ ``DefaultMQPushConsumer``).

    ::

        def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
            ...
            return ConsumeStatus.CONSUME_SUCCESS

        with PushConsumer("my-group", "127.0.0.1:9876", on_messages) as c:   # subscribe before start
            c.subscribe("TopicTest", "*")
            ...

    Args:
        group: consumer group.
        namesrv_addr: nameservers, ``;``-separated.
        listener: ``callback(list[MessageExt]) -> ConsumeStatus``.
        orderly: one batch at a time per queue, in order.
        consume_thread_nums: worker threads running callbacks (a bounded pool).
        consume_message_batch_max_size: messages per callback at most.
        max_reconsume_times: retries before the DLQ (-1 = 16).
        suspend_current_queue_time_s: orderly: pause before consuming a failed batch again.
        client_config: settings of the client instance (when this consumer creates it).
        credentials: the account that signs every request (``client.Credentials``); None: unsigned.
        **kwargs: :class:`GroupConsumerConfig` fields.

    Raises:
        InvalidParameterError: ``listener`` is not callable, or a bound is out of range.
    """

    def __init__(self, group: str, namesrv_addr: str, listener: Callable[[list[MessageExt]], ConsumeStatus], *,
                 orderly: bool = False, consume_thread_nums: int = 20, consume_message_batch_max_size: int = 1,
                 max_reconsume_times: int = -1, suspend_current_queue_time_s: float = 1.0,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 **kwargs: Any) -> None:
        if not callable(listener):
            raise InvalidParameterError(f"listener must be callable, got {type(listener).__name__}")
        client_config = with_credentials(client_config, credentials)
        if not 1 <= consume_thread_nums <= 1000:
            raise InvalidParameterError(f"consume_thread_nums must be in [1, 1000], got {consume_thread_nums}")
        if not 1 <= consume_message_batch_max_size <= 1024:
            raise InvalidParameterError(
                f"consume_message_batch_max_size must be in [1, 1024], got {consume_message_batch_max_size}")
        if max_reconsume_times < -1:
            raise InvalidParameterError(f"max_reconsume_times must be >= -1, got {max_reconsume_times}")
        self.config = GroupConsumerConfig(group, **kwargs)
        self.listener = listener
        self.orderly = orderly
        self.consume_thread_nums = consume_thread_nums
        self.batch_max = consume_message_batch_max_size
        self.max_reconsume_times = DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times == -1 else max_reconsume_times
        self.suspend_s = suspend_current_queue_time_s
        self._engine = SyncEngine(self.config, namesrv_addr, client_config, self._on_pulled,
                                  subscribe_retry_topic=True, lock_queues=orderly, on_locked=self._kick_all_orderly)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._busy: set[int] = set()  # orderly: ids of queues with a consume task running or scheduled
        self._inflight = 0
        # Consume tasks wait here, not as one pool future each (a future costs about 1 KiB per cached message);
        # at most consume_thread_nums pool jobs drain it.
        self._ready: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._drainers = 0
        self._idle = threading.Condition()
        self.callback_errors = 0
        """Callbacks that raised or returned something other than a ConsumeStatus."""
        self.last_callback_error: BaseException | None = None

    @property
    def group(self) -> str:
        return self.config.group

    @property
    def state(self) -> ClientState:
        return self._engine.state

    @property
    def client(self) -> ClientInstance:
        return self._engine.check_open()[0]

    def subscribe(self, topic: str, sub_expression: str | MessageSelector = "*") -> None:
        """Consume ``topic``: ``*``, ``TagA || TagB``, or a :class:`MessageSelector` (``MessageSelector.sql(...)``)."""
        self._engine.subscribe(topic, sub_expression)

    def assignment(self) -> set[MessageQueue]:
        return self._engine.core.held()

    def stats(self) -> dict[str, Any]:
        """Pulls sent, pulls put off by flow control (``pull_threshold_for_queue`` /
        ``pull_threshold_size_for_queue_mib``), rebalances, held queues, cached messages and body bytes, then
        the client metrics: pulls by serving member, lag, consumed messages, callback latency (docs/METRICS.md)."""
        return self._engine.stats()

    def start(self) -> PushConsumer:
        """Join the group and start consuming. Raises ClientError when already started or closed."""
        self._pool = concurrent.futures.ThreadPoolExecutor(self.consume_thread_nums,
                                                           thread_name_prefix=f"splitmq-consume-{self.group}")
        try:
            self._engine.start()
        except BaseException:
            self._pool.shutdown(wait=False)
            raise
        return self

    def __enter__(self) -> PushConsumer:
        if self.state is ClientState.UNOPENED:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, await_termination_s: float | None = None) -> None:
        """Stop pulling, let running callbacks finish (up to the bound), commit, leave the group. Idempotent.

        Args:
            await_termination_s: bound on waiting for in-flight callbacks (``close_timeout_s`` when None).
        """
        bound = self.config.close_timeout_s if await_termination_s is None else await_termination_s
        deadline = time.monotonic() + bound
        if self.state is ClientState.OPENED:
            self._engine._stop.set()  # no new pulls while the callbacks drain
            with self._idle:
                while self._inflight > 0 and time.monotonic() < deadline:
                    self._idle.wait(max(0.0, deadline - time.monotonic()))
                if self._inflight > 0:
                    log.warning("%s closing with %d callbacks still running after %.1f s", self.group,
                                self._inflight, bound)
        with self._idle:  # what has not started by now is not run: the queues re-deliver it after a restart
            self._inflight -= len(self._ready)
            self._ready.clear()
        self._engine.close(deadline)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- dispatch ---

    def _on_pulled(self, pq: ProcessQueue, generation: int, msgs: list[MessageExt]) -> None:
        if self.orderly:
            self._kick_orderly(pq)
            return
        for i in range(0, len(msgs), self.batch_max):
            self._submit(self._consume_concurrently, pq, msgs[i:i + self.batch_max])

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        pool = self._pool
        if pool is None or self._engine._stop.is_set():
            return
        with self._idle:
            self._inflight += 1
            self._ready.append((fn, args))
            if self._drainers >= self.consume_thread_nums:
                return
            self._drainers += 1
        try:
            pool.submit(self._drain)
        except RuntimeError:  # the pool shut down meanwhile: close() dropped the queued tasks
            with self._idle:
                self._drainers -= 1

    def _drain(self) -> None:
        while True:
            with self._idle:
                if not self._ready:
                    self._drainers -= 1
                    return
                fn, args = self._ready.popleft()
            try:
                fn(*args)
            except Exception as e:
                log.error("consume task of %s failed: %s", self.group, e)
            finally:
                self._done()

    def _done(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def _later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Timer(delay_s, self._submit, (fn, *args))
        t.daemon = True
        t.start()

    def _call(self, msgs: list[MessageExt]) -> ConsumeStatus:
        metrics = self._engine.metrics
        began = time.perf_counter() if metrics.on else 0.0
        try:
            with process_span(msgs, self.group) as span:  # a no-op without OpenTelemetry
                status = check_consume_status(self.listener(msgs))
                if span is not None:
                    span.set_attribute("splitmq.consume_status", status.name)
        except Exception as e:
            if metrics.on and msgs:
                metrics.processed(msgs[0].topic, len(msgs), False, began)
            self.callback_errors += 1
            self.last_callback_error = e
            log.error("consume callback of %s failed on %d messages (first %s): %s; consuming them later",
                      self.group, len(msgs), msgs[0].msg_id if msgs else "-", e)
            return ConsumeStatus.RECONSUME_LATER
        if metrics.on and msgs:
            metrics.processed(msgs[0].topic, len(msgs), status is ConsumeStatus.CONSUME_SUCCESS, began)
        return status

    # --- concurrently ---

    def _consume_concurrently(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        core = self._engine.core
        if not core.live(pq):
            return
        status = self._call(msgs)
        if not core.live(pq):
            return  # the queue moved to another instance meanwhile: it re-delivers from the committed offset
        if status is ConsumeStatus.CONSUME_SUCCESS:
            core.consumed(pq, msgs)
            return
        if self.config.message_model is MessageModel.BROADCASTING:
            log.warning("%s (broadcasting) drops %d messages whose callback asked for a retry", self.group, len(msgs))
            core.consumed(pq, msgs)
            return
        failed = [m for m in msgs if not self.send_back(pq.mq, m)]
        failed_ids = {id(m) for m in failed}
        core.consumed(pq, [m for m in msgs if id(m) not in failed_ids])
        if failed:
            again = [attrs.evolve(m, reconsume_times=m.reconsume_times + 1) for m in failed]
            self._later(_LOCAL_RETRY_DELAY_S, self._consume_concurrently, pq, again)

    # --- orderly ---

    def _kick_orderly(self, pq: ProcessQueue) -> None:
        with self._engine.core.lock:
            if id(pq) in self._busy:
                return
            self._busy.add(id(pq))
        self._submit(self._consume_orderly, pq)

    def _kick_all_orderly(self) -> None:
        """After a lock renewal: queues whose consumption stopped for want of a lock may go on."""
        core = self._engine.core
        with core.lock:
            pqs = [pq for pq in core.pqs.values() if pq.msg_count]
        for pq in pqs:
            self._kick_orderly(pq)

    def _consume_orderly(self, pq: ProcessQueue) -> None:
        core = self._engine.core
        locker = self._engine.locker
        while not self._engine._stop.is_set():
            # The queue's consume lock is held from the take to the commit: a hand-over waits for it.
            with locker.consume_lock(pq.mq) if locker is not None else contextlib.nullcontext():
                with core.lock:
                    may = core.live(pq) and (locker is None or locker.holds(pq.mq))
                    msgs = pq.take(self.batch_max) if may else []
                    if not msgs:  # nothing left, dropped, or not locked (a renewal kicks it again)
                        self._busy.discard(id(pq))
                        return
                status = self._call(msgs)
                with core.lock:
                    if not core.live(pq):
                        self._busy.discard(id(pq))
                        return
                if status is ConsumeStatus.RECONSUME_LATER and not self._orderly_give_up(pq, msgs):
                    with core.lock:
                        pq.return_consuming([attrs.evolve(m, reconsume_times=m.reconsume_times + 1) for m in msgs])
                    self._later(self.suspend_s, self._consume_orderly, pq)
                    return
                with core.lock:
                    core.offsets.update(pq.mq, pq.commit_consuming())
        with core.lock:
            self._busy.discard(id(pq))

    def _orderly_give_up(self, pq: ProcessQueue, msgs: Sequence[MessageExt]) -> bool:
        """True when every message has used its retries and went to the DLQ (the batch then counts as done)."""
        if any(m.reconsume_times < self.max_reconsume_times for m in msgs):
            return False
        return all(self.send_back(pq.mq, m, delay_level=-1) for m in msgs)

    # --- send back ---

    def send_back(self, mq: MessageQueue, msg: MessageExt, *, delay_level: int = 0) -> bool:
        """Hand ``msg`` back for a later retry (or the DLQ); False when both the RPC and the fallback failed."""
        client, _ = self._engine.check_open()
        try:
            self._send_back_rpc(client, mq, msg, delay_level)
            self._retry_expected(delay_level)
            return True
        except (ClientError, httpx.HTTPError) as e:
            log.info("send-back of %s (offset %d) failed: %s; producing it to %s", msg.msg_id,
                     msg.commit_log_offset, e, retry_topic(self.group))
        try:
            self._produce_retry(client, msg)
            self._retry_expected(delay_level)
            return True
        except (ClientError, httpx.HTTPError) as e:
            log.warning("retry copy of %s could not be produced: %s; consuming it again locally", msg.msg_id, e)
            return False

    def _retry_expected(self, delay_level: int) -> None:
        # The retry topic may have been created by this very send-back: pick its queues up within a second,
        # not at the next rebalance period (20 s), so the retry comes back after about its delay level.
        if delay_level >= 0:
            self._engine.expect_queues(retry_topic(self.group))

    def _send_back_rpc(self, client: ClientInstance, mq: MessageQueue, msg: MessageExt, delay_level: int) -> None:
        addr = client.find_broker_address_in_publish(msg.broker_name)
        if addr is None:
            client.update_topic_route_from_nameserver(mq.topic)
            addr = client.find_broker_address_in_publish(msg.broker_name)
        if addr is None:
            raise BrokerNotFoundError(f"The broker[{msg.broker_name}] not exist (no master for the send-back)")
        body = rq.dumps({"group": self.group, "offset": msg.commit_log_offset, "delayLevel": delay_level,
                         "originMsgId": msg.msg_id, "originTopic": msg.topic,
                         "maxReconsumeTimes": self.max_reconsume_times})
        rq.json_of(client.http.post(f"http://{addr}/consumer/sendback", content=body), addr)

    def _produce_retry(self, client: ClientInstance, msg: MessageExt) -> None:
        topic = retry_topic(self.group)
        info = client.try_to_find_topic_publish_info(topic)
        same = [q for q in info.message_queues if q.broker_name == msg.broker_name]
        mq = (same or list(info.message_queues))[0]
        addr = client.find_broker_address_in_publish(mq.broker_name)
        if addr is None:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        props = retry_message_properties(msg, self.max_reconsume_times)
        uniq = props.pop(UNIQ_KEY, None) or msg.msg_id
        copy = _RetryCopy(topic, msg.body, msg.tags, msg.keys, props, min(3 + msg.reconsume_times, 64), msg.flag)
        body = codec.encode_batch([cast(Message, copy)], born_timestamp_ms=int(time.time() * 1000),
                                  uniq_keys=[uniq])
        url = (rq.send_url(addr, topic, mq.queue_id, self.group)
               + f"&reconsumeTimes={msg.reconsume_times + 1}&maxReconsumeTimes={self.max_reconsume_times}")
        rq.parse_send(client.http.post(url, content=body), addr, 1)

    def __repr__(self) -> str:
        return f"PushConsumer({self.group!r}, state={self.state.value}, queues={len(self.assignment())})"
