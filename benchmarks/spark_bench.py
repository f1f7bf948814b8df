"""Spark connector benchmarks: decode-to-Arrow alone, sink encoding alone, end-to-end batch read, the writer.

Entry ``run(quick)`` (registered as ``"spark"``): ``python -m benchmarks spark [--quick]``. The full run reads
the acceptance size, **1,000,000 messages of 1 KiB** from 2 broker groups on this machine with ``local[2]``;
``SPLITMQ_SPARK_BENCH_ROWS`` overrides the read size (the writer uses a fifth of it, at least 20,000 rows) and
``--quick`` uses 20,000 rows for CI. The brokers run with the transfer caps raised as the connector docs advise
for analytical reads (:data:`ANALYTICS_BROKER_CONFIG`); RocketMQ's defaults (32 messages / 256 KiB per pull)
cost the reader more round trips, which its pipelined pulls hide only partly.

The pieces are callable on their own: :func:`bench_decode` and :func:`bench_encode` need neither Spark nor a
cluster; :func:`bench_batch_read` and :func:`bench_writer` take a SparkSession and a nameserver address.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
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

__all__ = ["ANALYTICS_BROKER_CONFIG", "bench_batch_read", "bench_decode", "bench_encode", "bench_writer", "run"]

TOPIC = "SparkBench"
#: Broker settings for analytical reads: a pull may carry 1024 messages / 4 MiB (RocketMQ default 32 / 256 KiB).
ANALYTICS_BROKER_CONFIG = {"maxTransferCountOnMessageInMemory": "1024", "maxTransferBytesOnMessageInMemory": "4194304"}
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


def _fill(ns: str, topic: str, n: int, body_size: int) -> float:
    """Store ``n`` messages round-robin over the topic's queues through the sink's sender; returns rows/s."""
    from client import Admin
    from spark_connector.options import parse_sink_options
    from spark_connector.sink import write_arrow_batches

    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=4)
    per = 8192
    batch = pa.RecordBatch.from_pydict({"body": [b"y" * body_size] * per, "keys": [f"k{i}" for i in range(per)]})
    batches = [batch] * (n // per) + ([batch.slice(0, n % per)] if n % per else [])
    t0 = time.perf_counter()
    write_arrow_batches(parse_sink_options({"nameserver": ns, "topic": topic}), iter(batches))
    return n / (time.perf_counter() - t0)


def bench_batch_read(spark: Any, ns: str, n: int, *, body_size: int = 1024, topic: str = "SparkBenchRead",
                     options: dict[str, str] | None = None) -> float:
    """Rows/s of ``spark.read.format("rocketmq") ... .write.format("noop")`` over ``n`` stored messages."""
    _fill(ns, topic, n, body_size)
    reader = spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    df = reader.load()
    warm = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
            .option("endingOffsets", "{}").load())
    warm.write.format("noop").mode("overwrite").save()  # start and warm both Python workers
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return n / (time.perf_counter() - t0)


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


def _session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master("local[2]").appName("splitmq-spark-bench")
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
    """The ``spark`` benchmark entry: decode and encode alone, then a 2-group cluster with a Spark session."""
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
    n_write = QUICK_ROWS if quick else max(QUICK_ROWS, n // 5)
    with tempfile.TemporaryDirectory(prefix="splitmq-bench-spark-") as root, \
            LocalCluster(root, broker_groups=2, slaves_per_group=0, broker_config=ANALYTICS_BROKER_CONFIG) as cluster:
        spark = _session()
        try:
            read = bench_batch_read(spark, cluster.namesrv_addr, n)
            write, direct = bench_writer(spark, cluster.namesrv_addr, n_write)
        finally:
            spark.stop()
    rows.append(Row(f"Spark batch read {n:,} x 1 KiB, 2 groups, local[2]", read, "rows/s", "decode to Arrow alone",
                    fast, ">= 100,000"))
    rows.append(Row(f"Spark writer {n_write:,} x 100 B, local[2]", write, "rows/s", "SDK send_batch, 1 process",
                    direct))
    return rows
