"""The duplicate window of idempotent sends (issue 38): for each unique key a master stored recently, where its
first copy is, so that a send of the same key within the window is answered with that copy's result instead of
being stored again. Pure state: no I/O, the clock injected, table-tested; the send processor asks it once per
batch and tells it every new append, and the controller fills it from the log whenever the broker becomes a
master (:meth:`DuplicateWindow.rebuild`).

Structure. Per topic, a dict from the key (the ``UNIQ_KEY`` bytes as the send carried them) to its
:class:`FirstWrite`: one append, or one run of records read back from the log, which holds its keys in order and
where they went (queue, first queue offset, each commit-log offset, the end of the append for the durability wait,
DLedger's commit future). A deque of the FirstWrites in store order drives expiry: a FirstWrite leaves, with all
its keys, once its store time is ``duplicateWindowMs`` old, or earlier when the window holds more than
``duplicateWindowMaxKeys`` keys (the oldest first; :attr:`DuplicateWindow.evicted_early` counts those keys, and an
operator who sees it move raises the bound or accepts a shorter window).

The data path. :meth:`DuplicateWindow.lookup` answers a batch with no known key and no key twice in it with None,
in C (a dict-keys ``isdisjoint`` and, for more than one key, a set): the common case costs one such test and one
``dict.update`` at :meth:`add`. Otherwise it returns :class:`Duplicates`, one verdict per message (the first copy's
place, an earlier message of the same batch, or new), and :meth:`Duplicates.placements` gives each message's queue,
queue offset and commit-log offset once the new ones are stored.

Invariant: a key maps to at most one FirstWrite, and a FirstWrite's ``keys`` map to it -- but for a key stored
again after its FirstWrite expired behind a younger one (a clock that stepped back), which maps to its new copy:
such a FirstWrite is noted, and only its eviction looks at what each key maps to. Every other eviction drops its
keys in C.

Memory, per key held (measured with ``tracemalloc``): the key's bytes object (72 bytes for the SDK's 32
characters), its dict slot and its share of its FirstWrite -- about 155 bytes in all for keys sent in batches of
64, about 340 for single sends (one FirstWrite each), a caller's longer keys their extra length. The default bound
of 500,000 keys thus holds 80 to 170 MB at most, and only while idempotent sends arrive.

CPU: the common case costs a batch two hash probes per key into a table of up to ``duplicateWindowMaxKeys`` keys
(the lookup and the insert; cache misses once the table is large) and one more at eviction.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import NamedTuple

from broker.store.api import StoredKey

__all__ = ["DEFAULT_MAX_KEYS", "DEFAULT_WINDOW_MS", "DuplicateWindow", "Duplicates", "FirstWrite", "StoredKey"]

#: ``duplicateWindowMs``: NATS JetStream's default duplicate window.
DEFAULT_WINDOW_MS = 120_000
#: ``duplicateWindowMaxKeys``.
DEFAULT_MAX_KEYS = 500_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class FirstWrite(NamedTuple):
    """The first copy of some keys: one append, or one run of records found in the log. A tuple of plain values
    (in the classic mode): the garbage collector stops tracking it, so a window of a million keys adds nothing to
    a full collection but the traversal of its dict."""

    keys: tuple[bytes, ...]
    """The keys of its records, in order (one the window took back after it expired is ``b""``)."""
    queue_id: int
    """The queue the send's answer named (for a delayed, timed or transactional message, the queue it goes to in
    the end, as the answer said)."""
    queue_offset: int
    """Queue offset of the first key's record; key ``i``'s is ``queue_offset + i``, as the answer gave it."""
    offsets: tuple[int, ...]
    """Commit-log offset of each key's record."""
    end: int
    """Commit-log end of the append (a duplicate's durability wait covers it)."""
    store_ts: int
    """Store time of the append, ms."""
    store_host: bytes
    """The packed store host of the records (offset msgIds)."""
    topic: str
    """The topic the window holds its keys under."""
    committed: asyncio.Future[tuple[int, int]] | None = None
    """DLedger: the entry's commit future (None when it is known committed: read back from a caught-up log)."""
    entry: tuple[int, int] | None = None
    """DLedger: ``(index, term)`` of the entry (a failed commit future is checked against the log)."""


#: A message's verdict in :class:`Duplicates`: ``(first write, position of the key in it)`` for a key stored
#: before, the position of an earlier message of the same batch with the same key, or None for a new message.
Verdict = tuple[FirstWrite, int] | int | None


class Duplicates:
    """What :meth:`DuplicateWindow.lookup` found in a batch that is not all new.

    Attributes:
        verdicts: one per message (see :data:`Verdict`).
        new: positions of the messages to store, in order.
        hits: messages answered from an earlier copy (stored before, or earlier in the batch).
    """

    __slots__ = ("hits", "new", "verdicts")

    def __init__(self, verdicts: list[Verdict]) -> None:
        self.verdicts = verdicts
        self.new = [i for i, v in enumerate(verdicts) if v is None]
        self.hits = len(verdicts) - len(self.new)

    def latest(self) -> FirstWrite | None:
        """The FirstWrite with the largest end among the keys stored before (what a batch of duplicates only
        waits for: its end covers the others in the classic mode, its commit the others in DLedger's)."""
        best: FirstWrite | None = None
        for v in self.verdicts:
            if type(v) is tuple and (best is None or v[0].end > best.end):
                best = v[0]
        return best

    def placements(self, fresh: FirstWrite | None) -> list[tuple[int, int, int]]:
        """``(queue id, queue offset, commit-log offset)`` of every message, in order; ``fresh`` is the append
        of the new messages (None when there are none)."""
        out: list[tuple[int, int, int]] = []
        j = 0
        for v in self.verdicts:
            if v is None:
                assert fresh is not None, "new messages but no append"
                out.append((fresh.queue_id, fresh.queue_offset + j, fresh.offsets[j]))
                j += 1
            elif type(v) is int:
                out.append(out[v])
            else:
                fw, at = v  # type: ignore[misc]
                out.append((fw.queue_id, fw.queue_offset + at, fw.offsets[at]))
        return out


class DuplicateWindow:
    """The keys stored within the last ``window_ms``, at most ``max_keys`` of them (module docstring).

    Args:
        window_ms: ``duplicateWindowMs`` (> 0).
        max_keys: ``duplicateWindowMaxKeys`` (> 0).
        clock_ms: wall clock in ms (store times are the broker's wall clock).
    """

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS, max_keys: int = DEFAULT_MAX_KEYS, *,
                 clock_ms: Callable[[], int] = _wall_ms) -> None:
        if window_ms <= 0 or max_keys <= 0:
            raise ValueError(f"window_ms and max_keys must be > 0, got {window_ms} and {max_keys}")
        self.window_ms = window_ms
        self.max_keys = max_keys
        self._clock = clock_ms
        self._tables: dict[str, dict[bytes, FirstWrite]] = {}
        self._order: collections.deque[FirstWrite] = collections.deque()
        self._taken_back: set[int] = set()
        """``id()`` of the FirstWrites in :attr:`_order` that a key was taken back from (:meth:`forget`)."""
        self.size = 0
        """Keys held."""
        self.duplicates = 0
        """Messages answered from an earlier copy since start."""
        self.evicted_early = 0
        """Keys dropped by ``max_keys`` before their time was up."""
        self.rebuilt = 0
        """Keys found in the log by the last :meth:`rebuild`."""

    def __len__(self) -> int:
        return self.size

    # -- the data path --------------------------------------------------------------------------------------
    def lookup(self, topic: str, keys: Sequence[bytes]) -> Duplicates | None:
        """None when every key of the batch is new and none repeats in it; else the verdict of each message.
        An empty key (a message without ``UNIQ_KEY``) is always new."""
        table = self._tables.get(topic)
        if len(keys) == 1:  # a single send: one probe, no view or set
            if table is None or keys[0] not in table:
                return None
        elif (table is None or table.keys().isdisjoint(keys)) and len(set(keys)) == len(keys):
            return None
        now = self._clock()
        self._expire(now)
        table = self._tables.get(topic)
        verdicts: list[Verdict] = []
        seen: dict[bytes, int] = {}
        cutoff = now - self.window_ms
        for i, k in enumerate(keys):
            fw = table.get(k) if table is not None and k else None
            if fw is not None and fw.store_ts <= cutoff:  # expired behind a younger one (the clock stepped back)
                self.forget(fw, k)
                fw = None
            if fw is not None:
                verdicts.append((fw, fw.keys.index(k)))
            elif k in seen:
                verdicts.append(seen[k])
            else:
                if k:
                    seen[k] = i
                verdicts.append(None)
        found = Duplicates(verdicts)
        self.duplicates += found.hits
        return found

    def add(self, first: FirstWrite) -> None:
        """``first`` stored its ``keys``, none of which the window holds: from now on they map to it. Expires what
        the window no longer holds, with ``first``'s store time as the time."""
        table = self._tables.get(first.topic)
        if table is None:
            table = self._tables[first.topic] = {}
        keys = first.keys
        if len(keys) == 1:
            if keys[0]:
                table[keys[0]] = first
        else:
            table.update(zip(keys, repeat(first)))
            table.pop(b"", None)  # a message without a key is never a duplicate
        self._order.append(first)
        self.size += len(first.keys)
        self._expire(first.store_ts)

    def _expire(self, now_ms: int) -> None:
        order = self._order
        cutoff = now_ms - self.window_ms
        while order and (order[0].store_ts <= cutoff or self.size > self.max_keys):
            fw = order.popleft()
            self.size -= len(fw.keys)
            if fw.store_ts > cutoff:
                self.evicted_early += len(fw.keys)
            table = self._tables.get(fw.topic)
            if table is None:
                continue
            if self._taken_back and id(fw) in self._taken_back:  # a key of it maps to a newer copy now
                self._taken_back.discard(id(fw))
                for k in fw.keys:
                    if table.get(k) is fw:
                        del table[k]
            elif len(fw.keys) == 1:
                table.pop(fw.keys[0], None)
            else:
                collections.deque(map(table.pop, fw.keys, repeat(None)), 0)  # in C: no loop per key here
        # A clock that stepped back leaves an older FirstWrite behind a younger one: the front decides.

    def forget(self, fw: FirstWrite, key: bytes) -> None:
        """Take ``key`` back from ``fw`` (expired behind a younger one): it is stored again and maps to its new copy,
        which ``fw``'s eviction must leave in place."""
        table = self._tables.get(fw.topic)
        if table is not None and table.get(key) is fw:
            del table[key]
        self._taken_back.add(id(fw))

    def clear(self) -> None:
        """Forget every key (the broker stopped being a master)."""
        self._tables.clear()
        self._order.clear()
        self._taken_back.clear()
        self.size = 0

    # -- filling from the log -------------------------------------------------------------------------------
    def since_ms(self) -> int:
        """The oldest store time a :meth:`rebuild` needs from the log."""
        return self._clock() - self.window_ms

    def rebuild(self, records: Iterable[StoredKey]) -> int:
        """Forget every key, then hold those of ``records`` (idempotent records read from the log, oldest first)
        that are within the window. Consecutive records of one append become one FirstWrite (same topic, queue,
        store time and host, adjacent in the log and in their queue); a key found twice keeps its first record.
        Returns the keys held."""
        self.clear()
        cutoff = self.since_ms()
        run: list[StoredKey] = []
        held: set[bytes] = set()
        for r in records:
            if r.store_ts <= cutoff or not r.key:
                continue
            if r.key in held:
                self._flush_run(run)
                continue
            if run:
                last = run[-1]
                if not (r.topic == last.topic and r.queue_id == last.queue_id and r.store_ts == last.store_ts
                        and r.store_host == last.store_host and r.queue_offset == last.queue_offset + 1
                        and r.offset == last.offset + last.size):
                    self._flush_run(run)
            run.append(r)
            held.add(r.key)
        self._flush_run(run)
        self.rebuilt = self.size
        return self.size

    def _flush_run(self, run: list[StoredKey]) -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        self.add(FirstWrite(tuple(r.key for r in run), first.queue_id, first.queue_offset,
                            tuple(r.offset for r in run), last.offset + last.size, first.store_ts, first.store_host,
                            first.topic))
        run.clear()
