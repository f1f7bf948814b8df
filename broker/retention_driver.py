"""The broker's cleaner task: a retention pass every ``cleanResourceInterval`` (RocketMQ's
``cleanResourceInterval`` schedule of ``CleanCommitLogService`` / ``CleanConsumeQueueService``), on the event loop.

A pass measures the disks (the store refuses writes above ``diskSpaceWarningLevelRatio``), decides whether to
delete (:func:`broker.store.retention.clean_decision`), then deletes the oldest commit-log files one at a time with
``deleteCommitLogFilesInterval`` between them, each followed at once by its consume-queue and index files, and logs
what each consumer group lost that it had not consumed. While the store refuses writes the disks are measured
every second, so writes resume soon after space comes back. An operator's request (:meth:`RetentionDriver.clean_now`)
runs a pass at once that deletes whatever has expired, whatever the hour.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import attrs

from broker.store.retention import DeletedFile, DiskUsage, StoreCleaning

__all__ = ["CleanReport", "RetentionDriver", "lost_by_group"]

log = logging.getLogger(__name__)

#: How often the disks are measured while the store refuses writes.
UNWRITEABLE_CHECK_S = 1.0


@attrs.frozen
class CleanReport:
    """What one pass did (the answer to an operator's clean request)."""

    deleted_files: int
    bytes_reclaimed: int
    min_offset: int
    reason: str
    """Why it deleted (``CleanReason`` text), or why not."""
    forced: bool
    usage: DiskUsage
    lost: Mapping[str, int]
    """``group -> messages`` it had not consumed that are gone."""

    def to_json(self) -> dict[str, object]:
        return {"deletedFiles": self.deleted_files, "bytesReclaimed": self.bytes_reclaimed,
                "minOffset": self.min_offset, "reason": self.reason, "forced": self.forced,
                "diskUsage": {"commitLog": self.usage.commitlog, "consumeQueue": self.usage.consume_queue,
                              "index": self.usage.index},
                "lostMessages": dict(self.lost)}


def lost_by_group(moved: Mapping[tuple[str, int], tuple[int, int]],
                  committed: Mapping[str, Mapping[int, int]], separator: str = "@") -> dict[str, int]:
    """Messages each group had not consumed that a deletion took: per queue whose min offset moved from ``old``
    to ``new``, ``new - max(committed, old)`` when the group's committed offset is below ``new``.

    Args:
        moved: ``(topic, queue) -> (old min, new min)``.
        committed: the consumer-offset table, ``"topic@group" -> {queue: offset}``.
        separator: between topic and group in the table's keys.
    """
    lost: dict[str, int] = {}
    for key, queues in committed.items():
        topic, _, group = key.partition(separator)
        for qid, offset in queues.items():
            span = moved.get((topic, qid))
            if span is not None and offset < span[1]:
                n = span[1] - max(offset, span[0])
                if n > 0:
                    lost[group] = lost.get(group, 0) + n
    return lost


class RetentionDriver:
    """Runs retention passes on the event loop.

    Args:
        cleaner: the store's cleaner.
        committed_offsets: returns the consumer-offset table (for the loss warning).
        interval_s: ``cleanResourceInterval``.
        delete_interval_s: ``deleteCommitLogFilesInterval``, between two deletions of one pass.
        batch_max: ``deleteFileBatchMax``, deletions per pass.
        sleep: ``asyncio.sleep`` (tests inject one).
    """

    def __init__(self, cleaner: StoreCleaning, committed_offsets: Callable[[], Mapping[str, Mapping[int, int]]], *,
                 interval_s: float, delete_interval_s: float, batch_max: int,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._cleaner = cleaner
        self._committed = committed_offsets
        self._interval_s = interval_s
        self._delete_interval_s = delete_interval_s
        self._batch_max = batch_max
        self._sleep = sleep
        self._lock = asyncio.Lock()
        self.passes = 0

    async def run(self) -> None:
        """Pass after pass until cancelled (the first right away: a broker may start on a full disk)."""
        while True:
            try:
                await self.pass_once(manual=False)
            except Exception:  # one failed pass (an unlink error...) must not end retention
                log.exception("retention pass failed")
            await self._sleep(self._interval_s if self._cleaner.writeable
                              else min(self._interval_s, UNWRITEABLE_CHECK_S))

    async def clean_now(self) -> CleanReport:
        """An operator's request: delete what has expired now, whatever the hour."""
        return await self.pass_once(manual=True)

    async def pass_once(self, *, manual: bool) -> CleanReport:
        async with self._lock:
            self.passes += 1
            cleaner = self._cleaner
            usage = cleaner.check_disk()
            decision = cleaner.decide(manual)
            deleted: list[DeletedFile] = []
            # Asked again before every deletion, not once per pass: during a pause a slave may drop its whole log
            # and restart it at its master's oldest file (HA), and the files it then writes are not the ones
            # this pass looked at.
            for i in range(self._batch_max):
                if i:
                    await self._sleep(self._delete_interval_s)
                if not cleaner.deletable(decision):
                    break
                gone = cleaner.delete_oldest()
                if gone is None:
                    break
                deleted.append(gone)
            lost: dict[str, int] = {}
            if deleted:
                moved: dict[tuple[str, int], tuple[int, int]] = {}
                for d in deleted:
                    for key, (old, new) in d.moved_queues.items():
                        moved[key] = (moved[key][0] if key in moved else old, new)
                lost = lost_by_group(moved, self._committed())
                for group, n in sorted(lost.items()):
                    log.warning("retention%s deleted %d messages group %s had not consumed",
                                " (disk above diskSpaceCleanForciblyRatio: files not yet expired)"
                                if decision.force else "", n, group)
                usage = cleaner.check_disk()
            # Unmapping a large file and freeing its blocks can take tens of ms: not on the event loop.
            await asyncio.to_thread(cleaner.close_retired)
            reason = decision.reason.value if decision.reason is not None else "nothing to do at this hour"
            return CleanReport(len(deleted), sum(d.end - d.start for d in deleted),
                               deleted[-1].new_min_offset if deleted else -1, reason, decision.force, usage, lost)
