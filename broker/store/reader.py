"""Read paths of the file store: ``get_message`` (docs/BEHAVIOUR.md 3.1), offsets by time, key queries.

Kept apart from the store class so the hot loop of ``get_message`` reads top to bottom. Each function takes the
parts of the store it reads (the commit log, the consume-queue table, the index, the read limits of the config).
"""

from __future__ import annotations

import functools
import itertools
import mmap
import struct
from bisect import bisect_right

from broker.store.api import GetMessageResult, GetMessageStatus, QueryResult, RecordFilter, TagFilter
from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue import BLANK_SIZE, CQ_UNIT, UNIT_SIZE, ConsumeQueueTable
from broker.store.index import IndexService
from broker.store.mapped_file import MappedFile
from common.codec import record_layout
from common.properties import scan_properties

__all__ = ["get_message", "offset_by_time", "query_message", "record_at", "store_timestamp"]

_I64 = struct.Struct(">q").unpack_from
_I32 = struct.Struct(">i").unpack_from
#: Units examined per call: ``max(16000, maxMsgNums * 20) / 20``.
_MIN_FILTER_BYTES = 16000


def _result(status: GetMessageStatus, next_offset: int, min_o: int, max_o: int) -> GetMessageResult:
    return GetMessageResult(status, next_offset, min_o, max_o)


def _file_holding(files: list[MappedFile], first_start: int, file_size: int, phy: int, size: int) -> MappedFile | None:
    """The commit-log file holding all ``size`` bytes at ``phy``; None for a blank unit, a removed file or bytes
    not written yet."""
    if size == BLANK_SIZE:
        return None
    idx = (phy - first_start) // file_size
    if not 0 <= idx < len(files):
        return None
    f = files[idx]
    return f if phy - f.start + size <= f.wrote else None


def get_message(
    cl: CommitLog, cqs: ConsumeQueueTable, cfg: StoreConfig, topic: str, queue_id: int, offset: int, max_nums: int,
    max_bytes: int, tag_filter: TagFilter | None, record_filter: RecordFilter | None = None, *,
    correct_offsets: bool, memory_bytes: int,
) -> GetMessageResult:
    """See :meth:`broker.store.api.MessageStore.get_message`.

    ``correct_offsets`` False (a slave without ``offsetCheckInSlave``) keeps the consumer's offset in every
    answer: a lagging replica must not move it (nextOffsetCorrection). ``memory_bytes``: how far behind the log's
    end a record still counts as in memory (the store's ``memory_bytes_for_reads``).
    """
    max_py = cl.max_offset
    cq = cqs.get(topic, queue_id)
    min_o = cq.min_offset if cq is not None else 0
    max_o = cq.max_offset if cq is not None else 0
    correct = correct_offsets
    if cq is None or max_o == 0:
        return _result(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0 if correct else offset, min_o, max_o)
    if offset < min_o:
        return _result(GetMessageStatus.OFFSET_TOO_SMALL, min_o if correct else offset, min_o, max_o)
    if offset == max_o:
        return _result(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_o, max_o)
    if offset > max_o:
        nxt = (min_o if min_o == 0 else max_o) if correct else offset
        return _result(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, min_o, max_o)
    loc = cq.locate(offset)
    if loc is None:
        units_per_file = cq.file_size // UNIT_SIZE
        nxt = offset + units_per_file - offset % units_per_file
        return _result(GetMessageStatus.OFFSET_FOUND_NULL, nxt if correct else offset, min_o, max_o)
    mf, pos = loc
    window = mf.mm[pos : min(mf.wrote, pos + max(_MIN_FILTER_BYTES, max_nums * UNIT_SIZE) // UNIT_SIZE * UNIT_SIZE)]
    if tag_filter is None and record_filter is None:
        found = _take_run(cl, cfg, window, max_py, offset, max_nums, max_bytes, min_o, max_o, memory_bytes)
        if found is not None:
            return found
    return _scan(cl, cfg, window, max_py, offset, max_nums, max_bytes, tag_filter, record_filter, min_o, max_o,
                 memory_bytes)


def _scan(
    cl: CommitLog, cfg: StoreConfig, window: bytes, max_py: int, offset: int, max_nums: int, max_bytes: int,
    tag_filter: TagFilter | None, record_filter: RecordFilter | None, min_o: int, max_o: int, memory: int,
) -> GetMessageResult:
    """Take the records of the consume-queue units in ``window`` (a copy of the units from ``offset`` on, at most
    max(16000, 20 * maxMsgNums) bytes, unpacked in one pass), within the caps, filters applied."""
    # Caps after the first record: the request's and those of where the record is (RocketMQ checks each in turn).
    # A record more than ``memory`` behind the log's end (below on_disk_below) is on disk.
    on_disk_below = max_py - memory
    mem_bytes = min(max_bytes, cfg.max_transfer_bytes_on_message_in_memory)
    mem_count = min(max_nums, cfg.max_transfer_count_on_message_in_memory)
    disk_bytes = min(max_bytes, cfg.max_transfer_bytes_on_message_in_disk)
    disk_count = min(max_nums, cfg.max_transfer_count_on_message_in_disk)
    files = cl.files
    first_start = files[0].start if files else 0
    file_size = cl.file_size
    runs: list[tuple[mmap.mmap, int, int]] = []
    queue_offsets: list[int] = []
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    total = count = 0
    next_phy_file_start = -1
    # The run of taken records contiguous in one commit-log file (ended runs are in ``runs``, as the map and the
    # byte range in it): that file's map, its first physical offset and the end of its written bytes, and where
    # the run starts and ends.
    run_mm: mmap.mmap | None = None
    run_first = run_limit = run_start = run_end = 0
    q = offset - 1
    phy = 0
    for phy, size, tag in CQ_UNIT.iter_unpack(window):
        q += 1
        if phy < next_phy_file_start:
            continue
        if count:
            if phy < on_disk_below:
                if count >= disk_count or total + size > disk_bytes:
                    break
            elif count >= mem_count or total + size > mem_bytes:
                break
        if tag_filter is not None and not tag_filter(tag):
            continue
        if run_first <= phy and phy + size <= run_limit and run_mm is not None:
            # Written bytes of the run's file (never a blank unit: its size exceeds any file).
            if record_filter is not None and not record_filter(run_mm[phy - run_first : phy - run_first + size]):
                continue
            if phy != run_end:  # not the next record of the run: the run ends, another starts
                runs.append((run_mm, run_start - run_first, run_end - run_first))
                run_start = phy
            run_end = phy + size
        else:
            f = _file_holding(files, first_start, file_size, phy, size)
            if f is None:
                if not count:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                if size != BLANK_SIZE:
                    next_phy_file_start = cl.roll_next_file(phy)
                continue
            if record_filter is not None and not record_filter(f.mm[phy - f.start : phy - f.start + size]):
                continue
            if run_mm is not None and run_end > run_start:
                runs.append((run_mm, run_start - run_first, run_end - run_first))
            run_mm, run_first, run_limit, run_start, run_end = f.mm, f.start, f.start + f.wrote, phy, phy + size
        queue_offsets.append(q)
        total += size
        count += 1
    else:
        q += 1
    if run_mm is not None and run_end > run_start:
        runs.append((run_mm, run_start - run_first, run_end - run_first))
    return GetMessageResult(GetMessageStatus.FOUND if count else status, q, min_o, max_o, _copy_out(runs),
                            queue_offsets, phy < on_disk_below)


def _take_run(
    cl: CommitLog, cfg: StoreConfig, window: bytes, max_py: int, offset: int, max_nums: int, max_bytes: int,
    min_o: int, max_o: int, memory: int,
) -> GetMessageResult | None:
    """What :func:`_scan` answers for an unfiltered read whose records are one run in one file and in memory,
    reached without a step per record: None when that is not the case (then :func:`_scan` reads it).

    The units up to the caps are one run when each starts where the one before ends: the usual case of a read
    from a slave, a queue written in batches, whose answer is then one slice of the map.
    """
    if len(window) < UNIT_SIZE:
        return None
    first_phy = _I64(window, 0)[0]
    if first_phy < max_py - memory:  # on disk: the disk caps and the slave suggestion are _scan's
        return None
    take = max(1, min(len(window) // UNIT_SIZE, max_nums, cfg.max_transfer_count_on_message_in_memory))
    if take > 1 and _I64(window, UNIT_SIZE)[0] != first_phy + _I32(window, 8)[0]:
        return None  # the second record is not next to the first (queues written a record at a time, mixed)
    units = _unpack_units(window, take)  # (phy, size) of each unit
    sizes = units[1::2]
    ends = list(itertools.accumulate(sizes))  # bytes of the first k records, k = 1..take
    # The first record goes even when it alone exceeds the byte cap (as _scan's ``if count`` lets it).
    take = max(1, bisect_right(ends, min(max_bytes, cfg.max_transfer_bytes_on_message_in_memory)))
    if units[0 : 2 * take : 2] != list(itertools.accumulate(sizes[: take - 1], initial=first_phy)):
        return None  # another queue's records (or a blank unit) in between
    files = cl.files
    f = _file_holding(files, files[0].start if files else 0, cl.file_size, first_phy, ends[take - 1])
    if f is None:
        return None  # a removed file, bytes not written yet, or a run across files
    start = first_phy - f.start
    return GetMessageResult(GetMessageStatus.FOUND, offset + take, min_o, max_o,
                            _copy_out([(f.mm, start, start + ends[take - 1])]), list(range(offset, offset + take)))


def _unpack_units(window: bytes, count: int) -> list[int]:
    """The commit-log offset and size of each of the first ``count`` units of ``window``, flat (their tag codes
    skipped), unpacked :data:`_CHUNK` units a call."""
    out: list[int] = []
    full, rest = divmod(count, _CHUNK)
    for i in range(full):
        out += _CHUNK_UNITS.unpack_from(window, i * _CHUNK * UNIT_SIZE)
    if rest:
        out += _units(rest).unpack_from(window, full * _CHUNK * UNIT_SIZE)
    return out


@functools.lru_cache(maxsize=64)
def _units(count: int) -> struct.Struct:
    """Offset and size of ``count`` units (at most :data:`_CHUNK`: about 64 bytes of Struct a unit, so the cache
    holds at most about 1 MiB)."""
    return struct.Struct(">" + "qi8x" * count)


_CHUNK = 256
_CHUNK_UNITS = _units(_CHUNK)


def _copy_out(runs: list[tuple[mmap.mmap, int, int]]) -> bytes:
    """The bytes of ``runs`` back to back, in one new buffer: each run is copied straight out of its map (no
    intermediate copy per run, and one large allocation per read, so glibc keeps reusing its memory instead of
    faulting fresh pages in)."""
    if len(runs) == 1:
        mm, start, end = runs[0]
        return mm[start:end]
    views = [memoryview(mm)[start:end] for mm, start, end in runs]
    try:
        return b"".join(views)
    finally:
        # Released at once, even when the join fails (a traceback would keep the list alive): retention cannot
        # close a map while a view of it is open.
        for view in views:
            view.release()


def _record_ts(cl: CommitLog, phy: int, size: int) -> int:
    rec = cl.read(phy, size) if size != BLANK_SIZE else None
    if rec is None or len(rec) < 91:
        return -1
    try:
        _, ts_pos, _, _, _ = record_layout(rec, 0, len(rec))
    except Exception:
        return -1
    return int(_I64(rec, ts_pos)[0])


def store_timestamp(cl: CommitLog, cqs: ConsumeQueueTable, topic: str, queue_id: int, queue_offset: int) -> int:
    """Store time of one message, -1 when absent."""
    cq = cqs.get(topic, queue_id)
    unit = cq.unit(queue_offset) if cq is not None else None
    if unit is None:
        return -1
    return _record_ts(cl, unit[0], unit[1])


def offset_by_time(cl: CommitLog, cqs: ConsumeQueueTable, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """First queue offset stored at or after ``timestamp_ms`` (binary search; max offset when none)."""
    cq = cqs.get(topic, queue_id)
    if cq is None:
        return 0
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        ts = store_timestamp(cl, cqs, topic, queue_id, mid)
        if 0 <= ts < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _matches(rec: bytes, topic: bytes, key: bytes) -> bool:
    try:
        _, _, _, tp, pp = record_layout(rec, 0, len(rec))
    except Exception:
        return False
    if rec[tp + 1 : pp] != topic:
        return False
    props = scan_properties(rec[pp + 2 :])
    return props.uniq_key == key or key in props.keys.split(b" ")


def record_at(cl: CommitLog, physical_offset: int, size: int | None = None) -> bytes | None:
    """The record at a physical offset (its size read from the log when not given), or None."""
    if size is None:
        size = cl.record_size_at(physical_offset)
        if size is None:
            return None
    return cl.read(physical_offset, size)


def query_message(
    cl: CommitLog, index: IndexService | None, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
) -> QueryResult:
    """Records whose ``topic#key`` is indexed (unique key or one of the keys), newest first, no duplicates."""
    if index is None or max_num <= 0:
        return QueryResult([])
    topic_b, key_b = topic.encode(), key.encode()
    records: list[bytes] = []
    seen: set[int] = set()
    # Hash collisions are filtered out below, so look at a few more candidates than asked for.
    for phy in index.query(topic, key, max_num * 4, begin_ms, end_ms):
        if phy in seen:
            continue
        seen.add(phy)
        rec = record_at(cl, phy)
        if rec is not None and _matches(rec, topic_b, key_b):
            records.append(rec)
            if len(records) >= max_num:
                break
    return QueryResult(records, index.end_ts, index.end_phy)
