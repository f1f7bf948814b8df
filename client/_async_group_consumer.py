"""``AsyncGroupConsumer``: the asyncio twin of :class:`client.GroupConsumer` (same rules, coroutines).

The state, decisions and requests are :class:`client._group_engine.GroupEngine`'s, shared with the sync
consumer; :class:`AsyncEngine` only runs them on the event loop: one task for the background jobs, one pull task
per held queue, and :class:`client.AsyncPullConsumer` for every pull, offset and range query.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from client._consume_core import ITER_COMMIT_CHECK_S, GroupConsumerConfig
from client._consumer import AsyncPullConsumer
from client._group_engine import GroupEngine, claim_group
from client._instance import AsyncClientInstance, ClientConfig, ClientState, with_credentials
from client._metrics import ClientMetrics
from client._rebalance import ProcessQueue
from client._requests import Op
from common.errors import ClientClosedError, ClientError, InvalidParameterError
from common.message import MessageExt, MessageQueue
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["AsyncEngine", "AsyncGroupConsumer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _AsyncBoundPullConsumer(AsyncPullConsumer):
    """An AsyncPullConsumer on the engine's client instance, whose reference it borrows (see
    :class:`client._group_consumer._BoundPullConsumer`)."""

    def __init__(self, group: str, namesrv_addr: str, instance: AsyncClientInstance, metrics: ClientMetrics
                 ) -> None:
        super().__init__(group, namesrv_addr)
        self._bound = instance
        self._metrics = metrics  # the engine's

    def _open(self) -> AsyncClientInstance:
        self._client = self._bound
        self._client.register_consumer(self.group)
        self._metrics.bind(self._client)
        self._state = ClientState.OPENED
        return self._client

    async def close(self) -> None:
        """Mark closed; the engine releases the instance it acquired."""
        self._state = ClientState.CLOSED


class AsyncEngine(GroupEngine[AsyncClientInstance, AsyncPullConsumer]):
    """The tasks of one async consumer's engine: a background task runs the jobs
    :class:`~client._group_engine.RebalanceClock` says are due, and each held queue has a pull task (see
    :class:`~client._group_engine.GroupEngine` for the arguments).

    The client instance is the loop's shared one: one consumer per group per loop and nameserver list.
    """

    _stop: asyncio.Event
    _wake: asyncio.Event

    def __init__(self, config: GroupConsumerConfig, namesrv_addr: str, client_config: ClientConfig | None,
                 deliver: Callable[[ProcessQueue, int, list[MessageExt]], None], *,
                 subscribe_retry_topic: bool = False, lock_queues: bool = False,
                 on_locked: Callable[[], None] | None = None) -> None:
        if config.instance_name is not None:
            raise InvalidParameterError("AsyncGroupConsumer does not take instance_name")
        if lock_queues:
            raise InvalidParameterError("the async engine does not lock queues (orderly consumption)")
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        super().__init__(config, namesrv_addr, client_config, deliver, subscribe_retry_topic=subscribe_retry_topic,
                         lock_queues=lock_queues, on_locked=on_locked)
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._bg: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """See :meth:`client._group_consumer.SyncEngine.start`."""
        self._check_startable()
        client = AsyncClientInstance.acquire(self.namesrv_addr, self._client_config)
        try:
            claim_group(client, self.group)
        except ClientError:
            await client.release()
            raise
        self._opened(client, await _AsyncBoundPullConsumer(self.group, self.namesrv_addr, client,
                                                           self.metrics).start())
        self._bg = asyncio.get_running_loop().create_task(self._background(), name=f"splitmq-{self.group}")

    async def close(self, deadline: float) -> None:
        """See :meth:`client._group_consumer.SyncEngine.close`."""
        if self.state is not ClientState.OPENED:
            self.state = ClientState.CLOSED
            return
        self.state = ClientState.CLOSED
        self._stop.set()
        self._wake.set()
        tasks = [t for t in (self._bg, *self._tasks.values()) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        client, puller = self._parts()
        await client.drive(self.closing_op())
        await self._tell_listener()
        await puller.close()
        await client.release()

    async def drive(self, op: Op[T]) -> T:
        """See :meth:`client._group_consumer.SyncEngine.drive`."""
        client, _ = self.check_open()
        return await client.drive(op)

    async def rebalance(self) -> None:
        """See :meth:`client._group_consumer.SyncEngine.rebalance`."""
        await self.drive(self.rebalance_op())
        await self._tell_listener()

    async def _tell_listener(self) -> None:
        """See :meth:`client._group_consumer.SyncEngine._tell_listener`."""
        if not self.begin_telling():
            return
        try:
            while changes := self.next_changes():
                for method, queues in changes:
                    await self._call_listener(method, queues)
        except BaseException:
            self.end_telling()
            raise

    async def _call_listener(self, method: str, queues: set[MessageQueue]) -> None:
        try:
            result = self.listener_method(method)(queues)
            if inspect.isawaitable(result):  # a coroutine function's call: awaited here
                await result
        except Exception:  # the listener's bug must not stop the consumer
            log.exception("%s: rebalance listener %s(%s) failed", self.group, method, sorted(map(str, queues)))

    async def auto_commit(self) -> None:
        """See :meth:`client._group_consumer.SyncEngine.auto_commit`."""
        await self.drive(self.auto_commit_op())

    async def commit(self, offsets: Mapping[MessageQueue, int] | None) -> None:
        """See :meth:`client._group_engine.GroupEngine.commit_op`."""
        await self.drive(self.commit_op(offsets))

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`client._group_engine.GroupEngine.seek_op`."""
        await self.drive(self.seek_op(mq, offset))

    # --- tasks ---

    def _launch(self, pq: ProcessQueue) -> None:
        self._tasks[pq.mq] = asyncio.get_running_loop().create_task(self._pull_loop(pq),
                                                                    name=f"splitmq-{self.group}-{pq.mq}")

    def _forget(self, mq: MessageQueue) -> None:
        task = self._tasks.pop(mq, None)
        if task is not None:
            task.cancel()

    async def _background(self) -> None:
        client, _ = self._parts()
        while not self._stop.is_set():
            self._wake.clear()
            await client.drive(self.round_op())
            await self._tell_listener()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.clock.wait_s())

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        while self.core.live(pq) and not self._stop.is_set():
            try:
                delay = await self._pull_once(pq)
            except Exception as e:  # a pull task must survive anything a server answers
                if self._stop.is_set():
                    return
                log.warning("pull of %s failed: %s", pq.mq, e)
                delay = self.config.pull_delay_on_error_s
            if delay:
                await asyncio.sleep(delay)  # pacing this queue's next pull, not synchronisation

    async def _pull_once(self, pq: ProcessQueue) -> float:
        """See :meth:`client._group_consumer.SyncEngine._pull_once`."""
        step = self._pull_start(pq)
        if isinstance(step, float):
            return step
        generation, offset = step
        _, puller = self.check_open()
        cfg = self.config
        began = time.monotonic()
        try:
            r = await puller.pull(pq.mq, offset, cfg.pull_batch_size, self.core.filter_of(pq.mq.topic).selector,
                                  suspend_timeout_s=cfg.pull_suspend_s or None)
        except ClientError as e:
            log.info("pull of %s at %d failed: %s", pq.mq, offset, e)
            return cfg.pull_delay_on_error_s
        return self._pulled(pq, generation, offset, r, time.monotonic() - began)


class AsyncPollSignal:
    """Wakes the tasks waiting in ``poll`` when messages arrive, a queue resumes or the consumer closes."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float, ready: Callable[[], bool]) -> None:
        """Wait up to ``timeout_s`` unless ``ready()`` already."""
        self._event.clear()
        if ready():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


class AsyncGroupConsumer:
    """See :class:`client.GroupConsumer`; methods are coroutines, use ``async with``.

    The client instance is the loop's shared one (``instance_name`` is not supported here: one instance per
    loop and nameserver list, so one consumer per group per loop).
    """

    def __init__(self, group: str, namesrv_addr: str, *, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        self.config = GroupConsumerConfig(group, **kwargs)
        self._avail = AsyncPollSignal()
        self._engine = AsyncEngine(self.config, namesrv_addr, with_credentials(client_config, credentials),
                                   self._on_pulled)

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    @property
    def state(self) -> ClientState:
        """UNOPENED until ``start``, then OPENED, then CLOSED."""
        return self._engine.state

    @property
    def client(self) -> AsyncClientInstance:
        """The client instance this consumer uses."""
        return self._engine.check_open()[0]

    @property
    def pull_consumer(self) -> AsyncPullConsumer:
        """The pull machinery underneath (``pull_from_which_node_table`` and friends)."""
        return self._engine.check_open()[1]

    async def start(self) -> AsyncGroupConsumer:
        """See :meth:`client.GroupConsumer.start`."""
        await self._engine.start()
        return self

    async def __aenter__(self) -> AsyncGroupConsumer:
        if self.state is ClientState.UNOPENED:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close(acknowledge=exc[0] is None)

    async def close(self) -> None:
        """See :meth:`client.GroupConsumer.close`."""
        await self._close(acknowledge=True)

    async def _close(self, *, acknowledge: bool) -> None:
        if self.state is ClientState.OPENED and acknowledge:
            self._engine.core.ack_polled()
        await self._engine.close(time.monotonic() + self.config.close_timeout_s)
        self._avail.wake()

    # --- subscription ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector = "*") -> None:
        """See :meth:`client.GroupConsumer.subscribe`."""
        self._engine.subscribe(topic, sub_expression)

    def unsubscribe(self, topic: str) -> None:
        """See :meth:`client.GroupConsumer.unsubscribe`."""
        self._engine.unsubscribe(topic)

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.assign`."""
        self._engine.assign(queues)

    def assignment(self) -> set[MessageQueue]:
        """See :meth:`client.GroupConsumer.assignment`."""
        return self._engine.core.held()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`client.GroupConsumer.fetch_message_queues`."""
        return await self.pull_consumer.fetch_subscribe_message_queues(topic)

    # --- consuming ---

    def _on_pulled(self, pq: ProcessQueue, generation: int, msgs: list[MessageExt]) -> None:
        self._engine.core.offer(pq, generation, msgs)
        self._avail.wake()

    async def poll(self, timeout_s: float = 5.0) -> list[MessageExt]:
        """See :meth:`client.GroupConsumer.poll`."""
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise InvalidParameterError(f"timeout_s must be >= 0, got {timeout_s!r}")
        engine = self._engine
        engine.check_open()
        engine.core.ack_polled()
        await engine.auto_commit()
        deadline = time.monotonic() + timeout_s
        while True:
            msgs = engine.take_polled()
            if msgs:
                return msgs
            left = deadline - time.monotonic()
            if left <= 0 or self.state is not ClientState.OPENED:
                return []
            await self._avail.wait(left, engine.core.has_cached)

    def __aiter__(self) -> AsyncGroupConsumer:
        return self

    async def __anext__(self) -> MessageExt:
        """See :meth:`client.GroupConsumer.__next__`."""
        engine = self._engine
        if self.state is not ClientState.OPENED:
            raise StopAsyncIteration
        engine.core.ack_polled()
        while True:
            try:
                await engine.auto_commit()
            except ClientClosedError:  # closed by another thread or task meanwhile
                raise StopAsyncIteration from None
            msgs = engine.take_polled(1)
            if msgs:
                return msgs[0]
            if self.state is not ClientState.OPENED:
                raise StopAsyncIteration
            await self._avail.wait(min(ITER_COMMIT_CHECK_S, self.config.auto_commit_interval_s), self._ready)

    def _ready(self) -> bool:
        return self.state is not ClientState.OPENED or self._engine.core.has_cached()

    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """See :meth:`client.GroupConsumer.commit`."""
        await self._engine.commit(offsets)

    async def committed(self, mq: MessageQueue) -> int:
        """See :meth:`client.GroupConsumer.committed`."""
        return await self.pull_consumer.fetch_consume_offset(mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`client.GroupConsumer.seek`."""
        await self._engine.seek(mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        """See :meth:`client.GroupConsumer.seek_to_begin`."""
        await self.seek(mq, await self.pull_consumer.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        """See :meth:`client.GroupConsumer.seek_to_end`."""
        await self.seek(mq, await self.pull_consumer.max_offset(mq))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.pause`."""
        self._engine.core.set_paused(queues, True)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.resume`."""
        self._engine.core.set_paused(queues, False)
        self._avail.wake()

    async def rebalance_now(self) -> None:
        """See :meth:`client.GroupConsumer.rebalance_now`."""
        await self._engine.rebalance()

    def __repr__(self) -> str:
        return f"AsyncGroupConsumer({self.group!r}, state={self.state.value}, queues={len(self.assignment())})"
