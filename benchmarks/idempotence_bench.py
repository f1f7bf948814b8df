"""Idempotent sends (issue 38): ``python -m benchmarks idempotence [--quick]``.

Every figure comes from processes of a :class:`~client.cluster.LocalCluster` on this machine, driven through the
SDK's public API only:

* **kills**: an application loop -- threads sharing one idempotent :class:`~client.Producer`, each sending
  numbered messages and re-sending the same ``Message`` object until it gets SEND_OK (three with ``send``, one
  with ``send_batch`` of 8) -- while the master of a SYNC_MASTER group is SIGKILLed and restarted at its address
  (:func:`sync_master_kills`), and while the leader of a 3-member DLedger group is SIGKILLed and restarted
  (:func:`dledger_leader_kills`). Before each master kill the slave is paused (SIGSTOP) until the master holds
  sends it has not answered, so every kill leaves stored messages whose answer never comes; their re-sends land
  on the restarted master. Then every queue is read back from every member and each message's copies counted:
  *lost* (acknowledged, not stored) and *duplicated* (stored twice) must be 0. Each scenario runs with the
  brokers' duplicate window on and, in the same run, off (``duplicateWindowMs=0``): the off row counts what the
  window saves, and shows that the check can fail.
* **cost**: ``send_batch`` of 64 x 1 KiB and single sends from one thread against one ASYNC_MASTER without a
  slave (the broker's data path alone), an idempotent and a plain producer taking turns in short slices within
  one run, the order swapped every round; each round's ratio is printed and the median is the row (targets:
  ``send_batch`` >= 0.9, single send >= 0.95). The window holds every key sent in the run. Then the broker's own
  CPU per message of ``POST /send`` of 64, idempotent and plain in turns, in this process (:func:`broker_cost`: the
  send processor over a file store): no network, no client.

Noise: on a shared 2-core machine single slices swing by 20 % and more; the alternation cancels slow drifts, not
bursts. Quote every round.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx

from benchmarks import Row
from benchmarks._load import wait_for
from benchmarks.client_bench import CpuMeter
from broker.config import BrokerConfig
from broker.dedup import DuplicateWindow
from broker.durability import DurabilityWaiter
from broker.metadata import SubscriptionGroupManager, TopicConfigManager
from broker.metrics import BrokerMetrics
from broker.processor.send import SendProcessor
from broker.store.file_store import FileMessageStore
from client import Admin, Message, MessageQueue, Producer, PullStatus, SendResult, SendStatus
from client.cluster import BrokerHandle, LocalCluster
from client.errors import ClientError
from client.lowlevel import BrokerClient
from common.codec import UniqKeyGenerator, decode_records, encode_batch, pack_host
from common.codes import SysFlag
from remoting.router import Request

__all__ = ["KillReport", "ResendLoop", "broker_cost", "dledger_leader_kills", "read_back", "run", "send_cost",
           "sync_master_kills"]

GROUP = "broker-a"
QUEUES = 4
FILE_SIZE = 16 << 20
#: Bound of every wait on the cluster.
WAIT_S = 60.0
#: Brokers register every second and fetch topics from their master every second, build no key index, serve reads
#: as slaves (the read-back pulls each member) and answer it with up to 512 messages per pull.
COMMON = {"registerNameServerPeriod": "1000", "registerNameServerPeriodMinMs": "500",
          "slaveMetadataSyncInterval": "1000", "haSendHeartbeatInterval": "1000", "messageIndexEnable": "false",
          "slaveReadEnable": "true", "maxTransferCountOnMessageInMemory": "512",
          "maxTransferBytesOnMessageInMemory": str(1 << 20), "maxTransferCountOnMessageInDisk": "512",
          "maxTransferBytesOnMessageInDisk": str(1 << 20)}
#: DLedger elections within ~1.5 s of a leader's death (a follower campaigns after 3 x 500 ms of silence).
QUICK_ELECTIONS = {"heartBeatTimeIntervalMs": "500"}
WINDOW_OFF = {"duplicateWindowMs": "0"}


@attrs.define
class KillReport:
    """What one kill scenario stored."""

    scenario: str
    dedup: bool
    """The brokers' duplicate window on (else ``duplicateWindowMs=0``)."""
    kills: int = 0
    acknowledged: int = 0
    """Messages the application got SEND_OK for (every message it started, when the run ended cleanly)."""
    resends: int = 0
    """Sends of a message again by the application (after an error or a status other than SEND_OK)."""
    lost: dict[str, int] = attrs.field(factory=dict)
    """Per member: acknowledged messages it does not hold."""
    duplicated: dict[str, int] = attrs.field(factory=dict)
    """Per member: messages it holds more than once."""
    foreign: int = 0
    """Stored messages the application never sent (never expected)."""
    misplaced: int = 0
    """Acknowledged messages not at the queue offset their SEND_OK named, on the master."""
    problems: list[str] = attrs.field(factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not (any(self.lost.values()) or any(self.duplicated.values()) or self.foreign or self.misplaced
                    or self.problems)

    def summary(self) -> str:
        return (f"{self.scenario}, window {'on' if self.dedup else 'off'}: {self.kills} kills, {self.acknowledged} "
                f"acknowledged, {self.resends} re-sends; lost {self.lost}, duplicated {self.duplicated}, "
                f"foreign {self.foreign}, misplaced {self.misplaced}, {self.seconds:.0f} s"
                + (f"; problems: {self.problems}" if self.problems else ""))


class ResendLoop:
    """The application: threads sending numbered messages, each ``Message`` object re-sent until SEND_OK.

    Args:
        producer: the (idempotent) producer the threads share.
        topic: where they send.
        singles: threads sending one message per ``send``.
        batchers: threads sending ``batch`` messages per ``send_batch``.
        pad: body bytes after the message's name.
    """

    def __init__(self, producer: Producer, topic: str, *, singles: int = 3, batchers: int = 1, batch: int = 8,
                 pad: bytes = b"p" * 200) -> None:
        self.producer = producer
        self.topic = topic
        self.batch = batch
        self.pad = pad
        self.acked: dict[bytes, SendResult] = {}
        """Body -> the result of its SEND_OK."""
        self.resends = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(f"s{i}", 1), daemon=True) for i in range(singles)]
        self._threads += [threading.Thread(target=self._run, args=(f"b{i}", batch), daemon=True)
                          for i in range(batchers)]
        self.crash: BaseException | None = None

    def start(self) -> ResendLoop:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = WAIT_S) -> None:
        """Stop after each thread's message in hand is acknowledged (bounded)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        if any(t.is_alive() for t in self._threads):
            raise TimeoutError(f"the application's threads did not finish their last messages in {timeout_s} s")
        if self.crash is not None:
            raise self.crash

    def acked_count(self) -> int:
        return len(self.acked)

    def _run(self, name: str, n: int) -> None:
        seq = 0
        try:
            while not self._stop.is_set():
                msgs = [Message(self.topic, b"%s-%d-" % (name.encode(), seq + i) + self.pad) for i in range(n)]
                seq += n
                results = self._until_ok(msgs)
                with self._lock:
                    for m, r in zip(msgs, results, strict=True):
                        self.acked[m.body] = r
        except BaseException as e:  # kept for stop(): a harness bug must not pass for a clean run
            self.crash = e

    def _until_ok(self, msgs: list[Message]) -> list[SendResult]:
        """Send ``msgs`` (the same objects) until every one is acknowledged SEND_OK."""
        deadline = time.monotonic() + 5 * WAIT_S
        while True:
            try:
                rs = [self.producer.send(msgs[0])] if len(msgs) == 1 else self.producer.send_batch(msgs)
                if all(r.send_status is SendStatus.SEND_OK for r in rs):
                    return rs
                self.errors[rs[0].send_status.name] += 1
            except ClientError as e:
                self.errors[type(e).__name__] += 1
                time.sleep(0.05)  # the application's back-off after a failed send (the SDK waited its own way)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{msgs[0].body[:20]!r}... not acknowledged within {5 * WAIT_S} s: {self.errors}")
            with self._lock:
                self.resends += 1


@contextlib.contextmanager
def _cluster(root: Path, label: str, config: Mapping[str, str], **kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root / f"{label}-{uuid.uuid4().hex[:6]}", broker_config={**COMMON, **config},
                           commitlog_file_size_bytes=FILE_SIZE, **kwargs)
    with cluster:
        yield cluster


def _create_topic(cluster: LocalCluster) -> str:
    topic = f"Idem_{uuid.uuid4().hex[:8]}"
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=QUEUES)
    wait_for(lambda: all(topic in httpx.get(f"http://{b.addr}/topics", timeout=5).json()["topicConfigTable"]
                         for b in cluster.members(GROUP)), WAIT_S, f"topic {topic} on every member")
    return topic


def _ha(b: BrokerHandle) -> dict[str, Any]:
    obj = httpx.get(f"http://{b.addr}/ha", timeout=5).json()
    assert isinstance(obj, dict)
    return obj


def _progress(loop: ResendLoop, n: int) -> None:
    have = loop.acked_count()
    wait_for(lambda: loop.acked_count() >= have + n or loop.crash, WAIT_S, f"{n} more acknowledged messages")


def read_back(bc: BrokerClient, addr: str, topic: str) -> tuple[dict[bytes, list[tuple[int, int]]], list[str]]:
    """Every body stored in ``topic`` on the member at ``addr`` with its ``(queue id, queue offset)`` places, and the
    queues whose read stopped short."""
    found: dict[bytes, list[tuple[int, int]]] = collections.defaultdict(list)
    short: list[str] = []
    for q in range(QUEUES):
        mq = MessageQueue(topic, GROUP, q)
        offset, end = bc.queue_offset(addr, "min", mq), bc.queue_offset(addr, "max", mq)
        while offset < end:
            r = bc.pull_raw_from(addr, mq, offset, group="idem_read_back", max_nums=512)
            if r.status is not PullStatus.FOUND:
                short.append(f"{addr} queue {q}: {r.status.name} at {offset} of {end}")
                break
            for m in decode_records(r.records):
                found[m.body].append((q, m.queue_offset))
            offset = r.next_begin_offset
    return found, short


def _judge(report: KillReport, cluster: LocalCluster, topic: str, loop: ResendLoop, master: BrokerHandle) -> None:
    """Read every queue back from every member and count (see :class:`KillReport`)."""
    report.acknowledged = len(loop.acked)
    report.resends = loop.resends
    with BrokerClient(cluster.namesrv_addr) as bc:
        for b in cluster.members(GROUP):
            name = f"{'master' if b is master else 'member'}-{b.broker_id}"
            found, short = read_back(bc, b.addr, topic)
            report.problems += short
            report.lost[name] = sum(1 for body in loop.acked if body not in found)
            report.duplicated[name] = sum(1 for places in found.values() if len(places) > 1)
            report.foreign = max(report.foreign, sum(1 for body in found if body not in loop.acked))
            if b is master:
                report.misplaced = sum(1 for body, r in loop.acked.items()
                                       if (r.message_queue.queue_id, r.queue_offset) not in found.get(body, []))


def sync_master_kills(root: Path, *, rounds: int, dedup: bool = True,
                      progress: Callable[[str], None] | None = None) -> KillReport:
    """The application loop against a SYNC_MASTER group (one slave) whose master is SIGKILLed and restarted at its
    address ``rounds`` times, the slave paused before each kill until the master holds unanswered sends."""
    report = KillReport("SYNC_MASTER master SIGKILL + restart", dedup)
    t0 = time.monotonic()
    with _cluster(root, "sync", {} if dedup else WINDOW_OFF, mode="sync", slaves_per_group=1) as cluster:
        master, slave = cluster.broker(GROUP, 0), cluster.broker(GROUP, 1)
        topic = _create_topic(cluster)
        with Producer("idem_app", cluster.namesrv_addr) as p:
            loop = ResendLoop(p, topic).start()
            try:
                for rnd in range(rounds):
                    _progress(loop, 40)
                    slave.pause()
                    try:
                        wait_for(lambda: (h := _ha(master))["slaves"] and h["masterMaxOffset"]
                                 > h["slaves"][0]["ackOffset"], WAIT_S, "the master holding unanswered sends")
                        master.kill()
                    finally:
                        slave.resume()
                    report.kills += 1
                    master.start()
                    wait_for(lambda: (h := _ha(master))["connectionCount"] == 1
                             and h["slaves"][0]["ackOffset"] >= h["masterMaxOffset"], WAIT_S,
                             "the slave linked to the restarted master and caught up")
                    if progress is not None:
                        progress(f"  kill {rnd + 1}: {loop.acked_count()} acknowledged, {loop.resends} re-sends")
                _progress(loop, 40)
            finally:
                loop.stop()
        cluster.wait_slave_caught_up(GROUP, timeout_s=WAIT_S)
        wait_for(lambda: all(int(b.runtime()["dispatchBehindBytes"]) == 0 for b in (master, slave)), WAIT_S,
                 "dispatch done on both members")
        _judge(report, cluster, topic, loop, master)
    report.seconds = time.monotonic() - t0
    return report


def _caught_up(member: BrokerHandle, index: int) -> None:
    wait_for(lambda: int(member.runtime()["dledger"]["ledgerEndIndex"]) >= index, WAIT_S,
             f"n{member.broker_id} catching up to entry {index}")


def dledger_leader_kills(root: Path, *, rounds: int, dedup: bool = True,
                         progress: Callable[[str], None] | None = None) -> KillReport:
    """The application loop against a 3-member DLedger group whose leader is SIGKILLed ``rounds`` times, each
    dead member restarted once a new leader serves."""
    report = KillReport("DLedger leader SIGKILL", dedup)
    t0 = time.monotonic()
    config = {**QUICK_ELECTIONS, **({} if dedup else WINDOW_OFF)}
    with _cluster(root, "dledger", config, mode="dledger", peers_per_group=3) as cluster:
        topic = _create_topic(cluster)
        with Producer("idem_app", cluster.namesrv_addr) as p:
            loop = ResendLoop(p, topic).start()
            try:
                for rnd in range(rounds):
                    _progress(loop, 40)
                    dead = cluster.kill_master(GROUP)
                    report.kills += 1
                    new = cluster.leader(GROUP, WAIT_S)
                    dead.start()
                    _caught_up(dead, int(new.runtime()["dledger"]["ledgerEndIndex"]))
                    if progress is not None:
                        progress(f"  kill {rnd + 1}: {loop.acked_count()} acknowledged, {loop.resends} re-sends")
                _progress(loop, 40)
            finally:
                loop.stop()
        leader = cluster.leader(GROUP, WAIT_S)

        def converged() -> bool:
            end = int(leader.runtime()["dledger"]["ledgerEndIndex"])
            return all(int(rt["dledger"]["committedIndex"]) >= end and int(rt["dispatchBehindBytes"]) == 0
                       for rt in (b.runtime() for b in cluster.members(GROUP)))

        wait_for(converged, WAIT_S, "every member committing and dispatching the leader's log")
        _judge(report, cluster, topic, loop, leader)
    report.seconds = time.monotonic() - t0
    return report


# --- cost: idempotent against plain, alternating ------------------------------------------------------------

BODY = b"x" * 1024


@attrs.frozen
class Slice:
    """One timed slice of sends."""

    msgs_per_s: float
    client_us: float
    """Client CPU per message, µs."""
    broker_us: float
    """Broker CPU per message, µs."""


def _slice(p: Producer, topic: str, batch: int, seconds: float, meter: CpuMeter) -> Slice:
    """Sends by ``p`` from one thread for ``seconds`` (``send_batch`` of ``batch``, or single sends when ``batch``
    is 1); each message is new."""
    sent = 0
    out: dict[str, float] = {}
    with meter.measure(out, 1):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if batch == 1:
                p.send(Message(topic, BODY))
            else:
                p.send_batch([Message(topic, BODY) for _ in range(batch)])
            sent += batch
    return Slice(out["msgs_per_s"] * sent, out["client_us"] / sent, out["broker_us"] / sent)


def send_cost(namesrv: str, topic: str, *, batch: int, rounds: int, seconds: float, broker_pid: int | None = None,
              progress: Callable[[str], None] | None = None) -> list[tuple[Slice, Slice]]:
    """``rounds`` pairs of slices ``(idempotent, plain)``, taken in turns, the order swapped every round."""
    meter = CpuMeter(broker_pid)
    rounds_out: list[tuple[Slice, Slice]] = []
    with Producer("idem_on", namesrv, idempotent=True) as on, Producer("idem_off", namesrv, idempotent=False) as off:
        for p in (on, off):
            _slice(p, topic, batch, 0.3, meter)  # connections, routes
        for r in range(rounds):
            order = [(True, on), (False, off)] if r % 2 == 0 else [(False, off), (True, on)]
            got: dict[bool, Slice] = {}
            for is_on, p in order:
                got[is_on] = _slice(p, topic, batch, seconds, meter)
            a, b = got[True], got[False]
            rounds_out.append((a, b))
            if progress is not None:
                progress(f"  {'send_batch' if batch > 1 else 'send'} round {r + 1} ({'on' if r % 2 == 0 else 'off'} "
                         f"first): on {a.msgs_per_s:,.0f} off {b.msgs_per_s:,.0f} msgs/s ({a.msgs_per_s / b.msgs_per_s:.3f}); "
                         f"broker CPU {a.broker_us:.1f} / {b.broker_us:.1f} µs, client CPU {a.client_us:.1f} / "
                         f"{b.client_us:.1f} µs a message")
    return rounds_out


def broker_cost(root: Path, *, rounds: int, batches: int = 400, batch: int = 64,
                progress: Callable[[str], None] | None = None) -> list[tuple[float, float]]:
    """The broker's own CPU per message of ``POST /send`` with and without the idempotent bit, in this process:
    a master's send processor over a file store (no slave, no index), each request handled, then dispatched; ``rounds`` pairs of ``batches`` requests of ``batch`` new messages, taken in turns, the order
    swapped every round. Returns each round's ``(idempotent, plain)`` CPU µs per message. Without the network and
    the client this is the cost the window adds where it is paid, clear of a busy machine's noise."""
    return asyncio.run(_broker_cost(root, rounds, batches, batch, progress))


class _NoReplicas:
    """An ASYNC_MASTER's durability wait never asks for replica acks."""

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        return None


async def _broker_cost(root: Path, rounds: int, batches: int, batch: int,
                       progress: Callable[[str], None] | None) -> list[tuple[float, float]]:
    cfg = BrokerConfig(store_path_root_dir=str(root / f"inproc-{uuid.uuid4().hex[:6]}"), broker_name=GROUP,
                       listen_port=0, ha_listen_port=0, mapped_file_size_commit_log=256 << 20,
                       message_index_enable=False)
    host = pack_host("127.0.0.1", 10911)
    store = FileMessageStore(cfg.to_store_config(host))
    store.load()
    store.start()
    cfg_dir = Path(cfg.config_dir)
    def wall_ms() -> int:
        return time.time_ns() // 1_000_000

    topics = TopicConfigManager(cfg_dir, auto_create_topic_enable=True, default_topic_queue_nums=4,
                                delay_level_count=18, max_auto_create=100, clock_ms=wall_ms)
    window = DuplicateWindow(cfg.duplicate_window_ms, cfg.duplicate_window_max_keys)
    send = SendProcessor(cfg, addr="127.0.0.1:10911", store_host=host, store=store, topics=topics,
                         groups=SubscriptionGroupManager(cfg_dir, clock_ms=wall_ms), metrics=BrokerMetrics("C", GROUP, "ASYNC_MASTER"),
                         durability=DurabilityWaiter(flush_disk_type=cfg.flush_disk_type, broker_role=cfg.broker_role,
                                                     sync_flush_timeout_ms=cfg.sync_flush_timeout_ms,
                                                     flush_future=store.flush_future, replicas=_NoReplicas()),
                         request_registration=lambda: None, dedup=window)
    out: list[tuple[float, float]] = []
    try:
        keys = UniqKeyGenerator()
        msgs = [Message("InProc", BODY) for _ in range(batch)]
        query = b"group=pg&queueId=0&topic=InProc"
        for r in range(rounds):
            got: dict[bool, float] = {}
            for idem in ((True, False) if r % 2 == 0 else (False, True)):
                flag = int(SysFlag.IDEMPOTENT) if idem else 0
                requests = [Request("POST", "/send", None, encode_batch(msgs, born_timestamp_ms=1,
                                                                        uniq_keys=keys.next_many(batch), sys_flag=flag),
                                    ("127.0.0.1", 1), query) for _ in range(batches)]
                t0 = time.process_time()
                for request in requests:
                    await send.handle(request)
                while store.dispatch_available(64 << 20):
                    pass
                got[idem] = (time.process_time() - t0) / (batches * batch) * 1e6
            out.append((got[True], got[False]))
            if progress is not None:
                progress(f"  in-process broker round {r + 1}: {got[True]:.2f} / {got[False]:.2f} µs of CPU a message "
                         f"(window {len(window)} keys)")
    finally:
        store.shutdown()
    return out


def _kill_rows(report_on: KillReport, report_off: KillReport) -> list[Row]:
    rows = []
    for rep in (report_on, report_off):
        dups = max(rep.duplicated.values(), default=0)
        lost = max(rep.lost.values(), default=0)
        rows.append(Row(f"{rep.scenario}, window {'on' if rep.dedup else 'off'}: duplicated (of {rep.acknowledged} "
                        f"acknowledged, {rep.resends} re-sends, {rep.kills} kills; lost {lost})", float(dups), "msgs",
                        target="0" if rep.dedup else ""))
    return rows


def run(quick: bool) -> list[Row]:
    """``python -m benchmarks idempotence``: the kills with the window on and off, then the cost rows."""
    def say(line: str) -> None:
        print(line, flush=True)

    rounds = 3 if quick else 10
    root = Path(tempfile.mkdtemp(prefix="splitmq-idem-"))
    rows: list[Row] = []
    try:
        for fn in (sync_master_kills, dledger_leader_kills):
            reports = []
            for dedup in (True, False):
                rep = fn(root, rounds=rounds, dedup=dedup, progress=say)
                say(rep.summary())
                reports.append(rep)
            rows += _kill_rows(*reports)
        with _cluster(root, "cost", {}, mode="async", slaves_per_group=0) as cluster:
            topic = _create_topic(cluster)
            pid = cluster.broker(GROUP, 0).pid
            for batch, target in ((64, ">= 0.9"), (1, ">= 0.95")):
                each = send_cost(cluster.namesrv_addr, topic, batch=batch, rounds=4 if quick else 10,
                                 seconds=1.0 if quick else 2.0, broker_pid=pid, progress=say)
                name = f"send_batch of {batch}" if batch > 1 else "single send"
                ratios = [a.msgs_per_s / b.msgs_per_s for a, b in each]
                rows.append(Row(f"{name}, idempotent / plain msgs/s, median of {len(each)} alternating rounds "
                                f"(each: {', '.join(f'{r:.2f}' for r in ratios)})", statistics.median(ratios), "x",
                                target=target))
                for side, label in ((0, "idempotent"), (1, "plain")):
                    rows.append(Row(f"  {name}, {label}: broker CPU a message (median)",
                                    statistics.median(pair[side].broker_us for pair in each), "µs"))
        inproc = broker_cost(root, rounds=4 if quick else 10, progress=say)
        rows.append(Row(f"POST /send of 64, in-process broker CPU a message, idempotent (median of {len(inproc)} "
                        f"alternating rounds; each: {', '.join(f'{a:.1f}/{b:.1f}' for a, b in inproc)})",
                        statistics.median(a for a, _ in inproc), "µs", "plain",
                        statistics.median(b for _, b in inproc)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    from benchmarks import format_table

    print(format_table("idempotence", run(quick=False)))
