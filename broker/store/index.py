"""The index files (``<root>/index/<yyyyMMddHHmmssSSS>``): lookup by key and unique key (docs/BEHAVIOUR.md 7.3)::

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
from collections import deque
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import add, and_, itemgetter, mul

from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile, RetiredFiles
from common.codec import java_hash

__all__ = ["IndexFile", "IndexService", "key_hash"]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ITEM = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
INT_MAX = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
#: ``abs`` of an int32 held as ``h`` in ``[0, 2^32)``: ``h if h <= INT_MAX else (_TWO32 - h) & INT_MAX`` (0 for
#: Integer.MIN_VALUE, as Java's ``Math.abs`` overflows there), about half the cost of the bitwise form.
_TWO32 = 1 << 32


def _abs_hash(h: int) -> int:
    h &= _MASK
    return h if h <= INT_MAX else (_TWO32 - h) & INT_MAX


def key_hash(key: str) -> int:
    """``abs(javaHash(key))`` as the index stores it (0 when abs overflows)."""
    return _abs_hash(java_hash(key))


#: Java's hash of an ASCII string is ``sum(c_i * 31^(n-1-i))``. Writing each byte as ``31 * hi + lo``
#: (``hi`` <= 8, ``lo`` < 31) turns both halves into base-31 numerals that ``int(text, 31)`` evaluates in C: the
#: hash is ``int(hi digits, 31) * 31 + int(lo digits, 31)``, about half the cost of a per-byte ``sum(map(mul))``.
_DIGITS = b"0123456789abcdefghijklmnopqrstu"
_HI = bytes(_DIGITS[b // 31] for b in range(256))
_LO = bytes(_DIGITS[b % 31] for b in range(256))
#: A client unique id is 32 hex characters: 20 per producer process (ip, pid, random), 8 of time (ms in the
#: month) and a 4-character counter. Messages sent within the same millisecond share the first 28, whose share
#: of the hash is cached; only the last 4 are hashed per message.
_UNIQ_LEN = 32
_UNIQ_STABLE = 28
_UNIQ_CACHE_MAX = 4096
_POW31_4 = 31**4
_FIRST = itemgetter(0)
_HEAD = itemgetter(slice(None, _UNIQ_STABLE))
_MAX_PREFIX_LEN = 128
#: Smallest batch worked column by column: below it the set-up costs more than the per-record loop saves (a
#: single send is the common small batch).
_COLUMNS_FROM = 8


def _tail_shares(joined: bytes) -> Iterator[int]:
    """``sum(c_i * 31^(3-i))`` of the last 4 bytes of each unique key, from the keys joined (each of
    :data:`_UNIQ_LEN` bytes), column by column: a strided slice per column, ``map`` in C."""
    n = _UNIQ_LEN
    return map(add, map(add, map(mul, joined[n - 4 :: n], repeat(29791)), map(mul, joined[n - 3 :: n], repeat(961))),
               map(add, map(mul, joined[n - 2 :: n], repeat(31)), joined[n - 1 :: n]))


class _TopicHasher:
    """Hashes ``topic#key`` from bytes, reusing the hash of the ``topic#`` prefix (keys are mostly ASCII)."""

    __slots__ = ("_prefix_by_len", "_prefixes", "_uniq_heads", "prefix_hash", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.prefix_hash = java_hash(topic + "#")
        self._uniq_heads: dict[bytes, int] = {}
        #: ``prefix_hash * 31^n`` mod 2^32 for a key of n bytes.
        self._prefix_by_len: dict[int, int] = {}
        self._prefixes = [(self.prefix_hash * pow(31, n, 1 << 32)) & _MASK for n in range(_MAX_PREFIX_LEN + 1)]

    def _prefix(self, n: int) -> int:
        p = self._prefix_by_len.get(n)
        if p is None:
            p = (self.prefix_hash * pow(31, n, 1 << 32)) & _MASK
            if len(self._prefix_by_len) < 1024:
                self._prefix_by_len[n] = p
        return p

    def uniq(self, key: bytes) -> int:
        """:meth:`__call__` for a unique id, with the share of its first 28 characters cached."""
        if len(key) != _UNIQ_LEN or not key.isascii():
            return self(key)
        head = key[:_UNIQ_STABLE]
        part = self._uniq_heads.get(head)
        if part is None:
            if len(self._uniq_heads) >= _UNIQ_CACHE_MAX:
                self._uniq_heads.clear()
            part = self._uniq_heads[head] = (
                (self._prefix(_UNIQ_STABLE) + int(head.translate(_HI), 31) * 31 + int(head.translate(_LO), 31))
                * _POW31_4) & _MASK
        a, b, c, d = key[_UNIQ_STABLE:]
        return _abs_hash(part + a * 29791 + b * 961 + c * 31 + d)

    def _hash_columns(self, uniqs: list[bytes], keys: list[bytes], phys: list[int], out_h: list[int],
                      out_phy: list[int]) -> int:
        """:meth:`hashes` of a uniform batch, column by column; the entries per record (1 or 2), 0 (nothing
        added) when it is not one."""
        n = len(uniqs)
        with_uniq, with_keys = all(uniqs), all(keys)
        if with_uniq and with_keys:
            uh = self._uniq_batch(uniqs)
            kh = self._key_batch(keys) if uh is not None else None
            if uh is None or kh is None:
                return 0
            hs: list[int] = [0] * (2 * n)
            hs[0::2] = uh
            hs[1::2] = kh
            out_h.extend(hs)
            ps: list[int] = [0] * (2 * n)
            ps[0::2] = phys
            ps[1::2] = phys
            out_phy.extend(ps)
            return 2
        if (with_uniq and not any(keys)) or (with_keys and not any(uniqs)):
            col = self._uniq_batch(uniqs) if with_uniq else self._key_batch(keys)
            if col is None:
                return 0
            out_h.extend(col)
            out_phy.extend(phys)
            return 1
        return 0

    def __call__(self, key: bytes) -> int:
        if not key.isascii():
            return key_hash(f"{self.topic}#{key.decode('utf-8', 'replace')}")
        return _abs_hash(self._prefix(len(key)) + int(key.translate(_HI), 31) * 31 + int(key.translate(_LO), 31))

    def _uniq_batch(self, uniqs: list[bytes]) -> list[int] | None:
        """Index hashes of a batch of SDK unique ids, or None when one is not such an id."""
        joined = b"".join(uniqs)
        if set(map(len, uniqs)) != {_UNIQ_LEN} or not joined.isascii():
            return None
        heads = self._uniq_heads
        parts = list(map(heads.get, map(_HEAD, uniqs)))
        if None in parts:
            # A batch's ids mostly share one new head (the SDK's ids of one instant): hash it once, then look it up.
            for i, part in enumerate(parts):
                if part is None:
                    head = _HEAD(uniqs[i])
                    part = heads.get(head)
                    if part is None:
                        self.uniq(uniqs[i])  # fills the cache
                        part = heads[head]
                    parts[i] = part
        # abs(int32) of h mod 2^32, 0 for Integer.MIN_VALUE, as in _abs_hash
        return [h if h <= INT_MAX else (_TWO32 - h) & INT_MAX
                for h in map(and_, map(add, parts, _tail_shares(joined)), repeat(_MASK))]

    def _key_batch(self, keys: list[bytes]) -> list[int] | None:
        """Index hashes of single ASCII keys, or None when one is not."""
        joined = b"".join(keys)
        if b" " in joined or not joined.isascii() or max(map(len, keys)) > _MAX_PREFIX_LEN:
            return None
        pre, hi, lo = self._prefixes, _HI, _LO
        return [h if (h := (pre[len(k)] + int(k.translate(hi), 31) * 31 + int(k.translate(lo), 31)) & _MASK) <= INT_MAX
                else (_TWO32 - h) & INT_MAX for k in keys]

    def hashes(self, uniqs: list[bytes], keys: list[bytes], phys: list[int], out_h: list[int],
               out_phy: list[int], out_at: list[int] | None = None) -> None:
        """Index entries of a batch of records, in record order (unique key first, then each key): their hashes
        to ``out_h``, their record offsets to ``out_phy`` and, with ``out_at``, the record's position in the
        batch. A batch where every record has an SDK unique id and one ASCII key (or only one of the two) is
        hashed column by column; anything else record by record."""
        if not out_h and len(uniqs) >= _COLUMNS_FROM:
            per_record = self._hash_columns(uniqs, keys, phys, out_h, out_phy)
            if per_record:
                if out_at is not None:
                    at = list(range(len(uniqs)))
                    if per_record == 2:
                        both = [0] * (2 * len(at))
                        both[0::2] = both[1::2] = at
                        at = both
                    out_at.extend(at)
                return
        heads = self._uniq_heads
        hi, lo = _HI, _LO
        prefix = self._prefix
        add_h, add_p = out_h.append, out_phy.append
        add_at = out_at.append if out_at is not None else None
        for i, uniq in enumerate(uniqs):
            k = keys[i]
            if not uniq and not k:
                continue
            phy = phys[i]
            if uniq:
                head = uniq[:_UNIQ_STABLE]
                part = heads.get(head) if len(uniq) == _UNIQ_LEN else None
                if part is not None:
                    a, b, c, d = uniq[_UNIQ_STABLE:]
                    h = (part + a * 29791 + b * 961 + c * 31 + d) & _MASK
                    add_h(h if h <= INT_MAX else (_TWO32 - h) & INT_MAX)  # abs(int32), 0 for Integer.MIN_VALUE
                else:
                    add_h(self.uniq(uniq))
                add_p(phy)
                if add_at is not None:
                    add_at(i)
            if k:
                for key in (k.split(b" ") if b" " in k else (k,)):
                    if not key:
                        continue
                    if key.isascii():
                        h = (prefix(len(key)) + int(key.translate(hi), 31) * 31 + int(key.translate(lo), 31)) & _MASK
                        add_h(h if h <= INT_MAX else (_TWO32 - h) & INT_MAX)
                    else:
                        add_h(self(key))
                    add_p(phy)
                    if add_at is not None:
                        add_at(i)


_ITEM_STRUCTS: dict[int, struct.Struct] = {}
#: Items written by one call: its struct stays cached, and its slots rarely collide (the fast path).
_ITEMS_PER_WRITE = 512


def _items_struct(n: int) -> struct.Struct:
    """A struct of ``n`` consecutive items (cached: batches repeat their sizes; one-off sizes are not kept)."""
    st = _ITEM_STRUCTS.get(n)
    if st is None:
        st = struct.Struct(">" + "iqii" * n)
        if n <= 1024 and len(_ITEM_STRUCTS) < 256:
            _ITEM_STRUCTS[n] = st
    return st


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

    def put_keys(self, hashes: list[int], phys: list[int], times: list[int] | int, start: int) -> int:
        """Add the keys ``hashes[start:]`` (record offsets ``phys``, store times ``times`` or one time for all)
        as one put per key would, with one write of their items and one per touched slot; returns
        how many were added: at most :data:`_ITEMS_PER_WRITE`, fewer when the file fills up."""
        count0 = count = self.index_count
        take = min(len(hashes) - start, self.index_num - count, _ITEMS_PER_WRITE)
        if take <= 0:
            return 0
        mf = self.mf
        mm = mf.mm
        end = start + take
        hs = hashes[start:end] if start or end != len(hashes) else hashes
        ps = phys[start:end] if start or end != len(phys) else phys
        slot_num = self.slot_num
        # A slot holds the newest item of its chain; an item links to the one it replaced there (``prev``, 0:
        # none). A value past the items before this batch is garbage (a crash between item and header): none.
        hooked = mf.io.hooked
        where = [40 + 4 * (h % slot_num) for h in hs]
        if not hooked and take >= _COLUMNS_FROM and len(set(where)) == take:
            # The usual batch (keys << slots): every slot once, read and written column by column, in C.
            prevs = list(map(_FIRST, map(SLOT.unpack_from, repeat(mm), where)))
            if min(prevs) < 0 or max(prevs) >= count0:
                prevs = [p if 0 < p < count0 else 0 for p in prevs]
            new_slots = prevs.count(0)
            touched: dict[int, int] | None = None
            count = count0 + take
        else:
            touched = {}
            prevs = []
            add_prev = prevs.append
            new_slots = 0
            for at in where:
                prev = touched.get(at)
                if prev is None:
                    prev = SLOT.unpack_from(mm, at)[0]
                    if prev <= 0 or prev >= count0:
                        prev = 0
                        new_slots += 1
                touched[at] = count
                add_prev(prev)
                count += 1
        # Time offsets from the file's begin time; the first item of a new file is measured from the previous
        # file's end (its begin time is set by that item).
        begin = self.begin_ts
        first_ts = times if isinstance(times, int) else times[start]
        diffs: list[int]
        if isinstance(times, int):
            diff = 0 if begin <= 0 else min(max((times - begin) // 1000, 0), INT_MAX)
            # After a new file's first item its begin time is ``times`` itself: every later diff is 0.
            diffs = [diff] + [0] * (take - 1) if count0 <= 1 else [diff] * take
        else:
            ts = times[start:end]
            diffs = [0 if begin <= 0 else min(max((first_ts - begin) // 1000, 0), INT_MAX)]
            if count0 <= 1:
                begin = first_ts
            rest = ts[1:]
            if not rest:
                pass
            elif begin <= 0:
                diffs += [0] * len(rest)
            elif min(rest) >= begin and max(rest) - begin < INT_MAX * 1000:  # the usual: no clamping
                diffs += [(t - begin) // 1000 for t in rest]
            else:
                diffs += [min(max((t - begin) // 1000, 0), INT_MAX) for t in rest]
        args: list[int] = [0] * (4 * take)
        args[0::4] = hs
        args[1::4] = ps
        args[2::4] = diffs
        args[3::4] = prevs
        item_pos = self._items_at + count0 * 20
        packer = _items_struct(take)
        # Items before the slots that point at them: a concurrent query never follows a slot to an unwritten item.
        if touched is None:
            packer.pack_into(mm, item_pos, *args)
            deque(map(SLOT.pack_into, repeat(mm), where, range(count0, count0 + take)), maxlen=0)
        elif hooked:
            mf.write(item_pos, packer.pack(*args))
            for at, value in touched.items():
                mf.write(at, SLOT.pack(value))
        else:
            packer.pack_into(mm, item_pos, *args)
            for at, value in touched.items():
                SLOT.pack_into(mm, at, value)
        if count0 <= 1:
            self.begin_phy = ps[0]
            self.begin_ts = first_ts
        self.slot_count += new_slots
        self.index_count = count
        self.end_phy = ps[-1]
        self.end_ts = times if isinstance(times, int) else times[end - 1]
        return take

    def put_key(self, h: int, phy: int, store_ts: int) -> bool:
        """Add one key as :meth:`put_keys` would (False when the file is full): a single send's one or two
        index entries, without the batch's column set-up (which cost it about 8k instructions per key)."""
        count = self.index_count
        if count >= self.index_num:
            return False
        mf = self.mf
        mm = mf.mm
        slot_pos = 40 + (h % self.slot_num) * 4
        prev = SLOT.unpack_from(mm, slot_pos)[0]
        if prev <= 0 or prev >= count:
            prev = 0
            self.slot_count += 1
        begin = self.begin_ts
        diff = 0 if begin <= 0 else min(max((store_ts - begin) // 1000, 0), INT_MAX)
        item_pos = self._items_at + count * 20
        # The item before the slot that points at it (as in put_keys).
        if mf.io.hooked:
            mf.write(item_pos, ITEM.pack(h, phy, diff, prev))
            mf.write(slot_pos, SLOT.pack(count))
        else:
            ITEM.pack_into(mm, item_pos, h, phy, diff, prev)
            SLOT.pack_into(mm, slot_pos, count)
        if count <= 1:
            self.begin_phy = phy
            self.begin_ts = store_ts
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

    def hasher(self, topic: bytes) -> _TopicHasher:
        hasher = self._hashers.get(topic)
        if hasher is None:
            if len(self._hashers) >= 1024:  # each holds a few KiB of cached hash shares
                self._hashers.clear()
            hasher = self._hashers[topic] = _TopicHasher(topic.decode("utf-8", "replace"))
        return hasher

    def build(self, topic: bytes, phy: int, store_ts: int, uniq: bytes, keys: bytes) -> None:
        """Index one record's unique key and keys (skipped when already indexed)."""
        self.build_batch(topic, [phy], store_ts, [uniq], [keys])

    def build_batch(self, topic: bytes, phys: list[int], times: list[int] | int, uniqs: list[bytes],
                    keys: list[bytes]) -> None:
        """Index the unique keys and keys of records of one topic, in log order (``times``: each record's store
        time, or one for all). Records below the index's end are skipped (already indexed: a replay)."""
        files = self.files
        f = files[-1] if files else None
        if len(phys) == 1 and isinstance(times, int):  # a single send: its one or two entries put one by one
            self._build_one(f, topic, phys[0], times, uniqs[0], keys[0])
            return
        if f is not None and phys[0] < f.end_phy:
            keep = [i for i, phy in enumerate(phys) if phy >= f.end_phy]
            if not keep:
                return
            phys = [phys[i] for i in keep]
            uniqs = [uniqs[i] for i in keep]
            keys = [keys[i] for i in keep]
            if not isinstance(times, int):
                times = [times[i] for i in keep]
        hs: list[int] = []
        ps: list[int] = []
        if isinstance(times, int):
            self.hasher(topic).hashes(uniqs, keys, phys, hs, ps)
            item_times: list[int] | int = times
        else:
            at: list[int] = []
            self.hasher(topic).hashes(uniqs, keys, phys, hs, ps, at)
            item_times = [times[i] for i in at]
        if not hs:
            return
        done = 0
        while done < len(hs):
            n = f.put_keys(hs, ps, item_times, done) if f is not None else 0
            if n == 0:
                f = self._new_file()
                n = f.put_keys(hs, ps, item_times, done)
                if n == 0:
                    raise RuntimeError(f"index file {f.mf.path} takes no item (maxIndexNum {self.index_num})")
            done += n
        self._dirty = True

    def _build_one(self, f: IndexFile | None, topic: bytes, phy: int, store_ts: int, uniq: bytes,
                   keys: bytes) -> None:
        """:meth:`build_batch` of one record."""
        if (f is not None and phy < f.end_phy) or not (uniq or keys):
            return
        hasher = self.hasher(topic)
        hs = [hasher.uniq(uniq)] if uniq else []
        if keys:
            for k in keys.split(b" "):
                if k:
                    hs.append(hasher(k))
        for h in hs:
            if f is None or not f.put_key(h, phy, store_ts):
                f = self._new_file()
                if not f.put_key(h, phy, store_ts):
                    raise RuntimeError(f"index file {f.mf.path} takes no item (maxIndexNum {self.index_num})")
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
