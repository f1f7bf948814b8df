"""SYNC_MASTER and ASYNC_MASTER durability against real processes (docs/BEHAVIOUR.md 2.8, 2.9, decision 5, docs/HA.md).

* with the slave up, a SEND_OK message is in the slave's commit log when ``send`` returns;
* slave stopped -> SLAVE_NOT_AVAILABLE at once; slave paused (SIGSTOP) -> FLUSH_SLAVE_TIMEOUT after
  ``syncFlushTimeout``, also when the paused slave is killed while a send waits for it;
* the in-sync slave killed while lagging slaves are connected (one more than ``haMaxGapNotInSync`` behind, one
  that has not reported) -> SLAVE_NOT_AVAILABLE at once: only the acks of connected slaves count;
* the master SIGKILLed during a produce run, 20 times: no SEND_OK message is missing on the slave;
* ASYNC_MASTER: what a master kill loses is bounded by the replication lag just before it.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import pytest

from broker.ha.protocol import encode_report
from client import Message, MessageQueue, Producer, PullConsumer, PullStatus, SendResult, SendStatus
from client.cluster import BrokerHandle, LocalCluster
from client.errors import ClientError
from common.codec import decode_offset_msg_id
from tests.ha.support import (
    create_topic,
    ha_cluster,
    ha_of,
    max_offset,
    poll_until,
    slave_record,
    wait_slave_linked,
)

pytestmark = [pytest.mark.integration, pytest.mark.ha]

BODY = b"s" * 1024


def phy(r: SendResult) -> int:
    return decode_offset_msg_id(r.offset_msg_id)[1]


def timed_send(p: Producer, msg: Message) -> tuple[SendResult, float]:
    t = time.monotonic()
    r = p.send(msg)
    return r, time.monotonic() - t


def test_send_ok_is_on_the_slave_when_the_send_returns(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync")
    slave = cluster.broker("broker-a", 1)
    create_topic(cluster, "Sync")
    wait_slave_linked(cluster)
    with Producer("pg", cluster.namesrv_addr) as p:
        for i in range(60):
            batch = [Message("Sync", b"%d-" % i + BODY)] if i % 2 else [
                Message("Sync", b"%d.%d-" % (i, j) + BODY) for j in range(8)]
            results = p.send_batch(batch) if len(batch) > 1 else [p.send(batch[0])]
            for m, r in zip(batch, results, strict=True):
                assert r.send_status is SendStatus.SEND_OK
                got = slave_record(slave, phy(r))  # checked right after the send returned
                assert got is not None and got.body == m.body and got.msg_id == r.msg_id, (i, r)


def test_slave_stopped_is_not_available_at_once_and_paused_times_out(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync", config={"syncFlushTimeout": "1000"})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Gone")
    wait_slave_linked(cluster)
    sent: list[SendResult] = []
    took_na: list[float] = []
    took_timeout: list[float] = []
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=5.0) as p:
        r, _ = timed_send(p, Message("Gone", b"up"))
        assert r.send_status is SendStatus.SEND_OK
        sent.append(r)
        slave.stop()
        poll_until(lambda: ha_of(master)["connectionCount"] == 0, 5, "the master to see the slave gone")
        for i in range(5):
            r, took = timed_send(p, Message("Gone", b"stopped%d" % i))
            assert (r.send_status, took < 1.0) == (SendStatus.SLAVE_NOT_AVAILABLE, True), (r, took)
            sent.append(r)
            took_na.append(took)
        slave.start()
        wait_slave_linked(cluster)
        r, _ = timed_send(p, Message("Gone", b"back"))
        assert r.send_status is SendStatus.SEND_OK
        sent.append(r)
        slave.pause()
        try:
            for i in range(2):
                r, took = timed_send(p, Message("Gone", b"paused%d" % i))
                assert r.send_status is SendStatus.FLUSH_SLAVE_TIMEOUT and 0.95 <= took < 2.0, (r, took)
                sent.append(r)
                took_timeout.append(took)
        finally:
            slave.resume()
        wait_slave_linked(cluster)
        r, _ = timed_send(p, Message("Gone", b"resumed"))
        assert r.send_status is SendStatus.SEND_OK
        sent.append(r)
        # The slave a send waits for dies during the wait: the send is not failed early (another slave could
        # still ack it) and not left hanging: FLUSH_SLAVE_TIMEOUT at its deadline.
        slave.pause()
        waiting: list[tuple[SendResult, float]] = []
        sender = threading.Thread(target=lambda: waiting.append(timed_send(p, Message("Gone", b"dies"))),
                                  daemon=True)
        sender.start()
        poll_until(lambda: ha_of(master)["ackWaiters"] == 1, 5, "the send to wait for the paused slave",
                   interval_s=0.005)
        slave.kill()
        poll_until(lambda: ha_of(master)["connectionCount"] == 0, 5, "the master to see the slave gone")
        sender.join(10)
        (r, took), = waiting
        assert r.send_status is SendStatus.FLUSH_SLAVE_TIMEOUT and 0.95 <= took < 2.0, (r, took)
        sent.append(r)
        took_timeout.append(took)
        slave.start()
        wait_slave_linked(cluster)
        r, _ = timed_send(p, Message("Gone", b"restarted"))
        assert r.send_status is SendStatus.SEND_OK
        sent.append(r)
    print(f"\nSLAVE_NOT_AVAILABLE in <= {max(took_na) * 1000:.1f} ms; FLUSH_SLAVE_TIMEOUT (syncFlushTimeout 1000 ms) "
          f"in {min(took_timeout) * 1000:.0f}..{max(took_timeout) * 1000:.0f} ms")
    # Every status above means "stored on the master": all of them reach the slave in the end.
    for r in sent:
        assert slave_record(slave, phy(r)) is not None, r


class _RawSlave:
    """An HA connection to a master that reports ``report`` once (None: never) and then neither reads nor acks:
    how a fresh slave still catching up (or one that has not said where it stands) looks to the master."""

    def __init__(self, ha_addr: str, report: int | None) -> None:
        host, port = ha_addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5.0)
        if report is not None:
            self.sock.sendall(encode_report(report))
        host, port = self.sock.getsockname()[:2]
        self.addr = f"{host}:{port}"

    def close(self) -> None:
        self.sock.close()


GAP = 64 * 1024


def test_with_default_timeouts_a_paused_slave_gives_flush_slave_timeout_inside_the_send_timeout(
        cluster_factory) -> None:
    """The broker's replica wait (``syncFlushTimeout``) and the SDK's ``send_timeout_s`` are a pair: with both
    defaults the broker's FLUSH_SLAVE_TIMEOUT reaches the user before the SDK gives up on the request."""
    import inspect

    from broker.config import BrokerConfig

    send_timeout_s = inspect.signature(Producer).parameters["send_timeout_s"].default
    assert BrokerConfig().sync_flush_timeout_ms / 1000 < send_timeout_s
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync")
    slave = cluster.broker("broker-a", 1)
    create_topic(cluster, "Defaults")
    wait_slave_linked(cluster)
    with Producer("pg", cluster.namesrv_addr) as p:
        assert p.send(Message("Defaults", b"up")).send_status is SendStatus.SEND_OK
        slave.pause()
        try:
            r, took = timed_send(p, Message("Defaults", b"paused"))
        finally:
            slave.resume()
    assert r.send_status is SendStatus.FLUSH_SLAVE_TIMEOUT, r
    assert took < send_timeout_s, took


def test_in_sync_slave_killed_while_lagging_slaves_are_connected_is_not_available_at_once(cluster_factory) -> None:
    """Only connected slaves' own acks count: the best ack ever seen (``push2SlaveMaxOffset``) belongs to a
    slave that is gone, and the slaves still connected are far behind, so nobody can ack a send soon."""
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync",
                         config={"syncFlushTimeout": "2000", "haMaxGapNotInSync": str(GAP)})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Isr")
    wait_slave_linked(cluster)
    took_na: list[float] = []
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=10.0) as p:
        while max_offset(master) < 2 * GAP:  # an empty slave is then more than the gap behind
            for r in p.send_batch([Message("Isr", BODY) for _ in range(16)]):
                assert r.send_status is SendStatus.SEND_OK, r
        lagging, silent = _RawSlave(master.ha_addr, 0), _RawSlave(master.ha_addr, None)
        try:
            def raw_slaves_seen() -> bool:
                acks = {s["addr"]: s["ackOffset"] for s in ha_of(master)["slaves"]}
                return acks.get(lagging.addr) == 0 and acks.get(silent.addr) == -1 and len(acks) == 3

            poll_until(raw_slaves_seen, 5, "the master to see both raw slaves")
            r, _ = timed_send(p, Message("Isr", b"with the in-sync slave"))
            assert r.send_status is SendStatus.SEND_OK, r  # lagging slaves are not waited for
            slave.kill()  # the in-sync slave dies: its connection closes
            poll_until(lambda: ha_of(master)["connectionCount"] == 2, 5, "the master to see the slave gone")
            for i in range(3):
                r, took = timed_send(p, Message("Isr", b"lagging only %d" % i))
                took_na.append(took)
                assert (r.send_status, took < 0.5) == (SendStatus.SLAVE_NOT_AVAILABLE, True), (r, took)
        finally:
            lagging.close()
            silent.close()
        slave.start()
        wait_slave_linked(cluster)
        r, _ = timed_send(p, Message("Isr", b"in sync again"))
        assert r.send_status is SendStatus.SEND_OK, r
    print(f"\nin-sync slave gone, lagging slaves connected: SLAVE_NOT_AVAILABLE in "
          f"{min(took_na) * 1000:.1f}..{max(took_na) * 1000:.1f} ms (syncFlushTimeout 2000 ms)")


class _ProduceRun:
    """One producer thread sending batches until stopped; keeps every SEND_OK result."""

    def __init__(self, producer: Producer, topic: str, tag: str, batch: int = 4, pad: bytes = b"") -> None:
        self.producer = producer
        self.topic = topic
        self.tag = tag
        self.batch = batch
        self.pad = pad
        self.ok: list[tuple[bytes, SendResult]] = []
        self.other: list[Any] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"produce-{tag}")
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            bodies = [b"%s-%d-%s" % (self.tag.encode(), i + j, self.pad) for j in range(self.batch)]
            i += self.batch
            try:
                results = self.producer.send_batch([Message(self.topic, b) for b in bodies])
            except ClientError as e:
                self.other.append(e)
                continue
            for b, r in zip(bodies, results, strict=True):
                (self.ok.append((b, r)) if r.send_status is SendStatus.SEND_OK else self.other.append(r))

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def drain_all(consumer: PullConsumer, mqs: list[MessageQueue]) -> list[bytes]:
    bodies: list[bytes] = []
    for mq in mqs:
        offset = 0
        while True:
            r = consumer.pull(mq, offset, max_nums=32)
            if r.pull_status is not PullStatus.FOUND:
                assert r.pull_status is PullStatus.NO_NEW_MSG, (mq, offset, r)
                break
            assert r.served_by_broker_id == 1
            bodies.extend(m.body for m in r.msg_found_list)
            offset = r.next_begin_offset
    return bodies


def _kill_round(cluster: LocalCluster, p: Producer, rnd: int, min_ok: int) -> list[tuple[bytes, SendResult]]:
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    run = _ProduceRun(p, "Kill", f"r{rnd}")
    try:
        poll_until(lambda: len(run.ok) >= min_ok, 20, f"round {rnd}: {min_ok} SEND_OK", interval_s=0.005)
        master.kill()  # SIGKILL while the producer is sending
    finally:
        run.finish()
    assert run.ok, f"round {rnd}: nothing sent"
    poll_until(lambda: slave.runtime()["masterLinkUp"] is False, 10, "the slave to see the master gone")
    last_body, last = max(run.ok, key=lambda br: phy(br[1]))
    got = slave_record(slave, phy(last))  # the commit log is contiguous: the last one covers them all
    assert got is not None and got.body == last_body, f"round {rnd}: SEND_OK at {phy(last)} not on the slave"
    return run.ok


@pytest.mark.slow
def test_master_sigkilled_20_times_loses_no_send_ok_message(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="sync")
    master = cluster.broker("broker-a", 0)
    create_topic(cluster, "Kill", queue_nums=2)
    ok: list[tuple[bytes, SendResult]] = []
    t0 = time.monotonic()
    # The send in flight when the master dies has no other group to go to: it fails at its deadline, and each
    # round waits for it, so the deadline is short (a send that times out is not counted as acknowledged).
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=0.5) as p:
        for rnd in range(20):
            if rnd:
                master.start()
            wait_slave_linked(cluster)
            ok += _kill_round(cluster, p, rnd, min_ok=40)
    loop_s = time.monotonic() - t0
    # The master is down now: the slave serves every SEND_OK message (decision 6).
    with PullConsumer("cg", cluster.namesrv_addr) as c:
        mqs = c.fetch_subscribe_message_queues("Kill")
        served = drain_all(c, mqs)
    missing = {b for b, _ in ok} - set(served)
    print(f"\n20 master kills: {len(ok)} SEND_OK messages, {len(missing)} missing on the slave, loop {loop_s:.1f} s")
    assert not missing, sorted(missing)[:10]


def _sample_lag(master: BrokerHandle, stop: threading.Event, out: list[tuple[float, int, int]]) -> None:
    with httpx.Client(timeout=2.0) as http:
        while not stop.is_set():
            try:
                ha = http.get(f"http://{master.addr}/ha").json()
            except httpx.HTTPError:
                return
            if ha["slaves"]:
                out.append((time.monotonic(), ha["masterMaxOffset"], ha["slaves"][0]["ackOffset"]))
            stop.wait(0.01)


def test_async_master_kill_loses_at_most_the_replication_lag(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, mode="async")
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Lag", queue_nums=2)
    wait_slave_linked(cluster)
    samples: list[tuple[float, int, int]] = []
    stop_sampling = threading.Event()
    sampler = threading.Thread(target=_sample_lag, args=(master, stop_sampling, samples), daemon=True)
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=2.0) as p:
        sampler.start()
        runs = [_ProduceRun(p, "Lag", f"t{i}", batch=16, pad=BODY) for i in range(2)]
        try:
            poll_until(lambda: sum(len(r.ok) for r in runs) >= 8000, 30, "8000 SEND_OK")
            master.kill()
            killed_at = time.monotonic()
        finally:
            for run in runs:
                run.finish()
            stop_sampling.set()
            sampler.join(10)
    poll_until(lambda: slave.runtime()["masterLinkUp"] is False, 10, "the slave to see the master gone")
    slave_max = max_offset(slave)
    master.start()
    recovered_max = max_offset(master)
    ok = [br for run in runs for br in run.ok]
    _, last = max(ok, key=lambda br: phy(br[1]))
    rec = httpx.get(f"http://{master.addr}/message", params={"phyOffset": phy(last)}, timeout=5).content
    size = int.from_bytes(rec[:4], "big")
    # A message is lost when the slave does not hold all of its bytes (only the tail can be).
    lost = [b for b, r in ok if phy(r) >= slave_max or (phy(r) + 2 * size > slave_max
                                                        and slave_record(slave, phy(r)) is None)]
    lost_bytes = max(0, phy(last) + size - slave_max)
    before = [s for s in samples if s[0] <= killed_at]
    assert before, "no lag sample before the kill"
    t_last, m_last, ack_last = before[-1]
    window = [m - a for t, m, a in before if t >= killed_at - 1.0]
    rate = (m_last - before[0][1]) / max(1e-6, t_last - before[0][0])  # bytes/s over the run
    lag_ms = (m_last - ack_last) / rate * 1000 if rate else 0.0
    print(f"\nASYNC kill: lost {len(lost)} SEND_OK msgs / {lost_bytes} B; lag just before: {m_last - ack_last} B "
          f"(~{lag_ms:.1f} ms at {rate / 1e6:.1f} MB/s), max lag in the last second {max(window)} B")
    # The slave only grows, and the master had at most what it recovered: lost <= lag + what came after.
    assert lost_bytes <= (m_last - ack_last) + (recovered_max - m_last)
    assert lost_bytes <= max(window) + (recovered_max - m_last)
