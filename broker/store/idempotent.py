"""Reading back the records an idempotent producer sent (``SysFlag.IDEMPOTENT``), for the duplicate window
(:mod:`broker.dedup`) of a broker that becomes a master: at start, or a DLedger leader that caught up.

The window is rebuilt from the commit log itself, not from the index: the index holds what dispatch has built,
and on a classic master dispatch runs behind the appends (a retry may come before it caught up, and a crashed
broker re-dispatches after recovery), while a DLedger member dispatches committed entries only. The log holds
every record appended; its store times are in log order (the broker's clock, one per append), so the scan starts
at the first file (or, in DLedger mode, the first entry, found by bisection) stored at the window's start or
before and reads to the end. A record without the bit costs two reads of its head.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator

from broker.store.api import StoredKey
from broker.store.commitlog import CommitLog
from common.codec import MAGIC_V1, RECORD_PREFIX, record_layout
from common.codes import SysFlag
from common.errors import ProtocolViolationError
from common.properties import REAL_QID, REAL_TOPIC, decode_properties, scan_properties

__all__ = ["commitlog_keys", "record_keys", "store_time_at"]

_IDEMPOTENT = int(SysFlag.IDEMPOTENT)
_STOREHOST_V6 = int(SysFlag.STOREHOST_V6)
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_QUEUE = struct.Struct(">i4xq").unpack_from  # QUEUEID, then QUEUEOFFSET after FLAG
_PARKED = REAL_TOPIC.encode() + b"\x01"


def record_keys(buf: bytes | bytearray | memoryview | mmap.mmap, pos: int, end: int, base: int, since_ms: int) -> Iterator[StoredKey]:
    """The idempotent records stored after ``since_ms`` among the records of ``buf[pos:end]`` (``base`` is the
    commit-log offset of ``buf[0]``). Stops at a blank marker, a bad magic or an incomplete record."""
    view = memoryview(buf)
    while pos + 8 <= end:
        size, magic = RECORD_PREFIX.unpack_from(buf, pos)
        if magic != MAGIC_V1 or size < 91 or pos + size > end:
            return
        sys_flag = _I32(buf, pos + 36)[0]
        if sys_flag & _IDEMPOTENT:
            try:
                _, ts_pos, _, tp, pp = record_layout(view, pos, size)
            except ProtocolViolationError:
                return
            store_ts = _I64(buf, ts_pos)[0]
            if store_ts > since_ms:
                props = bytes(buf[pp + 2 : pos + size])
                key = scan_properties(props)[2]
                if key:
                    queue_id, queue_offset = _QUEUE(buf, pos + 12)
                    topic = bytes(buf[tp + 1 : pp]).decode("utf-8", "replace")
                    if _PARKED in props:  # a delayed, timed or half message: the answer named its real queue
                        real = decode_properties(props)
                        topic = real.get(REAL_TOPIC, topic)
                        try:
                            queue_id = int(real.get(REAL_QID, queue_id))
                        except ValueError:
                            pass
                    host_len = 20 if sys_flag & _STOREHOST_V6 else 8
                    yield StoredKey(topic, queue_id, queue_offset, base + pos, size, store_ts, key,
                                    bytes(buf[ts_pos + 8 : ts_pos + 8 + host_len]))
        pos += size


def store_time_at(buf: bytes | bytearray | memoryview | mmap.mmap, pos: int, end: int) -> int | None:
    """Store time of the record at ``buf[pos:]`` (None when no whole record starts there before ``end``)."""
    if pos + 8 > end:
        return None
    size, magic = RECORD_PREFIX.unpack_from(buf, pos)
    if magic != MAGIC_V1 or size < 91 or pos + size > end:
        return None
    try:
        ts_pos = record_layout(memoryview(buf), pos, size)[1]
    except ProtocolViolationError:
        return None
    return int(_I64(buf, ts_pos)[0])


def commitlog_keys(commitlog: CommitLog, since_ms: int) -> Iterator[StoredKey]:
    """:func:`record_keys` over a classic commit log, from the last file whose first record was stored at
    ``since_ms`` or before (the first file when none was)."""
    files = list(commitlog.files)
    start = 0
    # Newest first: a file whose first record is older than the window's start holds the start of the window.
    for i in range(len(files) - 1, -1, -1):
        ts = commitlog.first_store_timestamp(files[i])
        if ts is not None and ts <= since_ms:
            start = i
            break
    for mf in files[start:]:
        end = min(mf.wrote, mf.size)
        if end <= 0:
            continue
        yield from record_keys(mf.mm, 0, end, mf.start, since_ms)  # to the file's blank marker or its end
