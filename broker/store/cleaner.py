"""The store's half of retention: measure the disks, delete the oldest commit-log file, then the consume-queue and
index files that only pointed into it (RocketMQ's ``CleanCommitLogService`` + ``CleanConsumeQueueService``). The
decisions are in :mod:`broker.store.retention`; the pacing (a pass every ``cleanResourceInterval``, 100 ms between
deletions, the per-group loss warning) is the broker's :mod:`broker.retention_driver`.

Every method runs on the writer's thread (the broker's event loop), which also dispatches and serves reads, so a
reader never sees the commit log and its consume queues disagree about the minimum offset.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from broker.store.commitlog import CommitLog
from broker.store.consume_queue import ConsumeQueueTable
from broker.store.dispatch import Dispatcher
from broker.store.index import IndexService
from broker.store.retention import (
    CleanDecision,
    DeletedFile,
    DiskState,
    DiskUsage,
    RetentionConfig,
    RetentionStats,
    clean_decision,
    deletable_head,
    disk_state,
)

__all__ = ["StoreCleaner"]

log = logging.getLogger(__name__)

#: A store refusing writes measures its disks again at most this often when a write comes in.
_RECHECK_MS = 1000
#: A writing store measures its disks after this many bytes, so it stops near ``diskSpaceWarningLevelRatio`` even
#: when a fast disk fills between two cleaner passes (one ``statvfs`` per partition: a few us per MiB written).
WRITE_CHECK_BYTES = 1 << 20


class StoreCleaner:
    """Disk checks and deletions over the parts of one store.

    Args:
        commitlog, cqs, index, dispatcher: the store's parts (``index`` None when the index is off).
        cfg: the retention settings.
        used_ratio: ``path -> used fraction`` of its partition (:meth:`broker.store.io.FileIO.used_ratio`;
            tests inject one).
        clock_ms: wall clock in ms (file ages, the local hour of ``deleteWhen``).
        destroy_forcibly_ms: ``destroyMapedFileIntervalForcibly``.
    """

    def __init__(self, commitlog: CommitLog, cqs: ConsumeQueueTable, index: IndexService | None, dispatcher: Dispatcher,
                 cfg: RetentionConfig, used_ratio: Callable[[str], float], clock_ms: Callable[[], int],
                 destroy_forcibly_ms: int) -> None:
        self._cl, self._cqs, self._index, self._dispatcher = commitlog, cqs, index, dispatcher
        self.cfg = cfg
        self._used_ratio = used_ratio
        self._clock_ms = clock_ms
        self._destroy_forcibly_ms = destroy_forcibly_ms
        self.state = DiskState(True)
        self.usage = DiskUsage(0.0, 0.0, 0.0)
        self.stats = RetentionStats()
        self._write_error: str | None = None
        self._checked_ms = -_RECHECK_MS
        self._written = 0
        self._parts: list[tuple[str, ...]] | None = None  # the parts' directories, grouped by partition

    # -- the disk guard -------------------------------------------------------------------------------------
    @property
    def writeable(self) -> bool:
        return self.state.writeable

    def write_failed(self, error: str) -> None:
        """A write to the disk failed: refuse writes until a disk check, a second later at the earliest, finds
        room."""
        self._write_error = error
        self._checked_ms = self._clock_ms()
        self._set_state(disk_state(self.usage, error, self.cfg))

    def check_disk(self) -> DiskUsage:
        """Measure the three partitions and update :attr:`state` (a write error is forgotten once usage is below
        the warning level: the next write tries again)."""
        self._checked_ms = self._clock_ms()
        self._written = 0
        ratios: dict[str, float] = {}
        for group in self._partitions():
            r = self._used_ratio(group[0])
            ratios.update(dict.fromkeys(group, r))
        ix = self._index
        self.usage = usage = DiskUsage(ratios[self._cl.directory], ratios[self._cqs.directory],
                                       ratios[ix.directory] if ix is not None else 0.0)
        if self._write_error is not None and usage.highest <= self.cfg.disk_space_warning_level_ratio:
            self._write_error = None
        self._set_state(disk_state(usage, self._write_error, self.cfg))
        return usage

    def wrote(self, nbytes: int) -> None:
        """The writer appended ``nbytes``: measure the disks once ``WRITE_CHECK_BYTES`` went in since the last
        check."""
        self._written += nbytes
        if self._written >= WRITE_CHECK_BYTES:
            self.check_disk()

    def _partitions(self) -> list[tuple[str, ...]]:
        """The store parts' directories grouped by the partition they sit on (usually one group: one ``statvfs``
        serves all three). Found once the directories exist."""
        if self._parts is None:
            dirs = [self._cl.directory, self._cqs.directory] + ([self._index.directory] if self._index else [])
            try:
                devices: dict[int, list[str]] = {}
                for d in dirs:
                    devices.setdefault(os.stat(d).st_dev, []).append(d)
            except OSError:
                return [(d,) for d in dirs]  # not created yet: measure each (the nearest parent counts)
            self._parts = [tuple(g) for g in devices.values()]
        return self._parts

    def recheck(self) -> DiskState:
        """The state, measured again when the last check is a second old (a refused write's way back)."""
        if self._clock_ms() - self._checked_ms >= _RECHECK_MS:
            self.check_disk()
        return self.state

    def _set_state(self, state: DiskState) -> None:
        if state.writeable != self.state.writeable:
            if state.writeable:
                log.warning("store is writeable again: %s used", self.usage.describe())
            else:
                log.error("store refuses writes: %s", state.reason)
        self.state = state

    # -- retention ------------------------------------------------------------------------------------------
    def decide(self, manual: bool) -> CleanDecision:
        hour = time.localtime(self._clock_ms() / 1000).tm_hour
        return clean_decision(hour, self.usage.commitlog, manual, self.cfg)

    def deletable(self, decision: CleanDecision) -> int:
        """How many of the oldest commit-log files this pass may delete (0 when the decision says none)."""
        if decision.reason is None:
            return 0
        cl = self._cl
        # Never a byte the store still needs: not yet dispatched into the consume queues, or not yet flushed
        # (on a slave: everything it holds is replicated; the file being written always stays).
        keep_from = min(self._dispatcher.reput, cl.flushed_where)
        return deletable_head(cl.file_ages(self.cfg.delete_file_batch_max), self._clock_ms(),
                              reserved_ms=self.cfg.file_reserved_time_ms, force=decision.force, keep_from=keep_from,
                              batch_max=self.cfg.delete_file_batch_max)

    def delete_oldest(self) -> DeletedFile | None:
        """Delete the oldest commit-log file (never the last), then the queue and index files below the new
        minimum, and correct every queue's min offset. None when only one file is left."""
        now = self._clock_ms()
        cl = self._cl
        gone = cl.retire_head(1, now)
        if not gone:
            return None
        mf = gone[0]
        new_min = cl.min_offset
        before = {k: cq.min_offset for k, cq in self._cqs.queues.items()}
        queue_files = self._cqs.delete_expired(new_min, cl.retired, now)
        moved = {k: (old, cq.min_offset) for k, cq in self._cqs.queues.items()
                 if (old := before.get(k, cq.min_offset)) != cq.min_offset}
        index_files = self._index.delete_expired(new_min, cl.retired, now) if self._index is not None else 0
        st = self.stats
        st.files_deleted += 1
        st.bytes_reclaimed += mf.size
        st.queue_files_deleted += queue_files
        st.index_files_deleted += index_files
        log.info("retention deleted commit log file %s (offsets %d..%d), %d consume-queue and %d index files; "
                 "min offset now %d", mf.path, mf.start, mf.end, queue_files, index_files, new_min)
        return DeletedFile(mf.start, mf.end, new_min, queue_files, index_files, moved)

    def close_retired(self) -> int:
        """Unmap deleted files no reader holds any more (or held past ``destroyMapedFileIntervalForcibly``)."""
        return self._cl.retired.close_idle(self._clock_ms(), self._destroy_forcibly_ms)
