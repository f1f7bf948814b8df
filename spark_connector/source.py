"""The ``rocketmq`` Python data source: batch reader, streaming reader, and the entry points Spark calls.

Spark pickles the reader objects and ships them to executor Python workers, so they hold only validated
options (and, for the driver-side stream reader, small offset maps). SDK clients come from the per-worker pool
in :mod:`spark_connector.transport` and are never pickled. Spark passes ``schema`` (and ``overwrite``) as
keyword arguments, so those parameter names are fixed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from client.errors import ClientError
from spark_connector.arrow import spark_schema
from spark_connector.offsets import OffsetMap, offsets_from_json, offsets_to_json, rate_limit
from spark_connector.options import OptionError, SourceOptions, parse_source_options, redacted
from spark_connector.planning import QueueRange, plan_ranges
from spark_connector.reader import DataLossError, RangeReader
from spark_connector.resolve import fetch_offsets, queue_keys, resolve_end, resolve_start, route_snapshot
from spark_connector.slave_reads import check_slave_reads
from spark_connector.transport import pooled_client

log = logging.getLogger(__name__)

__all__ = ["RangePartition", "RocketMQBatchReader", "RocketMQDataSource", "RocketMQStreamReader"]


class RangePartition(InputPartition):
    """One Spark task: a planned :class:`QueueRange` (``value``)."""

    def __init__(self, value: QueueRange) -> None:
        super().__init__(value)

    def __repr__(self) -> str:
        return f"RangePartition({self.value})"


def _check_user_schema(schema: StructType | None, opts: SourceOptions) -> None:
    if schema is None:
        return
    ours = spark_schema(opts.include_properties)
    if schema != ours:
        raise OptionError(
            "the rocketmq source has a fixed schema; do not call .schema(...) (or pass exactly "
            f"{ours.simpleString()}), got {schema.simpleString()}"
        )


def _read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    rng = getattr(partition, "value", None)
    if not isinstance(rng, QueueRange):  # Spark turns an empty plan into one InputPartition(None)
        return
    client = pooled_client(opts.nameserver, opts.client, opts.credentials, tls_ca_file=opts.tls_ca_file)
    yield from RangeReader(client, opts, rng).batches()


class RocketMQBatchReader(DataSourceReader):
    """Batch read: one partition per non-empty queue range, offsets fixed when the DataFrame is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        client = pooled_client(opts.nameserver, opts.client, opts.credentials, tls_ca_file=opts.tls_ca_file)
        route = client.route(opts.topic, refresh=True)
        keys = queue_keys(route, opts.topic)
        if opts.pull_from == "slave":
            check_slave_reads(opts.nameserver, route_snapshot(route), client_config=opts.client_config())
        highs = fetch_offsets(client, route, keys, "max")
        starts = resolve_start(client, route, keys, opts, highs=highs)
        ends = resolve_end(client, route, keys, opts, highs=highs)
        ranges = plan_ranges(
            starts, ends, routes=route_snapshot(route), min_partitions=opts.min_partitions,
            max_records_per_partition=opts.max_records_per_partition,
        )
        log.info("rocketmq batch read of %s planned %d partition(s)", opts.topic, len(ranges))
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read with offsets ``{"topic":{"brokerName":{"queueId":next}}}`` (canonical JSON)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: OffsetMap | None = None
        self._latest: OffsetMap | None = None
        self._slaves_checked = options.pull_from != "slave"

    def _client(self) -> Any:
        return pooled_client(self.options.nameserver, self.options.client, self.options.credentials,
                             tls_ca_file=self.options.tls_ca_file)

    def initialOffset(self) -> dict:
        opts = self.options
        client = self._client()
        route = client.route(opts.topic, refresh=True)
        keys = queue_keys(route, opts.topic)
        return offsets_to_json(resolve_start(client, route, keys, opts))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current_latest()
        log.info("rocketmq availableNow target: %s", offsets_to_json(self._target))

    def _current_latest(self) -> OffsetMap:
        client = self._client()
        route = client.route(self.options.topic, refresh=True)
        keys = queue_keys(route, self.options.topic)
        return fetch_offsets(client, route, keys, "max")

    def _add_new_queues(self, start: OffsetMap, latest: OffsetMap) -> OffsetMap:
        new = [k for k in latest if k not in start]
        if not new:
            return dict(start)
        client = self._client()
        lows = fetch_offsets(client, client.route(self.options.topic), new, "min")
        lost = {k: v for k, v in lows.items() if v > 0}
        if lost:
            msg = f"new queue(s) start above offset 0 ({offsets_to_json(lost)}): their first messages expired"
            if self.options.fail_on_data_loss:
                raise DataLossError(msg + "; set failOnDataLoss=false to start at their min offset")
            log.warning("%s; starting at the min offset", msg)
        return {**start, **lows}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        latest = self._current_latest()
        self._latest = dict(latest)
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, 0)) for k, v in latest.items()}
        gone = [k for k in begin if k not in latest]
        if gone:
            log.warning("queue(s) %s left the route of %s; keeping their positions", gone, self.options.topic)
        full_start = self._add_new_queues(begin, latest)
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(full_start, latest, limit.max_rows)
        else:
            end = {k: max(v, full_start.get(k, 0)) for k, v in latest.items()}
        for k in gone:
            end[k] = begin[k]
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        opts = self.options
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        client = self._client()
        route = client.route(opts.topic)
        if not self._slaves_checked:  # once per query run: the first micro-batch it plans
            check_slave_reads(opts.nameserver, route_snapshot(route), client_config=opts.client_config())
            self._slaves_checked = True
        new = [k for k in stop if k not in begin]
        if new:
            begin = {**begin, **fetch_offsets(client, route, new, "min")}
        ranges = plan_ranges(
            begin, stop, routes=route_snapshot(route), min_partitions=opts.min_partitions,
            max_records_per_partition=opts.max_records_per_partition,
        )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        opts = self.options
        if not opts.commit_offsets_to_broker or opts.group is None:
            return
        try:
            client = self._client()
            route = client.route(opts.topic)
            by_group: dict[str, list[tuple[Any, int]]] = {}
            for k, off in offsets_from_json(end).items():
                by_group.setdefault(k.broker_name, []).append((k.message_queue, off))
            for broker_name, items in by_group.items():
                data = route.broker_data(broker_name)
                if data is None or data.master_addr is None:
                    continue  # slaves never take consumer-offset commits; this is best effort
                client.commit_offsets(data.master_addr, opts.group, items)
        except ClientError as e:
            log.warning("best-effort commit of consumer offsets for group %s failed: %s", opts.group, e)

    def stop(self) -> None:
        """Nothing to release: Spark may never call this; pooled clients close at process exit."""


class RocketMQDataSource(DataSource):
    """``spark.read.format("rocketmq")`` / ``readStream`` / ``write`` / ``writeStream``.

    Options: docs/SPARK.md, "Source options" and "Sink options". The read schema is fixed (see
    :func:`spark_connector.arrow.spark_schema`).
    """

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def __repr__(self) -> str:
        return f"RocketMQDataSource({redacted(self.options)})"

    def schema(self) -> StructType:
        opts = parse_source_options(self.options, streaming=None)
        return spark_schema(opts.include_properties)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_source_options(self.options, streaming=False)
        _check_user_schema(schema, opts)
        return RocketMQBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options, streaming=True)
        _check_user_schema(schema, opts)
        return RocketMQStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_connector.sink import make_batch_writer

        return make_batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_connector.sink import make_stream_writer

        return make_stream_writer(self.options, schema, overwrite)
