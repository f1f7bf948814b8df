"""Flush services (docs/BEHAVIOUR.md 7.8).

* :class:`FlushService` (one thread): under ASYNC_FLUSH, every ``flushIntervalCommitLog`` flush the commit log
  when at least ``flushCommitLogLeastPages`` pages are dirty, fully at least every
  ``flushCommitLogThoroughInterval``; every ``flushIntervalConsumeQueue`` flush consume queues, index and the
  checkpoint (both modes).
* :class:`GroupCommitService` (SYNC_FLUSH): callers get a ``Future`` per end offset; one flush serves every
  request it covers; a watcher completes a request still pending at ``syncFlushTimeout`` with False, even
  while the flusher is stuck in a slow fsync.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["FlushService", "GroupCommitService"]

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0


class FlushService:
    """Periodic flushing in one daemon thread.

    Args:
        flush_commitlog: ``least_pages -> None``, or None to leave the commit log to group commit.
        flush_logics: flushes consume queues, index and checkpoint.
    """

    def __init__(
        self,
        *,
        flush_commitlog: Callable[[int], object] | None,
        flush_logics: Callable[[], None],
        commitlog_interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        logics_interval_ms: int,
        name: str = "store-flush",
    ) -> None:
        self._flush_commitlog = flush_commitlog
        self._flush_logics = flush_logics
        self._cl_interval = commitlog_interval_ms / 1000
        self._least_pages = least_pages
        self._thorough = thorough_interval_ms / 1000
        self._logics_interval = logics_interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("flush thread did not stop within %.0f s", JOIN_TIMEOUT_S)

    def _run(self) -> None:
        now = time.monotonic()
        next_cl = now + self._cl_interval
        next_logics = now + self._logics_interval
        last_thorough = now
        while True:
            wait = min(next_cl if self._flush_commitlog else next_logics, next_logics) - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                return
            now = time.monotonic()
            try:
                if self._flush_commitlog is not None and now >= next_cl:
                    least = self._least_pages
                    if now - last_thorough >= self._thorough:
                        least, last_thorough = 0, now
                    self._flush_commitlog(least)
                    next_cl = now + self._cl_interval
                if now >= next_logics:
                    self._flush_logics()
                    next_logics = now + self._logics_interval
            except Exception:
                log.exception("periodic flush failed; retrying at the next interval")


class GroupCommitService:
    """SYNC_FLUSH group commit.

    Args:
        flush: flushes the whole written commit log and returns the flushed offset.
        flushed_offset: the current flushed offset (no I/O).
        timeout_ms: ``syncFlushTimeout``.
    """

    def __init__(self, flush: Callable[[], int], flushed_offset: Callable[[], int], timeout_ms: int) -> None:
        self._flush = flush
        self._flushed_offset = flushed_offset
        self._timeout_s = timeout_ms / 1000
        self._cond = threading.Condition()
        self._requests: list[tuple[int, float, Future[bool]]] = []
        self._wake = threading.Event()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run_flusher, name="store-group-commit", daemon=True),
            threading.Thread(target=self._run_watcher, name="store-flush-watcher", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake.set()
        for t in self._threads:
            if t.is_alive():
                t.join(JOIN_TIMEOUT_S)
        # The store flushed everything before stopping us: leftovers succeed if that flush covered them.
        self._complete(self._take(lambda r: True), self._flushed_offset())

    def request(self, end_offset: int) -> Future[bool]:
        """A future for ``flushed >= end_offset`` (True), or False after ``syncFlushTimeout``."""
        fut: Future[bool] = Future()
        if self._flushed_offset() >= end_offset:
            fut.set_result(True)
            return fut
        with self._cond:
            if self._stopping:
                fut.set_result(self._flushed_offset() >= end_offset)
                return fut
            self._requests.append((end_offset, time.monotonic() + self._timeout_s, fut))
            self._cond.notify_all()
        self._wake.set()
        return fut

    def _take(self, pred: Callable[[tuple[int, float, Future[bool]]], bool]) -> list[tuple[int, float, Future[bool]]]:
        with self._cond:
            taken = [r for r in self._requests if pred(r)]
            if taken:
                self._requests = [r for r in self._requests if not pred(r)]
        return taken

    def _take_upto(self, flushed: int) -> list[tuple[int, float, Future[bool]]]:
        return self._take(lambda r: r[0] <= flushed)

    def _complete(self, requests: list[tuple[int, float, Future[bool]]], flushed: int | None) -> None:
        for end, _, fut in requests:
            if not fut.done():
                fut.set_result(flushed is not None and flushed >= end)

    def _run_flusher(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            with self._cond:
                if self._stopping:
                    return
                pending = bool(self._requests)
            if not pending:
                continue
            try:
                flushed = self._flush()
            except Exception:
                log.exception("group commit flush failed; requests will time out")
                continue
            self._complete(self._take_upto(flushed), flushed)

    def _run_watcher(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                earliest = min((r[1] for r in self._requests), default=now + 1.0)
                if earliest > now:
                    self._cond.wait(earliest - now)
                    continue
                expired = [r for r in self._requests if r[1] <= now]
                self._requests = [r for r in self._requests if r[1] > now]
                for end, _, fut in expired:
                    if not fut.done():
                        log.warning("flush to offset %d not done within syncFlushTimeout %.0f ms", end,
                                    self._timeout_s * 1000)
                        fut.set_result(False)
