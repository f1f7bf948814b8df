"""The pull loop of one Spark task: read a planned queue range ``[start, end)`` into Arrow batches.

Member choice per pull follows the SDK (docs/BEHAVIOUR.md 3.3): ``auto`` resolves the broker's last suggestion for
the queue (the pooled client's hint table), ``master`` pins broker id 0 and ``slave`` pins id 1; either id goes
through ``find_broker_address_in_subscribe`` (id, then id+1 for slaves, then the first member). On top of the
SDK the connector adds two rules that keep a planned range exact:

* a member that answers "nothing here" before ``end`` (a lagging slave) is never taken as the end of the range:
  the rest of the range is pulled from the master;
* a master that does not answer (connect error, timeout) is skipped for the rest of the task when
  ``slaveFallback`` is on, so the group's slave serves instead.

Records at or past ``end`` are dropped (a pull cannot stop at ``end``); the tag filter is rechecked on the
client like the SDK does. Every wait and retry is bounded by ``pullRetries``.

**Pipelining.** One pull costs a broker round trip, and a broker caps each answer
(``maxTransferCountOnMessageInMemory``, 32 messages by RocketMQ default), so one request at a time leaves a task
waiting most of the time. The planned range is known and a queue's offsets are contiguous, so with
``pullConcurrency`` > 1 the task cuts the range into *segments* of ``window`` offsets and keeps up to
``pullConcurrency`` segment pulls in flight on a small thread pool, consuming answers strictly in offset order.
The first pull goes alone (it learns the broker's suggestion and cap). An answer that stops short of its
segment's end (the broker's count or byte cap) shrinks ``window`` to what one pull covered, and the rest of the
segment is pulled again from where the answer ended, so nothing is skipped. Any other surprise (an error, a
lagging member, an answer past its segment) drops the in-flight pulls and restarts the pipeline from the first
offset not yet read, through the same rules as the one-at-a-time loop. Answers are applied and decoded only on
the task's thread, in order, so the batches are the same whatever the concurrency.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from client.errors import (
    BrokerError,
    BrokerNotFoundError,
    ClientError,
    NoPermissionError,
    RequestTimeoutError,
    TransportError,
)
from client.lowlevel import find_broker_address_in_subscribe
from common.codes import PullStatus
from common.selector import MessageSelector
from spark_connector.arrow import RawChunk, decode_to_batch
from spark_connector.errors import DataLossError
from spark_connector.offsets import QueueKey
from spark_connector.options import SourceOptions
from spark_connector.planning import QueueRange
from spark_connector.pushdown import Subscription
from spark_connector.transport import DEFAULT_READER_GROUP, RawPull

log = logging.getLogger(__name__)

__all__ = ["DataLossError", "PullClient", "RangeReader", "parse_tags_filter", "subscription_of"]

#: Seconds a pipelined pull may run past ``pullTimeoutMs`` before the task stops waiting for its answer.
_RESULT_GRACE_S = 5.0


class PullClient(Protocol):
    """What the pull loop needs from a client (the pooled :class:`~spark_connector.transport.BrokerClient`)."""

    def broker_addrs(self, topic: str, broker_name: str, *, refresh: bool = False) -> dict[int, str]: ...

    def hint(self, key: QueueKey) -> int: ...

    def set_hint(self, key: QueueKey, broker_id: int) -> None: ...

    def pull(
        self, addr: str, key: QueueKey, offset: int, *, max_nums: int, max_bytes: int,
        sub_expression: str | MessageSelector, group: str, timeout_s: float,
    ) -> RawPull: ...


def parse_tags_filter(sub_expression: str) -> frozenset[str] | None:
    """The tag set of ``TagA || TagB`` (None for ``*``, which matches everything)."""
    expr = sub_expression.strip()
    if not expr or expr == "*":
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    return tags or None


def subscription_of(options: SourceOptions) -> Subscription:
    """The subscription of a read without pushed filters: the options' ``subExpression`` and its type."""
    if options.expression_type == "TAG":
        return Subscription(options.sub_expression, "TAG", parse_tags_filter(options.sub_expression))
    return Subscription(options.sub_expression, options.expression_type)


@dataclass
class _Segment:
    """Offsets ``[start, end)`` that one pull (``future``, once submitted) asks ``member`` at ``addr`` for."""

    start: int
    end: int
    member: int = -1
    addr: str = ""
    future: cf.Future[RawPull] | None = None


class RangeReader:
    """Reads one :class:`QueueRange`; iterate :meth:`batches`.

    Args:
        client: where pulls go.
        options: the source options (routing mode, retries, caps, filter, concurrency).
        rng: the planned range.
        subscription: what each pull asks the broker to filter (:func:`subscription_of` the options when None).
        sleep: injected pause (tests pass a fake).
    """

    def __init__(
        self,
        client: PullClient,
        options: SourceOptions,
        rng: QueueRange,
        *,
        subscription: Subscription | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.opts = options
        self.rng = rng
        self.key = rng.key
        self.offset = rng.start
        self.sleep = sleep
        self.addrs: Mapping[int, str] = dict(rng.broker_addrs)
        self.down: set[int] = set()
        self.force_master = False
        self.failures = 0
        self.stalls = 0
        self._use(subscription or subscription_of(options))
        self.group = options.group or DEFAULT_READER_GROUP
        self.served: set[int] = set()
        self.window = options.pull_batch_size
        """Offsets asked for per pull; shrinks to what the broker's cap lets one pull cover."""
        self.pull_max_bytes = max(1, min(options.pull_max_bytes, options.max_batch_bytes))
        self.requests = 0
        """Pull answers applied (for tests and logs)."""

    def _use(self, sub: Subscription) -> None:
        self.subscription = sub
        self.tags_filter = sub.tags
        self.selector: str | MessageSelector = (sub.expression if sub.expression_type == "TAG"
                                                else MessageSelector(sub.expression, sub.expression_type))

    # --- member choice ------------------------------------------------------------------------------------

    def _wanted_id(self) -> int:
        if self.force_master or self.opts.pull_from == "master":
            want = 0
        elif self.opts.pull_from == "slave":
            want = 1
        else:
            want = self.client.hint(self.key)
        if want in self.down:
            if want == 0 and not self.opts.slave_fallback:
                return 0
            alive = sorted(i for i in self.addrs if i not in self.down)
            if alive:
                return alive[0]
        return want

    def _resolve(self) -> tuple[int, str]:
        want = self._wanted_id()
        found = find_broker_address_in_subscribe(self.addrs, want, False)
        if found is None:
            self.addrs = self.client.broker_addrs(self.key.topic, self.key.broker_name, refresh=True)
            found = find_broker_address_in_subscribe(self.addrs, want, False)
        if found is None:
            raise BrokerNotFoundError(f"The broker[{self.key.broker_name}] not exist (reading {self.rng})")
        member = next((i for i, a in self.addrs.items() if a == found.broker_addr), want)
        return member, found.broker_addr

    # --- failures -----------------------------------------------------------------------------------------

    def _on_failure(self, member: int, addr: str, err: ClientError) -> None:
        self.failures += 1
        if self.failures > self.opts.pull_retries:
            raise err
        log.warning("pull of %s at %d from broker id %d (%s) failed (%d/%d): %s", self.key, self.offset, member,
                    addr, self.failures, self.opts.pull_retries, err)
        self.down.add(member)
        try:
            fresh = self.client.broker_addrs(self.key.topic, self.key.broker_name, refresh=True)
            if fresh:
                self.addrs = fresh
        except ClientError as e:  # the nameserver may be unreachable too; keep the snapshot
            log.warning("route refresh for %s failed: %s", self.key, e)
        if member == 0 and self.opts.slave_fallback and any(i != 0 for i in self.addrs):
            return  # the next attempt goes to a slave at once
        if len(self.down) >= len(self.addrs):
            self.down.clear()
        self.sleep(self.opts.retry_backoff_s)

    def _data_loss(self, message: str, skip_to: int) -> None:
        if self.opts.fail_on_data_loss:
            raise DataLossError(f"{message}; set failOnDataLoss=false to skip lost offsets")
        log.warning("%s; skipping to offset %d (failOnDataLoss=false)", message, skip_to)
        self.offset = skip_to

    def _no_progress(self, r: RawPull) -> None:
        """The member had nothing at ``offset`` although the plan says messages exist there."""
        if r.served_by_broker_id != 0 and not self.force_master and 0 not in self.down:
            log.info("broker id %d of %s has nothing at %d (< planned end %d): reading the rest from the master",
                     r.served_by_broker_id, self.key, self.offset, self.rng.end)
            self.force_master = True
            return
        if self.offset < r.min_offset:
            self._data_loss(f"{self.key}: offsets [{self.offset}, {r.min_offset}) expired (min offset "
                            f"{r.min_offset})", min(r.min_offset, self.rng.end))
            return
        self.stalls += 1
        if self.stalls > self.opts.pull_retries:
            self._data_loss(
                f"{self.key}: broker id {r.served_by_broker_id} has max offset {r.max_offset} but the planned "
                f"range needs [{self.offset}, {self.rng.end}) ({r.status.value} after {self.stalls} attempts)",
                self.rng.end,
            )
            return
        self.sleep(self.opts.retry_backoff_s)

    # --- one pull -----------------------------------------------------------------------------------------

    def _request(self, addr: str, offset: int, max_nums: int) -> RawPull:
        """The network part of one pull (runs on a pool thread when pipelined)."""
        return self.client.pull(
            addr, self.key, offset, max_nums=max_nums, max_bytes=self.pull_max_bytes,
            sub_expression=self.selector, group=self.group, timeout_s=self.opts.pull_timeout_s,
        )

    def _settle(self, member: int, addr: str, answer: Callable[[], RawPull]) -> RawPull | None:
        """Apply one pull's outcome to the routing state; None when it failed (the failure is counted)."""
        self.requests += 1
        try:
            r = answer()
        except TransportError as e:
            self._on_failure(member, addr, e)
            return None
        except BrokerError as e:
            fallback = self.subscription.fallback
            if isinstance(e, NoPermissionError) and fallback is not None:
                # the SQL92 filter pushdown added: this broker refuses SQL92 (enablePropertyFilter=false). Spark
                # re-checks those filters, so read with the plain subscription
                log.warning("broker id %d of %s refuses the pushed-down filter %r (%s): reading without it",
                            member, self.key, self.subscription.expression, e)
                self._use(fallback)
                return None
            if not e.retriable:
                raise
            if member != 0 and not self.force_master and 0 not in self.down:
                self.force_master = True  # a slave refusing (busy, not synced yet): the master serves the rest
                return None
            self._on_failure(member, addr, e)
            return None
        self.failures = 0
        if self.opts.pull_from == "auto":
            self.client.set_hint(self.key, r.suggest_which_broker_id)
        return r

    def _advance(self, r: RawPull) -> bool:
        """Apply a pull answer to ``offset``; True when it brought records to keep."""
        if r.status is PullStatus.FOUND and r.n_records > 0:
            self.stalls = 0
            self.served.add(r.served_by_broker_id)
            self.offset = max(r.next_begin_offset, self.offset + 1)
            return True
        if r.status is PullStatus.NO_MATCHED_MSG and r.next_begin_offset > self.offset:
            self.stalls = 0
            self.offset = r.next_begin_offset
            return False
        self._no_progress(r)
        return False

    # --- the loops ----------------------------------------------------------------------------------------

    def _sequential(self) -> Iterator[RawPull]:
        """One pull at a time (``pullConcurrency`` = 1, or a range one pull covers)."""
        while self.offset < self.rng.end:
            member, addr = self._resolve()
            answer = functools.partial(self._request, addr, self.offset, min(self.window, self.rng.end - self.offset))
            r = self._settle(member, addr, answer)
            if r is not None and self._advance(r):
                yield r

    def _submit(self, segs: deque[_Segment], depth: int, pool: cf.ThreadPoolExecutor) -> None:
        for i, seg in enumerate(segs):
            if i >= depth:
                break
            if seg.future is None:
                seg.member, seg.addr = self._resolve()
                seg.future = pool.submit(self._request, seg.addr, seg.start, seg.end - seg.start)

    def _pipelined(self, pool: cf.ThreadPoolExecutor) -> Iterator[RawPull]:
        """Up to ``pullConcurrency`` pulls in flight, answers applied in offset order (module docstring)."""
        segs: deque[_Segment] = deque()
        tail = self.offset  # the first offset no segment covers yet
        depth = 1  # one pull until one succeeded: it learns the broker's suggestion and cap
        wait_s = self.opts.pull_timeout_s + _RESULT_GRACE_S
        try:
            while self.offset < self.rng.end:
                while len(segs) < depth and tail < self.rng.end:
                    segs.append(_Segment(tail, min(self.rng.end, tail + self.window)))
                    tail = segs[-1].end
                self._submit(segs, depth, pool)
                head = segs.popleft()
                assert head.future is not None and head.start == self.offset, (head, self.offset)
                r = self._settle(head.member, head.addr, functools.partial(_answer, head.future, wait_s, head.addr))
                kept = r is not None and self._advance(r)
                moved = r is not None and r.next_begin_offset == self.offset
                if moved and self.offset == head.end:
                    depth = self.opts.pull_concurrency
                elif moved and head.start < self.offset < head.end:
                    # the broker capped the answer (count or bytes): pull the rest in pieces one pull covers
                    depth = self.opts.pull_concurrency
                    self.window = max(1, min(self.window, self.offset - head.start))
                    rest = [_Segment(s, min(head.end, s + self.window))
                            for s in range(self.offset, head.end, self.window)]
                    segs.extendleft(reversed(rest))
                else:  # failed, no progress, or past the segment: restart from the first unread offset
                    _forget(segs)
                    tail = self.offset
                if kept:
                    assert r is not None
                    yield r
        finally:
            _forget(segs)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the range's messages (each within ``maxBatchRows`` and, but for a single record
        larger than it, ``maxBatchBytes``)."""
        cap_rows, cap_bytes = self.opts.max_batch_rows, self.opts.max_batch_bytes
        pool: cf.ThreadPoolExecutor | None = None
        if self.opts.pull_concurrency > 1 and self.rng.size > self.window:
            pool = cf.ThreadPoolExecutor(self.opts.pull_concurrency, thread_name_prefix="splitmq-spark-pull")
        try:
            pending: list[RawChunk] = []
            rows = nbytes = 0
            for r in self._pipelined(pool) if pool is not None else self._sequential():
                if pending and nbytes + len(r.records) > cap_bytes:
                    yield from self._flush(pending)
                    pending, rows, nbytes = [], 0, 0
                pending.append((r.records, r.served_by_broker_id))
                rows += r.n_records
                nbytes += len(r.records)
                if rows >= cap_rows or nbytes >= cap_bytes:
                    yield from self._flush(pending)
                    pending, rows, nbytes = [], 0, 0
            if pending:
                yield from self._flush(pending)
        finally:
            if pool is not None:  # running pulls end on their own timeout; nobody reads them
                pool.shutdown(wait=False, cancel_futures=True)

    def _flush(self, chunks: list[RawChunk]) -> Iterator[pa.RecordBatch]:
        batch = decode_to_batch(
            chunks, topic=self.key.topic, broker_name=self.key.broker_name,
            include_properties=self.opts.include_properties, end_offset=self.rng.end,
            tags_filter=self.tags_filter,
        )
        cap = self.opts.max_batch_rows
        for start in range(0, batch.num_rows, cap):
            yield batch.slice(start, cap)


def _answer(future: cf.Future[RawPull], wait_s: float, addr: str) -> RawPull:
    """The answer of a pipelined pull; one that outlives its own timeout by far counts as timed out."""
    try:
        return future.result(timeout=wait_s)
    except cf.TimeoutError:
        future.cancel()
        raise RequestTimeoutError(f"pull from {addr} gave no answer within {wait_s:.1f} s (pullTimeoutMs plus "
                                  f"{_RESULT_GRACE_S:.0f} s grace)", broker_addr=addr) from None


def _forget(segs: deque[_Segment]) -> None:
    """Drop in-flight pulls: queued ones never run; running ones end on their own timeout, unread."""
    for seg in segs:
        if seg.future is not None:
            seg.future.cancel()
    segs.clear()
