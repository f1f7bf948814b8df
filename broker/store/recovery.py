"""Start-up recovery (docs/BEHAVIOUR.md 7.6).

* Normal (no abort file): validate the last three commit-log files, cut after the last valid record, cut
  consume queues that point past it, and dispatch whatever the queues miss.
* Abnormal (abort file present): start from the newest file whose first record is older than the checkpoint's
  minimum timestamp, validate forward with CRCs, cut, then re-dispatch everything from that file (consume
  queues and index ignore what they already hold).

Either way the caller rebuilds the queue-offset table from the consume queues once they have caught up.
"""

from __future__ import annotations

import logging

from broker.store.checkpoint import Checkpoint
from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue import ConsumeQueueTable
from broker.store.dispatch import Dispatcher

__all__ = ["abnormal_start_index", "recover"]

log = logging.getLogger(__name__)


def abnormal_start_index(cl: CommitLog, cp: Checkpoint, *, with_index: bool) -> int:
    """Index of the commit-log file abnormal recovery starts from (the index's timestamp counts when
    ``with_index``)."""
    min_ts = cp.min_timestamp_index() if with_index else cp.min_timestamp()
    files = cl.files
    for i in range(len(files) - 1, -1, -1):
        ts = cl.first_store_timestamp(files[i])
        if ts is not None and 0 < ts <= min_ts:
            return i
    return 0


def recover(cl: CommitLog, cqs: ConsumeQueueTable, cp: Checkpoint, dispatcher: Dispatcher, cfg: StoreConfig, *,
            last_exit_ok: bool) -> None:
    """Recover the commit log and the consume queues, then dispatch up to the end of the log.

    Args:
        cl: the loaded commit log.
        cqs: the loaded consume queues.
        cp: the checkpoint (its flushed offset is updated).
        dispatcher: rebuilds the consume queues and the index from the commit log.
        cfg: ``check_crc_on_recover``, ``truncate_corrupt``.
        last_exit_ok: no abort file was found (normal recovery).

    Raises:
        StoreCorruptError: a corrupt record mid-log and not ``truncate_corrupt``.
    """
    cqs.recover()
    if not cl.files:
        if cqs.queues:
            log.warning("no commit log files: destroying %d consume queues", len(cqs.queues))
        cqs.destroy_all()
        dispatcher.reset_caches()
        dispatcher.reput = cl.min_offset
    else:
        if last_exit_ok:
            start_index = max(0, len(cl.files) - 3)
        else:
            start_index = abnormal_start_index(cl, cp, with_index=dispatcher.index is not None)
            log.warning("abnormal exit detected: recovering the commit log from %s", cl.files[start_index].path)
        start_offset = cl.files[start_index].start
        end = cl.recover(start_index, check_crc=cfg.check_crc_on_recover, truncate_corrupt=cfg.truncate_corrupt,
                         durable_offset=cp.flushed_offset)
        if not last_exit_ok:
            # What survived a crash may still sit in the page cache only.
            cl.mark_unflushed(start_offset)
            cl.flush()
        cqs.truncate_dirty(end)
        if last_exit_ok:
            dispatcher.reput = min(max(cqs.max_physic_end(), cl.min_offset), end)
        else:
            dispatcher.reput = start_offset
    while dispatcher.dispatch_available(64 << 20):
        pass
    if dispatcher.reput < cl.max_offset:
        log.error("dispatch stopped at %d before the end of the log %d", dispatcher.reput, cl.max_offset)
    cp.flushed_offset = cl.flushed_where
    cp.flush()
