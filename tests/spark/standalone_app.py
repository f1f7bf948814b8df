"""The Spark application of tests/spark/test_standalone.py, run as its own process against a standalone cluster.

    python tests/spark/standalone_app.py SPARK_MASTER_URL NAMESRV WORKDIR

It does what docs/SPARK.md tells a user to do on a cluster (``PYSPARK_PYTHON`` names the interpreter that has
the connector), then a batch read, a streaming read stopped and restarted from its checkpoint, and a write,
and prints one ``RESULT {json}`` line for the test to check.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import spark_connector
from client import Message, Producer

TOPIC, OUT_TOPIC = "StandaloneIn", "StandaloneOut"


def produce(namesrv: str, first: int, n: int) -> None:
    with Producer("standalone-app", namesrv) as producer:
        producer.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(first, first + n)])


def main() -> int:
    master, namesrv, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the Python workers' interpreter, before the session (docs/SPARK.md)
    wrong = os.environ.get("SPLITMQ_TEST_WORKER_PYTHON")  # the test's check of the refusal: a bare interpreter
    if wrong:
        os.environ["PYSPARK_PYTHON"] = wrong
    spark = (SparkSession.builder.master(master).appName("splitmq-standalone-test")
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark_connector.register(spark)
    except RuntimeError as e:
        spark.stop()
        print("REFUSED " + str(e), flush=True)
        return 3
    result: dict[str, object] = {}
    try:
        reader = spark.read.format("rocketmq").option("nameserver", namesrv).option("topic", TOPIC)
        result["batch"] = sorted(bytes(r.body).decode() for r in reader.load().select("body").collect())

        seen: list[str] = []

        def sink(df: object, _batch_id: int) -> None:
            seen.extend(bytes(r.body).decode() for r in df.select("body").collect())  # type: ignore[attr-defined]

        def stream_once() -> None:
            q = (spark.readStream.format("rocketmq").option("nameserver", namesrv).option("topic", TOPIC)
                 .option("startingOffsets", "earliest").load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(workdir / "ckpt"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(120)
            if q.isActive:
                raise SystemExit("the availableNow query did not finish within 120 s")

        stream_once()
        result["stream_first"] = sorted(seen)
        seen.clear()
        produce(namesrv, 100, 10)
        stream_once()  # restarted from the checkpoint: only the new messages
        result["stream_restart"] = sorted(seen)

        df = spark.createDataFrame([(f"w{i}".encode(),) for i in range(30)], "body binary")
        df.write.format("rocketmq").mode("append").option("nameserver", namesrv).option("topic", OUT_TOPIC).save()
        out = spark.read.format("rocketmq").option("nameserver", namesrv).option("topic", OUT_TOPIC).load()
        result["written"] = sorted(bytes(r.body).decode() for r in out.select("body").collect())
        result["executors"] = spark.sparkContext.master
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
