"""The dispatcher (RocketMQ's ReputMessageService, SEMANTICS.md 7.7): tails the commit log from the reput
offset and builds consume-queue units and index entries from the record bytes alone, so it runs the same on a
slave fed with replicated bytes.

It stops at an incomplete record (a slave may hold half of one) and at an invalid one (logged), and jumps to
the next file at a blank marker. ``dispatch_available`` is non-blocking and bounded; the broker's
:class:`broker.dispatch_driver.DispatchDriver` calls it on its event loop, woken by the store's append event.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable

from broker.store.commitlog import CommitLog
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from broker.store.index import IndexService
from client.errors import ProtocolViolationError
from client.protocol.codec import (
    BLANK_MAGIC,
    DISPATCH_HEAD_V4,
    MAGIC_V1,
    RECORD_PREFIX,
    record_layout,
    tags_hash,
)
from client.protocol.properties import scan_properties

__all__ = ["SCHEDULE_TOPIC", "Dispatcher"]

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_SCHEDULE_B = SCHEDULE_TOPIC.encode()
_I64 = __import__("struct").Struct(">q").unpack_from

DispatchListener = Callable[[str, int, int], None]


class Dispatcher:
    """Builds consume queues and the index from the commit log."""

    def __init__(
        self,
        commitlog: CommitLog,
        cqs: ConsumeQueueTable,
        index: IndexService | None,
        delay_levels_ms: tuple[int, ...],
        listeners: list[DispatchListener],
    ) -> None:
        self.commitlog = commitlog
        self.cqs = cqs
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.listeners = listeners
        self.reput = 0
        #: Store time of the last dispatched record (checkpoint logicsMsgTimestamp).
        self.last_store_ts = 0
        self.lock = threading.Lock()
        self._cq_cache: dict[tuple[bytes, int], ConsumeQueue | None] = {}
        self._tags_cache: dict[bytes, int] = {}
        self._stuck_at = -1

    # -- dispatch ---------------------------------------------------------------------------------------
    def reset_caches(self) -> None:
        self._cq_cache.clear()

    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        """Dispatch up to about ``max_bytes`` of complete records; returns the bytes consumed (0: caught up)."""
        with self.lock:
            notify: dict[ConsumeQueue, int] = {}
            consumed = self._dispatch(max_bytes, notify)
        for cq, max_offset in notify.items():
            for listener in self.listeners:
                try:
                    listener(cq.topic, cq.queue_id, max_offset)
                except Exception:
                    log.exception("dispatch listener failed for %s-%d", cq.topic, cq.queue_id)
        return consumed

    def _dispatch(self, max_bytes: int, notify: dict[ConsumeQueue, int]) -> int:
        cl = self.commitlog
        consumed = 0
        while consumed < max_bytes:
            reput = self.reput
            if reput >= cl.max_offset:
                break
            mf = cl.file_for(reput)
            if mf is None:
                if reput < cl.min_offset:
                    log.warning("reput offset %d below the commit log's min %d; skipping ahead", reput,
                                cl.min_offset)
                    self.reput = cl.min_offset
                    continue
                break
            pos = reput - mf.start
            new_pos, blank = self._dispatch_file(mf.mm, mf.start, mf.size, pos, mf.wrote,
                                                 pos + max_bytes - consumed, notify)
            if blank:
                new_pos = mf.size
            consumed += new_pos - pos
            self.reput = mf.start + new_pos
            if new_pos == pos:
                break
        return consumed

    def _queue(self, topic: bytes, queue_id: int) -> ConsumeQueue | None:
        key = (topic, queue_id)
        try:
            return self._cq_cache[key]
        except KeyError:
            cq = self._cq_cache[key] = self.cqs.get_or_create(topic.decode("utf-8", "replace"), queue_id)
            return cq

    def _tags_code(self, tags: bytes) -> int:
        code = self._tags_cache.get(tags)
        if code is None:
            code = tags_hash(tags.decode("utf-8", "replace"))
            if len(self._tags_cache) < 65536:
                self._tags_cache[tags] = code
        return code

    def _invalid(self, file_start: int, pos: int, why: str) -> tuple[int, bool]:
        if self._stuck_at != file_start + pos:
            self._stuck_at = file_start + pos
            log.error("dispatch stopped at physical offset %d: %s", file_start + pos, why)
        return pos, False

    def _dispatch_file(
        self, mm: mmap.mmap, file_start: int, file_size: int, pos: int, limit: int, budget_end: int,
        notify: dict[ConsumeQueue, int],
    ) -> tuple[int, bool]:
        """Dispatch records in one file from ``pos`` to ``limit``; ``(new position, hit blank marker)``."""
        head = DISPATCH_HEAD_V4.unpack_from
        scan = scan_properties
        queue_for = self._queue
        cache = self._cq_cache
        index = self.index
        index_end = index.end_phy if index is not None else 0
        last_ts = self.last_store_ts
        while pos < budget_end and pos + 8 <= limit:
            if pos + 88 > file_size:
                size, magic = RECORD_PREFIX.unpack_from(mm, pos)
                if magic == BLANK_MAGIC:
                    self.last_store_ts = last_ts
                    return pos, True
                return self._invalid(file_start, pos, f"bad magic {magic & 0xFFFFFFFF:#x}")
            size, magic, queue_id, queue_offset, phy, sys_flag, store_ts, body_len = head(mm, pos)
            if magic != MAGIC_V1:
                self.last_store_ts = last_ts
                if magic == BLANK_MAGIC:
                    return pos, True
                return self._invalid(file_start, pos, f"bad magic {magic & 0xFFFFFFFF:#x}")
            if pos + size > limit:
                break  # incomplete record: wait for the rest
            if size < 91:
                self.last_store_ts = last_ts
                return self._invalid(file_start, pos, f"impossible size {size}")
            if sys_flag & 0x30:
                try:
                    _, ts_pos, _, tp, pp = record_layout(memoryview(mm), pos, size)
                except ProtocolViolationError as exc:
                    self.last_store_ts = last_ts
                    return self._invalid(file_start, pos, str(exc))
                store_ts = _I64(mm, ts_pos)[0]
            else:
                tp = pos + 88 + body_len
                pp = tp + 1 + mm[tp]
            topic = mm[tp + 1 : pp]
            # The record's properties read once, from its stored bytes (the same on a slave).
            tags, keys, uniq, _, _ = scan(mm[pp + 2 : pos + size])
            tx = sys_flag & 0xC
            if tx == 0 or tx == 8:
                cq = cache.get((topic, queue_id)) or queue_for(topic, queue_id)
                if cq is not None:
                    if topic == _SCHEDULE_B:
                        levels = self.delay_levels_ms
                        delay = levels[queue_id] if 0 <= queue_id < len(levels) else 1000
                        tag = store_ts + delay
                    else:
                        tag = self._tags_code(tags) if tags else 0
                    if cq.put(phy, size, tag, queue_offset):
                        notify[cq] = queue_offset + 1
            if index is not None and tx != 0xC and phy >= index_end and (uniq or keys):
                index.build(topic, phy, store_ts, uniq, keys)
            last_ts = store_ts
            pos += size
        self.last_store_ts = last_ts
        return pos, False
