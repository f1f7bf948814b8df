"""Transactional messages on the broker: the half-message rewrite of a prepared send, end-transaction, and the
check service (RocketMQ's ``TransactionalMessageServiceImpl`` + ``TransactionalMessageCheckService``).

The rules are :mod:`broker.transaction.rules`; this module reads and writes the store around them. Every write
goes through the store (so the half, op and check-max topics replicate to slaves like any other topic), on the
broker's event loop thread, without an await between the writes of one end (the real message and its op record
are contiguous in the commit log).

Idempotence. An end whose transaction already has an op record does nothing: the service remembers the ids of
the last ``ENDED_MAX`` settled transactions (from the ends it wrote and the op records it read, also at start),
so a second end -- a retried request, a producer answering a check after its own end got through -- writes
nothing. A second end that arrives after ``ENDED_MAX`` newer transactions were settled is not recognised.

Check service: on a master only (:meth:`start` / :meth:`stop`, also on a DLedger role change). Every
``transactionCheckInterval`` one round (:meth:`check_round`): read the op records from the op offset, walk the
half queue from the check offset (:func:`~broker.transaction.rules.plan_round`), re-put each message to check
with one more ``TRANSACTION_CHECK_TIMES`` and queue the check for its producer group
(:class:`~broker.transaction.checks.CheckQueues`), move those checked ``transactionCheckMax`` times to
``TRANS_CHECK_MAX_TIME_TOPIC``, then store both offsets as consumer offsets of ``CID_SYS_RMQ_TRANS`` (persisted
with the others, and synced to slaves). A crash before they are persisted replays part of a round: a half
message may be re-put and checked twice, and the second end is recognised as above.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

import attrs

from broker.metadata import ConsumerOffsetManager
from broker.store.api import AppendResult, GetMessageStatus, MessageStore, PutMessageStatus
from broker.transaction.checks import CheckQueues
from broker.transaction.rules import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    SYSTEM_GROUP,
    CheckRules,
    HalfView,
    OpView,
    Verdict,
    check_times_of,
    committed_properties,
    half_properties,
    op_offset_after,
    op_properties,
    op_view,
    plan_round,
    recheck_properties,
)
from common.codec import BatchItem, create_offset_msg_id, decode_records, pack_host
from common.codes import SysFlag
from common.errors import (
    InvalidParameterError,
    MessageIllegalError,
    ProtocolViolationError,
    QueryNotFoundError,
    ServiceNotAvailableError,
)
from common.message import MessageExt
from common.properties import PGROUP, REAL_TOPIC, UNIQ_KEY, decode_properties, encode_properties
from common.transaction import EndTransactionRequest, TransactionCheck, TransactionResolution

__all__ = ["ENDED_MAX", "EndOutcome", "RoundReport", "TransactionalMessageService"]

log = logging.getLogger(__name__)

#: Settled transaction ids remembered for idempotent ends.
ENDED_MAX = 100_000
#: Half messages one round looks at, at most (the rest wait for the next round).
ROUND_HALVES_MAX = 10_000
#: Op records one round reads, at most.
ROUND_OPS_MAX = 100_000
#: Op records read at start from before the check service's op offset (transactions settled just before).
RECALL_AT_START = 10_000
_READ_BATCH = 256
_READ_MAX_BYTES = 8 << 20
_TRANSACTION_BITS = int(SysFlag.TRANSACTION_ROLLBACK)
#: Cleared in the committed copy: its hosts are its own, and it is the broker's copy, not an idempotent send.
_HOST_BITS = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6 | SysFlag.IDEMPOTENT)


@attrs.frozen
class EndOutcome:
    """What an end request did."""

    state: str
    """``COMMITTED``, ``ROLLED_BACK`` or ``ALREADY_ENDED`` (nothing written)."""
    last_put: AppendResult | None
    """The last write (its durability is what the request waits for); None when nothing was written."""
    offset_msg_id: str = ""
    """The committed message's broker msgId ('' otherwise)."""


@attrs.frozen
class RoundReport:
    """What one check round did."""

    checked: int = 0
    discarded: int = 0
    settled: int = 0
    half_offset: int = 0
    op_offset: int = 0


def _packed_host(addr: str) -> bytes:
    host, _, port = addr.rpartition(":")
    return pack_host(host.strip("[]"), int(port))


class TransactionalMessageService:
    """Half messages, ends and checks for one broker.

    Args:
        store: the message store.
        offsets: consumer offsets (the check progress is kept as ``CID_SYS_RMQ_TRANS``'s).
        checks: where checks wait for their producer group.
        rules: ``transactionTimeOut`` and ``transactionCheckMax``.
        interval_ms: ``transactionCheckInterval``.
        clock_ms: wall clock in ms (the store's: born and store times are compared with it).
        store_host: the broker's packed address (offset msgIds of committed messages).
        catch_up_dispatch: dispatch what is pending now (so the half queue's end is current).
        on_put: called after each successful write (metrics).
    """

    def __init__(self, store: MessageStore, offsets: ConsumerOffsetManager, checks: CheckQueues, *, rules: CheckRules,
                 interval_ms: int, clock_ms: Callable[[], int], store_host: bytes,
                 catch_up_dispatch: Callable[[], bool], on_put: Callable[[str, AppendResult], None] | None = None
                 ) -> None:
        if interval_ms <= 0:
            raise ValueError("transactionCheckInterval must be > 0")
        self._store = store
        self._offsets = offsets
        self.checks = checks
        self.rules = rules
        self._interval_s = interval_ms / 1000.0
        self._clock_ms = clock_ms
        self._store_host = store_host
        self._catch_up = catch_up_dispatch
        self._on_put = on_put
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    # --- prepare --------------------------------------------------------------------------------------------

    @staticmethod
    def half_item(topic: str, queue_id: int, group: str, items: list[BatchItem]) -> BatchItem:
        """The half message a prepared send stores instead of ``items`` (RocketMQ's ``parseHalfMessageInner``):
        the same body, flags and born time, ``REAL_TOPIC`` / ``REAL_QID`` / ``PGROUP`` added, the transaction
        bits cleared (so it is an ordinary message of the half topic's queue 0).

        Raises:
            MessageIllegalError: more than one message, a delay level, or no producer group.
        """
        if len(items) != 1:
            raise MessageIllegalError(f"a prepared (transactional) send carries one message, got {len(items)} "
                                      f"for topic {topic}")
        item = items[0]
        if item.delay_level:
            raise MessageIllegalError(f"a transactional message to topic {topic} cannot have a delay level "
                                      f"(DELAY={item.delay_level})")
        props = decode_properties(item.properties)
        group = group or props.get(PGROUP, "")
        if not group:
            raise MessageIllegalError(f"a prepared message to topic {topic} names no producer group (the group "
                                      "query argument or the PGROUP property): nobody could answer its checks")
        if not item.uniq_key:
            raise MessageIllegalError(f"a prepared message to topic {topic} has no {UNIQ_KEY} (its transaction id)")
        raw = encode_properties(half_properties(props, topic, queue_id, group))
        return item._replace(sys_flag=item.sys_flag & ~_TRANSACTION_BITS, properties=raw)

    # --- end ------------------------------------------------------------------------------------------------

    def _remember(self, txid: str) -> None:
        ended = self._ended
        ended[txid] = None
        ended.move_to_end(txid)
        while len(ended) > ENDED_MAX:
            ended.popitem(last=False)

    def find_half(self, req: EndTransactionRequest) -> MessageExt:
        """The half message an end request names, checked against it.

        Raises:
            QueryNotFoundError: no half message is stored at ``commitLogOffset``.
            InvalidParameterError: the half message there has another transaction id, group or topic.
        """
        record = self._store.look_message_by_offset(req.commit_log_offset)
        msg = None
        if record is not None:
            with contextlib.suppress(ProtocolViolationError, IndexError):
                msg = decode_records(record)[0]
        if msg is None or msg.topic != HALF_TOPIC:
            raise QueryNotFoundError(f"no half message of transaction {req.transaction_id} at commit-log offset "
                                     f"{req.commit_log_offset} (prepared transaction message not found)")
        props = msg.properties
        for what, got, want in (("transactionId", props.get(UNIQ_KEY, ""), req.transaction_id),
                                ("group", props.get(PGROUP, ""), req.group),
                                ("topic", props.get(REAL_TOPIC, ""), req.topic)):
            if got != want:
                raise InvalidParameterError(f"the half message at commit-log offset {req.commit_log_offset} has "
                                            f"{what} {got!r}, the end request says {want!r}")
        return msg

    def end(self, req: EndTransactionRequest) -> EndOutcome:
        """Commit or roll back (``endMessageTransaction``): write the real message on commit, then the op record.

        Raises:
            QueryNotFoundError / InvalidParameterError: see :meth:`find_half`.
            MessageIllegalError: the half message's ``REAL_TOPIC`` / ``REAL_QID`` are unreadable.
        """
        msg = self.find_half(req)
        txid = req.transaction_id
        if txid in self._ended:
            log.info("transaction %s of group %s already ended; %s%s ignored", txid, req.group,
                     req.resolution.value, " (from a check)" if req.from_check else "")
            return EndOutcome("ALREADY_ENDED", None)
        real = None
        if req.resolution is TransactionResolution.COMMIT:
            try:
                real = committed_properties(msg.properties)
            except ValueError as e:
                raise MessageIllegalError(f"transaction {txid}: {e}") from None
        self._catch_up()
        # Every copy of the transaction lies below this (the one named is, even if dispatch is still behind).
        half_end = max(self._store.get_max_offset_in_queue(HALF_TOPIC, 0), msg.queue_offset + 1)
        offset_msg_id = ""
        # No await from here on: the real message and its op record are written back to back.
        if real is not None:
            topic, queue_id, props = real
            committed = self._put(topic, queue_id, msg, props)
            # Remembered at once: should the op record fail (disk full), a retried end must not commit again.
            self._remember(txid)
            offset_msg_id = create_offset_msg_id(self._store_host, committed.wrote_offset)
        last = self._put(OP_TOPIC, 0, None, op_properties(txid, half_end), body=str(msg.queue_offset).encode())
        self._remember(txid)
        log.debug("transaction %s of group %s: %s%s", txid, req.group, req.resolution.value,
                  " (from a check)" if req.from_check else "")
        return EndOutcome("COMMITTED" if real is not None else "ROLLED_BACK", last, offset_msg_id)

    def _put(self, topic: str, queue_id: int, msg: MessageExt | None, props: dict[str, str], *,
             body: bytes | None = None) -> AppendResult:
        """One write; raises the store's refusal as a broker error. A failed real-message put stops an end before
        its op record; a failed op record after a committed message leaves the transaction remembered (never
        committed twice) and its half message checked again, up to ``transactionCheckMax``."""
        now = self._clock_ms()
        if msg is not None:
            result = self._store.put_message(
                topic, queue_id, msg.body, props, born_host=_packed_host(msg.born_host),
                born_timestamp=msg.born_timestamp, flag=msg.flag,
                sys_flag=msg.sys_flag & ~(_TRANSACTION_BITS | _HOST_BITS), reconsume_times=msg.reconsume_times)
        else:
            result = self._store.put_message(topic, queue_id, body or b"", props, born_host=self._store_host,
                                              born_timestamp=now)
        if result.status is not PutMessageStatus.PUT_OK:
            raise ServiceNotAvailableError(f"transaction write to {topic} queue {queue_id} failed: "
                                           f"{result.status.value} {result.remark}")
        if self._on_put is not None:
            self._on_put(topic, result)
        return result

    # --- the check service ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Remember the transactions the op records say are settled, and start the rounds (a master only)."""
        if self.running:
            return
        self._catch_up()
        # Also the op records just before the check service's op offset: a late end of a transaction settled
        # shortly before a restart is still recognised.
        store = self._store
        op_offset = self._offsets.query(SYSTEM_GROUP, OP_TOPIC, 0) or 0
        start = max(store.get_min_offset_in_queue(OP_TOPIC, 0),
                    min(op_offset, store.get_max_offset_in_queue(OP_TOPIC, 0) - RECALL_AT_START))
        for op in self._read_ops(start):
            self._remember(op.transaction_id)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="broker-transaction-check")
        log.info("transaction check service started: every %.1f s, timeout %d ms, at most %d checks",
                 self._interval_s, self.rules.timeout_ms, self.rules.check_max)

    async def stop(self) -> None:
        """Stop the rounds and drop the queued checks (a new master checks again). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.checks.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.check_round()
            except Exception:  # one bad round (disk error...) must not end the checks
                log.exception("transaction check round failed")

    def _read(self, topic: str, start: int, limit: int) -> list[tuple[int, MessageExt, bytes]]:
        out: list[tuple[int, MessageExt, bytes]] = []
        offset = start
        end = self._store.get_max_offset_in_queue(topic, 0)
        while offset < end and len(out) < limit:
            res = self._store.get_message(SYSTEM_GROUP, topic, 0, offset, min(_READ_BATCH, limit - len(out)),
                                          _READ_MAX_BYTES)
            if res.status is not GetMessageStatus.FOUND:
                if res.next_begin_offset <= offset:
                    break
                log.warning("%s: units [%d, %d) have no message (%s); skipped", topic, offset,
                            res.next_begin_offset, res.status.value)
                offset = res.next_begin_offset
                continue
            for qo, rec in zip(res.queue_offsets, res.records, strict=True):
                try:
                    out.append((qo, decode_records(rec)[0], rec))
                except Exception as e:
                    log.error("%s offset %d: unreadable record skipped: %s", topic, qo, e)
            offset = res.next_begin_offset
        return out

    def _read_ops(self, start: int) -> list[OpView]:
        ops = []
        for qo, msg, _rec in self._read(OP_TOPIC, start, ROUND_OPS_MAX):
            op = op_view(qo, msg.properties)
            if op is not None:
                ops.append(op)
        return ops

    def check_round(self) -> RoundReport:
        """One round (see the module docstring); synchronous, as the store is."""
        self.rounds += 1
        self._catch_up()
        offsets = self._offsets
        op_start = offsets.query(SYSTEM_GROUP, OP_TOPIC, 0) or 0
        half_start = max(offsets.query(SYSTEM_GROUP, HALF_TOPIC, 0) or 0,
                         self._store.get_min_offset_in_queue(HALF_TOPIC, 0))
        ops = self._read_ops(op_start)
        settled = {op.transaction_id for op in ops}
        for txid in settled:
            self._remember(txid)
        halves = self._read(HALF_TOPIC, half_start, ROUND_HALVES_MAX)
        views = [HalfView(qo, msg.properties.get(UNIQ_KEY, ""), msg.born_timestamp,
                          check_times_of(msg.properties)) for qo, msg, _ in halves]
        plan = plan_round(half_start, views, settled, self._clock_ms(), self.rules)
        by_offset = {qo: (msg, rec) for qo, msg, rec in halves}
        checked = discarded = done = 0
        for view, verdict in plan.actions:
            msg, _rec = by_offset[view.queue_offset]
            if verdict is Verdict.SETTLED:
                done += 1
            elif verdict is Verdict.DISCARD:
                discarded += 1
                log.warning("transaction %s of group %s (topic %s) checked %d times without an answer: moved to "
                            "%s (transactionCheckMax=%d)", view.transaction_id, msg.properties.get(PGROUP),
                            msg.properties.get(REAL_TOPIC), view.check_times, CHECK_MAX_TOPIC,
                            self.rules.check_max)
                self._put(CHECK_MAX_TOPIC, 0, msg, dict(msg.properties))
            elif not view.transaction_id or not msg.properties.get(PGROUP):
                log.error("half message at offset %d has no transaction id or group; skipped", view.queue_offset)
            else:
                checked += 1
                self._check(msg, view.check_times + 1)
        half_offset = plan.next_offset
        op_offset = op_offset_after(op_start, ops, half_offset)
        offsets.commit(SYSTEM_GROUP, HALF_TOPIC, 0, half_offset)
        offsets.commit(SYSTEM_GROUP, OP_TOPIC, 0, op_offset)
        if checked or discarded:
            log.info("transaction check round: %d checked, %d discarded, %d settled; half offset %d, op offset %d",
                     checked, discarded, done, half_offset, op_offset)
        return RoundReport(checked, discarded, done, half_offset, op_offset)

    def _check(self, msg: MessageExt, check_times: int) -> None:
        """Re-put the half message with its new check count (``putBackHalfMsgQueue``), then queue the check
        naming the new copy."""
        props = recheck_properties(msg.properties, check_times)
        try:
            topic, queue_id, _ = committed_properties(props)
        except ValueError as e:
            log.error("half message %s skipped: %s", msg.offset_msg_id, e)
            return
        result = self._put(HALF_TOPIC, 0, msg, props)
        record = self._store.look_message_by_offset(result.wrote_offset)
        if record is None:  # cannot happen right after a put; the next round checks again
            log.error("re-put half message at %d cannot be read back", result.wrote_offset)
            return
        check = TransactionCheck(props.get(UNIQ_KEY, ""), result.wrote_offset, result.queue_offset, topic,
                                 queue_id, check_times, record)
        self.checks.offer(props[PGROUP], check)

    def status(self) -> dict[str, object]:
        return {"running": self.running, "rounds": self.rounds, "checksDropped": self.checks.dropped,
                "parkedCheckPolls": self.checks.parked}
