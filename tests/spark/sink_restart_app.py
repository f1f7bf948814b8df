"""The streaming query of the exactly-once sink test (tests/spark/test_standalone.py), run as its own process so
that the test can SIGKILL it mid-batch and start it again from its checkpoint.

    python tests/spark/sink_restart_app.py SPARK_MASTER_URL NAMESRV CHECKPOINT RUN

It reads topic ``SinkIn`` from its earliest offset, ``ROWS_PER_BATCH`` offsets per micro-batch, and writes each
row's body to topic ``SinkOut`` with the ``rocketmq`` sink (idempotent, the default). The rows pass through a
``mapInArrow`` that hands them on in slices of ``SLICE`` rows with a pause after each, so that a micro-batch's
sends are spread over seconds and a kill lands inside one. ``RUN`` is ``first`` (runs until killed) or
``restart`` (``availableNow``: replays the batch the kill interrupted, reads what is left, then exits 0 and
prints ``DONE``). ``SINK_IDEMPOTENT=false`` in the environment turns the sink's idempotence off (to see the
duplicates the test guards against).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

import spark_connector

IN_TOPIC, OUT_TOPIC = "SinkIn", "SinkOut"
ROWS_PER_BATCH = 4000
SLICE = 250
PAUSE_S = 0.15


def paced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows unchanged, in the same order, ``SLICE`` at a time with a pause after each."""
    for batch in batches:
        for start in range(0, batch.num_rows, SLICE):
            yield batch.slice(start, SLICE)
            time.sleep(PAUSE_S)  # pacing the workload so that the kill lands mid-batch, not synchronisation


def main() -> int:
    master, namesrv, checkpoint, run = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(master).appName("splitmq-sink-restart")
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    rows = (spark.readStream.format("rocketmq").option("nameserver", namesrv).option("topic", IN_TOPIC)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(ROWS_PER_BATCH)).load()
            .select("body")
            .mapInArrow(paced, "body binary"))
    writer = (rows.writeStream.format("rocketmq").option("nameserver", namesrv).option("topic", OUT_TOPIC)
              .option("idempotent", os.environ.get("SINK_IDEMPOTENT", "true"))
              .option("checkpointLocation", checkpoint))
    if run == "restart":
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    print(f"STARTED {query.id} {time.time():.3f}", flush=True)
    query.awaitTermination()
    spark.stop()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
