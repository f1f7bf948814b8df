"""The broker's message store in DLedger mode (docs/BEHAVIOUR.md 9.8): the replicated DLedger log is the commit log.

A send becomes one DLedger entry whose body is the send's RocketMQ records (docs/BEHAVIOUR.md 7.1), written back to
back straight into the entry; each record's PHYSICALOFFSET is its position in the data files, so the entry's
first record sits at entry position + 48 and msgIds carry those offsets. Everything that reads the commit log
(pulls, lookups by offset or key, the flush thread, the disk guard) reads the DLedger data files through the
same :class:`~broker.store.commitlog.CommitLog` interface.

Consume queues and the index are built only from *committed* entries (:class:`CommittedDispatcher`), so a
consumer never sees an entry a new leader may truncate, and the store's end (``max_physical_offset``) is the
committed position. Committed entries are never truncated, so the queues never need cutting back; after a crash
they are cut to the end of the recovered log, and dispatch resumes from the first entry they miss.

The store's append event is published when the committed position moves (not at the local append), which is
what wakes dispatch and, through it, parked pulls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Iterator, Sequence

from broker.dledger.config import AppendError
from broker.dledger.entry import BODY_OFFSET
from broker.dledger.server import DLedgerServer
from broker.dledger.store import DLedgerStore
from broker.store.api import AppendResult, PutMessageStatus, StoredKey, StoreError
from broker.store.cleaner import StoreCleaner
from broker.store.commitlog import Run
from broker.store.config import StoreConfig
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from broker.store.dispatch import HANDOVER_MAX_MESSAGES, Dispatcher, DispatchListener
from broker.store.file_store import FileMessageStore
from broker.store.idempotent import record_keys, store_time_at
from broker.store.index import IndexService
from broker.store.io import FileIO
from common.codec import BatchItem, write_batch_records

__all__ = ["CommittedDispatcher", "DLedgerMessageStore", "put_status"]

log = logging.getLogger(__name__)

#: DLedger's ``checkPointInterval``: the checkpoint (end and committed index) is rewritten at most this often while
#: running, and at shutdown. Recovery does not depend on it: the end comes from the entries, and a committed index
#: behind the consume queues is raised to what they hold.
CHECKPOINT_INTERVAL_MS = 3000

#: How an append the member refused is answered (docs/BEHAVIOUR.md 9.8's table, 4.9.3 column).
_REFUSED = {
    "NOT_LEADER": PutMessageStatus.SERVICE_NOT_AVAILABLE,
    "LEADER_TRANSFERRING": PutMessageStatus.SERVICE_NOT_AVAILABLE,
    "LEADER_PENDING_FULL": PutMessageStatus.OS_PAGE_CACHE_BUSY,
}


def put_status(code: str) -> PutMessageStatus:
    """The put status of a DLedger append code (docs/BEHAVIOUR.md 9.8)."""
    return _REFUSED.get(code, PutMessageStatus.UNKNOWN_ERROR)


def _retrieve(fut: asyncio.Future[tuple[int, int]]) -> None:
    """Mark a commit future's failure as seen (a send that does not wait, a server-side put)."""
    if not fut.cancelled():
        fut.exception()


class CommittedDispatcher(Dispatcher):
    """Builds consume queues and the index from committed entries, one entry at a time (records inside an entry
    are dispatched by the classic loop). ``reput`` is the position after the last dispatched entry.

    On the leader the append hands each entry's records over (:meth:`handover_entry`, the classic store's
    :meth:`Dispatcher.handover`), so its commit builds their units without parsing the bytes back -- that parse
    cost the leader as much as the append itself. A hand-over is used only for the very entry it was made for:
    same index and term (Raft's log matching: then the same bytes), else the entry is parsed; an entry of a lost
    leadership that a new leader replaced at the same position is never taken for it."""

    def __init__(self, ledger: DLedgerStore, cqs: ConsumeQueueTable, index: IndexService | None,
                 delay_levels_ms: tuple[int, ...], listeners: list[DispatchListener]) -> None:
        super().__init__(ledger.data, cqs, index, delay_levels_ms, listeners)
        self.ledger = ledger
        self.next_index = 0
        self._handed: collections.deque[tuple[int, int]] = collections.deque(maxlen=HANDOVER_MAX_MESSAGES)
        """``(index, term)`` of the entries handed over, in append order (bounded: a lost one is parsed)."""

    def handover_entry(self, index: int, term: int, body_pos: int, runs: Sequence[Run], total: int,
                       store_ts: int, offsets: Sequence[int]) -> None:
        """The leader appended entry ``index`` of ``term`` whose body (``total`` bytes of records, as ``runs``
        planned them, each record at its offset in ``offsets``) starts at ``body_pos``."""
        self._handed.append((index, term))
        self.handover(body_pos, body_pos + total, store_ts, runs, offsets)

    def _handed_over(self, index: int, term: int) -> bool:
        """Whether the hand-over waiting for entry ``index`` was made for it (the same term); drops those of
        earlier indexes (entries dispatched from their bytes)."""
        handed = self._handed
        while handed and handed[0][0] < index:
            handed.popleft()
        if handed and handed[0][0] == index:
            return handed.popleft()[1] == term
        return False

    def start_at(self, physical_offset: int) -> None:
        """Resume with the first entry that ends after ``physical_offset`` (queues skip what they hold)."""
        ledger = self.ledger
        lo, hi = max(ledger.begin_index, 0), ledger.end_index + 1
        while lo < hi:
            mid = (lo + hi) // 2
            unit = ledger.unit(mid)
            if unit is not None and unit[0] + unit[1] <= physical_offset:
                lo = mid + 1
            else:
                hi = mid
        self.next_index = lo
        unit = ledger.unit(lo)
        self.reput = unit[0] if unit is not None else ledger.end_pos

    def _dispatch(self, max_bytes: int, notify: dict[ConsumeQueue, int]) -> int:
        ledger = self.ledger
        consumed = 0
        while consumed < max_bytes and self.next_index <= ledger.committed_index:
            index = self.next_index
            unit = ledger.unit(index)
            if unit is None:
                if index < ledger.begin_index:  # the log restarted further on (a follower far behind a leader
                    self.next_index = ledger.begin_index  # whose retention deleted what it missed)
                    self.cqs.correct_min_offsets(ledger.data.min_offset)
                    continue
                break
            pos, size, term = unit
            if size > BODY_OFFSET:  # a leader's empty entry holds no record
                mf = ledger.data.file_for(pos)
                if mf is None:
                    break
                at = pos - mf.start
                end = at + size
                handed = self._take_handover(pos + BODY_OFFSET) if self._handed else None
                if (handed is not None and handed[1] == pos + size and self._handed_over(index, term)
                        and self._matches(mf.mm, at + BODY_OFFSET, handed)):
                    self._dispatch_handover(handed, notify)
                else:
                    done, _ = self._dispatch_file(mf.mm, mf.start, mf.size, at + BODY_OFFSET, end, end, notify)
                    if done != end:
                        log.error("dispatch stopped in entry %d at position %d", index, mf.start + done)
                        break
            self.next_index = index + 1
            self.reput = pos + size
            consumed += size
        return consumed


class DLedgerMessageStore(FileMessageStore):
    """The file store with the DLedger log as its commit log.

    Args:
        config: the store configuration (``mapped_file_size_commitlog`` sizes the DLedger data files).
        self_id: this member's id (the log lives in ``<root>/dledger-<self_id>``).
        index_file_size: ``mappedFileSizeForEntryIndex``.
        io: the file layer (default :class:`~broker.store.io.FileIO`).

    The broker attaches the member with :meth:`attach` before it starts serving.
    """

    def __init__(self, config: StoreConfig, *, self_id: str, index_file_size: int, io: FileIO | None = None) -> None:
        super().__init__(config, io)
        self.ledger = DLedgerStore(self.io, os.path.join(self.root, f"dledger-{self_id}"),
                                   data_file_size=config.mapped_file_size_commitlog, index_file_size=index_file_size,
                                   preallocate=config.preallocate_commitlog)
        self.commitlog = self.ledger.data
        # The classic dispatcher's listener list itself: a listener added later (add_dispatch_listener) hears both.
        self.entries = CommittedDispatcher(self.ledger, self.cqs, self.index, config.delay_levels_ms,
                                           self.dispatcher.listeners)
        self.dispatcher = self.entries
        self.cleaner = StoreCleaner(self.commitlog, self.cqs, self.index, self.dispatcher, config.retention,
                                    config.disk_used_ratio or self.io.used_ratio, config.clock_ms,
                                    config.destroy_mapped_file_interval_forcibly_ms)
        self.node: DLedgerServer | None = None
        self._checkpointed = (-2, -2)
        self._checkpointed_at = 0

    def attach(self, node: DLedgerServer) -> None:
        """The member that appends for this store (built on :attr:`ledger`)."""
        self.node = node

    # -- lifecycle ------------------------------------------------------------------------------------------
    def _open_and_recover(self, last_exit_ok: bool) -> None:
        """The DLedger log opens and recovers its own end (:meth:`DLedgerStore.load`; ``commitlog`` is its data
        chain); the consume queues are cut to it and dispatch resumes with the first entry they miss."""
        ledger = self.ledger
        ledger.load()
        self.cqs.load()
        if self.index is not None:
            self.index.load()
        self.cqs.recover()
        self.cqs.truncate_dirty(ledger.end_pos)
        dispatched = self.cqs.max_physic_end()
        self._commit_dispatched(dispatched)
        start = min(dispatched, self.index.end_phy) if self.index is not None else dispatched
        self.entries.start_at(start)
        while self.dispatcher.dispatch_available(64 << 20):
            pass

    def _commit_dispatched(self, dispatched: int) -> None:
        """Queues only ever held committed entries: a checkpoint written before their commit is behind them."""
        ledger = self.ledger
        if dispatched <= max(ledger.committed_pos, 0):
            return
        self.entries.start_at(dispatched - 1)
        index = self.entries.next_index
        if index <= ledger.end_index and index > ledger.committed_index:
            log.info("%s: committed index %d raised to %d (the consume queues hold it)", ledger.directory,
                     ledger.committed_index, index)
            ledger.committed_index = index
            ledger.committed_pos = ledger.end_of(index)

    def _flush_commitlog(self, least_pages: int) -> int:
        flushed = super()._flush_commitlog(least_pages)
        ledger = self.ledger
        ledger.index.flush()
        now = (ledger.end_index, ledger.committed_index)
        at = self.config.clock_ms()
        if now != self._checkpointed and at - self._checkpointed_at >= CHECKPOINT_INTERVAL_MS:
            ledger.write_checkpoint()
            self._checkpointed, self._checkpointed_at = now, at
        return flushed

    def _close_files(self, *, crashed: bool = False) -> None:
        if not crashed and self.loaded:
            try:
                self.ledger.write_checkpoint()
            except OSError as e:
                log.error("cannot write the DLedger checkpoint: %s", e)
        self.ledger.index.close()
        super()._close_files(crashed=crashed)

    def committed_moved(self, committed_index: int, committed_pos: int) -> None:
        """The member's commit callback: publish the append event (dispatch and parked pulls wake)."""
        self._after_append()

    # -- writes ---------------------------------------------------------------------------------------------
    def append_batch(
        self,
        topic: str,
        queue_id: int,
        items: Sequence[BatchItem],
        *,
        born_host: bytes,
        reconsume_times: int = 0,
    ) -> AppendResult:
        """Append the records as one entry of the leader's log; ``committed`` on the result completes when a
        quorum stores it. Same validation as the classic store; a member that is not the leader refuses."""
        bad = self._unavailable()
        if bad is not None:
            return bad
        node = self.node
        if node is None:
            return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, "the DLedger member is not started")
        plan = self.validator.plan(topic, queue_id, items, self.topic_queue_table)
        if isinstance(plan, AppendResult):
            return plan
        runs, total, advances, first_queue_offset = plan
        room = self.commitlog.file_size - BODY_OFFSET - 8
        if total > room:
            return AppendResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"batch of {len(items)} messages is {total} bytes stored; it must fit one DLedger data file "
                f"(mappedFileSizeCommitLog {self.commitlog.file_size} minus 56)",
            )
        store_ts = self.config.clock_ms()
        store_host = self.config.store_host
        offsets: list[int] = []

        def build(buf: bytearray, at: int, phys: int) -> None:
            pos = at
            for topic_b, qid, first, run_items, nbytes in runs:
                offsets.extend(write_batch_records(
                    buf, pos, phys - at, topic=topic_b, queue_id=qid, first_queue_offset=first, items=run_items,
                    born_host=born_host, store_timestamp=store_ts, store_host=store_host,
                    reconsume_times=reconsume_times))
                pos += nbytes

        try:
            index, pos, fut = node.append_nowait(total, build)
        except AppendError as e:
            return AppendResult(put_status(e.code), f"{e} (DLedger group {node.config.group})")
        except OSError as exc:
            return self._disk_error(exc)
        fut.add_done_callback(_retrieve)
        self.entries.handover_entry(index, node.state.term, pos + BODY_OFFSET, runs, total, store_ts, offsets)
        self._stored(advances, store_ts, total)
        return AppendResult(PutMessageStatus.PUT_OK, "", pos + BODY_OFFSET, total, first_queue_offset, len(items),
                            store_ts, tuple(offsets), committed=fut, entry=(index, node.state.term))

    def append_to_commitlog(self, physical_offset: int, data: bytes | memoryview) -> None:
        raise StoreError("a DLedger store is replicated by its DLedger member, not by the classic HA channel")

    def restart_log_at(self, physical_offset: int) -> None:
        raise StoreError("a DLedger store is replicated by its DLedger member, not by the classic HA channel")

    def truncate(self, physical_offset: int) -> None:
        raise StoreError("a DLedger store truncates only its uncommitted tail, through its DLedger member")

    # -- reads ----------------------------------------------------------------------------------------------
    def get_commitlog_data(self, physical_offset: int, max_bytes: int) -> memoryview | None:
        return None  # no classic HA stream in DLedger mode

    def idempotent_keys(self, since_ms: int) -> Iterator[StoredKey]:
        """The idempotent records of every entry of this member's log, committed or not, from the last entry
        stored at ``since_ms`` or before (found by bisection: entries are in store order)."""
        ledger = self.ledger
        lo, hi = max(ledger.begin_index, 0), ledger.end_index + 1
        while lo < hi:  # the first entry stored after since_ms
            mid = (lo + hi) // 2
            ts = self._entry_store_time(mid, hi)
            if ts is not None and ts <= since_ms:
                lo = mid + 1
            else:
                hi = mid
        for index in range(max(lo - 1, ledger.begin_index, 0), ledger.end_index + 1):
            unit = ledger.unit(index)
            if unit is None or unit[1] <= BODY_OFFSET:  # gone, or a leader's empty entry
                continue
            pos, size, _ = unit
            mf = ledger.data.file_for(pos)
            if mf is None:
                continue
            at = pos - mf.start
            yield from record_keys(mf.mm, at + BODY_OFFSET, at + size, mf.start, since_ms)

    def _entry_store_time(self, index: int, before: int) -> int | None:
        """Store time of the first record at or after entry ``index`` (below ``before``; None: none there)."""
        ledger = self.ledger
        for i in range(index, before):
            unit = ledger.unit(i)
            if unit is None:
                return None
            pos, size, _ = unit
            if size <= BODY_OFFSET:
                continue  # a leader's empty entry: the next one tells
            mf = ledger.data.file_for(pos)
            return None if mf is None else store_time_at(mf.mm, pos - mf.start + BODY_OFFSET, pos - mf.start + size)
        return None

    @property
    def max_physical_offset(self) -> int:
        """The committed position: readers and dispatch see committed entries only."""
        return max(self.ledger.committed_pos, self.commitlog.min_offset)

    def entry_committed(self, entry: tuple[int, int]) -> bool:
        """Whether the entry ``(index, term)`` is committed in this member's log (it is there, of that term, at or
        below the committed index: committed entries are never truncated)."""
        index, term = entry
        ledger = self.ledger
        unit = ledger.unit(index)
        return index <= ledger.committed_index and unit is not None and unit[2] == term

    @property
    def ledger_caught_up(self) -> bool:
        """Every entry of the log is committed and dispatched (a new leader waits for this before it serves)."""
        ledger = self.ledger
        return ledger.end_index == ledger.committed_index and self.entries.next_index > ledger.committed_index
