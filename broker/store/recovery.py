"""Start-up recovery (SEMANTICS.md 7.6).

* Normal (no abort file): validate the last three commit-log files, cut after the last valid record, cut
  consume queues that point past it, and dispatch whatever the queues miss.
* Abnormal (abort file present): start from the newest file whose first record is older than the checkpoint's
  minimum timestamp, validate forward with CRCs, cut, then re-dispatch everything from that file (consume
  queues and index ignore what they already hold).

Either way the queue-offset table is rebuilt from the consume queues once they have caught up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.store.file_store import FileMessageStore

__all__ = ["abnormal_start_index", "recover"]

log = logging.getLogger(__name__)


def abnormal_start_index(store: FileMessageStore) -> int:
    """Index of the commit-log file abnormal recovery starts from."""
    cp = store.checkpoint
    assert cp is not None
    min_ts = cp.min_timestamp_index() if store.index is not None else cp.min_timestamp()
    files = store.commitlog.files
    for i in range(len(files) - 1, -1, -1):
        ts = store.commitlog.first_store_timestamp(files[i])
        if ts is not None and 0 < ts <= min_ts:
            return i
    return 0


def recover(store: FileMessageStore, *, last_exit_ok: bool) -> None:
    """Recover the commit log and consume queues, then dispatch up to the end of the log.

    Raises:
        StoreCorruptError: a corrupt record mid-log and not ``truncate_corrupt``.
    """
    cl, cqs, cp, cfg = store.commitlog, store.cqs, store.checkpoint, store.config
    assert cp is not None
    cqs.recover()
    dispatcher = store.dispatcher
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
            start_index = abnormal_start_index(store)
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
    store.rebuild_topic_queue_table()
    cp.flushed_offset = cl.flushed_where
    cp.flush()
