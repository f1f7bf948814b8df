"""Spark connector benchmarks: decode-to-Arrow alone, end-to-end batch read, and the Arrow writer.

Entry ``run(quick)`` (register it as ``"spark": "benchmarks.spark_bench:run"``). The three pieces are also
callable on their own: :func:`bench_decode` needs neither Spark nor a cluster; :func:`bench_batch_read` and
:func:`bench_writer` take a SparkSession and a running cluster's nameserver address.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

from benchmarks import Row
from client.protocol.codec import decode_records, encode_properties, pack_host, record_size, write_record
from client.protocol.properties import KEYS, TAGS, UNIQ_KEY
from spark_connector.arrow import decode_to_batch, messages_to_batch

__all__ = ["bench_batch_read", "bench_decode", "bench_writer", "run"]

TOPIC = "SparkBench"


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
    # a pull carries 32 records; the reader hands the decoder the chunks of 128 pulls at once
    sizes = [0]
    view = memoryview(raw)
    for rec in decode_records(raw):
        sizes.append(sizes[-1] + rec.store_size)
    chunks = [(view[sizes[i]:sizes[min(i + 32, len(sizes) - 1)]], 0) for i in range(0, len(sizes) - 1, 32)]
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


def _fill(ns: str, topic: str, n: int, body_size: int) -> None:
    from client import Admin, Message, MessageQueue, Producer

    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=4)
        route = admin.topic_route(topic)
        queues = [MessageQueue(topic, bd.broker_name, q) for bd in route.broker_datas for q in range(4)]
    body = b"y" * body_size
    with Producer("spark-bench-fill", ns) as p:
        for i in range(0, n, 256):
            mq = queues[(i // 256) % len(queues)]
            p.send_batch([Message(topic, body, keys=f"k{j}") for j in range(i, min(n, i + 256))], mq)


def bench_batch_read(spark: Any, ns: str, n: int, *, body_size: int = 1024, topic: str = "SparkBenchRead") -> float:
    """Rows/s of ``spark.read.format("rocketmq") ... .write.format("noop")`` over ``n`` stored messages."""
    _fill(ns, topic, n, body_size)
    df = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
          .option("pullBatchSize", "256").load())
    warm = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", topic)
            .option("endingOffsets", "{}").load())
    warm.write.format("noop").mode("overwrite").save()  # start and warm both Python workers
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return n / (time.perf_counter() - t0)


def bench_writer(spark: Any, ns: str, n: int, *, body_size: int = 100, topic: str = "SparkBenchWrite") -> tuple[float, float]:
    """Rows/s of ``df.write.format("rocketmq")``, and of the SDK's ``send_batch`` from one Python process."""
    from client import Admin, Message, Producer

    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=4)
    df = spark.range(n).selectExpr(f"cast(repeat('z', {body_size}) as binary) as body",
                                   "concat('k', cast(id as string)) as keys", "'TagW' as tags").cache()
    df.count()
    df.limit(2).write.format("rocketmq").mode("append").option("nameserver", ns).option("topic", topic).save()
    t0 = time.perf_counter()
    df.write.format("rocketmq").mode("append").option("nameserver", ns).option("topic", topic).save()
    spark_rate = n / (time.perf_counter() - t0)
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


def run(quick: bool) -> list[Row]:
    """The ``spark`` benchmark entry: decode alone, then (Java permitting) a cluster with a Spark session."""
    fast, slow = bench_decode(16_384 if quick else 262_144)
    fast_p, slow_p = bench_decode(16_384 if quick else 131_072, include_properties=True)
    rows = [
        Row("decode to Arrow, 1 KiB bodies", fast, "rows/s", "SDK decode_records + Arrow", slow, ">= 300,000"),
        Row("decode to Arrow + properties map", fast_p, "rows/s", "SDK decode_records + Arrow", slow_p),
    ]
    from client.cluster import LocalCluster

    n = 20_000 if quick else 200_000
    with tempfile.TemporaryDirectory(prefix="splitmq-bench-spark-") as root, \
            LocalCluster(root, broker_groups=2, slaves_per_group=0) as cluster:
        spark = _session()
        try:
            read = bench_batch_read(spark, cluster.namesrv_addr, n)
            write, direct = bench_writer(spark, cluster.namesrv_addr, n)
        finally:
            spark.stop()
    rows.append(Row(f"Spark batch read {n} x 1 KiB, local[2]", read, "rows/s", "decode to Arrow alone", fast,
                    ">= 100,000"))
    rows.append(Row(f"Spark Arrow writer {n} x 100 B, local[2]", write, "rows/s", "SDK send_batch, 1 process",
                    direct, ">= 500,000 excl. broker"))
    return rows
