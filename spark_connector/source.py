"""The ``rocketmq`` Python data source: batch reader, streaming reader, and the entry points Spark calls.

Spark pickles the reader objects and ships them to executor Python workers, so they hold only validated
options (and, for the driver-side stream reader, small offset maps). SDK clients come from the per-worker pool
in :mod:`spark_connector.transport` and are never pickled. Spark passes ``schema`` (and ``overwrite``) as
keyword arguments, so those parameter names are fixed.

Every method Spark calls is wrapped by :func:`spark_connector.errors.user_facing`: an error meant for the user
(a bad option, a cluster that does not answer, data loss) reaches them as one line, and the SDK's errors are
explained there (:func:`spark_connector.errors.explain`).

The stream reader keeps, with each checkpointed offset map, the identity of every broker group's store
(:mod:`spark_connector.offsets`, ``"@groups"``) and checks a checkpoint against the cluster before it plans from
it (:mod:`spark_connector.checks`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from client import Admin
from client.errors import ClientError
from spark_connector.arrow import spark_schema
from spark_connector.checks import check_checkpoint, foreign_groups
from spark_connector.errors import (
    ConnectorError,
    DataLossError,
    OptionError,
    explain,
    user_facing,
    user_facing_iter,
)
from spark_connector.offsets import (
    OffsetMap,
    groups_from_json,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from spark_connector.options import SourceOptions, parse_source_options, redacted
from spark_connector.planning import MinOffsetsGate, QueueRange, plan_ranges
from spark_connector.pushdown import Pushdown, Subscription, push_filters
from spark_connector.reader import RangeReader
from spark_connector.resolve import (
    ClusterView,
    QueueState,
    cluster_view,
    fetch_offsets,
    fetch_state,
    resolve_end,
    resolve_start,
)
from spark_connector.slave_reads import check_slave_reads
from spark_connector.transport import BrokerClient, pooled_client

log = logging.getLogger(__name__)

__all__ = ["RangePartition", "RocketMQBatchReader", "RocketMQDataSource", "RocketMQFilteringBatchReader",
           "RocketMQStreamReader"]


class RangePartition(InputPartition):
    """One Spark task: a planned :class:`QueueRange` (``value``) and the subscription of its pulls (pushed-down
    filters included; None: the options' ``subExpression``)."""

    def __init__(self, value: QueueRange, subscription: Subscription | None = None) -> None:
        super().__init__(value)
        self.subscription = subscription

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


def _client(opts: SourceOptions) -> BrokerClient:
    return pooled_client(opts.nameserver, opts.client, opts.credentials, tls_ca_file=opts.tls_ca_file)


@contextlib.contextmanager
def _asking(opts: SourceOptions, what: str) -> Iterator[None]:
    """Turn the SDK's errors into one-line :class:`ConnectorError` s naming ``what`` failed and what to check."""
    try:
        yield
    except ConnectorError:
        raise
    except ClientError as e:
        raise explain(e, nameserver=opts.nameserver, what=what) from None


def _topic_lister(opts: SourceOptions) -> Callable[[], list[str]]:
    def list_topics() -> list[str]:
        with Admin(opts.nameserver, client_config=opts.client_config()) as admin:
            return admin.topic_list()

    return list_topics


def _observe(opts: SourceOptions, *, refresh: bool, what: str) -> tuple[ClusterView, QueueState]:
    """The read's queues now, and each one's min/max offset and its group's identity."""
    client = _client(opts)
    with _asking(opts, what):
        view = cluster_view(client, opts, refresh=refresh, list_topics=_topic_lister(opts))
        return view, fetch_state(client, view.brokers, view.keys)


def _read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    rng = getattr(partition, "value", None)
    if not isinstance(rng, QueueRange):  # Spark turns an empty plan into one InputPartition(None)
        return
    with _asking(opts, f"reading {rng}"):
        yield from RangeReader(_client(opts), opts, rng, subscription=getattr(partition, "subscription", None)
                               ).batches()


class RocketMQBatchReader(DataSourceReader):
    """Batch read: one partition per non-empty queue range, offsets fixed when the DataFrame is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.pushdown = Pushdown()

    @user_facing
    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        what = f"planning the read of {opts.describe_topics()}"
        client = _client(opts)
        with _asking(opts, what):
            view = cluster_view(client, opts, refresh=True, list_topics=_topic_lister(opts))
            keys = [k for k in view.keys if self.pushdown.keeps(k)]
            view = ClusterView(view.topics, keys, view.brokers)
            if opts.pull_from == "slave" and keys:
                check_slave_reads(opts.nameserver, view.brokers, client_config=opts.client_config())
            state = fetch_state(client, view.brokers, keys)
            starts = resolve_start(client, view, opts, state)
            ends = resolve_end(client, view, opts, state)
            inverted = [f"{k} starts at {starts[k]} after its end {ends[k]}" for k in keys if starts[k] > ends[k]]
            if inverted:
                raise OptionError(f"options startingOffsets/endingOffsets (or their timestamps) give inverted ranges: "
                                  f"{'; '.join(inverted[:3])}: make every start <= its end")
            starts, ends = self._apply_times(client, view, starts, ends)
        starts, ends = self.pushdown.cut(starts, ends)
        ranges = plan_ranges(starts, ends, routes=view.brokers, min_partitions=opts.min_partitions,
                             max_records_per_partition=opts.max_records_per_partition)
        sub = self.pushdown.subscription(opts.sub_expression, opts.expression_type)
        if self.pushdown.described:
            log.info("rocketmq: filters pushed to the brokers: %s (subscription %r, %s)",
                     ", ".join(self.pushdown.described), sub.expression, sub.expression_type)
        log.info("rocketmq batch read of %s planned %d partition(s)", opts.describe_topics(), len(ranges))
        return [RangePartition(r, sub) for r in ranges]

    def _apply_times(self, client: BrokerClient, view: ClusterView, starts: OffsetMap, ends: OffsetMap
                     ) -> tuple[OffsetMap, OffsetMap]:
        """Narrow each range to the pushed store-time bounds (the brokers' time search)."""
        p = self.pushdown
        keys = [k for k in view.keys if starts[k] < ends[k]]
        if p.store_from_ms is not None and keys:
            found = fetch_offsets(client, view.brokers, keys, "search", timestamp_ms=p.store_from_ms)
            starts = {k: max(v, found.get(k, v)) for k, v in starts.items()}
        if p.store_until_ms is not None and keys:
            found = fetch_offsets(client, view.brokers, keys, "search", timestamp_ms=p.store_until_ms)
            ends = {k: min(v, found.get(k, v)) for k, v in ends.items()}
        return starts, ends

    @user_facing_iter
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)


class RocketMQFilteringBatchReader(RocketMQBatchReader):
    """The batch reader that takes Spark's filters (``filterPushdown=true``, the default): see
    :mod:`spark_connector.pushdown`. Spark calls ``pushFilters`` only with
    ``spark.sql.python.filterPushdown.enabled=true``, which :func:`spark_connector.register` sets."""

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        self.pushdown, for_spark = push_filters(filters)
        return for_spark


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read with offsets ``{"topic":{"brokerName":{"queueId":next}}, "@groups": {...}}``."""

    def __init__(self, options: SourceOptions, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.options = options
        self._target: OffsetMap | None = None
        self._latest: OffsetMap | None = None
        self._slaves_checked = options.pull_from != "slave"
        self._gate = (MinOffsetsGate(options.min_offsets_per_trigger, options.max_trigger_delay_ms,
                                     clock_ms or (lambda: int(time.time() * 1000)))
                      if options.min_offsets_per_trigger else None)
        self._planned: tuple[str, str, OffsetMap, QueueState] | None = None
        """``(start, end, checked start, state)`` of the last ``latestOffset``, reused by ``partitions``."""

    def _what(self) -> str:
        return self.options.describe_topics()

    @user_facing
    def initialOffset(self) -> dict:
        opts = self.options
        view, state = _observe(opts, refresh=True, what=f"starting the stream of {self._what()}")
        with _asking(opts, f"starting the stream of {self._what()}"):
            start = resolve_start(_client(opts), view, opts, state)
        return offsets_to_json(start, state.identities)

    def getDefaultReadLimit(self) -> ReadLimit:
        opts = self.options
        if opts.max_offsets_per_trigger:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        if opts.min_offsets_per_trigger:
            return ReadMinRows(opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    @user_facing
    def prepareForTriggerAvailableNow(self) -> None:
        _, state = _observe(self.options, refresh=True, what=f"reading the latest offsets of {self._what()}")
        self._target = dict(state.maxs)
        log.info("rocketmq availableNow target: %s", offsets_to_json(self._target))

    def _checked(self, begin: OffsetMap, groups: dict[str, str], state: QueueState) -> OffsetMap:
        return check_checkpoint(begin, groups, state, fail=self.options.fail_on_data_loss, what=self._what())

    def _new_queues(self, start: OffsetMap, latest: OffsetMap, state: QueueState) -> OffsetMap:
        """``start`` plus the queues that appeared since, at their min offset (above 0: their first messages
        expired before the stream saw them, which is data loss)."""
        new = {k: state.mins[k] for k in latest if k not in start}
        lost = {k: v for k, v in new.items() if v > 0}
        if lost:
            msg = (f"new queue(s) of {self._what()} start above offset 0, their first messages expired unread: "
                   + ", ".join(f"{k} starts at {v}" for k, v in sorted(lost.items())[:3]))
            if self.options.fail_on_data_loss:
                raise DataLossError(msg + ". Set failOnDataLoss=false to start them at their min offset")
            log.warning("%s; starting at the min offset (failOnDataLoss=false)", msg)
        return {**start, **new}

    def _groups_of(self, offsets: OffsetMap, state: QueueState, old: dict[str, str]) -> dict[str, str | None]:
        """Identities to checkpoint with ``offsets``: the current ones, the checkpoint's where unknown now."""
        return {name: state.identities.get(name) or old.get(name) for name in {k.broker_name for k in offsets}}

    def _delay(self, start: OffsetMap, latest: OffsetMap) -> bool:
        """Whether ``minOffsetsPerTrigger`` skips this trigger (:class:`MinOffsetsGate`; availableNow never waits)."""
        if self._gate is None or self._target is not None:
            return False
        new = sum(max(0, v - start.get(k, 0)) for k, v in latest.items())
        if self._gate.admit(new):
            return False
        log.debug("rocketmq: %d new offsets < minOffsetsPerTrigger=%d: waiting", new, self._gate.min_offsets)
        return True

    @user_facing
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self.options
        begin, old_groups = offsets_from_json(start), groups_from_json(start)
        _, state = _observe(opts, refresh=True, what=f"planning a micro-batch of {self._what()}")
        checked = self._checked(begin, old_groups, state)
        latest = dict(state.maxs)
        self._latest = dict(latest)
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, state.mins[k])) for k, v in latest.items()}
        full_start = self._new_queues(checked, latest, state)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_offsets_per_trigger
        if isinstance(limit, ReadAllAvailable) or not max_rows:
            end = {k: max(v, full_start[k]) for k, v in latest.items()}
        else:
            end = rate_limit(full_start, latest, max_rows)
        if not isinstance(limit, ReadAllAvailable) and checked == begin and set(latest) <= set(begin) \
                and self._delay(full_start, latest):
            return start  # the same offsets: Spark runs no micro-batch this trigger
        doc = offsets_to_json(end, self._groups_of(end, state, old_groups))
        self._planned = (_text(start), _text(doc), full_start, state)
        return doc

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest is not None else None

    @user_facing
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        opts = self.options
        what = f"planning a micro-batch of {self._what()}"
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        planned = self._planned
        if planned is not None and planned[0] == _text(start) and planned[1] == _text(end):
            checked, state = planned[2], planned[3]  # latestOffset just checked this start against the cluster
            view_brokers = None
        else:  # a micro-batch replayed from the offset log: check both ends against the cluster now
            view, state = _observe(opts, refresh=True, what=what)
            view_brokers = view.brokers
            self._check_end(stop, groups_from_json(end), state)
            checked = self._new_queues(self._checked(begin, groups_from_json(start), state),
                                       {k: v for k, v in stop.items() if k in state.maxs}, state)
        self._planned = None
        client = _client(opts)
        with _asking(opts, what):
            brokers = view_brokers or cluster_view(client, opts, refresh=False,
                                                   list_topics=_topic_lister(opts)).brokers
            if not self._slaves_checked:  # once per query run: the first micro-batch it plans
                check_slave_reads(opts.nameserver, brokers, client_config=opts.client_config())
                self._slaves_checked = True
        ranges = plan_ranges(
            {k: v for k, v in checked.items() if k in stop}, stop, routes=brokers,
            min_partitions=opts.min_partitions, max_records_per_partition=opts.max_records_per_partition,
        )
        return [RangePartition(r) for r in ranges]

    def _check_end(self, stop: OffsetMap, groups: dict[str, str], state: QueueState) -> None:
        """A replayed micro-batch's end must still be in the same stores and queues (with
        ``failOnDataLoss=false`` the replay reads what is left, start checks decide where from)."""
        problems = [f"broker group {name} holds another store than the offset log's (group identity "
                    f"{cur[:8]}... now, {old[:8]}... then)" for name, (old, cur) in foreign_groups(groups, state.identities).items()]
        problems += [f"{k} ends at {v}, beyond its max offset {state.maxs[k]}" for k, v in sorted(stop.items())
                     if k in state.maxs and v > state.maxs[k] and k.broker_name in state.from_master]
        if problems and self.options.fail_on_data_loss:
            raise DataLossError(
                f"the micro-batch being replayed from the checkpoint of this query does not fit {self._what()} any "
                f"more: {'; '.join(problems[:3])}. Set failOnDataLoss=false to go on from the earliest offsets "
                "still there, or give the query a new checkpointLocation")
        if problems:
            log.warning("replayed micro-batch does not fit %s: %s (failOnDataLoss=false)", self._what(),
                        "; ".join(problems))

    @user_facing_iter
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        opts = self.options
        if not opts.commit_offsets_to_broker or opts.group is None:
            return
        try:
            client = _client(opts)
            by_group: dict[str, list[tuple[Any, int]]] = {}
            for k, off in offsets_from_json(end).items():
                by_group.setdefault(k.broker_name, []).append((k.message_queue, off))
            for broker_name, items in by_group.items():
                addrs = client.broker_addrs(items[0][0].topic, broker_name)
                master = addrs.get(0)
                if master is None:
                    continue  # slaves never take consumer-offset commits; this is best effort
                client.commit_offsets(master, opts.group, items)
        except ClientError as e:
            log.warning("best-effort commit of consumer offsets for group %s failed: %s", opts.group, e)

    def stop(self) -> None:
        """Nothing to release: Spark may never call this; pooled clients close at process exit."""


def _text(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


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

    @user_facing
    def schema(self) -> StructType:
        opts = parse_source_options(self.options, streaming=None)
        return spark_schema(opts.include_properties)

    @user_facing
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_source_options(self.options, streaming=False)
        _check_user_schema(schema, opts)
        return RocketMQFilteringBatchReader(opts) if opts.filter_pushdown else RocketMQBatchReader(opts)

    @user_facing
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options, streaming=True)
        _check_user_schema(schema, opts)
        return RocketMQStreamReader(opts)

    @user_facing
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_connector.sink import make_batch_writer

        return make_batch_writer(self.options, schema, overwrite)

    @user_facing
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_connector.sink import make_stream_writer

        return make_stream_writer(self.options, schema, overwrite)
