"""Retention and disk guards of the store, as pure decisions (RocketMQ's ``CleanCommitLogService`` and the disk
checks of ``DefaultMessageStore``; keys and defaults in docs/BEHAVIOUR.md 1.3). No I/O: the store measures, the
broker's cleaner paces, these functions decide.

A pass of the cleaner:

1. :func:`disk_state` -- the store is writeable unless a partition it writes is above
   ``diskSpaceWarningLevelRatio`` (90 %) or the last write failed and usage has not dropped below that since;
2. :func:`clean_decision` -- clean now when the hour is one of ``deleteWhen``, the commit log's partition is above
   ``diskMaxUsedSpaceRatio`` (75 %) or an operator asked; past ``diskSpaceCleanForciblyRatio`` (85 %) files go
   even before they expire;
3. :func:`deletable_head` -- how many of the oldest commit-log files may go: oldest first and contiguous (the log
   has no holes), expired (last write ``fileReservedTime`` ago) unless forced, never the file being written, never
   a byte the store still needs (not dispatched, not flushed), at most ``deleteFileBatchMax`` per pass.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import attrs

__all__ = [
    "CleanDecision",
    "CleanReason",
    "DeletedFile",
    "DiskState",
    "DiskUsage",
    "FileAge",
    "RetentionConfig",
    "RetentionStats",
    "StoreCleaning",
    "clean_decision",
    "deletable_head",
    "disk_state",
    "parse_delete_when",
]

_HOUR_MS = 3_600_000


def parse_delete_when(text: str) -> tuple[int, ...]:
    """``"04"`` or ``"04;16"`` -> hours of the day ``(4, 16)``.

    Raises:
        ValueError: a part is not an hour 00..23 (the message quotes it).
    """
    hours = []
    for part in text.split(";"):
        part = part.strip()
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"deleteWhen part {part!r} is not an hour 00..23 (several are separated by ';')")
        hours.append(int(part))
    return tuple(sorted(set(hours)))


def _ratio(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value}")


@attrs.frozen(kw_only=True)
class RetentionConfig:
    """The cleaner's settings. Ratios are fractions of a partition's size (RocketMQ's keys are percents)."""

    file_reserved_time_ms: int = 72 * _HOUR_MS
    """``fileReservedTime`` (hours in the file): a commit-log file expires this long after its last write."""
    delete_when: tuple[int, ...] = (4,)
    """``deleteWhen``: hours of the local day at which expired files are deleted."""
    disk_max_used_space_ratio: float = attrs.field(default=0.75, validator=_ratio)
    """``diskMaxUsedSpaceRatio``: above it expired files are deleted whatever the hour."""
    disk_space_clean_forcibly_ratio: float = attrs.field(default=0.85, validator=_ratio)
    """``diskSpaceCleanForciblyRatio``: above it the oldest files are deleted even before they expire."""
    disk_space_warning_level_ratio: float = attrs.field(default=0.90, validator=_ratio)
    """``diskSpaceWarningLevelRatio``: above it the store refuses writes until usage drops below it."""
    clean_file_forcibly_enable: bool = True
    """``cleanFileForciblyEnable``: allow the forced deletion above ``disk_space_clean_forcibly_ratio``."""
    delete_file_batch_max: int = 10
    """``deleteFileBatchMax``: commit-log files deleted per pass at most."""

    @property
    def delete_when_text(self) -> str:
        return ";".join(f"{h:02d}" for h in self.delete_when)


@attrs.frozen
class DiskUsage:
    """Used fraction of the partitions holding the commit log, the consume queues and the index."""

    commitlog: float
    consume_queue: float
    index: float

    @property
    def highest(self) -> float:
        return max(self.commitlog, self.consume_queue, self.index)

    def describe(self) -> str:
        return (f"commit log {self.commitlog:.1%}, consume queue {self.consume_queue:.1%}, "
                f"index {self.index:.1%}")


@attrs.frozen
class DiskState:
    """Whether the store takes writes, and why not."""

    writeable: bool
    reason: str = ""
    """Empty when writeable; else the message a refused send carries."""


def disk_state(usage: DiskUsage, write_error: str | None, cfg: RetentionConfig) -> DiskState:
    """The store's writeability after a disk check.

    Args:
        usage: what the partitions hold now.
        write_error: the last write error since usage was last below the warning level, or None.
        cfg: the ratios.
    """
    limit = cfg.disk_space_warning_level_ratio
    if usage.highest > limit:
        return DiskState(False, f"disk full: {usage.describe()} used, above diskSpaceWarningLevelRatio "
                                f"{limit:.0%}; writes resume by themselves once usage is below it (reads work)")
    if write_error is not None:
        return DiskState(False, f"the last write failed ({write_error}); {usage.describe()} used; writes resume "
                                f"after the next disk check finds room (reads work)")
    return DiskState(True)


class CleanReason(enum.Enum):
    """Why a pass deletes files (logged with what it deleted)."""

    TIME = "the hour is one of deleteWhen"
    SPACE = "disk usage is above diskMaxUsedSpaceRatio"
    MANUAL = "an operator asked for a pass now (splitmq broker clean, Admin.clean_expired_files)"


@attrs.frozen
class CleanDecision:
    """Whether a pass deletes, and whether unexpired files may go too."""

    reason: CleanReason | None
    """None: nothing is deleted this pass."""
    force: bool = False
    """Delete the oldest files even before they expire (usage above ``diskSpaceCleanForciblyRatio``)."""


def clean_decision(hour: int, commitlog_ratio: float, manual: bool, cfg: RetentionConfig) -> CleanDecision:
    """RocketMQ's ``isTimeToDelete || isSpaceToDelete || manualDelete``, with ``cleanAtOnce`` as ``force``.

    Args:
        hour: the local hour of the day now.
        commitlog_ratio: used fraction of the commit log's partition.
        manual: an operator's request is pending.
        cfg: the settings.
    """
    force = cfg.clean_file_forcibly_enable and commitlog_ratio > cfg.disk_space_clean_forcibly_ratio
    if commitlog_ratio > cfg.disk_max_used_space_ratio:
        return CleanDecision(CleanReason.SPACE, force)
    if manual:
        return CleanDecision(CleanReason.MANUAL, force)
    if hour in cfg.delete_when:
        return CleanDecision(CleanReason.TIME, force)
    return CleanDecision(None)


@attrs.frozen
class FileAge:
    """One commit-log file as the cleaner sees it."""

    start: int
    end: int
    last_write_ms: int


def deletable_head(files: Sequence[FileAge], now_ms: int, *, reserved_ms: int, force: bool, keep_from: int,
                   batch_max: int) -> int:
    """How many files from the head of ``files`` (oldest first) may be deleted now.

    Deletion stops at the first file that must stay, so the log stays contiguous: the last file (being written)
    always stays; so does every file that ends past ``keep_from`` (bytes not yet dispatched into the consume
    queues, not yet flushed, or, on a slave, not yet replicated), and, unless ``force``, every file written to
    less than ``reserved_ms`` ago.
    """
    n = 0
    for f in files[:-1]:
        if n >= batch_max or f.end > keep_from:
            break
        if not force and now_ms - f.last_write_ms < reserved_ms:
            break
        n += 1
    return n


@attrs.frozen
class DeletedFile:
    """One commit-log file retention deleted, and what followed it."""

    start: int
    end: int
    new_min_offset: int
    queue_files: int
    index_files: int
    moved_queues: dict[tuple[str, int], tuple[int, int]]
    """``(topic, queue) -> (old min offset, new min offset)`` for every queue whose min offset moved."""


@attrs.define
class RetentionStats:
    """Counters for ``/metrics``."""

    files_deleted: int = 0
    bytes_reclaimed: int = 0
    queue_files_deleted: int = 0
    index_files_deleted: int = 0


class StoreCleaning(Protocol):
    """What the broker uses of a store's cleaner (:class:`broker.store.cleaner.StoreCleaner`)."""

    state: DiskState
    usage: DiskUsage
    stats: RetentionStats

    @property
    def writeable(self) -> bool: ...

    def check_disk(self) -> DiskUsage:
        """Measure the partitions; update ``state``."""
        ...

    def decide(self, manual: bool) -> CleanDecision: ...

    def deletable(self, decision: CleanDecision) -> int:
        """How many of the oldest commit-log files may go now."""
        ...

    def delete_oldest(self) -> DeletedFile | None:
        """Delete the oldest commit-log file and what only pointed into it."""
        ...

    def close_retired(self) -> int:
        """Unmap deleted files no reader holds any more."""
        ...
