"""The index files (``<root>/index/<yyyyMMddHHmmssSSS>``): lookup by key and unique key (SEMANTICS.md 7.3)::

    header   40 B   beginTimestamp int64 | endTimestamp int64 | beginPhyOffset int64 | endPhyOffset int64
                    | hashSlotCount int32 | indexCount int32 (starts at 1)
    slots    maxHashSlotNum x int32      most recent item number of the slot (0 = empty)
    items    maxIndexNum x 20 B          keyHash int32 | phyOffset int64 | timeDiffSeconds int32 | prevIndex int32

Keys are ``topic#UNIQ_KEY`` and ``topic#k`` for each key; ``keyHash = abs(javaHash(key))`` (0 on overflow). A
full file is followed by a new one that starts where it ended.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import struct
import threading
from collections.abc import Callable
from operator import mul

from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile, RetiredFiles
from client.protocol.codec import java_hash

__all__ = ["IndexFile", "IndexService", "key_hash"]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ITEM = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
INT_MAX = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_POWERS: dict[int, tuple[tuple[int, ...], int]] = {}


def _powers(n: int) -> tuple[tuple[int, ...], int]:
    """``(31^(n-1) .. 31^0, 31^n)`` mod 2^32."""
    p = _POWERS.get(n)
    if p is None:
        p = _POWERS[n] = (tuple(pow(31, n - 1 - i, 1 << 32) for i in range(n)), pow(31, n, 1 << 32))
    return p


def _abs_hash(h: int) -> int:
    h &= _MASK
    if h & 0x80000000:
        h = (1 << 32) - h  # abs of a negative int32
        return 0 if h > INT_MAX else h
    return h


def key_hash(key: str) -> int:
    """``abs(javaHash(key))`` as the index stores it (0 when abs overflows)."""
    return _abs_hash(java_hash(key))


#: A client unique id is 32 hex characters whose first 20 (ip, pid, random) are the same for every message of a
#: producer process: their hash is cached, so only the last 12 are hashed per message.
_UNIQ_LEN = 32
_UNIQ_STABLE = 20
_UNIQ_CACHE_MAX = 4096


class _TopicHasher:
    """Hashes ``topic#key`` from bytes, reusing the hash of the ``topic#`` prefix (keys are mostly ASCII)."""

    __slots__ = ("_uniq_heads", "prefix_hash", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.prefix_hash = java_hash(topic + "#")
        self._uniq_heads: dict[bytes, int] = {}

    def uniq(self, key: bytes) -> int:
        """:meth:`__call__` for a unique id, with the producer-constant head's share of the hash cached."""
        if len(key) != _UNIQ_LEN or not key.isascii():
            return self(key)
        head = key[:_UNIQ_STABLE]
        part = self._uniq_heads.get(head)
        if part is None:
            if len(self._uniq_heads) >= _UNIQ_CACHE_MAX:
                self._uniq_heads.clear()
            weights = _powers(_UNIQ_STABLE)[0]
            tail_shift = _powers(_UNIQ_LEN - _UNIQ_STABLE)[1]
            part = self._uniq_heads[head] = (
                self.prefix_hash * _powers(_UNIQ_LEN)[1] + sum(map(mul, head, weights)) * tail_shift
            ) & _MASK
        weights, _ = _powers(_UNIQ_LEN - _UNIQ_STABLE)
        return _abs_hash(part + sum(map(mul, key[_UNIQ_STABLE:], weights)))

    def __call__(self, key: bytes) -> int:
        n = len(key)
        if not key.isascii():
            return key_hash(f"{self.topic}#{key.decode('utf-8', 'replace')}")
        weights, shift = _powers(n)
        return _abs_hash(self.prefix_hash * shift + sum(map(mul, key, weights)))


class IndexFile:
    """One index file. The header lives in Python ints and reaches the map at flush and close: a header older
    than the items only hides the newest items, which recovery re-adds (it replays from the index checkpoint)."""

    def __init__(self, mf: MappedFile, slot_num: int, index_num: int) -> None:
        self.mf = mf
        self.slot_num = slot_num
        self.index_num = index_num
        (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
         self.index_count) = HEADER.unpack_from(mf.mm, 0)
        if self.index_count <= 0:
            self.index_count = 1
        self._items_at = 40 + slot_num * 4

    @staticmethod
    def file_size(slot_num: int, index_num: int) -> int:
        return 40 + slot_num * 4 + index_num * 20

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def _write_header(self) -> None:
        data = HEADER.pack(self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
                           self.index_count)
        self.mf.write(0, data)

    def put_key(self, h: int, phy: int, store_ts: int) -> bool:
        """Add one key (its :func:`key_hash`); False when the file is full."""
        count = self.index_count
        if count >= self.index_num:
            return False
        mf = self.mf
        mm = mf.mm
        slot_pos = 40 + (h % self.slot_num) * 4
        prev = SLOT.unpack_from(mm, slot_pos)[0]
        if prev <= 0 or prev > count:
            prev = 0
        begin = self.begin_ts
        diff = 0 if begin <= 0 else min(max((store_ts - begin) // 1000, 0), INT_MAX)
        item_pos = self._items_at + count * 20
        if mf.io.hooked:
            mf.write(item_pos, ITEM.pack(h, phy, diff, prev))
            mf.write(slot_pos, SLOT.pack(count))
        else:
            ITEM.pack_into(mm, item_pos, h, phy, diff, prev)
            SLOT.pack_into(mm, slot_pos, count)
        if count <= 1:
            self.begin_phy = phy
            self.begin_ts = store_ts
        if prev == 0:
            self.slot_count += 1
        self.index_count = count + 1
        self.end_phy = phy
        self.end_ts = store_ts
        return True

    def select(self, h: int, begin_ms: int, end_ms: int, max_num: int, out: list[int]) -> None:
        """Append to ``out`` the offsets of items with hash ``h`` stored within ``[begin_ms, end_ms]``."""
        mm = self.mf.mm
        count = self.index_count
        index = SLOT.unpack_from(mm, 40 + (h % self.slot_num) * 4)[0]
        if index <= 0 or index > count or count <= 1:
            return
        seen = 0
        while len(out) < max_num and seen < count:
            seen += 1
            item_h, phy, diff, prev = ITEM.unpack_from(mm, self._items_at + index * 20)
            if diff < 0:
                break
            ts = self.begin_ts + diff * 1000
            if item_h == h and begin_ms <= ts <= end_ms:
                out.append(phy)
            if prev <= 0 or prev > count or prev == index or ts < begin_ms:
                break
            index = prev

    def flush(self) -> None:
        # Items and slots are written at random positions: msync the whole map (only dirty pages cost).
        mf = self.mf
        if not mf.closed:
            self._write_header()
            mf.io.flush(mf.mm, mf.path, 0, mf.size)

    def close(self, *, write_header: bool = True) -> None:
        if not self.mf.closed:
            if write_header:
                self._write_header()
            self.mf.close()


class IndexService:
    """The index files of a store; ``build`` is called by the dispatcher, ``query`` by readers."""

    def __init__(self, io: FileIO, directory: str, slot_num: int, index_num: int,
                 clock_ms: Callable[[], int]) -> None:
        self.io = io
        self.directory = directory
        self.slot_num = slot_num
        self.index_num = index_num
        self.clock_ms = clock_ms
        self.files: list[IndexFile] = []
        self._hashers: dict[bytes, _TopicHasher] = {}
        self.lock = threading.Lock()
        self._dirty = False

    def load(self) -> None:
        self.io.makedirs(self.directory)
        size = IndexFile.file_size(self.slot_num, self.index_num)
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if not name.isdigit() or os.path.getsize(path) != size:
                log.warning("ignoring index file %s (size %d, expected %d for maxHashSlotNum %d, maxIndexNum %d)",
                            path, os.path.getsize(path), size, self.slot_num, self.index_num)
                continue
            mf = MappedFile.open(self.io, path, 0, size, create=False)
            mf.wrote = mf.flushed = size
            self.files.append(IndexFile(mf, self.slot_num, self.index_num))

    @property
    def end_phy(self) -> int:
        return self.files[-1].end_phy if self.files else 0

    @property
    def end_ts(self) -> int:
        return self.files[-1].end_ts if self.files else 0

    def _new_file(self) -> IndexFile:
        size = IndexFile.file_size(self.slot_num, self.index_num)
        ms = self.clock_ms()
        while True:
            name = _dt.datetime.fromtimestamp(ms / 1000).strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"
            path = os.path.join(self.directory, name)
            if not os.path.exists(path) and (not self.files or path > self.files[-1].mf.path):
                break
            ms += 1
        mf = MappedFile.open(self.io, path, 0, size, create=True)
        mf.wrote = size
        f = IndexFile(mf, self.slot_num, self.index_num)
        if self.files:
            prev = self.files[-1]
            f.begin_phy = f.end_phy = prev.end_phy
            f.begin_ts = f.end_ts = prev.end_ts
            prev.flush()  # a full file is final: put it on disk with its header
        with self.lock:
            self.files.append(f)
        return f

    def build(self, topic: bytes, phy: int, store_ts: int, uniq: bytes, keys: bytes) -> None:
        """Index one record's unique key and keys (skipped when already indexed)."""
        files = self.files
        f = files[-1] if files else None
        if f is not None and phy < f.end_phy:
            return
        hasher = self._hashers.get(topic)
        if hasher is None:
            hasher = self._hashers[topic] = _TopicHasher(topic.decode("utf-8", "replace"))
        hashes = [hasher.uniq(uniq)] if uniq else []
        if keys:
            hashes.extend(hasher(k) for k in keys.split(b" ") if k)
        for h in hashes:
            if f is None or not f.put_key(h, phy, store_ts):
                f = self._new_file()
                f.put_key(h, phy, store_ts)
        self._dirty = True

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Physical offsets whose ``topic#key`` hash matches, newest file first (may hold false positives)."""
        h = key_hash(f"{topic}#{key}")
        out: list[int] = []
        for f in reversed(list(self.files)):
            if len(out) >= max_num:
                break
            if f.end_ts >= begin_ms and f.begin_ts <= end_ms:
                f.select(h, begin_ms, end_ms, max_num, out)
        return out

    def flush(self) -> bool:
        """msync every dirty file; True if anything was flushed."""
        if not self._dirty:
            return False
        self._dirty = False
        if self.files:
            self.files[-1].flush()  # earlier files were flushed when they filled up
        return True

    def delete_expired(self, min_phy: int, retired: RetiredFiles, now_ms: int) -> int:
        """Retire the index files that only cover commit-log bytes below ``min_phy`` (never the last one)."""
        with self.lock:
            n = 0
            while n < len(self.files) - 1 and self.files[n].end_phy < min_phy:
                n += 1
            gone = self.files[:n]
            self.files = self.files[n:]  # a new list: query() iterates a copy, the dispatcher the last file
        for f in gone:
            retired.add(f.mf, now_ms)
        return n

    def close(self, *, crashed: bool = False) -> None:
        for f in self.files:
            f.close(write_header=not crashed)
