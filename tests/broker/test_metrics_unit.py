"""``BrokerMetrics`` without a broker: what the data path's bumps render as, in the exposition a scraper reads."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import BrokerMetrics

BASE = {"cluster": "C", "node_type": "broker", "node_id": "broker-a-0"}


def samples(m: BrokerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples}


def families(m: BrokerMetrics) -> set[str]:
    return {fam.name for fam in text_string_to_metric_families(m.render().decode())}


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def test_every_family_is_there_before_any_traffic() -> None:
    m = BrokerMetrics("C", "broker-a-0", "SLAVE")
    assert families(m) >= {"rocketmq_messages_in", "rocketmq_messages_out", "rocketmq_throughput_in",
                           "rocketmq_throughput_out", "splitmq_pull_served", "splitmq_send_requests",
                           "splitmq_pull_requests", "rocketmq_rpc_latency", "splitmq_parked_pulls"}
    assert samples(m)[key("splitmq_pull_served_total", role="SLAVE")] == 0


def test_counters_add_up_per_topic_and_per_code() -> None:
    m = BrokerMetrics("C", "broker-a-0", "ASYNC_MASTER")
    m.stored("T", 3, 3000)
    m.stored("T", 1, 1000)
    m.stored("U", 2, 10)
    m.served("T", 5, 500)
    m.served("U", 1, 7)
    for code, pull in ((0, False), (0, False), (14, False), (0, True), (19, True), (19, True)):
        m.count_request(code, pull=pull)
    got = samples(m)
    assert got[key("rocketmq_messages_in_total", **BASE, topic="T")] == 4
    assert got[key("rocketmq_throughput_in_total", **BASE, topic="T")] == 4000
    assert got[key("rocketmq_messages_in_total", **BASE, topic="U")] == 2
    assert got[key("rocketmq_messages_out_total", **BASE, topic="T")] == 5
    assert got[key("rocketmq_throughput_out_total", **BASE, topic="U")] == 7
    assert got[key("splitmq_pull_served_total", role="ASYNC_MASTER")] == 6
    assert got[key("splitmq_send_requests_total", code="0")] == 2
    assert got[key("splitmq_send_requests_total", code="14")] == 1
    assert got[key("splitmq_pull_requests_total", code="0")] == 1
    assert got[key("splitmq_pull_requests_total", code="19")] == 2
    assert key("splitmq_pull_requests_total", code="14") not in got


@pytest.mark.parametrize(("seconds", "first_bucket"), [
    (0.0, "5e-05"), (0.00005, "5e-05"), (0.0000501, "0.0001"), (0.3, "0.5"), (10.0, "10.0"), (10.5, "+Inf")])
def test_latency_lands_in_the_first_bucket_whose_bound_is_not_below_it(seconds: float, first_bucket: str) -> None:
    m = BrokerMetrics("C", "broker-a-0", "ASYNC_MASTER")
    m.observe_request("/send", 200, seconds)
    counts = [v for (name, _labels), v in samples(m).items() if name == "rocketmq_rpc_latency_bucket"]  # le order
    les = [dict(labels)["le"] for (name, labels) in samples(m) if name == "rocketmq_rpc_latency_bucket"]
    first = les.index(first_bucket)
    assert counts == [0] * first + [1] * (len(les) - first)


def test_latency_buckets_are_cumulative_with_count_and_sum_per_path_and_status() -> None:
    m = BrokerMetrics("C", "broker-a-0", "ASYNC_MASTER")
    for s in (0.00004, 0.0002, 0.0002, 3.0):
        m.observe_request("/pull", 200, s)
    m.observe_request("/pull", 403, 0.001)
    got = samples(m)
    labels = {**BASE, "request_code": "/pull", "response_code": "200"}
    assert got[key("rocketmq_rpc_latency_bucket", **labels, le="5e-05")] == 1
    assert got[key("rocketmq_rpc_latency_bucket", **labels, le="0.00025")] == 3
    assert got[key("rocketmq_rpc_latency_bucket", **labels, le="2.5")] == 3
    assert got[key("rocketmq_rpc_latency_bucket", **labels, le="5.0")] == 4
    assert got[key("rocketmq_rpc_latency_bucket", **labels, le="+Inf")] == 4
    assert got[key("rocketmq_rpc_latency_count", **labels)] == 4
    assert got[key("rocketmq_rpc_latency_sum", **labels)] == pytest.approx(3.00044)
    assert got[key("rocketmq_rpc_latency_count", **{**labels, "response_code": "403"})] == 1
