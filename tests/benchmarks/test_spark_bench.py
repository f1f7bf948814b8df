"""The pieces of ``python -m benchmarks spark`` that need no Spark session, run small: decode and encode alone, the
fill through the sink's sender, and the SDK baseline reading the slaves (what the Spark rows are compared with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import spark_bench
from client import Admin
from client.cluster import LocalCluster

pytestmark = [pytest.mark.integration]


def test_decode_and_encode_alone_report_positive_rates() -> None:
    fast, slow = spark_bench.bench_decode(4096, rows_per_batch=1024)
    enc, enc_sdk = spark_bench.bench_encode(10_000)
    assert min(fast, slow, enc, enc_sdk) > 0


def test_the_sdk_baseline_reads_every_message_from_the_slaves(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, broker_groups=1, slaves_per_group=1) as cluster:
        ns = cluster.namesrv_addr
        spark_bench._fill(ns, "BenchSdk", 3000, 1024)
        cluster.wait_slave_caught_up("broker-a")
        before = spark_bench._slave_bytes(cluster)
        rate, rows = spark_bench.bench_sdk_read(ns, "BenchSdk")
        moved = spark_bench._slave_bytes(cluster) - before
        with Admin(ns) as admin:
            stored = sum(hi - lo for _mq, lo, hi in admin.topic_offsets("BenchSdk"))
    assert rows == stored == 3000 and rate > 0
    assert moved > 3000 * 1024  # the slave, not the master, wrote the answers
