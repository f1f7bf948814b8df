"""The retention decisions of :mod:`broker.store.retention`, as tables (no files)."""

from __future__ import annotations

import pytest

from broker.store.retention import (
    CleanDecision,
    CleanReason,
    DiskUsage,
    FileAge,
    RetentionConfig,
    clean_decision,
    deletable_head,
    disk_state,
    parse_delete_when,
)

CFG = RetentionConfig()  # 72 h, "04", 75 / 85 / 90 %
H = 3_600_000


@pytest.mark.parametrize(("text", "hours"), [("04", (4,)), ("04;16", (4, 16)), ("16;04;04", (4, 16)),
                                             ("0", (0,)), ("23", (23,)), (" 04 ; 16 ", (4, 16))])
def test_parse_delete_when(text: str, hours: tuple[int, ...]) -> None:
    assert parse_delete_when(text) == hours


@pytest.mark.parametrize("text", ["", "24", "4;", "noon", "-1", "04,16"])
def test_parse_delete_when_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="deleteWhen part"):
        parse_delete_when(text)


@pytest.mark.parametrize(
    ("hour", "ratio", "manual", "expected"),
    [
        (3, 0.50, False, CleanDecision(None)),  # not the hour, room on the disk
        (4, 0.50, False, CleanDecision(CleanReason.TIME)),  # deleteWhen
        (3, 0.50, True, CleanDecision(CleanReason.MANUAL)),  # an operator, whatever the hour
        (3, 0.75, False, CleanDecision(None)),  # 75 % is not above 75 %
        (3, 0.76, False, CleanDecision(CleanReason.SPACE)),  # above diskMaxUsedSpaceRatio
        (3, 0.85, False, CleanDecision(CleanReason.SPACE)),  # 85 % is not above 85 %: no force
        (3, 0.86, False, CleanDecision(CleanReason.SPACE, force=True)),  # above diskSpaceCleanForciblyRatio
        (4, 0.86, True, CleanDecision(CleanReason.SPACE, force=True)),  # space wins over the other reasons
        (3, 0.99, False, CleanDecision(CleanReason.SPACE, force=True)),
    ],
)
def test_clean_decision(hour: int, ratio: float, manual: bool, expected: CleanDecision) -> None:
    assert clean_decision(hour, ratio, manual, CFG) == expected


def test_forced_deletion_can_be_disabled() -> None:
    cfg = RetentionConfig(clean_file_forcibly_enable=False)
    assert clean_decision(3, 0.99, False, cfg) == CleanDecision(CleanReason.SPACE, force=False)


def test_several_delete_hours() -> None:
    cfg = RetentionConfig(delete_when=(4, 16))
    assert [clean_decision(h, 0.1, False, cfg).reason for h in (3, 4, 15, 16)] == [
        None, CleanReason.TIME, None, CleanReason.TIME]


NOW = 1_000 * H


def files(*ages_h: float, size: int = 100) -> list[FileAge]:
    """Files back to back, each last written ``age`` hours before NOW (the last one is the current file)."""
    return [FileAge(i * size, (i + 1) * size, int(NOW - age * H)) for i, age in enumerate(ages_h)]


@pytest.mark.parametrize(
    ("ages", "force", "keep_from", "batch_max", "expected"),
    [
        ((100, 90, 80, 0), False, 10**9, 10, 3),  # every expired file, oldest first
        ((100, 90, 80), False, 10**9, 10, 2),  # never the last file, expired or not
        ((100,), False, 10**9, 10, 0),  # a single file is the current one
        ((100, 71, 80, 0), False, 10**9, 10, 1),  # stops at the first unexpired file (no holes)
        ((72, 0), False, 10**9, 10, 1),  # exactly fileReservedTime: expired
        ((71.9, 0), False, 10**9, 10, 0),
        ((1, 1, 1, 0), True, 10**9, 10, 3),  # forced: age does not matter
        ((100, 90, 80, 0), False, 200, 10, 2),  # a file ending past keep_from (not dispatched/flushed) stays
        ((100, 90, 80, 0), True, 199, 10, 1),  # ... even when forced
        ((100, 90, 80, 0), False, 10**9, 2, 2),  # deleteFileBatchMax
        ((), False, 10**9, 10, 0),
    ],
)
def test_deletable_head(ages: tuple[float, ...], force: bool, keep_from: int, batch_max: int, expected: int) -> None:
    got = deletable_head(files(*ages), NOW, reserved_ms=72 * H, force=force, keep_from=keep_from,
                         batch_max=batch_max)
    assert got == expected


@pytest.mark.parametrize(
    ("usage", "error", "writeable", "words"),
    [
        (DiskUsage(0.5, 0.5, 0.5), None, True, ""),
        (DiskUsage(0.9, 0.9, 0.9), None, True, ""),  # 90 % is not above 90 %
        (DiskUsage(0.91, 0.2, 0.2), None, False, "disk full: commit log 91.0%, consume queue 20.0%, index 20.0%"),
        (DiskUsage(0.2, 0.95, 0.2), None, False, "above diskSpaceWarningLevelRatio 90%"),  # any partition
        (DiskUsage(0.2, 0.2, 0.2), "disk full: ENOSPC", False, "the last write failed (disk full: ENOSPC)"),
    ],
)
def test_disk_state(usage: DiskUsage, error: str | None, writeable: bool, words: str) -> None:
    state = disk_state(usage, error, CFG)
    assert state.writeable is writeable
    assert words in state.reason
    if not writeable:
        assert "reads work" in state.reason


def test_ratios_are_checked() -> None:
    with pytest.raises(ValueError, match="disk_max_used_space_ratio"):
        RetentionConfig(disk_max_used_space_ratio=75)
