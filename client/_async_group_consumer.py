"""``AsyncGroupConsumer``: the asyncio twin of :class:`client.GroupConsumer` (same rules, coroutines).

The state and decisions are :class:`client._consume_core.GroupCore`'s, shared with the sync consumer; this
module only moves them onto the event loop: one rebalance task, one pull task per held queue, and
:class:`client.AsyncPullConsumer` for every pull, offset and range query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import httpx

from client._consume_core import GroupConsumerConfig, GroupCore, consume_timestamp_ms
from client._consumer import AsyncPullConsumer
from client._group_consumer import consumer_ids_url, id_query_addrs, parse_consumer_ids
from client._instance import AsyncClientInstance, ClientConfig, ClientState, with_credentials
from client._offset_store import LocalFileOffsetStore
from client._rebalance import MessageModel, ProcessQueue, plan_start_offset
from common.errors import ClientClosedError, ClientError, InvalidParameterError, RouteNotFoundError
from common.message import MessageExt, MessageQueue
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = ["AsyncGroupConsumer"]

log = logging.getLogger(__name__)


class AsyncGroupConsumer:
    """See :class:`client.GroupConsumer`; methods are coroutines, use ``async with``.

    The client instance is the loop's shared one (``instance_name`` is not supported here: one instance per
    loop and nameserver list, so one consumer per group per loop).
    """

    def __init__(self, group: str, namesrv_addr: str, *, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None, **kwargs: Any) -> None:
        self.config = GroupConsumerConfig(group, **kwargs)
        if self.config.instance_name is not None:
            raise InvalidParameterError("AsyncGroupConsumer does not take instance_name")
        self.namesrv_addr = namesrv_addr
        self.core = GroupCore(self.config)
        self._client_config = attrs.evolve(with_credentials(client_config, credentials) or ClientConfig(),
                                           heartbeat_broker_interval_s=self.config.heartbeat_interval_s)
        self._state = ClientState.UNOPENED
        self._puller: AsyncPullConsumer | None = None
        self._store: LocalFileOffsetStore | None = None
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._bg: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._avail = asyncio.Event()
        self._next_auto_commit = 0.0

    @property
    def group(self) -> str:
        """The consumer group."""
        return self.config.group

    @property
    def state(self) -> ClientState:
        """UNOPENED until ``start``, then OPENED, then CLOSED."""
        return self._state

    def _open(self) -> tuple[AsyncClientInstance, AsyncPullConsumer]:
        if self._state is not ClientState.OPENED or self._puller is None:
            raise ClientClosedError(f"consumer {self.group} is {self._state.value.lower()}: start it first")
        return self._puller.client, self._puller

    @property
    def client(self) -> AsyncClientInstance:
        """The client instance this consumer uses."""
        return self._open()[0]

    @property
    def pull_consumer(self) -> AsyncPullConsumer:
        """The pull machinery underneath (``pull_from_which_node_table`` and friends)."""
        return self._open()[1]

    async def start(self) -> AsyncGroupConsumer:
        """See :meth:`client.GroupConsumer.start`."""
        if self._state is ClientState.CLOSED:
            raise ClientClosedError(f"consumer {self.group} is closed; create a new one")
        if self._state is ClientState.OPENED:
            raise ClientError(f"consumer {self.group} is already started")
        self._puller = await AsyncPullConsumer(self.group, self.namesrv_addr,
                                               client_config=self._client_config).start()
        if self.config.message_model is MessageModel.BROADCASTING:
            self._store = LocalFileOffsetStore(self.config.offset_store_dir, "DEFAULT", self.group)
            self._store.load()
        for topic in self.core.topics():
            self._puller.client.consumer_uses_topic(self.group, topic, self.core.filter_of(topic).selector)
        self._state = ClientState.OPENED
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_s
        self._bg = asyncio.get_running_loop().create_task(self._background(), name=f"splitmq-{self.group}")
        return self

    async def __aenter__(self) -> AsyncGroupConsumer:
        if self._state is ClientState.UNOPENED:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Acknowledge the last poll, commit, stop the tasks and leave. Idempotent, bounded."""
        if self._state is not ClientState.OPENED:
            self._state = ClientState.CLOSED
            return
        self.core.ack_polled()
        self._state = ClientState.CLOSED
        tasks = [t for t in [self._bg, *self._tasks.values()] if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.close_timeout_s)
        try:
            await asyncio.wait_for(self._persist(all_held=True), self.config.close_timeout_s)
        except (ClientError, TimeoutError) as e:
            log.warning("final commit of %s failed: %s", self.group, e)
        assert self._puller is not None
        await self._puller.client.unregister_consumer_group(self.group)
        await self._puller.close()
        self._avail.set()

    # --- subscription ---

    def subscribe(self, topic: str, sub_expression: str | MessageSelector = "*") -> None:
        """See :meth:`client.GroupConsumer.subscribe`."""
        flt = self.core.subscribe(topic, sub_expression)
        if self._state is ClientState.OPENED:
            self.client.consumer_uses_topic(self.group, topic, flt.selector)
            self._wake.set()

    def unsubscribe(self, topic: str) -> None:
        """See :meth:`client.GroupConsumer.unsubscribe`."""
        self.core.unsubscribe(topic)
        self._wake.set()

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.assign`."""
        self.core.assign(queues)
        self._wake.set()

    def assignment(self) -> set[MessageQueue]:
        """See :meth:`client.GroupConsumer.assignment`."""
        return self.core.held()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`client.GroupConsumer.fetch_message_queues`."""
        return await self._open()[1].fetch_subscribe_message_queues(topic)

    # --- background ---

    async def _background(self) -> None:
        client, _ = self._open()
        await client.send_heartbeat_to_all_brokers()
        cfg = self.config
        while self._state is ClientState.OPENED:
            try:
                await self.rebalance_now()
            except Exception as e:
                log.warning("rebalance of %s failed: %s", self.group, e)
            if cfg.auto_commit:
                try:
                    await self._persist()
                except Exception as e:
                    log.warning("offset commit of %s failed: %s", self.group, e)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(cfg.rebalance_interval_s, cfg.auto_commit_interval_s))

    async def rebalance_now(self) -> None:
        """One rebalance round (also run every ``rebalance_interval_s``)."""
        client, _ = self._open()
        core = self.core
        if core.assigned_mode:
            await self._apply(None, set(core.manual_queues))
            return
        topics = core.topics()
        for topic in topics:
            wanted = await self._allocate(client, topic)
            if wanted is not None:
                await self._apply(topic, wanted)
        for mq in core.held():
            if mq.topic not in topics:
                await self._drop(mq)

    async def _allocate(self, client: AsyncClientInstance, topic: str) -> set[MessageQueue] | None:
        try:
            mqs = await client.subscribe_queues_or_fetch(topic)
        except RouteNotFoundError:
            return None
        if self.config.message_model is MessageModel.BROADCASTING:
            return set(mqs)
        cids = None
        for addr in id_query_addrs(client, topic):
            try:
                cids = parse_consumer_ids(await client.http.get(consumer_ids_url(addr, self.group)), addr)
                break
            except (httpx.HTTPError, ClientError) as e:
                log.info("consumer ids of %s from %s: %s", self.group, addr, e)
        if cids is None:
            return None
        if client.client_id not in cids:
            await client.send_heartbeat_to_all_brokers()
            return None
        return set(self.config.allocate_strategy.allocate(self.group, client.client_id, list(mqs), cids))

    async def _apply(self, topic: str | None, wanted: set[MessageQueue]) -> None:
        held = self.core.held(topic)
        for mq in sorted(held - wanted):
            await self._drop(mq)
        for mq in sorted(wanted - held):
            try:
                start = await self._start_offset(mq)
            except ClientError as e:
                log.warning("%s: cannot read the start offset of %s: %s", self.group, mq, e)
                continue
            pq = self.core.add_queue(mq, start)
            if pq is not None:
                self._tasks[mq] = asyncio.get_running_loop().create_task(self._pull_loop(pq))

    async def _drop(self, mq: MessageQueue) -> None:
        offset = self.core.drop_queue(mq)
        task = self._tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        if offset >= 0:
            try:
                await self._commit_one(mq, offset)
            except ClientError as e:
                log.warning("hand-over commit of %s failed: %s", mq, e)

    async def _start_offset(self, mq: MessageQueue) -> int:
        _, puller = self._open()
        committed = self._store.read(mq) if self._store else await puller.fetch_consume_offset(mq)
        plan = plan_start_offset(self.config.consume_from_where, committed, mq.topic)
        if plan.kind == "offset":
            return plan.offset
        if plan.kind == "max":
            return await puller.max_offset(mq)
        return await puller.search_offset(mq, consume_timestamp_ms(self.config, int(time.time() * 1000)))

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        cfg = self.config
        while self.core.live(pq) and self._state is ClientState.OPENED:
            delay = 0.0
            if pq.paused:
                delay = 0.1
            elif pq.over_threshold(cfg.pull_threshold_for_queue, cfg.threshold_bytes):
                delay = 0.05
            else:
                try:
                    delay = await self._pull_once(pq)
                except ClientError as e:
                    log.info("pull of %s failed: %s", pq.mq, e)
                    delay = cfg.pull_delay_on_error_s
            if delay:
                await asyncio.sleep(delay)  # pacing the next pull of this queue, not synchronisation

    async def _pull_once(self, pq: ProcessQueue) -> float:
        cfg = self.config
        _, puller = self._open()
        gen, offset = pq.generation, pq.next_pull_offset
        began = time.monotonic()
        r = await puller.pull(pq.mq, offset, cfg.pull_batch_size, self.core.filter_of(pq.mq.topic).selector,
                              suspend_timeout_s=cfg.pull_suspend_s or None)
        added, delay = self.core.after_pull(pq, gen, offset, r, time.monotonic() - began, self.group)
        if added:
            self.core.offer(pq, gen, added)
            self._avail.set()
        return delay

    # --- consuming ---

    async def poll(self, timeout_s: float = 5.0) -> list[MessageExt]:
        """See :meth:`client.GroupConsumer.poll`."""
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise InvalidParameterError(f"timeout_s must be >= 0, got {timeout_s!r}")
        self._open()
        self.core.ack_polled()
        if self.config.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_s
            try:
                await self._persist()
            except ClientError as e:
                log.warning("auto commit of %s failed: %s", self.group, e)
        deadline = time.monotonic() + timeout_s
        while True:
            msgs = self.core.take_polled(self.config.max_poll_messages)
            if msgs:
                return msgs
            left = deadline - time.monotonic()
            if left <= 0 or self._state is not ClientState.OPENED:
                return []
            self._avail.clear()
            if self.core.has_cached():
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._avail.wait(), left)

    async def _commit_one(self, mq: MessageQueue, offset: int) -> None:
        if self._store is not None:
            self._store.table.update(mq, offset, increase_only=False)
            self._store.persist()
            return
        assert self._puller is not None
        await self._puller.update_consume_offset(mq, offset)

    async def _persist(self, *, all_held: bool = False) -> list[MessageQueue]:
        dirty = self.core.offsets.take_dirty()
        if all_held:
            dirty.update(self.core.snapshot_offsets())
        failed = []
        for mq, off in sorted(dirty.items()):
            try:
                await self._commit_one(mq, off)
            except ClientError as e:
                failed.append(mq)
                log.info("commit of %s at %d failed: %s", mq, off, e)
        self.core.offsets.mark_dirty(failed)
        return failed

    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """See :meth:`client.GroupConsumer.commit`."""
        self._open()
        if offsets is None:
            self.core.ack_polled()
            failed = await self._persist()
            if failed:
                raise ClientError(f"commit of {self.group} failed for {sorted(map(str, failed))}; "
                                  "they stay pending for the next commit")
            return
        for mq, off in offsets.items():
            self.core.offsets.update(mq, off, increase_only=False)
            await self._commit_one(mq, off)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """See :meth:`client.GroupConsumer.seek`."""
        _, puller = self._open()
        pq = self.core.pqs.get(mq)
        if pq is None:
            raise InvalidParameterError(f"seek: {mq} is not assigned to this consumer ({self.assignment()})")
        lo, hi = await puller.min_offset(mq), await puller.max_offset(mq)
        if not isinstance(offset, int) or not lo <= offset <= hi:
            raise InvalidParameterError(f"seek offset {offset!r} of {mq} is outside [{lo}, {hi}]")
        self.core.reset_queue(pq, offset)

    async def committed(self, mq: MessageQueue) -> int:
        """See :meth:`client.GroupConsumer.committed`."""
        return await self._open()[1].fetch_consume_offset(mq)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        """See :meth:`client.GroupConsumer.seek_to_begin`."""
        await self.seek(mq, await self._open()[1].min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        """See :meth:`client.GroupConsumer.seek_to_end`."""
        await self.seek(mq, await self._open()[1].max_offset(mq))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.pause`."""
        self.core.set_paused(queues, True)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """See :meth:`client.GroupConsumer.resume`."""
        self.core.set_paused(queues, False)
        self._avail.set()
