"""The chaos harness's pure parts: message keys, the attempt counter, the fault plan, what a consumer records,
and the stall monitor (no process)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import httpx
import pytest

from benchmarks.chaos.cluster import ChaosCluster, ClusterSpec
from benchmarks.chaos.ledger import AttemptCounter, Ledger, Location, body_of, key_of, make_key, split_key
from benchmarks.chaos.nemesis import FaultKind, plan
from benchmarks.chaos.report import ChaosReport
from benchmarks.chaos.run import _keep_evidence
from benchmarks.chaos.workload import GAP, ConsumedQueue, Consumers, StallMonitor
from client import MessageQueue


def test_keys_round_trip_and_reject_other_bodies() -> None:
    body = body_of(12, 3_456_789, b"pad")
    assert split_key(key_of(body)) == (12, 3_456_789) and key_of(body) == make_key(12, 3_456_789)
    for other in (b"", b"hello", b"chaos:12.3|", body.replace(b"|", b"/", 1), b"chaos:abcd.0000000001|"):
        assert key_of(other) == -1


def test_location_packs_and_unpacks() -> None:
    where = Location(1, 1023, (1 << 40) - 1)
    assert Location.unpack(where.pack()) == where


def _counter(ledger: Ledger, fail: Exception | None) -> AttemptCounter:
    def answer(request: httpx.Request) -> httpx.Response:
        if fail is not None:
            raise fail
        return httpx.Response(200)

    return AttemptCounter(ledger, httpx.MockTransport(answer))


@pytest.mark.parametrize(("fail", "counted"), [
    (None, 1),
    (httpx.ReadTimeout("slow"), 1),           # the broker may have stored it
    (httpx.RemoteProtocolError("gone"), 1),   # so may a broker that died before answering
    (httpx.ConnectError("refused"), 0),       # nothing left this process
])
def test_the_attempt_counter_counts_sends_that_may_have_reached_a_broker(fail: Exception | None,
                                                                         counted: int) -> None:
    led = Ledger(2)
    led.reserve(1, 3)
    body = b"head" + body_of(1, 0, b"x") + b"props" + body_of(1, 2, b"y")
    with httpx.Client(transport=_counter(led, fail)) as http:
        for path in ("/send", "/pull"):  # only sends count
            try:
                http.post(f"http://127.0.0.1:1{path}", content=body)
            except httpx.HTTPError:
                pass
    assert list(led.attempts[1]) == [counted, 0, counted]


def test_the_plan_brings_every_kind_once_per_round() -> None:
    faults = plan(random.Random(7), ["broker-a", "broker-b"], hold_s=(0.1, 0.2), gap_s=(0.0, 0.1))
    rounds = [[next(faults) for _ in FaultKind] for _ in range(4)]
    for r in rounds:
        assert Counter(f.kind for f in r) == Counter(FaultKind)
        assert all(0.1 <= f.hold_s <= 0.2 and f.group in ("broker-a", "broker-b") for f in r)
    again = plan(random.Random(7), ["broker-a", "broker-b"], hold_s=(0.1, 0.2), gap_s=(0.0, 0.1))
    assert [next(again) for _ in range(len(FaultKind))] == rounds[0]  # a seed reproduces a run's faults
    assert {k.role for k in FaultKind} == {"master", "slave", "nameserver", "link"}
    assert {k.action for k in FaultKind} == {"kill", "pause", "restart", "disk", "cut"}


def test_a_consumed_queue_records_gaps_and_rereads() -> None:
    q = ConsumedQueue(MessageQueue("T", "a", 0))
    q.take(0, 10)
    q.take(2, 12)  # offset 1 was skipped
    q.take(1, 11)  # served later after all
    q.take(2, 99)  # served again, with another message
    assert (list(q.keys), q.gaps, q.reread_mismatches) == ([10, 11, 99], 1, 1)
    q.take(5, 15)
    assert list(q.keys)[3:] == [GAP, GAP, 15]


def test_the_stall_monitor_measures_time_behind_without_progress() -> None:
    mq = MessageQueue("T", "a", 0)
    consumers = Consumers("127.0.0.1:1", [mq], "g", deadline_s=1.0)  # never started
    q = consumers.queues[mq]
    now = [100.0]
    high = [0]
    monitor = StallMonitor(consumers, lambda _: high[0], clock=lambda: now[0])
    q.last_progress = 90.0
    monitor.sample()  # nothing exists beyond the consumer: no stall however old its last progress
    high[0] = 5
    now[0] = 101.0
    monitor.sample()  # behind from now on
    now[0] = 104.0
    monitor.sample()
    assert monitor.longest[mq] == pytest.approx(3.0)
    q.last_progress, q.offset = 104.5, 3  # progress, still behind
    now[0] = 105.0
    monitor.sample()
    assert monitor.longest[mq] == pytest.approx(3.0)
    q.offset = 5
    now[0] = 200.0
    monitor.sample()  # caught up
    high[0] = 6
    now[0] = 201.0
    monitor.sample()
    now[0] = 202.0
    monitor.sample()
    assert monitor.longest[mq] == pytest.approx(3.0)  # the new stall counts from when the message appeared


def test_acked_from_counts_the_acknowledged_messages_a_slave_lacks() -> None:
    led = Ledger(2)
    led.reserve(0, 3)
    led.reserve(1, 2)
    led.ack(0, 0, Location(0, 0, 0), 100)
    led.ack(0, 1, Location(1, 0, 0), 900)   # another group
    led.ack(0, 2, Location(0, 1, 0), 300)
    led.ack(1, 1, Location(0, 0, 1), 500)   # message 1.0 was never acknowledged
    assert [led.acked_from(0, at) for at in (0, 101, 300, 301, 501)] == [3, 2, 2, 1, 0]
    assert led.acked_from(1, 900) == 1 and led.acked_from(1, 901) == 0


def test_a_failed_run_keeps_every_store_and_what_the_checker_noted(tmp_path: Path) -> None:
    """A failed run keeps what the checker noted, and the stores its tmpfs disks would take with them."""
    cluster = ChaosCluster(tmp_path / "cluster", ClusterSpec(mode="sync", disk="fault-layer"))
    try:
        for b in cluster.local.brokers:
            (b.store_dir / "commitlog").mkdir(parents=True)
            (b.store_dir / "commitlog" / "00000000000000000000").write_bytes(b.store_dir.parent.name.encode())
        report = ChaosReport(profile="short", mode="sync", disk="fault-layer", seed=1, root=str(tmp_path),
                             targets=(1, 1), stuck_after_s=1.0)
        report.verdict.note("replica_mismatch", "queue (1, 0): 225 offsets differ, first at 0")
        _keep_evidence(cluster, report, tmp_path)
    finally:
        cluster.close()
    kept = sorted(p.name for p in (tmp_path / "kept-stores").iterdir())
    assert kept == sorted(b.store_dir.parent.name for b in cluster.local.brokers) and len(kept) == 4
    assert (tmp_path / "kept-stores" / kept[0] / "commitlog" / "00000000000000000000").read_bytes() == kept[0].encode()
    assert "replica_mismatch: queue (1, 0): 225 offsets differ, first at 0" in (tmp_path / "failure.txt").read_text()
