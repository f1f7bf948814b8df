"""Batch-read a SplitMQ topic with PySpark, and write rows back with the ``rocketmq`` sink.

    python examples/spark_batch_read.py                      # starts a throw-away local cluster
    python examples/spark_batch_read.py --namesrv "$NAMESRV_ADDR" --topic TopicTest
    python examples/spark_batch_read.py --namesrv "$NAMESRV_ADDR" --master spark://127.0.0.1:7077

Needs the spark extra (``pip install '.[spark]'`` from the repository's root) and Java 17+. docs/SPARK.md runs
it on a standalone cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def _nameserver(addr: str | None) -> Iterator[str]:
    if addr:
        yield addr
        return
    from client.cluster import LocalCluster

    # brokers that serve analytical reads should let one pull carry more than RocketMQ's 32 messages / 256 KiB
    analytics = {"maxTransferCountOnMessageInMemory": "1024", "maxTransferBytesOnMessageInMemory": "4194304"}
    with tempfile.TemporaryDirectory(prefix="splitmq-example-") as root, \
            LocalCluster(root, broker_groups=2, slaves_per_group=1, broker_config=analytics) as cluster:
        yield cluster.namesrv_addr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namesrv", help="nameserver host:port (default: start a local cluster)")
    parser.add_argument("--topic", default="SparkExample")
    parser.add_argument("--messages", type=int, default=100, metavar="N", help="messages to produce (default 100)")
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must use this interpreter

    from pyspark.sql import SparkSession

    import spark_connector
    from client import Admin, Message, Producer

    with _nameserver(args.namesrv) as ns:
        with Admin(ns) as admin:
            admin.create_topic(args.topic, queue_nums=4)
        with Producer("example-producer", ns) as producer:
            producer.send_batch([Message(args.topic, f"hello {i}".encode(), tags="TagA", keys=f"order-{i}")
                                 for i in range(args.messages)])

        spark = (SparkSession.builder.master(args.master).appName("splitmq-batch-example")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark_connector.register(spark)
        try:
            df = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", args.topic)
                  .option("startingOffsets", "earliest").load())
            print(f"{df.count()} messages in {df.rdd.getNumPartitions()} partition(s) (one per non-empty queue)")
            df.selectExpr("brokerName", "queueId", "queueOffset", "tags", "keys", "cast(body as string) as body",
                          "servedBy").orderBy("brokerName", "queueId", "queueOffset").show(5, truncate=False)
            # Write a transformed copy back; the sink only appends (each row once, even when Spark retries a task).
            (df.selectExpr("upper(cast(body as string)) as body", "keys", "'TagB' as tags")
               .write.format("rocketmq").mode("append").option("nameserver", ns).option("topic", args.topic)
               .save())
            tagged = (spark.read.format("rocketmq").option("nameserver", ns).option("topic", args.topic)
                      .option("subExpression", "TagB").load())
            print(f"{tagged.count()} messages with tag TagB after the write")
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
