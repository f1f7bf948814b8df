"""The sink's data path: Arrow rows to send-batch bodies, and a bounded pipeline of ``POST /send`` requests.

Why not ``Producer.send_batch``: it takes ``Message`` objects, and building, validating and re-encoding one per
row cost more than the whole Spark side of a write (about 25 us per row, against a few for encoding the
send-batch item directly). This module keeps the SDK's rules and only drops the per-row objects:

* every row is checked like ``Message`` plus ``validate_message`` would (topic legal and not reserved, checked
  once per distinct topic; body present and non-empty; tags, keys and properties free of the ``\\x01``/``\\x02``
  separators; no reserved property names; properties within 32767 bytes; the stored record within
  ``maxMessageSize``), with the same error class (``MessageIllegalError``) naming the row;
* every message gets its own ``UNIQ_KEY`` (the msgId users see): from :class:`RowKeys` when the write is
  idempotent (deterministic from the write, the task's partition and the row's index, so a replayed task sends the
  same keys and the brokers' duplicate window answers them as duplicates), else from the SDK's
  :class:`UniqKeyGenerator`;
* items are laid out by ``common.codec``'s send-batch format, at most :data:`MAX_BATCH_MESSAGES`
  messages and about :data:`MAX_BATCH_BYTES` per request, one topic and queue per request;
* each request is one :meth:`client.lowlevel.BrokerClient.send_encoded`: the SDK's own queue choice (writable
  queues of groups with a master; the ``TBW102`` route when the topic does not exist yet, so brokers that
  auto-create topics still do; round robin for rows without a queue) and its retry loop (a failed request is
  retried whole on a queue of another broker group, ``retries`` times within ``sendTimeoutMs``, docs/BEHAVIOUR.md
  4.6); rows with an explicit queue get one attempt, as with the SDK.

Up to ``sendConcurrency`` requests are in flight per task; a write task returns only after every request was
answered, and any failure raises (Spark then fails or retries the task). Idempotent writes set
``SysFlag.IDEMPOTENT`` on every item and send each row without an explicit queue to the broker group its key
hashes to (:func:`client.lowlevel.group_for_key`), so a replay reaches the window that holds the first copy.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from client.errors import MessageIllegalError
from client.lowlevel import RawSendResult, TopicPublishInfo, group_for_key, validate_message
from common.codec import (
    BATCH_ITEM_HEAD,
    BATCH_MAGIC,
    DEFAULT_MAX_MESSAGE_SIZE,
    UniqKeyGenerator,
    body_crc,
    record_size,
)
from common.codes import SendStatus, SysFlag
from common.message import Message, MessageQueue
from common.properties import KEYS, MAX_PROPERTIES_BYTES, SYSTEM_KEYS, TAGS, UNIQ_KEY

log = logging.getLogger(__name__)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "Chunk",
    "ChunkBuilder",
    "ItemEncoder",
    "RowKeys",
    "SendClient",
    "Sender",
    "encode_columns",
]

#: Messages and (approximate) bytes per send request.
MAX_BATCH_MESSAGES = 512
MAX_BATCH_BYTES = 1024 * 1024
_U16 = 2


class SendClient(Protocol):
    """What the sender needs from a client (the pooled :class:`~spark_connector.transport.BrokerClient`)."""

    def publish_info(self, topic: str, *, refresh: bool = False) -> TopicPublishInfo: ...

    def send_encoded(self, topic: str, body: bytes, count: int, *, group: str, queue: MessageQueue | None = None,
                     timeout_s: float = 3.0, retries: int = 2, idempotent: bool = False,
                     pinned: str | None = None) -> RawSendResult: ...


class Chunk(NamedTuple):
    """One send request: items of one topic for one queue (None: the sender picks the queue, within ``group``
    when that is set)."""

    topic: str
    queue: MessageQueue | None
    body: bytes
    messages: int
    group: str | None = None


class RowKeys:
    """Deterministic ``UNIQ_KEY``s of one write task: ``<prefix><row index in hex>``.

    The prefix names the write and the task's partition (:func:`spark_connector.sink.task_row_keys`); the same
    rows replayed in the same order get the same keys.

    Args:
        prefix: printable, no white space, at most 110 characters (keys stay within 128).
        groups: the broker group of a key among a topic's groups (:func:`group_for_key` over its route).
    """

    def __init__(self, prefix: str, groups: Callable[[str, str], str | None]) -> None:
        if not prefix.isprintable() or any(c.isspace() for c in prefix) or len(prefix) > 110:
            raise ValueError(f"row key prefix {prefix!r} must be printable without white space, 110 chars at most")
        self.prefix = prefix
        self.groups = groups

    def key(self, row: int) -> str:
        """The key of the task's row ``row`` (counted over every batch of the task)."""
        return f"{self.prefix}{row:x}"


def _check_text(row: int, what: str, value: str) -> None:
    if "\x01" in value or "\x02" in value:
        raise MessageIllegalError(f"row {row}: {what} {value[:40]!r} holds a reserved separator (\\x01 or \\x02)")


class ItemEncoder:
    """Validates rows and encodes each as one send-batch item (see the module docstring for the rules).

    Args:
        max_message_size: limit on each message's stored record size.
        uniq: the ``UNIQ_KEY`` source (one per process) of rows without a key of their own.
        clock_ms: wall clock in ms for ``BORNTIMESTAMP``.
        idempotent: set ``SysFlag.IDEMPOTENT`` on every item (the brokers' duplicate window then checks its key).
    """

    def __init__(
        self,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        uniq: UniqKeyGenerator,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        idempotent: bool = False,
    ) -> None:
        self.max_message_size = max_message_size
        self.uniq = uniq
        self.clock_ms = clock_ms
        self.sys_flag = int(SysFlag.IDEMPOTENT) if idempotent else 0
        self._topics: dict[str, int] = {}

    def topic_len(self, row: int, topic: object) -> int:
        """UTF-8 length of a legal, non-reserved topic (checked once per distinct topic)."""
        if not isinstance(topic, str):
            raise MessageIllegalError(f"row {row}: topic is {'null' if topic is None else type(topic).__name__}"
                                      " and no topic option is set")
        n = self._topics.get(topic)
        if n is None:
            try:
                validate_message(Message(topic, b"-"), self.max_message_size)
            except MessageIllegalError as e:
                raise MessageIllegalError(f"row {row}: {e}") from None
            n = self._topics[topic] = len(topic.encode())
        return n

    def properties(self, row: int, tags: str | None, keys: str | None,
                   user: list[tuple[str, str]] | None, uniq_key: str | None = None) -> bytes:
        """The ``k\\x01v\\x02`` property bytes of one row, with ``uniq_key`` (a fresh one when None)."""
        parts: list[str] = []
        if user:
            for k, v in user:
                if not isinstance(k, str) or not k or not isinstance(v, str):
                    raise MessageIllegalError(f"row {row}: property {k!r}: names must be non-empty str, values str")
                if k in SYSTEM_KEYS:
                    raise MessageIllegalError(f"row {row}: property {k!r} is reserved; use the {k.lower()} column")
                _check_text(row, "property", k)
                _check_text(row, "property value", v)
                parts.append(f"{k}\x01{v}\x02")
        if tags:
            _check_text(row, "tags", tags)
            parts.append(f"{TAGS}\x01{tags}\x02")
        if keys:
            _check_text(row, "keys", keys)
            joined = " ".join(keys.split())
            if joined:
                parts.append(f"{KEYS}\x01{joined}\x02")
        parts.append(f"{UNIQ_KEY}\x01{uniq_key or self.uniq.next()}\x02")
        data = "".join(parts).encode()
        if len(data) > MAX_PROPERTIES_BYTES:
            raise MessageIllegalError(f"row {row}: properties are {len(data)} bytes, more than {MAX_PROPERTIES_BYTES}")
        return data

    def item(self, row: int, topic_len: int, body: object, props: bytes, born_ms: int) -> bytes:
        """One send-batch item: header, body, properties."""
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(body, bytes):
            raise MessageIllegalError(f"row {row}: body is {'null' if body is None else type(body).__name__}; "
                                      "it must be binary or string")
        if not body:
            raise MessageIllegalError(f"row {row}: body is empty")
        size = record_size(len(body), topic_len, len(props))
        if size > self.max_message_size:
            raise MessageIllegalError(f"row {row}: the message is {size} bytes stored, more than maxMessageSize "
                                      f"{self.max_message_size}")
        head = BATCH_ITEM_HEAD.pack(BATCH_ITEM_HEAD.size + len(body) + _U16 + len(props), BATCH_MAGIC,
                                    body_crc(body), 0, self.sys_flag, born_ms, len(body))
        return b"".join((head, body, len(props).to_bytes(2, "big"), props))


class ChunkBuilder:
    """Groups items by (topic, queue) and cuts them into requests of bounded size."""

    def __init__(self, max_messages: int = MAX_BATCH_MESSAGES, max_bytes: int = MAX_BATCH_BYTES) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._open: dict[tuple[str, MessageQueue | None, str | None], tuple[list[bytes], list[int]]] = {}

    def add(self, topic: str, queue: MessageQueue | None, item: bytes, group: str | None = None) -> Chunk | None:
        """Add one item (for ``queue``, else for any queue of ``group``, else for any queue); returns a full chunk
        when this item completed one."""
        key = (topic, queue, group)
        entry = self._open.get(key)
        if entry is None:
            entry = self._open[key] = ([], [0])
        items, size = entry
        items.append(item)
        size[0] += len(item)
        if len(items) >= self.max_messages or size[0] >= self.max_bytes:
            del self._open[key]
            return Chunk(topic, queue, b"".join(items), len(items), group)
        return None

    def finish(self) -> list[Chunk]:
        """Every partly filled chunk (the builder is empty afterwards)."""
        out = [Chunk(t, q, b"".join(items), len(items), g) for (t, q, g), (items, _) in self._open.items()]
        self._open.clear()
        return out


class Sender:
    """Sends chunks with bounded concurrency through the SDK's routed, retried send (module docstring).

    Args:
        client: the pooled broker client (routes, queue choice, retries).
        group: the producer group named in requests.
        send_timeout_s: the deadline of one chunk, all attempts included.
        retries: extra attempts on another broker group (chunks without an explicit queue).
        concurrency: requests in flight at most.
        idempotent: the chunks' items carry ``SysFlag.IDEMPOTENT``: a retry after an attempt that may have stored
            them stays in that attempt's group (:meth:`client.lowlevel.BrokerClient.send_encoded`).
    """

    def __init__(self, client: SendClient, group: str, *, send_timeout_s: float, retries: int,
                 concurrency: int, idempotent: bool = False) -> None:
        self.client = client
        self.idempotent = idempotent
        self.group = group
        self.send_timeout_s = send_timeout_s
        self.retries = retries
        self.concurrency = max(1, concurrency)
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._inflight: deque[cf.Future[int]] = deque()
        self.requests = 0
        self.not_durable = 0

    def queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues of ``topic`` ordered by (brokerName, queueId): what a ``queueId`` column indexes."""
        return sorted(self.client.publish_info(topic).message_queues)

    def group_of(self, topic: str, key: str) -> str | None:
        """The broker group ``key`` goes to among ``topic``'s groups (the SDK's rule for a caller's key)."""
        return group_for_key(self.client.publish_info(topic), key)

    def _send_chunk(self, chunk: Chunk) -> int:
        sent = self.client.send_encoded(chunk.topic, chunk.body, chunk.messages, group=self.group, queue=chunk.queue,
                                        timeout_s=self.send_timeout_s, retries=self.retries,
                                        idempotent=self.idempotent, pinned=chunk.group)
        if sent.send_status is not SendStatus.SEND_OK:
            log.warning("%s stored %d messages but answered %s (not yet durable)", sent.message_queue,
                        chunk.messages, sent.send_status.name)
            with self._lock:
                self.not_durable += chunk.messages
        return chunk.messages

    # --- the pipeline -------------------------------------------------------------------------------------

    def submit(self, chunk: Chunk) -> None:
        """Send ``chunk`` (in the background when concurrency > 1); raises an earlier request's failure."""
        self.requests += 1
        if self.concurrency == 1:
            self._send_chunk(chunk)
            return
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="splitmq-spark-send")
        while len(self._inflight) >= self.concurrency:
            self._inflight.popleft().result()
        self._inflight.append(self._pool.submit(self._send_chunk, chunk))

    def flush(self) -> None:
        """Wait for every request in flight; raises the first failure (the others still finish)."""
        first: BaseException | None = None
        while self._inflight:
            try:
                self._inflight.popleft().result()
            except BaseException as e:  # collect the first, drain the rest so nothing runs unobserved
                first = first or e
        if first is not None:
            raise first

    def close(self) -> None:
        """Stop the worker threads (after :meth:`flush`, or on failure: queued requests are dropped)."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def encode_columns(
    columns: Mapping[str, list[Any]], n: int, *, topic_option: str | None, encoder: ItemEncoder,
    builder: ChunkBuilder, queue_of: Callable[[int, str, Any, Any], MessageQueue | None],
    row_keys: RowKeys | None = None, first_row: int = 0,
) -> Iterator[Chunk]:
    """Encode ``n`` rows given as Python column lists; yields every chunk that fills up on the way.

    Args:
        columns: ``body`` plus any of ``topic``, ``tags``, ``keys``, ``properties``, ``queueId``, ``brokerName``.
        n: the row count.
        topic_option: the sink's ``topic`` option (beats the column).
        encoder: validation and item layout.
        builder: where items accumulate (call ``finish`` after the last batch).
        queue_of: ``(row, topic, queueId, brokerName) -> MessageQueue | None``.
        row_keys: each row's ``UNIQ_KEY`` (``row_keys.key(first_row + i)``) and, for a row without a queue, the
            broker group it is sent to; None: fresh keys, any group.
        first_row: the task's index of the first of these rows.
    """
    none = [None] * n
    bodies = columns["body"]
    topics = [topic_option] * n if topic_option else columns.get("topic", none)
    tags, keys, props = columns.get("tags", none), columns.get("keys", none), columns.get("properties", none)
    qids, brokers = columns.get("queueId", none), columns.get("brokerName", none)
    born_ms = encoder.clock_ms()
    for i in range(n):
        topic = topics[i]
        topic_len = encoder.topic_len(i, topic)
        key = row_keys.key(first_row + i) if row_keys is not None else None
        item = encoder.item(i, topic_len, bodies[i], encoder.properties(i, tags[i], keys[i], props[i], key), born_ms)
        queue = queue_of(i, topic, qids[i], brokers[i]) if qids[i] is not None else None
        group = row_keys.groups(topic, key) if row_keys is not None and key is not None and queue is None else None
        chunk = builder.add(topic, queue, item, group)
        if chunk is not None:
            yield chunk
