"""The ``rocketmq`` sink: Arrow batch and streaming writers (rows encoded and sent by :mod:`spark_connector.send`).

Input columns: ``body`` (required; binary, or string sent as UTF-8), ``topic`` (string; the ``topic`` option
overrides it; one of the two is required), ``tags``, ``keys`` (space-separated string), ``properties``
(``map<string,string>``), ``queueId`` (int) and ``brokerName`` (string). ``queueId`` alone is the index of a
queue in the topic's writable queues ordered by (brokerName, queueId), like Kafka's ``partition``; with
``brokerName`` it names that exact queue. Without ``queueId`` requests go round-robin over the writable queues
and a failed one is retried on another broker group, as the SDK's default selection does. Any other column is
an error.

A task sends every row and waits for each broker answer before returning its commit message; a failed task
raises and Spark retries it. With ``idempotent=true`` (the default) each row's ``UNIQ_KEY`` is deterministic
(:func:`task_row_keys`): a streaming write's from the query id (which a restart from the checkpoint keeps), the
micro-batch id, the task's partition and the row's index in it; a batch write's from an id drawn once per
``save()``, the partition and the row's index. A replayed micro-batch, a task retry or a speculative copy sends
the same keys, and the brokers' duplicate window (``duplicateWindowMs``, docs/GUIDE.md "Idempotent sends")
answers them with the first copies: a streaming query killed mid-batch and restarted from its checkpoint leaves
every row stored once, provided the replay comes within the window and reads the same rows in the same order per
partition (docs/SPARK.md, "Exactly-once writes"). With ``idempotent=false`` keys are random and delivery is
at-least-once, like the Kafka sink. Only ``mode("append")`` is supported.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType

from client.lowlevel import TopicPublishInfo, group_among, key_group_names
from common.codec import UniqKeyGenerator
from common.message import MessageQueue
from spark_connector.options import OptionError, SinkOptions, parse_sink_options
from spark_connector.send import ChunkBuilder, ItemEncoder, RowKeys, Sender, encode_columns
from spark_connector.transport import pooled_client

log = logging.getLogger(__name__)

__all__ = [
    "RocketMQBatchWriter",
    "RocketMQStreamWriter",
    "WriteCommit",
    "make_batch_writer",
    "make_stream_writer",
    "send_arrow_batches",
    "task_row_keys",
    "write_arrow_batches",
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


# --- rows to requests -----------------------------------------------------------------------------------

#: One ``UNIQ_KEY`` source per Python worker process (keyed by pid: workers are forked, and a generator
#: inherited across a fork would repeat its parent's ids).
_UNIQ: dict[int, UniqKeyGenerator] = {}


def _uniq() -> UniqKeyGenerator:
    pid = os.getpid()
    gen = _UNIQ.get(pid)
    if gen is None:
        _UNIQ.clear()
        gen = _UNIQ[pid] = UniqKeyGenerator()
    return gen


def _columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    return {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}


class _QueueResolver:
    """``queueId`` (and ``brokerName``) column values to the queue they name, per topic."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self._queues: dict[str, list[MessageQueue]] = {}

    def __call__(self, row: int, topic: str, qid: Any, broker: Any) -> MessageQueue:
        if broker is not None:
            return MessageQueue(topic, broker, int(qid))
        queues = self._queues.get(topic)
        if queues is None:
            queues = self._queues[topic] = self.sender.queues(topic)
        if not 0 <= qid < len(queues):
            raise OptionError(f"row {row}: queueId {qid} is outside the {len(queues)} writable queues of topic {topic}")
        return queues[qid]


class KeyGroups:
    """A key's broker group among a topic's groups, as :func:`client.lowlevel.group_for_key` chooses it, with
    the topic's group names (:func:`client.lowlevel.key_group_names`) taken once per task."""

    def __init__(self, publish_info: Callable[[str], TopicPublishInfo]) -> None:
        self._publish_info = publish_info
        self._names: dict[str, list[str]] = {}

    def __call__(self, topic: str, key: str) -> str | None:
        names = self._names.get(topic)
        if names is None:
            names = self._names[topic] = key_group_names(self._publish_info(topic))
        return group_among(names, key)


def task_row_keys(write_id: str, partition: int, groups: Callable[[str, str], str | None]) -> RowKeys:
    """The keys of one task's rows: ``<write_id>-<partition>-<row>`` (hex numbers).

    Args:
        write_id: ``<query id without dashes>-<micro-batch id in hex>`` for a streaming write, a random id drawn at
            ``save()`` for a batch write.
        partition: the task's partition (Spark's ``TaskContext.partitionId``: the same for a retry).
        groups: where a key goes (:class:`KeyGroups`).
    """
    return RowKeys(f"{write_id}-{partition:x}-", groups)


def _streaming_write_id() -> tuple[str, int] | None:
    """``(write id, partition)`` of the running micro-batch task: Spark's query id (kept in the checkpoint) and
    batch id, which it hands every task as local properties; None outside a streaming task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return None
    query, batch = tc.getLocalProperty("sql.streaming.queryId"), tc.getLocalProperty("streaming.sql.batchId")
    if not query or batch is None or not batch.isdigit():
        return None
    return f"{query.replace('-', '')}-{int(batch):x}", tc.partitionId()


def _task_partition() -> int | None:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return None if tc is None else tc.partitionId()


def send_arrow_batches(batches: Iterator[pa.RecordBatch], opts: SinkOptions, sender: Sender, *,
                       row_keys: RowKeys | None = None) -> WriteCommit:
    """Encode and send every row of ``batches``; returns once every request was answered.

    Args:
        batches: the task's rows.
        opts: the sink's options.
        sender: where the requests go.
        row_keys: deterministic keys (an idempotent write); None: fresh keys.

    Raises:
        MessageIllegalError: a row breaks the SDK's message rules (the message names the row).
        OptionError: a ``queueId`` outside the topic's writable queues.
        ClientError: a send failed after its retries.
    """
    encoder = ItemEncoder(uniq=_uniq(), idempotent=sender.idempotent)
    builder = ChunkBuilder()
    resolve = _QueueResolver(sender)
    rows = 0
    try:
        for batch in batches:
            chunks = encode_columns(_columns(batch), batch.num_rows, topic_option=opts.topic, encoder=encoder,
                                    builder=builder, queue_of=resolve, row_keys=row_keys, first_row=rows)
            for chunk in chunks:
                sender.submit(chunk)
            rows += batch.num_rows
        for chunk in builder.finish():
            sender.submit(chunk)
        sender.flush()
    finally:
        sender.close()
    return WriteCommit(rows, sender.requests)


def write_arrow_batches(opts: SinkOptions, iterator: Iterator[pa.RecordBatch], *,
                        key_source: tuple[str, int] | None = None) -> WriteCommit:
    """Send every row of ``iterator`` as ``opts`` say, through a sender of its own (one writer task's work; the
    benchmarks call it without Spark).

    Args:
        opts: the sink's options.
        iterator: the rows.
        key_source: ``(write id, partition)`` of the rows' deterministic keys (:func:`task_row_keys`) when
            ``opts.idempotent``; None: fresh keys (still sent with the idempotent bit, which protects the SDK's
            own retries).
    """
    client = pooled_client(opts.nameserver, opts.client, opts.credentials, tls_ca_file=opts.tls_ca_file)
    sender = Sender(client, opts.producer_group, send_timeout_s=opts.send_timeout_s, retries=opts.retries,
                    concurrency=opts.send_concurrency, idempotent=opts.idempotent)
    row_keys = None
    if opts.idempotent and key_source is not None:
        row_keys = task_row_keys(key_source[0], key_source[1], KeyGroups(client.publish_info))
    return send_arrow_batches(iterator, opts, sender, row_keys=row_keys)


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq").mode("append")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        #: drawn once per ``save()`` (the writer is built on the driver and shipped to every task)
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        partition = _task_partition()
        key_source = None if partition is None else (self.write_id, partition)
        return write_arrow_batches(self.options, iterator, key_source=key_source)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.info("rocketmq sink wrote %d rows in %d tasks", rows, len(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.warning("rocketmq sink job aborted; %d rows were already stored%s", rows,
                    "" if self.options.idempotent else " (at-least-once)")


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("rocketmq")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        key_source = _streaming_write_id() if self.options.idempotent else None
        if self.options.idempotent and key_source is None:
            log.warning("rocketmq sink: no streaming query id or batch id in this task's context; its rows get "
                        "random keys (a replay of this micro-batch may store them again)")
        return write_arrow_batches(self.options, iterator, key_source=key_source)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteCommit))
        log.info("rocketmq sink micro-batch %d wrote %d rows", batchId, rows)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("rocketmq sink micro-batch %d aborted; stored rows stay stored (%s)", batchId,
                    "its replay re-sends the same keys" if self.options.idempotent else "at-least-once")


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
