"""Spark connector benchmarks: decode-to-Arrow alone, sink encoding alone, end-to-end batch read, the writer.

Entry ``run(quick)`` (registered as ``"spark"``): ``python -m benchmarks spark [--quick]``. The full run reads
the acceptance size, **1,000,000 messages of 1 KiB** from 2 broker groups on this machine with ``local[2]``;
``SPLITMQ_SPARK_BENCH_ROWS`` overrides the read size (the writer uses a fifth of it, at least 20,000 rows) and
``--quick`` uses 20,000 rows for CI. The brokers run with their defaults: a slave serves 1024 messages / 4 MiB
per pull (a master keeps RocketMQ's 32 / 256 KiB).

The pieces are callable on their own: :func:`bench_decode` and :func:`bench_encode` need neither Spark nor a
cluster; :func:`bench_batch_read` and :func:`bench_writer` take a SparkSession and a nameserver address;
:func:`bench_spark_floor` a SparkSession only (Spark's own cost per row of a Python data source, no connector).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import Row
from common.codec import (
    UniqKeyGenerator,
    decode_records,
    encode_batch,
    encode_properties,
    pack_host,
    record_size,
    write_record,
)
from common.message import Message
from common.properties import KEYS, TAGS, UNIQ_KEY
from spark_connector.arrow import decode_to_batch, messages_to_batch
from spark_connector.options import DEFAULT_PULL_BATCH_SIZE
from spark_connector.send import ChunkBuilder, ItemEncoder, encode_columns

__all__ = ["bench_batch_read", "bench_decode", "bench_encode", "bench_spark_floor", "bench_writer", "run"]

TOPIC = "SparkBench"
READ_TOPIC, TAG_TOPIC = "SparkBenchRead", "SparkBenchTags"
FULL_READ_ROWS = 1_000_000
QUICK_ROWS = 20_000


def _records(n: int, body_size: int) -> bytes:
    buf = bytearray()
    born, store = pack_host("10.0.0.7", 5555), pack_host("127.0.0.1", 10911)
    body = b"x" * body_size
    pos = 0
    for i in range(n):
        props = encode_properties({TAGS: f"Tag{i % 4}", KEYS: f"key{i}", UNIQ_KEY: f"{i:032X}"})
        size = record_size(len(body), len(TOPIC), len(props))
        buf.extend(bytes(size))
        write_record(buf, pos, topic=TOPIC.encode(), queue_id=0, flag=0, queue_offset=i, physical_offset=pos,
                     sys_flag=0, born_timestamp=1_700_000_000_000 + i, born_host=born,
                     store_timestamp=1_700_000_000_001 + i, store_host=store, reconsume_times=0,
                     prepared_tx_offset=0, body=body, body_crc=0, properties=props)
        pos += size
    return bytes(buf)


def bench_decode(n_rows: int = 65_536, *, body_size: int = 1024, rows_per_batch: int = 4096,
                 include_properties: bool = False) -> tuple[float, float]:
    """Rows/s of :func:`decode_to_batch` on stored records, and of the MessageExt path on the same bytes.

    Returns:
        ``(connector rows/s, SDK decode_records + messages_to_batch rows/s)``.
    """
    raw = _records(rows_per_batch, body_size)
    # the reader hands the decoder one Arrow batch worth of pull answers of pullBatchSize records each
    sizes = [0]
    view = memoryview(raw)
    for rec in decode_records(raw):
        sizes.append(sizes[-1] + rec.store_size)
    per = DEFAULT_PULL_BATCH_SIZE
    chunks = [(view[sizes[i]:sizes[min(i + per, len(sizes) - 1)]], 0) for i in range(0, len(sizes) - 1, per)]
    rounds = max(1, n_rows // rows_per_batch)
    decode_to_batch(chunks, topic=TOPIC, broker_name="broker-a", include_properties=include_properties)  # warm-up
    t0 = time.perf_counter()
    for _ in range(rounds):
        decode_to_batch(chunks, topic=TOPIC, broker_name="broker-a", include_properties=include_properties)
    fast = rounds * rows_per_batch / (time.perf_counter() - t0)
    base_rounds = max(1, rounds // 4)
    t0 = time.perf_counter()
    for _ in range(base_rounds):
        messages_to_batch(decode_records(raw, broker_name="broker-a"), 0, include_properties=include_properties)
    slow = base_rounds * rows_per_batch / (time.perf_counter() - t0)
    return fast, slow


def _write_batch(n: int, body_size: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "body": [b"z" * body_size] * n,
        "keys": [f"k{i}" for i in range(n)],
        "tags": ["TagW"] * n,
    })


def bench_encode(n_rows: int = 100_000, *, body_size: int = 100) -> tuple[float, float]:
    """Rows/s of the sink's row encoding alone (no network), and of building SDK ``Message`` batches instead.

    Returns:
        ``(connector encode rows/s, Message + check + encode_batch rows/s)``.
    """
    per = 10_000
    batch = _write_batch(per, body_size)
    rounds = max(1, n_rows // per)
    encoder = ItemEncoder(uniq=UniqKeyGenerator())
    t0 = time.perf_counter()
    for _ in range(rounds):
        builder = ChunkBuilder()
        cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
        for _chunk in encode_columns(cols, per, topic_option=TOPIC, encoder=encoder, builder=builder,
                                     queue_of=lambda *_: None):
            pass
        builder.finish()
    fast = rounds * per / (time.perf_counter() - t0)
    from client.lowlevel import check_batch

    uniq = UniqKeyGenerator()
    t0 = time.perf_counter()
    for _ in range(rounds):
        cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
        msgs = [Message(TOPIC, cols["body"][i], tags=cols["tags"][i], keys=cols["keys"][i]) for i in range(per)]
        for i in range(0, per, 512):
            part = msgs[i:i + 512]
            check_batch(part, 4 << 20)
            encode_batch(part, born_timestamp_ms=0, uniq_keys=[uniq.next() for _ in part])
    slow = rounds * per / (time.perf_counter() - t0)
    return fast, slow


def _fill(ns: str, topic: str, n: int, body_size: int, *, tags: list[str] | None = None) -> float:
    """Store ``n`` messages round-robin over the topic's queues through the sink's sender; returns rows/s.

    ``tags``: row ``i`` gets ``tags[i % len(tags)]`` (None: no tags)."""
    from client import Admin
    from spark_connector.options import parse_sink_options
    from spark_connector.sink import write_arrow_batches

    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=4)
    per = 8192
    cols: dict[str, list[Any]] = {"body": [b"y" * body_size] * per, "keys": [f"k{i}" for i in range(per)]}
    if tags:
        cols["tags"] = [tags[i % len(tags)] for i in range(per)]
    batch = pa.RecordBatch.from_pydict(cols)
    batches = [batch] * (n // per) + ([batch.slice(0, n % per)] if n % per else [])
    t0 = time.perf_counter()
    write_arrow_batches(parse_sink_options({"nameserver": ns, "topic": topic, "sendConcurrency": "8"}), iter(batches))
    return n / (time.perf_counter() - t0)


def _timed_noop(df: Any) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def _reader(spark: Any, ns: str, topic: str, options: dict[str, str] | None = None) -> Any:
    reader = spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    return reader


def bench_batch_read(spark: Any, ns: str, n: int, *, body_size: int = 1024, topic: str = "SparkBenchRead",
                     options: dict[str, str] | None = None, fill: bool = True) -> tuple[float, float]:
    """Rows/s of ``spark.read.format("rocketmq") ... .write.format("noop")`` over ``n`` stored messages, and the
    share of that read's time a read of no rows takes (job start, planning: route and offset lookups).

    ``fill=False``: the topic already holds the ``n`` messages."""
    if fill:
        _fill(ns, topic, n, body_size)
    # start and warm the Python workers: every task of a read of the first 64 offsets of each queue
    _timed_noop(_reader(spark, ns, topic, options).load().where("queueOffset < 64"))
    # every queue starts at its end (no message is stored in 2100): the same planning, no rows
    empty = _reader(spark, ns, topic, options).option("startingTimestamp", "4102444800000").load()
    planning = min(_timed_noop(empty) for _ in range(2))
    elapsed = _timed_noop(_reader(spark, ns, topic, options).load())
    return n / elapsed, planning / elapsed


def _prebuilt_source(batch: pa.RecordBatch) -> type:
    """A Python data source named ``splitmq-prebuilt`` whose every partition yields ``batch`` again and again: the
    connector's schema with no network and no decode. Option ``partitions`` (default 8), ``batches`` per partition.
    Defined here, not at module level, so Spark's workers get the class and its batch by value (cloudpickle)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_connector.arrow import spark_schema

    class _Reader(DataSourceReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.parts = int(options.get("partitions", "8"))
            self.batches = int(options.get("batches", "1"))

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            for _ in range(self.batches):
                yield batch

    class PrebuiltSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "splitmq-prebuilt"

        def schema(self) -> Any:
            return spark_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return _Reader(dict(self.options))

    return PrebuiltSource


def bench_spark_floor(spark: Any, n: int, *, body_size: int = 1024, partitions: int = 8) -> float:
    """Rows/s of Spark reading ``n`` rows of the connector's schema from a source that costs nothing (one prebuilt
    Arrow batch of 4096 decoded 1 KiB messages, yielded again and again) into the ``noop`` sink: what Spark itself
    spends per row of a Python data source on this machine, the ceiling of any connector's read. Same warm-up as
    :func:`bench_batch_read` (a small read first)."""
    per = 4096
    raw = _records(per, body_size)
    batch = decode_to_batch([(memoryview(raw), 1)], topic=READ_TOPIC, broker_name="broker-a", include_properties=False)
    spark.dataSource.register(_prebuilt_source(batch))
    batches = max(1, n // (per * partitions))

    def load(k: int) -> Any:
        return (spark.read.format("splitmq-prebuilt").option("partitions", str(partitions))
                .option("batches", str(k)).load())

    _timed_noop(load(1))
    return batches * per * partitions / _timed_noop(load(batches))


def bench_sdk_read(ns: str, topic: str, *, broker_id: int = 1, max_nums: int = 1024) -> tuple[float, int]:
    """One Python process pulling every queue of ``topic`` to its end with the public SDK's :class:`PullConsumer`
    (``connect_broker_by_user`` with ``default_broker_id`` 1: the slaves only, as ``pullFrom=slave``), ``max_nums`` a
    pull, one pull at a time: rows/s and rows."""
    from client import PullConsumer, PullStatus

    with PullConsumer("spark-bench-sdk", ns, connect_broker_by_user=True, default_broker_id=broker_id) as consumer:
        queues = consumer.fetch_subscribe_message_queues(topic)
        ends = {mq: (consumer.min_offset(mq), consumer.max_offset(mq)) for mq in queues}
        rows = 0
        t0 = time.perf_counter()
        for mq, (offset, end) in ends.items():
            while offset < end:
                r = consumer.pull(mq, offset, max_nums=max_nums)
                if r.pull_status is not PullStatus.FOUND:
                    raise RuntimeError(f"SDK read of {mq} at {offset}: {r.pull_status.name}")
                rows += len(r.msg_found_list)
                offset = r.next_begin_offset
        return rows / (time.perf_counter() - t0), rows


def _slave_bytes(cluster: Any) -> int:
    """Bytes the slave brokers' processes have written so far (``/proc/PID/io`` ``wchar``: their pull answers,
    plus their small log and store writes)."""
    total = 0
    for b in cluster.brokers:
        if b.broker_id != 0 and b.pid:
            for line in Path(f"/proc/{b.pid}/io").read_text().splitlines():
                if line.startswith("wchar:"):
                    total += int(line.split()[1])
    return total


def bench_pushdown(spark: Any, cluster: Any, topic: str, n: int) -> tuple[tuple[float, int, int], tuple[float, int, int]]:
    """A selective read, ``WHERE tags = 'Rare'`` (1 row in 16), from the slaves with the filter pushed to them and
    with ``filterPushdown=false`` (Spark filters after reading every row): ``(seconds, bytes the slaves wrote,
    rows)`` of each, best of two."""
    ns = cluster.namesrv_addr
    out = []
    for push in ("true", "false"):
        best: tuple[float, int, int] | None = None
        for _ in range(2):
            df = _reader(spark, ns, topic, {"pullFrom": "slave", "filterPushdown": push}).load().where("tags = 'Rare'")
            b0 = _slave_bytes(cluster)
            t0 = time.perf_counter()
            rows = df.count()
            got = (time.perf_counter() - t0, _slave_bytes(cluster) - b0, rows)
            best = got if best is None or got[0] < best[0] else best
        assert best is not None
        out.append(best)
    if out[0][2] != out[1][2] or out[0][2] != n // 16:
        raise RuntimeError(f"pushdown read {out[0][2]} rows, plain {out[1][2]}, expected {n // 16}")
    return out[0], out[1]


def bench_writer(spark: Any, ns: str, n: int, *, body_size: int = 100, topic: str = "SparkBenchWrite") -> tuple[float, float]:
    """Rows/s of ``df.write.format("rocketmq")``, and of the SDK's ``send_batch`` from one Python process."""
    from client import Admin, Producer

    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=4)
    df = spark.range(n).selectExpr(f"cast(repeat('z', {body_size}) as binary) as body",
                                   "concat('k', cast(id as string)) as keys", "'TagW' as tags").cache()
    df.count()
    df.limit(2).write.format("rocketmq").mode("append").option("nameserver", ns).option("topic", topic).save()
    t0 = time.perf_counter()
    df.write.format("rocketmq").mode("append").option("nameserver", ns).option("topic", topic).save()
    spark_rate = n / (time.perf_counter() - t0)
    df.unpersist()
    body = b"z" * body_size
    m = max(1, n // 4)
    with Producer("spark-bench-direct", ns) as p:
        t0 = time.perf_counter()
        for i in range(0, m, 512):
            p.send_batch([Message(topic, body, tags="TagW", keys=f"k{j}") for j in range(i, min(m, i + 512))])
        sdk_rate = m / (time.perf_counter() - t0)
    return spark_rate, sdk_rate


def _session(master: str = "local[2]") -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master(master).appName("splitmq-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


def _read_rows(quick: bool) -> int:
    env = os.environ.get("SPLITMQ_SPARK_BENCH_ROWS")
    if env:
        return max(1000, int(env))
    return QUICK_ROWS if quick else FULL_READ_ROWS


def run(quick: bool) -> list[Row]:
    """The ``spark`` benchmark entry: decode and encode alone, then a 2-group cluster with a slave per group, the
    same messages read from the slaves by one SDK process, by Spark ``local[2]`` and ``local[1]``, a selective
    read with and without filter pushdown, and the writer."""
    fast, slow = bench_decode(16_384 if quick else 262_144)
    fast_p, slow_p = bench_decode(16_384 if quick else 131_072, include_properties=True)
    enc, enc_sdk = bench_encode(20_000 if quick else 200_000)
    rows = [
        Row("decode to Arrow, 1 KiB bodies", fast, "rows/s", "SDK decode_records + Arrow", slow, ">= 300,000"),
        Row("decode to Arrow + properties map", fast_p, "rows/s", "SDK decode_records + Arrow", slow_p),
        Row("sink encode, 100 B bodies", enc, "rows/s", "SDK Message + encode_batch", enc_sdk),
    ]
    from client.cluster import LocalCluster

    n = _read_rows(quick)
    n_tags = QUICK_ROWS if quick else max(QUICK_ROWS, n // 5) // 16 * 16
    n_write = QUICK_ROWS if quick else max(QUICK_ROWS, n // 5)
    slave = {"pullFrom": "slave"}
    with tempfile.TemporaryDirectory(prefix="splitmq-bench-spark-") as root, \
            LocalCluster(root, broker_groups=2, slaves_per_group=1) as cluster:
        ns = cluster.namesrv_addr
        fill_rate = _fill(ns, READ_TOPIC, n, 1024)
        _fill(ns, TAG_TOPIC, n_tags, 1024, tags=["Rare"] + ["Common"] * 15)
        for group in ("broker-a", "broker-b"):
            cluster.wait_slave_caught_up(group, timeout_s=600)
        sdk, sdk_rows = bench_sdk_read(ns, READ_TOPIC)
        if sdk_rows != n:
            raise RuntimeError(f"the SDK read {sdk_rows} rows of {n}")
        spark = _session("local[2]")
        try:
            read2, plan2 = bench_batch_read(spark, ns, n, topic=READ_TOPIC, options=slave, fill=False)
            floor2 = bench_spark_floor(spark, n)
            pushed, plain = bench_pushdown(spark, cluster, TAG_TOPIC, n_tags)
            write, direct = bench_writer(spark, ns, n_write)
        finally:
            spark.stop()
        spark = _session("local[1]")
        try:
            read1, plan1 = bench_batch_read(spark, ns, n, topic=READ_TOPIC, options=slave, fill=False)
            floor1 = bench_spark_floor(spark, n)
        finally:
            spark.stop()
    what = f"{n:,} x 1 KiB from the slaves, 2 groups"
    rows += [
        Row(f"fill: the sink's sender, 1 process, {n:,} x 1 KiB", fill_rate, "rows/s"),
        Row(f"SDK PullConsumer, 1 process, {what}", sdk, "rows/s"),
        Row(f"Spark local[2] batch read, {what} (planning {plan2:.1%})", read2, "rows/s",
            "SDK PullConsumer, 1 process", sdk, ">= 1.5x"),
        Row(f"Spark local[2] batch read, {what}", read2, "rows/s", "decode to Arrow alone", fast, ">= 0.5x"),
        Row(f"Spark local[1] batch read, {what} (planning {plan1:.1%})", read1, "rows/s", "Spark local[2]", read2),
        Row(f"Spark local[2], {n:,} rows from a source that costs nothing (Spark's own ceiling)", floor2, "rows/s",
            "SDK PullConsumer, 1 process", sdk),
        Row(f"Spark local[1], {n:,} rows from a source that costs nothing", floor1, "rows/s",
            "the same, local[2]", floor2),
        Row(f"tags = 'Rare' (1/16 of {n_tags:,}), pushed to the slaves: seconds", pushed[0], "s",
            "not pushed (filterPushdown=false)", plain[0]),
        Row(f"tags = 'Rare' (1/16 of {n_tags:,}), pushed to the slaves: MB the slaves wrote", pushed[1] / 1e6, "MB",
            "not pushed (filterPushdown=false)", plain[1] / 1e6),
        Row(f"Spark writer {n_write:,} x 100 B, local[2]", write, "rows/s", "SDK send_batch, 1 process", direct),
    ]
    return rows
