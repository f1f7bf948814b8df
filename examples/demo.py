"""The SplitMQ tour that ``make demo`` runs.

1. Start a local cluster: a nameserver and two broker groups (broker-a, broker-b), each a master and a slave.
2. Produce messages in batches to a topic with 4 queues per group.
3. Read them back: the first pull of each queue goes to the master, which tells a slow consumer (we set
   ``accessMessageInMemoryMaxRatio=0`` so every consumer counts as slow) to read from the slave instead.
4. Kill broker-a's master with SIGKILL and keep consuming broker-a's queues from its slave, while the producer
   keeps writing to broker-b.
5. Read the whole topic with Spark through the same routing (skipped with a note if Java is missing).
6. Print a summary with the figures, stop everything.

Each figure says what it includes: the produce rate is timed after a warm-up (a fresh broker first creates and
pre-faults its commit-log file), and the Spark read is timed twice (the first query also starts Spark's Python
workers). What is expected and harmless is kept off the screen: Spark logs at ERROR through its own log4j2
file, the JVM's start-up banner lines are dropped, and the connection-refused retries aimed at the master
killed in step 4 become one line saying it is skipped. Anything else on stderr is shown as it comes.

Run: ``python examples/demo.py [--messages N] [--no-spark] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import ClientError

TOPIC = "DemoTopic"
WARMUP_TOPIC = "DemoWarmup"
GROUP = "demo-consumers"
BATCH = 64

#: Spark's logging for the demo: errors only, to stderr (its default profile logs every WARN and says so).
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""
#: What the connector logs while it retries a member that is gone.
REFUSED = re.compile(r"Connection refused|ConnectError|connect to \S+ failed")
#: Lines the JVM prints whatever log4j says (start-up banners): expected, harmless, dropped.
JVM_NOISE = re.compile(r"^(WARNING: Using incubator modules|Using Spark's default log4j profile|Setting default log "
                       r"level to|To adjust logging level use)")


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def produce(namesrv: str, count: int, tag: str, topic: str = TOPIC) -> tuple[int, float]:
    """Send ``count`` 1 KiB messages in batches of BATCH (each batch one request to one queue), one thread."""
    sent = 0
    with Producer("demo-producer", namesrv) as producer:
        producer.client.try_to_find_topic_publish_info(topic)  # route lookup outside the timing
        start = time.perf_counter()
        while sent < count:
            n = min(BATCH, count - sent)
            batch = [Message(topic, f"{tag}-{sent + i}".encode().ljust(1024, b"."), tags=tag, keys=[f"k{sent + i}"])
                     for i in range(n)]
            producer.send_batch(batch)
            sent += n
        elapsed = time.perf_counter() - start
    return sent, elapsed


def drain(consumer: PullConsumer, queues: list[MessageQueue], offsets: dict[MessageQueue, int],
          served: Counter[int], *, show: int = 0, deadline_s: float = 30.0) -> int:
    """Pull every queue up to its current end; returns messages read. Prints the first ``show`` pulls."""
    got = 0
    shown = 0
    deadline = time.monotonic() + deadline_s
    for mq in queues:
        while time.monotonic() < deadline:
            try:
                r = consumer.pull(mq, offsets.get(mq, 0), max_nums=32)
            except ClientError as e:
                if e.retriable:
                    time.sleep(0.1)  # the route or the slave is catching up; try again shortly
                    continue
                raise
            if shown < show:
                print(f"   pull {mq}: {r.pull_status.name:<8} {len(r.msg_found_list):>2} msgs served by id "
                      f"{r.served_by_broker_id}, broker suggests id {r.suggest_which_broker_id} next")
                shown += 1
            if r.pull_status is PullStatus.FOUND:
                got += len(r.msg_found_list)
                served[r.served_by_broker_id] += len(r.msg_found_list)
                offsets[mq] = r.next_begin_offset
            elif r.pull_status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_ILLEGAL):
                break
            else:
                offsets[mq] = r.next_begin_offset
    return got


class QuietStderr:
    """For the Spark step: this process's stderr -- inherited by the JVM and Spark's Python workers -- goes
    through a pipe; JVM banner lines are dropped, and lines about the master killed in step 4 (the connector
    retrying it, then reading from its slave) become one line, once. Everything else is passed on as it comes.

    The reader thread outlives the step (the JVM keeps the pipe until this process exits) and keeps filtering.
    """

    def __init__(self, killed_name: str, killed_addr: str) -> None:
        self.killed_name = killed_name
        self.killed_addr = killed_addr
        self.skipped = 0
        self._saved = -1

    def __enter__(self) -> QuietStderr:
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        self._saved = os.dup(2)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        threading.Thread(target=self._pump, args=(read_fd, os.dup(self._saved)), daemon=True,
                         name="demo-stderr").start()
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)

    def _pump(self, read_fd: int, out_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as lines, os.fdopen(out_fd, "wb", buffering=0) as out:
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                if JVM_NOISE.match(text):
                    continue
                if self.killed_addr in text and REFUSED.search(text):
                    self.skipped += 1
                    if self.skipped == 1:
                        out.write(f"   ({self.killed_name}'s master at {self.killed_addr} is down since step 4: "
                                  f"Spark skips it and reads {self.killed_name} from its slave)\n".encode())
                    continue
                out.write(raw)


def spark_read(namesrv: str, root: Path, quiet: QuietStderr) -> tuple[int, float, float] | None:
    """Read the topic twice with Spark; returns (rows, first query s, second query s), None when skipped."""
    if shutil.which("java") is None:
        print("   (skipped: no Java on this machine; Spark needs Java 17)")
        return None
    try:
        from pyspark.sql import SparkSession

        import spark_connector
    except ImportError as e:
        print(f"   (skipped: {e})")
        return None
    # Spark's Python workers must run this interpreter (the one with pyarrow and the connector installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log4j = root / "log4j2-demo.properties"
    log4j.write_text(LOG4J2)
    with quiet:
        spark = (SparkSession.builder.master("local[2]").appName("splitmq-demo")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            spark_connector.register(spark)
            timings = []
            for _ in range(2):  # the first query also starts Spark's Python workers; the second is the read alone
                start = time.perf_counter()
                df = spark.read.format("rocketmq").option("nameserver", namesrv).option("topic", TOPIC).load()
                rows = df.groupBy("brokerName", "servedBy").count().orderBy("brokerName", "servedBy").collect()
                timings.append(time.perf_counter() - start)
        finally:
            spark.stop()
    total = 0
    for row in rows:
        print(f"   {row['brokerName']}: {row['count']} rows served by broker id {row['servedBy']}")
        total += row["count"]
    return total, timings[0], timings[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000, help="messages per produce step (default 4000)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark step")
    parser.add_argument("--root", help="cluster directory (default: a temporary one, removed at the end)")
    args = parser.parse_args()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="splitmq-demo-"))
    figures: dict[str, str] = {}
    t0 = time.perf_counter()

    step("1. start a nameserver and two broker groups, each a master and a slave")
    broker_config = {"accessMessageInMemoryMaxRatio": "0", "slaveReadEnable": "true"}
    with LocalCluster(root, broker_groups=2, slaves_per_group=1, mode="async", broker_config=broker_config) as cluster:
        print(f"   nameserver {cluster.namesrv_addr}")
        for b in cluster.brokers:
            print(f"   {b.name} id={b.broker_id} pid={b.pid} addr={b.addr} ha={b.ha_addr}")
        admin = Admin(cluster.namesrv_addr)
        admin.create_topic(TOPIC, queue_nums=4)
        admin.create_topic(WARMUP_TOPIC, queue_nums=4)

        step(f"2. produce {args.messages} messages of 1 KiB in batches of {BATCH}")
        # A fresh broker creates and pre-faults its first commit-log file on the first writes: warm up on
        # another topic, so the figure is the steady rate, not the file set-up.
        warm, _ = produce(cluster.namesrv_addr, max(args.messages // 2, BATCH * 8), "warmup", WARMUP_TOPIC)
        n, secs = produce(cluster.namesrv_addr, args.messages, "first")
        figures["produce"] = (f"{n} msgs in {secs:.2f} s ({n / secs:,.0f} msgs/s): one thread, each batch of {BATCH} "
                              f"acknowledged before the next, after {warm} warm-up msgs")
        print(f"   {figures['produce']}")
        print("   (python -m benchmarks client measures the SDK's throughput; splitmq produce --count uses threads)")
        for name in cluster.group_names:
            cluster.wait_slave_caught_up(name, timeout_s=30)
        print("   both slaves caught up with their masters")

        step("3. consume: the master serves the first pull and sends this slow consumer to its slave")
        served: Counter[int] = Counter()
        offsets: dict[MessageQueue, int] = {}
        with PullConsumer(GROUP, cluster.namesrv_addr) as consumer:
            queues = sorted(consumer.fetch_subscribe_message_queues(TOPIC))
            got = drain(consumer, queues, offsets, served, show=4)
            print(f"   read {got} messages: {served[0]} served by masters, {served[1]} by slaves")
            figures["read/write split"] = f"{served[1]} of {got} messages served by slaves"

            step("4. kill broker-a's master (SIGKILL); keep consuming from its slave, keep producing to broker-b")
            killed = cluster.broker("broker-a", 0)
            killed.kill()
            killed_at = time.monotonic()
            n2, _ = produce(cluster.namesrv_addr, args.messages // 4, "after-kill")
            print(f"   produced {n2} more messages while broker-a has no master (they all went to broker-b)")
            served_after: Counter[int] = Counter()
            got2 = drain(consumer, queues, offsets, served_after, show=2)
            figures["failover"] = (f"{got2} more messages read after the kill, first pull answered "
                                   f"{time.monotonic() - killed_at:.2f} s after it")
            print(f"   {figures['failover']}; total read {got + got2} of {n + n2}")
            if got + got2 != n + n2:
                print("   MISMATCH: some messages were not read", file=sys.stderr)
                return 1

        step("5. read the topic with Spark (format 'rocketmq'), routed like the SDK")
        quiet = QuietStderr("broker-a", killed.addr)
        result = None if args.no_spark else spark_read(cluster.namesrv_addr, root, quiet)
        if result is not None:
            rows, first_s, again_s = result
            figures["spark"] = (f"{rows} rows in {again_s:.1f} s (the first query took {first_s:.1f} s: it also "
                                f"starts Spark's Python workers)")
        admin.close()

    step("summary")
    for k, v in figures.items():
        print(f"   {k:<17} {v}")
    print(f"   total time        {time.perf_counter() - t0:.1f} s; cluster stopped")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
