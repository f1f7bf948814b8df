"""Stream a SplitMQ topic into Parquet with Structured Streaming (exactly-once into the file sink).

    python examples/spark_streaming.py                       # a throw-away local cluster and output
    python examples/spark_streaming.py --out /tmp/out        # run it again: it goes on where it stopped
    python examples/spark_streaming.py --namesrv 127.0.0.1:9876 --topic TopicTest --out /tmp/out

Each run produces ``2 x --messages`` messages in two rounds and reads them with an ``availableNow`` query (what
is there, at most ``maxOffsetsPerTrigger`` offsets per micro-batch, then it stops). With ``--out`` the query's
checkpoint and, without ``--namesrv``, the local cluster's stores are kept under that directory, so a second
run with the same ``--out`` restarts the same cluster and reads only what was produced since.

The checkpoint belongs to that cluster: it holds each broker group's store identity next to its offsets. Point
it at another cluster (delete ``<out>/cluster``, or pass another ``--namesrv``) and the query stops with one
line saying so (``failOnDataLoss``) instead of skipping or re-reading messages without a word.

Needs the spark extra (``pip install -e '.[spark]'``) and Java 17+.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def _nameserver(addr: str | None, store: str) -> Iterator[str]:
    if addr:
        yield addr
        return
    from client.cluster import LocalCluster

    with LocalCluster(store, broker_groups=2, slaves_per_group=1) as cluster:
        yield cluster.namesrv_addr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namesrv", help="nameserver host:port (default: start a local cluster)")
    parser.add_argument("--topic", default="SparkStreamExample")
    parser.add_argument("--messages", type=int, default=300, metavar="N",
                        help="messages to produce per round, a multiple of 50 (default 300)")
    parser.add_argument("--out", default=None,
                        help="output directory, kept with the checkpoint and the local cluster (default: a "
                             "temporary one, removed at the end)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with contextlib.ExitStack() as stack:
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory(prefix="splitmq-stream-out-"))
        return _run(args, os.path.abspath(out))


def _run(args: argparse.Namespace, out: str) -> int:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    import spark_connector
    from client import Admin, Message, Producer

    with _nameserver(args.namesrv, os.path.join(out, "cluster")) as ns:
        with Admin(ns) as admin:
            admin.create_topic(args.topic, queue_nums=4)
        spark = (SparkSession.builder.master("local[2]").appName("splitmq-stream-example")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("OFF")  # the query's own failure is printed below, in one line
        spark_connector.register(spark)
        try:
            for round_no in range(2):
                with Producer("example-producer", ns) as producer:
                    for i in range(0, args.messages, 50):
                        producer.send_batch([Message(args.topic, f"round {round_no} msg {j}".encode(), keys=f"k{j}")
                                             for j in range(i, i + 50)])
                query = (spark.readStream.format("rocketmq").option("nameserver", ns).option("topic", args.topic)
                         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
                         .selectExpr("brokerName", "queueId", "queueOffset", "cast(body as string) as body",
                                     "storeTimestamp")
                         .writeStream.format("parquet").option("path", f"{out}/data")
                         .option("checkpointLocation", f"{out}/checkpoint").trigger(availableNow=True).start())
                try:
                    query.awaitTermination()
                except StreamingQueryException as e:
                    print(f"the query stopped: {str(e).splitlines()[0]}")
                    return 2
                batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
                print(f"round {round_no}: micro-batches of {batches} rows")
            total = spark.read.parquet(f"{out}/data").count()
            with Admin(ns) as admin:  # every message of the topic came from this example
                produced = sum(high for _, _, high in admin.topic_offsets(args.topic))
            print(f"{total} rows in {out}/data ({produced} produced; restarts added no duplicates)")
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
