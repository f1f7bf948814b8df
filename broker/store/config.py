"""Store configuration: a frozen, validated attrs object (units last in names). Built by the broker from its
``.properties`` file (RocketMQ's camelCase keys map to these snake_case fields), or directly in tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import attrs

from broker.store.retention import RetentionConfig
from common.codes import BrokerRole, FlushDiskType
from common.memory_cgroup import effective_memory_limit_bytes

__all__ = ["DEFAULT_DELAY_LEVELS", "StoreConfig", "parse_delay_levels", "total_physical_memory_bytes"]

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``"1s 5s 1m"`` -> ``(1000, 5000, 60000)``; raises ValueError naming the bad token."""
    out = []
    for tok in text.split():
        unit = _UNITS_MS.get(tok[-1:])
        if unit is None or not tok[:-1].isdigit():
            raise ValueError(f"messageDelayLevel token {tok!r} is not <number><s|m|h|d>")
        out.append(int(tok[:-1]) * unit)
    if not out:
        raise ValueError("messageDelayLevel is empty")
    return tuple(out)


def total_physical_memory_bytes() -> int:
    """The machine's physical RAM (RocketMQ's TOTAL_PHYSICAL_MEMORY_SIZE)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen(kw_only=True)
class StoreConfig:
    """Everything the message store needs to know. Defaults are RocketMQ's (docs/BEHAVIOUR.md 1.3)."""

    store_path_root_dir: str
    """``storePathRootDir``: holds commitlog/, consumequeue/, index/, checkpoint, abort, config/."""
    mapped_file_size_commitlog: int = attrs.field(default=1 << 30, validator=_positive)
    """``mappedFileSizeCommitLog`` bytes per commit-log file."""
    mapped_file_size_consume_queue: int = attrs.field(default=300_000 * 20, validator=_positive)
    """``mappedFileSizeConsumeQueue``; rounded up to a multiple of 20."""
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    sync_flush_timeout_ms: int = attrs.field(default=2000, validator=_positive)
    flush_interval_commitlog_ms: int = attrs.field(default=500, validator=_positive)
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    max_message_size: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    access_message_in_memory_max_ratio: int = attrs.field(default=40)
    """Percent of the broker's memory (RAM, or its memory cgroup's limit when smaller) under which a reader counts
    as "in memory" (``suggestPullingFromSlave``; :mod:`broker.store.read_memory`)."""
    total_physical_memory_bytes: int = attrs.field(factory=total_physical_memory_bytes)
    memory_limit_bytes: Callable[[], int | None] = effective_memory_limit_bytes
    """Reads the memory cgroup's limit (None: unlimited); injected in tests."""
    memory_limit_refresh_ms: int = attrs.field(default=15_000, validator=_positive)
    """How long one reading of the limit is used (by ``clock_ms``) before it is read again."""
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    offset_check_in_slave: bool = False
    truncate_corrupt: bool = False
    """Recovery: truncate at a corrupt record mid-log instead of refusing to start."""
    check_crc_on_recover: bool = True
    preallocate_commitlog: bool = True
    """Create and pre-fault the next commit-log file in a background thread (RocketMQ's
    AllocateMappedFileService with warmMapedFile), so appends do not pay a page fault per 4 KiB."""
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"
    """Packed ``ip + int32 port`` written into STOREHOSTADDRESS (:func:`common.codec.pack_host`)."""
    clock_ms: Callable[[], int] = _wall_clock_ms
    """Wall clock in ms (injected in tests)."""
    retention: RetentionConfig = attrs.field(factory=RetentionConfig)
    """File retention and the disk guard (:mod:`broker.store.retention`)."""
    destroy_mapped_file_interval_forcibly_ms: int = attrs.field(default=120_000, validator=_positive)
    """``destroyMapedFileIntervalForcibly``: a deleted file still held by a reader is unmapped after this."""
    disk_used_ratio: Callable[[str], float] | None = None
    """``path -> used fraction of its partition``; None: the file layer's ``statvfs`` (tests inject one)."""

    @property
    def consume_queue_file_size(self) -> int:
        return (self.mapped_file_size_consume_queue + 19) // 20 * 20

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)
