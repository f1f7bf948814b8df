"""Push consumer flow control: with a backlog far larger than the per-queue thresholds and a slow callback, the
consumer's pulls pause (counted), its cache stays under ``pull_threshold_for_queue`` x queues, and its resident
memory (a child process, sampled with psutil) grows by no more than that cache allows.

The 1 GiB version is ``python -m benchmarks.consumer_bench rss`` (and the ``consumer`` benchmark entry).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benchmarks.consumer_bench import bench_push_backlog_rss, fill_topic, rss_allowance_bytes
from client.cluster import LocalCluster

pytestmark = pytest.mark.integration

MIB = 1 << 20
THRESHOLD = 100
PULL_BATCH = 32  # GroupConsumerConfig.pull_batch_size: one pull may overshoot the threshold by this much
BODY = 1024


def test_slow_callback_pauses_pulls_and_bounds_memory(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0)
    backlog = 32 * 1024  # 32 MiB of 1 KiB messages: 30 times what the thresholds let the consumer cache
    topic = fill_topic(cluster.namesrv_addr, "FlowCtl", backlog, body_bytes=BODY)
    r = bench_push_backlog_rss(cluster.namesrv_addr, topic, duration_s=6.0, callback_sleep_s=0.005,
                               consume_thread_nums=2, pull_threshold_for_queue=THRESHOLD,
                               pull_threshold_size_for_queue_mib=100)
    queues, stats = r["queues"], r["stats"]
    cache_bound = queues * (THRESHOLD + PULL_BATCH)
    grew = r["peak_rss"] - r["idle_rss"]
    # Each cached message may cost its body plus ~4 KiB of Python objects (measured: 2-3 KiB), plus 8 MiB slack.
    rss_bound = rss_allowance_bytes(queues, THRESHOLD, PULL_BATCH, BODY)
    print(f"idle RSS {r['idle_rss'] / MIB:.1f} MiB, peak {r['peak_rss'] / MIB:.1f} MiB (+{grew / MIB:.1f}, bound "
          f"{rss_bound / MIB:.1f}); consumed {r['consumed']}, pulled {stats['pulledMessages']} in {stats['pulls']} "
          f"pulls, {stats['flowControlled']} pulls put off, max cached {r['max_cached']} (bound {cache_bound})")
    assert queues >= 8
    assert r["consumed"] > 0
    assert stats["flowControlled"] > 0, stats
    assert r["max_cached"] <= cache_bound
    # Pulling stopped once the cache was full: it brought what was consumed plus at most one full cache.
    assert stats["pulledMessages"] <= r["consumed"] + cache_bound, stats
    assert stats["pulledMessages"] < backlog // 2, "the consumer pulled the backlog regardless of its cache"
    assert grew <= rss_bound, f"RSS grew by {grew / MIB:.1f} MiB, more than {rss_bound / MIB:.1f} MiB"
