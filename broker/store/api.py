"""The message store's interface: what the broker, the HA service and the tests may call.

One interface, implemented by the file store (:mod:`broker.store.file_store`) and, for tests, by a memory
store. The store is synchronous and does no networking; it never calls asyncio. Waiting for durability
(SYNC_FLUSH group commit) is exposed as ``concurrent.futures.Future`` so that an event loop can await it with
``asyncio.wrap_future`` and a plain thread can call ``.result()``.

Threads: all mutating calls (``append_batch``, ``put_message``, ``append_to_commitlog``, ``dispatch_available``,
``truncate``) come from one thread at a time (the broker's event loop, or the test's thread). Read calls may
come from that same thread. The flush services run in the store's own threads and synchronise with it
internally; dispatch runs only when the owner calls ``dispatch_available``.

Events: every append (of any kind: a batch, a server-built message, replicated bytes) publishes one *append
event*: each append listener is called once, synchronously, on the appending thread, with the new end of the
commit log. The broker subscribes replication, dispatch and its put rate to it. Each dispatch that adds units to
a queue publishes a *dispatch event* to the dispatch listeners (long polling, delayed delivery).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import NamedTuple, Protocol

import attrs

from broker.store.retention import StoreCleaning
from common.codec import BatchItem, read_record_prefix

__all__ = [
    "AppendResult",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageStatus",
    "QueryResult",
    "StoreCorruptError",
    "StoreError",
    "StoredKey",
]


class StoreError(Exception):
    """A store failure that is not the caller's fault (disk full, I/O error); the message says which file."""


class StoreCorruptError(StoreError):
    """Recovery found a corrupt record in the middle of the commit log (file and offset in the message)."""


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@attrs.frozen
class AppendResult:
    """Outcome of an append; on PUT_OK the records are in the commit log (not necessarily flushed)."""

    status: PutMessageStatus
    """PUT_OK, or why nothing was written."""
    remark: str = ""
    """For a failure: what was wrong (names the topic, queue, file or limit)."""
    wrote_offset: int = -1
    """Physical offset of the first record."""
    wrote_bytes: int = 0
    """Total bytes of the records (the end offset is ``wrote_offset + wrote_bytes``)."""
    queue_offset: int = -1
    """Logical offset of the first message in its consume queue."""
    msg_count: int = 0
    """Messages written."""
    store_timestamp: int = 0
    """Store time given to every record of this append."""
    physical_offsets: tuple[int, ...] = ()
    """Physical offset of each record."""
    committed: asyncio.Future[tuple[int, int]] | None = attrs.field(default=None, eq=False, repr=False)
    """DLedger mode: completes once a quorum of the group stores the entry (fails with the reason it cannot);
    the broker's durability wait awaits it. None in the classic mode."""
    entry: tuple[int, int] | None = None
    """DLedger mode: ``(index, term)`` of the entry. None in the classic mode."""

    @property
    def end_offset(self) -> int:
        return self.wrote_offset + self.wrote_bytes


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.frozen
class GetMessageResult:
    """Outcome of ``get_message`` (docs/BEHAVIOUR.md 3.1)."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    data: bytes = b""
    """The found records back to back, in queue order: a pull answer sends it as it is, and :attr:`records`
    splits it."""
    queue_offsets: list[int] = attrs.field(factory=list)
    """Logical offset of each found record."""
    suggest_pulling_from_slave: bool = False
    """``diff > memory`` with ``memory = min(RAM, memory cgroup limit) * accessMessageInMemoryMaxRatio / 100``
    (scan branch only; :mod:`broker.store.read_memory`)."""

    @property
    def msg_count(self) -> int:
        return len(self.queue_offsets)

    @property
    def total_size(self) -> int:
        return len(self.data)

    @property
    def records(self) -> list[bytes]:
        """Each found record's bytes (a copy), in queue order, for callers that handle records one by one. A
        stored record starts with its TOTALSIZE, which equals its consume-queue unit's size."""
        data = self.data
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            size = read_record_prefix(data, pos)[0]
            if not 0 < size <= n - pos:
                raise StoreCorruptError(f"a read record's TOTALSIZE {size} at byte {pos} of {n} read bytes "
                                        "disagrees with its consume-queue unit")
            out.append(data[pos : pos + size])
            pos += size
        return out


@attrs.frozen
class QueryResult:
    """Records found by a key / unique-key lookup."""

    records: list[bytes]
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0


class StoredKey(NamedTuple):
    """A record stored through the idempotent path, as :meth:`MessageStore.idempotent_keys` reads it back (what the
    duplicate window needs, :mod:`broker.dedup`)."""

    topic: str
    """The topic the send named (``REAL_TOPIC`` of a record the broker parked in a system topic: a delayed, timed
    or transactional message)."""
    queue_id: int
    """The queue the send's answer named (``REAL_QID`` of a parked record)."""
    queue_offset: int
    """The record's own queue offset (what the send's answer gave)."""
    offset: int
    """Its commit-log offset."""
    size: int
    """Its size."""
    store_ts: int
    """Its store time, ms."""
    key: bytes
    """Its ``UNIQ_KEY``, as the send carried it."""
    store_host: bytes
    """Its packed store host."""


#: ``(topic, queue_id, tags_code_or_none) -> bool``: consume-queue filter for ``get_message``.
TagFilter = Callable[[int], bool]
#: ``record -> bool``: a filter on a stored record (an SQL92 subscription reads its properties), applied after
#: the tag filter to the records a read would return; None costs nothing.
RecordFilter = Callable[[bytes], bool]


class MessageStore(Protocol):
    """What every store implements. Offsets: *physical* = commit-log byte offset; *queue* = logical index."""

    # lifecycle -------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Open files, recover (normal or abnormal, docs/BEHAVIOUR.md 7.6), create the abort file.

        Raises:
            StoreCorruptError: a corrupt record mid-log and ``truncate_corrupt`` was not set.
        """

    def start(self) -> None:
        """Start the background flush services."""

    def shutdown(self) -> None:
        """Stop services, dispatch and flush everything, delete the abort file. Idempotent."""

    # writes ---------------------------------------------------------------------------------------------
    def append_batch(
        self,
        topic: str,
        queue_id: int,
        items: Sequence[BatchItem],
        *,
        born_host: bytes,
        reconsume_times: int = 0,
    ) -> AppendResult:
        """Append messages of one topic/queue contiguously, all or nothing; assign queue offsets.

        Validates first (topic name and length, properties size, ``maxMessageSize``, writeable store, role not
        SLAVE) and returns a non-OK status with a remark instead of writing. Applies the delay rewrite for
        messages with a ``DELAY`` property (to ``SCHEDULE_TOPIC_XXXX``, queue ``level-1``, ``REAL_TOPIC`` /
        ``REAL_QID`` properties). Does not wait for flush or replication.
        """

    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: dict[str, str],
        *,
        born_host: bytes,
        born_timestamp: int,
        flag: int = 0,
        sys_flag: int = 0,
        reconsume_times: int = 0,
    ) -> AppendResult:
        """Append one message built server-side (delay redelivery, send-back); same rules as append_batch."""

    def flush_future(self, end_offset: int) -> Future[bool]:
        """A future set to True once the commit log is flushed to ``end_offset``, False at ``syncFlushTimeout``.

        Under ASYNC_FLUSH the future is already done (True). Concurrent callers share flushes (group commit).
        """

    def append_to_commitlog(self, physical_offset: int, data: bytes | memoryview) -> None:
        """Slave side of HA: write replicated bytes at ``physical_offset`` (must equal ``max_physical_offset``
        unless the store is empty), creating files as needed, then wake the dispatcher.

        Raises:
            ValueError: ``physical_offset`` does not continue the log.
            StoreError: the bytes cannot be written (disk full).
        """

    def restart_log_at(self, physical_offset: int) -> None:
        """Slave side of HA: drop the whole commit log and start it again, empty, at ``physical_offset`` (a file
        start past its end: the master's oldest file, after retention deleted the bytes between)."""

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        """Subscribe to the append event: ``callback(new_max_physical_offset)`` once after every append, on the
        appending thread (register before appends start; a failing listener is logged, the others still run)."""

    def add_dispatch_listener(self, callback: Callable[[str, int, int], None]) -> None:
        """Call ``callback(topic, queue_id, new_max_queue_offset)`` after records are dispatched to a queue."""

    # dispatch -------------------------------------------------------------------------------------------
    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        """Build consume-queue units and index entries for up to ``max_bytes`` of undispatched commit log.

        Works from the commit-log bytes alone (so it runs on slaves). Returns the bytes consumed; 0 when
        caught up. Non-blocking.
        """

    @property
    def dispatch_behind_bytes(self) -> int:
        """``max_physical_offset - reput offset``."""

    @property
    def dispatch_handover_bytes(self) -> int:
        """Of those, the bytes of appended batches handed over to dispatch (built from what the send path read,
        without parsing); 0 on a slave."""

    # reads ----------------------------------------------------------------------------------------------
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        max_bytes: int,
        tag_filter: TagFilter | None = None,
        record_filter: RecordFilter | None = None,
    ) -> GetMessageResult:
        """Read up to ``max_nums`` messages / ``max_bytes`` from a queue (statuses and next-offset rules of
        docs/BEHAVIOUR.md 3.1, including the slave rule that suppresses offset corrections). A record refused by
        ``record_filter`` is skipped like a tag mismatch: it counts toward no limit."""

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is >= ``timestamp_ms`` (max offset when none)."""

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """Store time of one message, -1 when absent."""

    def look_message_by_offset(self, physical_offset: int, size: int | None = None) -> bytes | None:
        """The record at a physical offset, or None."""

    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryResult:
        """Records whose index key ``topic#key`` matches (keys and unique keys), newest first, deduplicated."""

    def get_commitlog_data(self, physical_offset: int, max_bytes: int) -> memoryview | None:
        """Bytes of the commit log from ``physical_offset`` to the written end of the file holding it
        (at most ``max_bytes``); never crosses a file. None when nothing is there. Used by the HA master."""

    @property
    def memory_bytes_for_reads(self) -> int:
        """How far behind the log's end a read still counts as in memory (``suggestPullingFromSlave``)."""

    @property
    def max_physical_offset(self) -> int: ...

    @property
    def min_physical_offset(self) -> int: ...

    @property
    def flushed_physical_offset(self) -> int: ...

    @property
    def mapped_file_size_commitlog(self) -> int: ...

    def topic_queue_max_offsets(self) -> dict[tuple[str, int], int]:
        """Max queue offset of every (topic, queue) the store knows (for runtime info and metrics)."""

    @property
    def cleaner(self) -> StoreCleaning:
        """Retention and the disk guard (driven by the broker's :mod:`broker.retention_driver`)."""
        ...

    def truncate(self, physical_offset: int) -> None:
        """Drop commit-log bytes from ``physical_offset`` on and consume-queue units pointing there (HA / DLedger
        divergence repair)."""

    def idempotent_keys(self, since_ms: int) -> Iterator[StoredKey]:
        """The records of the log stored through the idempotent path (``SysFlag.IDEMPOTENT``) whose store time is
        after ``since_ms``, oldest first: every record appended, dispatched or not (DLedger: every entry of the
        member's log, committed or not). Reads from the first file (DLedger: entry) stored at ``since_ms`` or
        before; what the window needs when the broker becomes a master (:mod:`broker.dedup`)."""
        ...
