"""The dispatcher (RocketMQ's ReputMessageService, SEMANTICS.md 7.7): tails the commit log from the reput
offset and builds consume-queue units and index entries from the record bytes alone, so it runs the same on a
slave fed with replicated bytes.

It stops at an incomplete record (a slave may hold half of one) and at an invalid one (logged), and jumps to
the next file at a blank marker. ``dispatch_available`` is non-blocking; with ``start_thread`` a daemon thread
dispatches whenever :meth:`Dispatcher.wake` is called (appends do), waiting on an Event, not polling.
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

__all__ = ["SCHEDULE_TOPIC", "Dispatcher"]

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_SCHEDULE_B = SCHEDULE_TOPIC.encode()
_TAGS = b"TAGS\x01"
_KEYS = b"KEYS\x01"
_UNIQ = b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01"
_I64 = __import__("struct").Struct(">q").unpack_from

DispatchListener = Callable[[str, int, int], None]


def find_prop(props: bytes, key: bytes) -> bytes:
    """Raw value of ``key`` (``b"NAME\\x01"``) in a property string, b'' when absent."""
    i = props.find(key)
    while i > 0 and props[i - 1] != 2:
        i = props.find(key, i + 1)
    if i < 0:
        return b""
    i += len(key)
    j = props.find(b"\x02", i)
    return props[i:j] if j >= 0 else props[i:]


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
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- thread -----------------------------------------------------------------------------------------
    def start_thread(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="store-dispatch", daemon=True)
        self._thread.start()

    def stop_thread(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(10.0)
            if self._thread.is_alive():
                log.error("dispatch thread did not stop within 10 s")
        self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            # The timeout only bounds the cost of a lost wake-up; appends set the event.
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                while not self._stop and self.dispatch_available(4 << 20):
                    pass
            except Exception:
                log.exception("dispatch failed at reput offset %d", self.reput)

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

    def _tags_code(self, props: bytes) -> int:
        raw = find_prop(props, _TAGS)
        if not raw:
            return 0
        code = self._tags_cache.get(raw)
        if code is None:
            code = tags_hash(raw.decode("utf-8", "replace"))
            if len(self._tags_cache) < 65536:
                self._tags_cache[raw] = code
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
            props = mm[pp + 2 : pos + size]
            tx = sys_flag & 0xC
            if tx == 0 or tx == 8:
                cq = cache.get((topic, queue_id)) or queue_for(topic, queue_id)
                if cq is not None:
                    if topic == _SCHEDULE_B:
                        levels = self.delay_levels_ms
                        delay = levels[queue_id] if 0 <= queue_id < len(levels) else 1000
                        tag = store_ts + delay
                    else:
                        tag = self._tags_code(props) if props else 0
                    if cq.put(phy, size, tag, queue_offset):
                        notify[cq] = queue_offset + 1
            if index is not None and tx != 0xC and phy >= index_end and props:
                uniq = find_prop(props, _UNIQ)
                keys = find_prop(props, _KEYS)
                if uniq or keys:
                    index.build(topic, phy, store_ts, uniq, keys)
            last_ts = store_ts
            pos += size
        self.last_store_ts = last_ts
        return pos, False
