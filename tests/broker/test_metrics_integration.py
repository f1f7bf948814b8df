"""``GET /metrics`` of real brokers: parses with prometheus_client, counters move with traffic, HA gauges show
a slave's lag while it is paused and none once it caught up."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import Admin, Message, MessageQueue, Producer, PullConsumer
from client.cluster import LocalCluster
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

NAMES = {
    "rocketmq_messages_in", "rocketmq_messages_out", "rocketmq_throughput_in", "rocketmq_throughput_out",
    "rocketmq_consumer_lag_messages", "rocketmq_storage_size", "rocketmq_storage_flush_behind_bytes",
    "rocketmq_storage_dispatch_behind_bytes", "rocketmq_rpc_latency", "splitmq_ha_slave_ack_offset",
    "splitmq_ha_slave_diff_bytes", "splitmq_ha_in_sync_slaves", "splitmq_ha_transfer_bytes",
    "splitmq_pull_served",
}


def scrape(addr: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"http://{addr}/metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
        out.setdefault(fam.name, [])
    return out


def total(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def test_metrics_move_with_traffic_and_show_slave_lag(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=1)
    master = cluster.broker("broker-a", 0)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("MetricsT", queue_nums=1)
    before = scrape(master.addr)
    assert set(before) >= NAMES, f"missing metric families: {sorted(NAMES - set(before))}"
    with Producer("pm", cluster.namesrv_addr) as p:
        p.send_batch([Message("MetricsT", b"x" * 1024) for _ in range(64)])
        cluster.wait_slave_caught_up("broker-a", timeout_s=15)
        after = scrape(master.addr)
        assert total(after, "rocketmq_messages_in_total", topic="MetricsT") == 64
        assert total(after, "rocketmq_throughput_in_total", topic="MetricsT") >= 64 * 1024
        assert total(after, "rocketmq_rpc_latency_count", request_code="/send", response_code="200") >= 1
        assert total(after, "splitmq_ha_in_sync_slaves") == 1
        assert total(after, "splitmq_ha_slave_diff_bytes") == 0

        slave = cluster.broker("broker-a", 1)
        slave.pause()
        try:
            p.send_batch([Message("MetricsT", b"y" * 1024) for _ in range(64)])
            lagging = scrape(master.addr)
            assert total(lagging, "splitmq_ha_slave_diff_bytes") > 64 * 1024
        finally:
            slave.resume()
        poll_until(lambda: total(scrape(master.addr), "splitmq_ha_slave_diff_bytes") == 0, 15,
                   "slave catching up in the metrics")

    mq = MessageQueue("MetricsT", "broker-a", 0)
    with PullConsumer("gm", cluster.namesrv_addr) as c:
        r = c.pull(mq, 0, max_nums=32)
        c.update_consume_offset(mq, r.next_begin_offset)
    poll_until(lambda: total(scrape(master.addr), "rocketmq_consumer_lag_messages", consumer_group="gm",
                             topic="MetricsT") == 128 - r.next_begin_offset, 15, "consumer lag gauge")
    served = scrape(master.addr)
    assert total(served, "rocketmq_messages_out_total", topic="MetricsT") >= len(r.msg_found_list)
    assert total(served, "splitmq_pull_served_total", role="ASYNC_MASTER") >= len(r.msg_found_list)
