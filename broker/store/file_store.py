"""The file message store: commit log + consume queues + index + checkpoint under ``storePathRootDir``.

Lifecycle: ``FileMessageStore(config)`` -> :meth:`load` (lock, recover, abort file) -> :meth:`start`
(flush threads) -> :meth:`shutdown` (dispatch and flush everything, delete the abort file). Dispatch runs when
the owner asks (``dispatch_available``; the broker's dispatch driver, woken by the append event).
The write path and the recovery rules are in :mod:`broker.store.writer` and :mod:`broker.store.recovery`;
reads in :mod:`broker.store.reader`. This class wires them together and owns the lifecycle.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

from broker.store import reader, recovery
from broker.store.api import (
    AppendResult,
    GetMessageResult,
    PutMessageStatus,
    QueryResult,
    RecordFilter,
    StoredKey,
    StoreError,
    TagFilter,
)
from broker.store.checkpoint import Checkpoint
from broker.store.cleaner import StoreCleaner
from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue import ConsumeQueueTable
from broker.store.dispatch import Dispatcher
from broker.store.flush import FlushService, GroupCommitService
from broker.store.idempotent import commitlog_keys
from broker.store.index import IndexService
from broker.store.io import FileIO
from broker.store.read_memory import MemoryLimitCache, memory_bytes_for_reads
from broker.store.writer import PutValidator
from common.codec import BatchItem, batch_item
from common.codes import BrokerRole, FlushDiskType
from common.properties import MAX_PROPERTIES_BYTES, encode_properties

__all__ = ["FileMessageStore"]

log = logging.getLogger(__name__)

#: Errors that mean "no room": the disk, the user's quota, or the largest file the file system allows.
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class _State(enum.Enum):
    CREATED = "CREATED"
    LOADED = "LOADED"
    RUNNING = "RUNNING"
    SHUT_DOWN = "SHUT_DOWN"


_DONE_TRUE: Future[bool] = Future()
_DONE_TRUE.set_result(True)


class FileMessageStore:
    """The :class:`~broker.store.api.MessageStore` on disk (docs/BEHAVIOUR.md 1.5, 7).

    Args:
        config: the store configuration.
        io: the file layer (default :class:`~broker.store.io.FileIO`; the tests and the chaos broker pass a
            subclass that injects faults, ``benchmarks/chaos/faulty_io.py``).
    """

    def __init__(self, config: StoreConfig, io: FileIO | None = None) -> None:
        self.config = config
        self.io = io or FileIO()
        root = config.store_path_root_dir
        self.root = root
        self._state = _State.CREATED
        self._role = config.broker_role
        self._delay_levels = config.delay_levels_ms
        self.commitlog = CommitLog(self.io, os.path.join(root, "commitlog"), config.mapped_file_size_commitlog,
                                   preallocate=config.preallocate_commitlog)
        self.cqs = ConsumeQueueTable(self.io, os.path.join(root, "consumequeue"), config.consume_queue_file_size)
        self.index = (
            IndexService(self.io, os.path.join(root, "index"), config.max_hash_slot_num, config.max_index_num,
                         config.clock_ms)
            if config.message_index_enable else None
        )
        self.checkpoint: Checkpoint | None = None
        self._append_listeners: list[Callable[[int], None]] = []
        self._dispatch_listeners: list[Callable[[str, int, int], None]] = []
        self.dispatcher = Dispatcher(self.commitlog, self.cqs, self.index, self._delay_levels,
                                     self._dispatch_listeners)
        self.validator = PutValidator(config, self._delay_levels)
        #: The memory cgroup's limit, re-read every ``memory_limit_refresh_ms`` (through ``self.config``, so a
        #: test that swaps the config swaps the reader and the clock too).
        self.memory_limit = MemoryLimitCache(lambda: self.config.memory_limit_bytes(),
                                             lambda: self.config.clock_ms(), config.memory_limit_refresh_ms)
        #: Retention and the disk guard; the broker's cleaner task drives it (:mod:`broker.retention_driver`).
        self.cleaner = StoreCleaner(self.commitlog, self.cqs, self.index, self.dispatcher, config.retention,
                                    config.disk_used_ratio or self.io.used_ratio, config.clock_ms,
                                    config.destroy_mapped_file_interval_forcibly_ms)
        #: Next queue offset per (topic, queue): assigned on put, rebuilt from the consume queues at load.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self._flush_service: FlushService | None = None
        self._group_commit: GroupCommitService | None = None
        self._lock_fd: int | None = None
        self._abort_path = os.path.join(root, "abort")

    # -- lifecycle ------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Lock the directory, open and recover every file (docs/BEHAVIOUR.md 7.6), write the abort file.

        Raises:
            StoreCorruptError: a corrupt record mid-log and ``truncate_corrupt`` is not set.
            StoreError: the directory is locked by another store, or a file cannot be opened.
            RuntimeError: called twice.
        """
        if self._state is not _State.CREATED:
            raise RuntimeError(f"load() called on a store in state {self._state.value}; create a new store")
        self.io.makedirs(self.root)
        self._lock_dir()
        try:
            last_exit_ok = not os.path.exists(self._abort_path)
            self.checkpoint = Checkpoint(self.io, os.path.join(self.root, "checkpoint"))
            self._open_and_recover(last_exit_ok)
            # Retention may have deleted commit-log files the queues still point into (a crash between the two).
            self.cqs.correct_min_offsets(self.commitlog.min_offset)
            self.rebuild_topic_queue_table()
            self.io.write_small_file(self._abort_path, str(os.getpid()).encode())
        except BaseException:
            self._close_files()
            self._unlock_dir()
            raise
        self._state = _State.LOADED

    def _open_and_recover(self, last_exit_ok: bool) -> None:
        """Open the commit log, the consume queues and the index, recover them and dispatch what the queues miss
        (docs/BEHAVIOUR.md 7.6)."""
        assert self.checkpoint is not None
        self.commitlog.load()
        self.cqs.load()
        if self.index is not None:
            self.index.load()
        recovery.recover(self.commitlog, self.cqs, self.checkpoint, self.dispatcher, self.config,
                         last_exit_ok=last_exit_ok)

    def _lock_dir(self) -> None:
        path = os.path.join(self.root, "lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(f"store directory {self.root} is in use by another store (lock file {path})") from None
            raise StoreError(f"cannot lock {path}: {exc}") from exc
        self._lock_fd = fd

    def _unlock_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def start(self) -> None:
        """Start the flush thread(s), and the preparation of the commit log's current and next file."""
        if self._state is not _State.LOADED:
            raise RuntimeError(f"start() needs a loaded store; state is {self._state.value}")
        cfg = self.config
        sync = cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self._flush_service = FlushService(
            flush_commitlog=None if sync else self._flush_commitlog,
            flush_logics=self._flush_logics,
            commitlog_interval_ms=cfg.flush_interval_commitlog_ms,
            least_pages=cfg.flush_commitlog_least_pages,
            thorough_interval_ms=cfg.flush_commitlog_thorough_interval_ms,
            logics_interval_ms=cfg.flush_interval_consume_queue_ms,
        )
        self._flush_service.start()
        if sync:
            self._group_commit = GroupCommitService(
                lambda: self._flush_commitlog(0), lambda: self.commitlog.flushed_where, cfg.sync_flush_timeout_ms
            )
            self._group_commit.start()
        self.commitlog.prepare_ahead()
        self._state = _State.RUNNING

    def shutdown(self) -> None:
        """Stop services, dispatch and flush everything, delete the abort file. Idempotent."""
        if self._state in (_State.SHUT_DOWN, _State.CREATED):
            self._state = _State.SHUT_DOWN
            return
        self._stop_services()
        try:
            while self.dispatcher.dispatch_available(64 << 20):
                pass
            self._flush_commitlog(0)
            self._flush_logics()
        finally:
            if self._group_commit is not None:
                self._group_commit.stop()
            behind = self.dispatch_behind_bytes
            self._close_files()
            if not behind:
                self.io.remove(self._abort_path)
            else:
                log.warning("dispatch is %d bytes behind at shutdown: keeping the abort file", behind)
            self._unlock_dir()
            self._state = _State.SHUT_DOWN

    def crash(self) -> None:
        """Test helper: stop threads and close files without dispatching, flushing or removing the abort file,
        as if the process had been killed."""
        if self._state is _State.SHUT_DOWN:
            return
        self._stop_services()
        if self._group_commit is not None:
            self._group_commit.stop()
        self._close_files(crashed=True)
        self._unlock_dir()
        self._state = _State.SHUT_DOWN

    def _stop_services(self) -> None:
        if self._flush_service is not None:
            self._flush_service.stop()

    def _close_files(self, *, crashed: bool = False) -> None:
        self.commitlog.close()
        self.cqs.close()
        if self.index is not None:
            self.index.close(crashed=crashed)
        if self.checkpoint is not None:
            self.checkpoint.close()

    def __enter__(self) -> FileMessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- flushing -------------------------------------------------------------------------------------------
    def _flush_commitlog(self, least_pages: int) -> int:
        ts = self.validator.last_store_ts or self.dispatcher.last_store_ts
        flushed = self.commitlog.flush(least_pages)
        cp = self.checkpoint
        if cp is not None and flushed > cp.flushed_offset:
            cp.physic_ts = max(cp.physic_ts, ts)
            cp.flushed_offset = flushed
        return flushed

    def _flush_logics(self) -> None:
        cp = self.checkpoint
        if cp is None:
            return
        with self.dispatcher.lock:
            ts = self.dispatcher.last_store_ts
            if self.index is not None and self.index.flush():
                cp.index_ts = self.index.end_ts
        # Outside the lock: the msyncs wait for the disk and the dispatcher (the broker's event loop) takes the
        # lock for every chunk. Every unit stored up to ``ts`` was written before this flush starts.
        self.cqs.flush()
        if ts:
            cp.logics_ts = ts
        cp.flush()

    def flush_future(self, end_offset: int) -> Future[bool]:
        """Future set True once the commit log is flushed to ``end_offset`` (SYNC_FLUSH group commit), False
        after ``syncFlushTimeout``; already True under ASYNC_FLUSH."""
        gc = self._group_commit
        if gc is None:
            if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
                fut: Future[bool] = Future()
                fut.set_result(self._flush_commitlog(0) >= end_offset)
                return fut
            return _DONE_TRUE
        return gc.request(end_offset)

    # -- writes ---------------------------------------------------------------------------------------------
    def set_broker_role(self, role: BrokerRole) -> None:
        """Switch role at runtime (a promoted slave rebuilds its queue-offset table first)."""
        if self._role is BrokerRole.SLAVE and role is not BrokerRole.SLAVE and self._state is not _State.CREATED:
            while self.dispatcher.dispatch_available(64 << 20):
                pass
            self.rebuild_topic_queue_table()
        self._role = role

    @property
    def broker_role(self) -> BrokerRole:
        return self._role

    @property
    def loaded(self) -> bool:
        """:meth:`load` completed and the store is not shut down (its files are open and recovered)."""
        return self._state in (_State.LOADED, _State.RUNNING)

    def rebuild_topic_queue_table(self) -> None:
        self.topic_queue_table = {k: cq.max_offset for k, cq in self.cqs.queues.items()}

    def _unavailable(self) -> AppendResult | None:
        if self._state not in (_State.LOADED, _State.RUNNING):
            return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                f"message store is not running (state {self._state.value})")
        if self._role is BrokerRole.SLAVE:
            return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                "broker role is SLAVE: a slave does not accept writes")
        state = self.cleaner.state
        if not state.writeable and not (state := self.cleaner.recheck()).writeable:
            return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, f"message store is not writeable: {state.reason}")
        return None

    def append_batch(
        self,
        topic: str,
        queue_id: int,
        items: Sequence[BatchItem],
        *,
        born_host: bytes,
        reconsume_times: int = 0,
    ) -> AppendResult:
        """Append messages of one topic/queue contiguously, all or nothing (see the MessageStore protocol)."""
        bad = self._unavailable()
        if bad is not None:
            return bad
        plan = self.validator.plan(topic, queue_id, items, self.topic_queue_table)
        if isinstance(plan, AppendResult):
            return plan
        runs, total, advances, first_queue_offset = plan
        if total + 8 > self.commitlog.file_size:
            return AppendResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"batch of {len(items)} messages is {total} bytes stored; it must fit one commit log file "
                f"(mappedFileSizeCommitLog {self.commitlog.file_size} minus 8)",
            )
        store_ts = self.config.clock_ms()
        try:
            wrote_offset, offsets = self.commitlog.append(
                runs, total, store_timestamp=store_ts, born_host=born_host, store_host=self.config.store_host,
                reconsume_times=reconsume_times,
            )
        except OSError as exc:
            return self._disk_error(exc)
        # What the send path read (queues, tags, keys, unique keys) goes to dispatch with the batch.
        self.dispatcher.handover(wrote_offset, wrote_offset + total, store_ts, runs, offsets)
        self._stored(advances, store_ts, total)
        self._after_append()
        return AppendResult(PutMessageStatus.PUT_OK, "", wrote_offset, total, first_queue_offset, len(items),
                            store_ts, tuple(offsets))

    def _stored(self, advances: list[tuple[tuple[str, int], int]], store_ts: int, total: int) -> None:
        """A put is in the log: advance its queues' next offsets, note its store time and size."""
        table = self.topic_queue_table
        for key, count in advances:
            table[key] = table.get(key, 0) + count
        self.validator.last_store_ts = store_ts
        self.cleaner.wrote(total)

    def _disk_error(self, exc: OSError) -> AppendResult:
        created = getattr(exc, "creating_file", False)
        full = exc.errno in _DISK_FULL_ERRNOS
        what = "disk full" if full else "I/O error"
        log.error("append failed (%s): %s", what, exc)
        self.cleaner.write_failed(f"{what}: {exc}")
        if created:
            return AppendResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
                                f"cannot create the next commit log file ({what}); nothing was written: {exc}")
        return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                            f"message store is not writeable ({what}); nothing was written: {exc}")

    def _after_append(self) -> None:
        """Publish the append event: each listener, once, with the new end of the log, on this thread."""
        if self._append_listeners:
            end = self.commitlog.max_offset
            for cb in self._append_listeners:
                try:
                    cb(end)
                except Exception:
                    log.exception("append listener failed")

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: dict[str, str],
        *,
        born_host: bytes,
        born_timestamp: int,
        flag: int = 0,
        sys_flag: int = 0,
        reconsume_times: int = 0,
    ) -> AppendResult:
        """Append one message built server-side (delay redelivery, send-back); same rules as append_batch."""
        try:
            props = encode_properties(properties)
        except Exception as exc:
            size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in properties.items())
            status = (PutMessageStatus.PROPERTIES_SIZE_EXCEEDED if size > MAX_PROPERTIES_BYTES
                      else PutMessageStatus.MESSAGE_ILLEGAL)
            return AppendResult(status, str(exc))
        item = batch_item(body, props, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp)
        return self.append_batch(topic, queue_id, [item], born_host=born_host, reconsume_times=reconsume_times)

    def append_to_commitlog(self, physical_offset: int, data: bytes | memoryview) -> None:
        """Slave side of HA: continue the log with the master's bytes (see the MessageStore protocol)."""
        if self._state not in (_State.LOADED, _State.RUNNING):
            raise StoreError(f"message store is not running (state {self._state.value})")
        try:
            self.commitlog.append_raw(physical_offset, data)
        except OSError as exc:
            raise StoreError(f"cannot write replicated data at offset {physical_offset}: {exc}") from exc
        if self.dispatcher.reput < self.commitlog.min_offset:
            self.dispatcher.reput = self.commitlog.min_offset
        self._after_append()

    def restart_log_at(self, physical_offset: int) -> None:
        """Slave side of HA: the master's oldest file starts at ``physical_offset``, past the end of this log
        (retention deleted the bytes between while this slave was away). Drop the whole commit log, start it again
        there; the consume queues keep their offsets and point nowhere until new units arrive.

        Raises:
            StoreError: not a slave, not past the end of the log, or not a commit-log file start.
        """
        cl = self.commitlog
        if self._role is not BrokerRole.SLAVE:
            raise StoreError("only a slave restarts its commit log at its master's offset")
        if physical_offset <= cl.max_offset or physical_offset % cl.file_size:
            raise StoreError(f"cannot restart the commit log at {physical_offset}: it must be a file start past the "
                             f"log's end {cl.max_offset}")
        while self.dispatcher.dispatch_available(64 << 20):
            pass
        with self.dispatcher.lock:
            self.dispatcher.drop_handovers()
            now = self.config.clock_ms()
            cl.reset_to(physical_offset, now)
            self.dispatcher.reput = physical_offset
            self.cqs.delete_expired(physical_offset, cl.retired, now)
            if self.index is not None:
                self.index.delete_expired(physical_offset, cl.retired, now)
            if self.checkpoint is not None:
                self.checkpoint.flushed_offset = physical_offset
                self.checkpoint.flush()

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        """Subscribe to the append event (see the MessageStore protocol)."""
        self._append_listeners.append(callback)

    def add_dispatch_listener(self, callback: Callable[[str, int, int], None]) -> None:
        """``callback(topic, queue_id, max_offset)`` after units were added to a queue; called inside
        ``dispatch_available``, on the thread that called it."""
        self._dispatch_listeners.append(callback)

    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        return self.dispatcher.dispatch_available(max_bytes)

    @property
    def dispatch_behind_bytes(self) -> int:
        return max(0, self.max_physical_offset - self.dispatcher.reput)

    @property
    def dispatch_handover_bytes(self) -> int:
        return self.dispatcher.handover_bytes

    def truncate(self, physical_offset: int) -> None:
        """Drop commit-log bytes from ``physical_offset`` on, and the consume-queue units pointing there."""
        with self.dispatcher.lock:
            self.dispatcher.drop_handovers()
            self.commitlog.truncate(physical_offset)
            self.cqs.truncate_dirty(physical_offset)
            self.dispatcher.reput = min(self.dispatcher.reput, self.commitlog.max_offset)
            if self.checkpoint is not None and self.checkpoint.flushed_offset > physical_offset:
                self.checkpoint.flushed_offset = physical_offset
                self.checkpoint.flush()
        while self.dispatcher.dispatch_available(64 << 20):
            pass
        self.rebuild_topic_queue_table()

    # -- reads ----------------------------------------------------------------------------------------------
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        max_bytes: int,
        tag_filter: TagFilter | None = None,
        record_filter: RecordFilter | None = None,
    ) -> GetMessageResult:
        """Read from a queue with the statuses and next-offset rules of docs/BEHAVIOUR.md 3.1."""
        # A slave keeps the consumer's offset unless offsetCheckInSlave (docs/BEHAVIOUR.md 3.1, nextOffsetCorrection).
        correct = self._role is not BrokerRole.SLAVE or self.config.offset_check_in_slave
        return reader.get_message(self.commitlog, self.cqs, self.config, topic, queue_id, offset, max_nums, max_bytes,
                                  tag_filter, record_filter, correct_offsets=correct,
                                  memory_bytes=self.memory_bytes_for_reads)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.cqs.get(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.cqs.get(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return reader.offset_by_time(self.commitlog, self.cqs, topic, queue_id, timestamp_ms)

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        return reader.store_timestamp(self.commitlog, self.cqs, topic, queue_id, queue_offset)

    def look_message_by_offset(self, physical_offset: int, size: int | None = None) -> bytes | None:
        return reader.record_at(self.commitlog, physical_offset, size)

    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryResult:
        return reader.query_message(self.commitlog, self.index, topic, key, max_num, begin_ms, end_ms)

    def get_commitlog_data(self, physical_offset: int, max_bytes: int) -> memoryview | None:
        return self.commitlog.get_data(physical_offset, max_bytes)

    def idempotent_keys(self, since_ms: int) -> Iterator[StoredKey]:
        """See the MessageStore protocol (:func:`broker.store.idempotent.commitlog_keys`)."""
        return commitlog_keys(self.commitlog, since_ms)

    @property
    def memory_bytes_for_reads(self) -> int:
        """``memory`` of ``suggestPullingFromSlave``: a read further than this behind the log's end is cold
        (:func:`broker.store.read_memory.memory_bytes_for_reads`)."""
        cfg = self.config
        return memory_bytes_for_reads(cfg.total_physical_memory_bytes, self.memory_limit.limit_bytes(),
                                      cfg.access_message_in_memory_max_ratio)

    @property
    def max_physical_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def min_physical_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def flushed_physical_offset(self) -> int:
        return self.commitlog.flushed_where

    @property
    def mapped_file_size_commitlog(self) -> int:
        return self.commitlog.file_size

    def topic_queue_max_offsets(self) -> dict[tuple[str, int], int]:
        return {k: cq.max_offset for k, cq in list(self.cqs.queues.items())}
