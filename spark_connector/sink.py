"""The ``rocketmq`` sink: Arrow batch and streaming writers over the SDK's ``Producer.send_batch``.

Input columns: ``body`` (required; binary, or string sent as UTF-8), ``topic`` (string; the ``topic`` option
overrides it; one of the two is required), ``tags``, ``keys`` (space-separated string), ``properties``
(``map<string,string>``), ``queueId`` (int) and ``brokerName`` (string). ``queueId`` alone is the index of a
queue in the topic's writable queues ordered by (brokerName, queueId), like Kafka's ``partition``; with
``brokerName`` it names that exact queue. Without ``queueId`` the SDK's default queue selection applies. Any
other column is an error.

Delivery is **at-least-once**: a task sends every row and waits for each broker answer before returning its
commit message; a failed task raises, Spark retries it, and rows the failed attempt already stored are stored
again (like the Kafka sink). Only ``mode("append")`` is supported.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType

from spark_connector.options import OptionError, SinkOptions, parse_sink_options

log = logging.getLogger(__name__)

__all__ = [
    "RocketMQBatchWriter",
    "RocketMQStreamWriter",
    "WriteCommit",
    "make_batch_writer",
    "make_stream_writer",
    "send_arrow_batch",
]

APPEND_ONLY = (
    'the rocketmq sink only appends: use df.write.format("rocketmq").mode("append").save() '
    "(overwrite is not supported; a message queue cannot delete what it stored)"
)
_ALLOWED = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "tags": (StringType,),
    "keys": (StringType,),
    "properties": (MapType,),
    "queueId": (IntegerType, LongType),
    "brokerName": (StringType,),
}
#: Messages and bytes per send request (one topic, one queue).
_BATCH_MAX_MESSAGES = 512
_BATCH_MAX_BYTES = 1024 * 1024


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one write task reports: rows it sent."""

    rows: int
    requests: int


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Fail early (on the driver) on unknown columns, wrong types, or a missing body/topic.

    Raises:
        OptionError: naming the column.
    """
    names = {f.name: f for f in schema.fields}
    for name, f in names.items():
        allowed = _ALLOWED.get(name)
        if allowed is None:
            raise OptionError(f"the rocketmq sink has no column {name!r}; allowed: {', '.join(sorted(_ALLOWED))}")
        if not isinstance(f.dataType, allowed):
            raise OptionError(f"sink column {name} has type {f.dataType.simpleString()}; expected "
                              f"{' or '.join(t.typeName() for t in allowed)}")
    if "body" not in names:
        raise OptionError("the rocketmq sink needs a body column (binary or string)")
    if "topic" not in names and opts.topic is None:
        raise OptionError("the rocketmq sink needs the topic option or a topic column")
    if "brokerName" in names and "queueId" not in names:
        raise OptionError("sink column brokerName needs a queueId column too")


# --- producers pooled per worker ------------------------------------------------------------------------

_PRODUCERS: dict[tuple[Any, ...], Any] = {}
_PRODUCERS_LOCK = threading.Lock()


def _pooled_producer(opts: SinkOptions) -> Any:
    from client import Producer

    key = (opts.nameserver, opts.producer_group, opts.send_timeout_s, opts.retries,
           tuple(sorted(opts.client.items())))
    with _PRODUCERS_LOCK:
        p = _PRODUCERS.get(key)
        if p is None:
            p = Producer(opts.producer_group, opts.nameserver, send_timeout_s=opts.send_timeout_s,
                         retry_times_when_send_failed=opts.retries)
            p.start()
            _PRODUCERS[key] = p
        return p


def _close_producers() -> None:
    with _PRODUCERS_LOCK:
        producers = list(_PRODUCERS.values())
        _PRODUCERS.clear()
    for p in producers:
        try:
            p.close()
        except Exception:  # best effort at interpreter exit
            log.debug("closing a pooled producer failed", exc_info=True)


atexit.register(_close_producers)


# --- rows to messages -----------------------------------------------------------------------------------


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


def _writable_queues(producer: Any, topic: str) -> list[Any]:
    info = producer.client.try_to_find_topic_publish_info(topic)
    return sorted(info.message_queues)


def _target_queue(producer: Any, topic: str, qid: int | None, broker: str | None, cache: dict[str, list[Any]]) -> Any:
    from client import MessageQueue

    if qid is None:
        return None
    if broker is not None:
        return MessageQueue(topic, broker, int(qid))
    queues = cache.get(topic)
    if queues is None:
        queues = cache[topic] = _writable_queues(producer, topic)
    if not queues:
        raise OptionError(f"topic {topic} has no writable queue")
    if not 0 <= qid < len(queues):
        raise OptionError(f"queueId {qid} is outside the {len(queues)} writable queues of topic {topic}")
    return queues[qid]


def _group_rows(batch: pa.RecordBatch, opts: SinkOptions, producer: Any) -> dict[tuple[str, Any], list[Any]]:
    """Messages of ``batch`` grouped by (topic, target queue or None)."""
    from client import Message

    n = batch.num_rows
    bodies = _column(batch, "body") or []
    topics = [opts.topic] * n if opts.topic else (_column(batch, "topic") or [None] * n)
    tags = _column(batch, "tags") or [None] * n
    keys = _column(batch, "keys") or [None] * n
    props = _column(batch, "properties") or [None] * n
    qids = _column(batch, "queueId") or [None] * n
    brokers = _column(batch, "brokerName") or [None] * n
    groups: dict[tuple[str, Any], list[Any]] = {}
    cache: dict[str, list[Any]] = {}
    for i in range(n):
        body, topic = bodies[i], topics[i]
        if body is None:
            raise OptionError(f"row {i}: body is null")
        if topic is None:
            raise OptionError(f"row {i}: topic is null and no topic option is set")
        if isinstance(body, str):
            body = body.encode()
        msg = Message(topic, body, tags=tags[i] or None, keys=keys[i] or None,
                      properties=dict(props[i]) if props[i] else None)
        mq = _target_queue(producer, topic, qids[i], brokers[i], cache)
        groups.setdefault((topic, mq), []).append(msg)
    return groups


def send_arrow_batch(producer: Any, batch: pa.RecordBatch, opts: SinkOptions) -> tuple[int, int]:
    """Send every row of ``batch``; returns ``(rows, requests)``. Raises on any failed send."""
    rows = requests = 0
    for (_, mq), msgs in _group_rows(batch, opts, producer).items():
        start = 0
        while start < len(msgs):
            end, size = start, 0
            while end < len(msgs) and end - start < _BATCH_MAX_MESSAGES and (end == start or size < _BATCH_MAX_BYTES):
                size += len(msgs[end].body)
                end += 1
            producer.send_batch(msgs[start:end], mq)
            rows += end - start
            requests += 1
            start = end
    return rows, requests


def _write_all(opts: SinkOptions, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
    producer = _pooled_producer(opts)
    rows = requests = 0
    for batch in iterator:
        r, q = send_arrow_batch(producer, batch, opts)
        rows += r
        requests += q
    return WriteCommit(rows, requests)


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq").mode("append")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write_all(self.options, iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.info("rocketmq sink wrote %d rows in %d tasks", rows, len(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.warning("rocketmq sink job aborted; %d rows were already stored (at-least-once)", rows)


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("rocketmq")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return _write_all(self.options, iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.info("rocketmq sink micro-batch %d wrote %d rows", batchId, rows)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("rocketmq sink micro-batch %d aborted; stored rows stay stored (at-least-once)", batchId)


def _sink_options(options: Mapping[str, Any], schema: StructType, overwrite: bool) -> SinkOptions:
    if overwrite:
        raise OptionError(APPEND_ONLY)
    opts = parse_sink_options(options)
    check_sink_schema(schema, opts)
    return opts


def make_batch_writer(options: Mapping[str, Any], schema: StructType, overwrite: bool) -> RocketMQBatchWriter:
    """The batch writer for ``DataSource.writer`` (rejects overwrite with a message saying to append)."""
    return RocketMQBatchWriter(_sink_options(options, schema, overwrite))


def make_stream_writer(options: Mapping[str, Any], schema: StructType, overwrite: bool) -> RocketMQStreamWriter:
    """The streaming writer for ``DataSource.streamWriter``."""
    return RocketMQStreamWriter(_sink_options(options, schema, overwrite))
