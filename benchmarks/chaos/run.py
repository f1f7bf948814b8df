"""One chaos run: a cluster, the workload, the nemesis until the profile's targets are met, then the checks.

:func:`run_chaos` returns a :class:`~benchmarks.chaos.report.ChaosReport`; it never leaves a process behind
(the cluster is a context manager, paused processes are resumed before they are stopped, worker threads are
told to stop and joined with bounds). Bounded everywhere: the fault loop by the profile's ``time_limit_s``,
each heal, settle and drain by its own timeout.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path

from benchmarks.chaos.checker import LagWindow, compare_commitlogs, judge, read_back
from benchmarks.chaos.cluster import ChaosCluster, ChaosClusterError, ClusterSpec, pick_disk_mode, resume_all
from benchmarks.chaos.ledger import AttemptCounter, Ledger
from benchmarks.chaos.nemesis import FaultRecord, Nemesis, plan
from benchmarks.chaos.profiles import Profile
from benchmarks.chaos.report import ChaosReport
from benchmarks.chaos.workload import Consumers, ProducerThread, StallMonitor
from client import Admin, ClientConfig, ClientInstance, MessageQueue, Producer
from client.cluster import ClusterError
from client.errors import ClientError
from client.lowlevel import BrokerClient

__all__ = ["run_chaos"]

log = logging.getLogger(__name__)

TOPIC = "ChaosTopic"
PRODUCER_GROUP = "chaos-producers"
CONSUMER_GROUP = "chaos-consumers"
CHECKER_GROUP = "chaos-checker"
#: Bound on joining a producer thread once told to stop (a send may be in its retries).
PRODUCER_JOIN_S = 15.0


def run_chaos(profile: Profile, *, mode: str = "sync", seed: int | None = None, disk: str = "auto",
              root: Path | None = None, progress: Callable[[str], None] | None = None,
              idempotent: bool = True) -> ChaosReport:
    """Run ``profile`` against a fresh cluster of ``mode`` (``sync`` or ``async``) groups.

    Args:
        profile: sizes, targets and bounds.
        mode: SYNC_MASTER or ASYNC_MASTER groups.
        seed: the nemesis's random source (random when None; the report names it).
        disk: ``auto`` (tmpfs when root), ``tmpfs`` or ``fault-layer``.
        root: where the cluster lives; a new temporary directory when None, deleted after a clean run and kept
            (named in the report) after a failed one.
        progress: called with a line now and then (a long run says how far it is).
        idempotent: the producers' ``idempotent`` (issue 38): then a duplicate of any kind fails the run.
    """
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be sync or async, got {mode!r}")
    seed = random.randrange(1 << 32) if seed is None else seed
    own_root = root is None
    root = Path(tempfile.mkdtemp(prefix="splitmq-chaos-")) if root is None else root
    spec = ClusterSpec(mode="sync" if mode == "sync" else "async", disk=pick_disk_mode(disk),
                       commitlog_file_size_bytes=profile.commitlog_file_bytes, tmpfs_size_bytes=profile.tmpfs_bytes,
                       broker_config={"mappedFileSizeConsumeQueue": str(profile.consume_queue_file_bytes),
                                      **profile.broker_config})
    report = ChaosReport(profile=profile.name, mode=mode, disk=spec.disk, seed=seed, root=str(root),
                         targets=(profile.faults, profile.acknowledged), stuck_after_s=profile.stuck_after_s,
                         idempotent=idempotent)
    t0 = time.monotonic()
    try:
        with ChaosCluster(root / "cluster", spec) as cluster:
            try:
                _Run(profile, cluster, report, random.Random(seed), progress or (lambda _: None)).go()
            finally:
                resume_all(cluster)
                if report.failures():
                    _keep_evidence(cluster, report, root)
    except (ChaosClusterError, ClusterError, ClientError, OSError) as e:
        report.errors.append(f"run stopped: {e!r}")
    report.duration_s = time.monotonic() - t0
    if own_root and not report.failures():
        shutil.rmtree(root, ignore_errors=True)
    return report


def _keep_evidence(cluster: ChaosCluster, report: ChaosReport, root: Path) -> None:
    """A failed run keeps what it found (every example the checker noted) and a copy of each broker's store, which
    a tmpfs disk would otherwise take with it, under ``root``."""
    lines = [report.summary()]
    lines += [f"{kind}: {text}" for kind, texts in report.verdict.examples.items() for text in texts]
    (root / "failure.txt").write_text("\n".join(lines) + "\n")
    try:
        cluster.keep_stores(root / "kept-stores")
    except OSError as e:
        report.errors.append(f"could not keep the stores: {e}")


class _Run:
    """The steps of one run, sharing the cluster, the ledger and the report."""

    def __init__(self, profile: Profile, cluster: ChaosCluster, report: ChaosReport, rng: random.Random,
                 progress: Callable[[str], None]) -> None:
        self.p = profile
        self.cluster = cluster
        self.report = report
        self.rng = rng
        self.progress = progress
        self.groups = cluster.groups
        self.mqs = [MessageQueue(TOPIC, g, q) for g in self.groups for q in range(profile.queues_per_group)]
        self.ledger = Ledger(profile.batch_producers + profile.single_producers)
        self.abort = threading.Event()

    def go(self) -> None:
        self._create_topic()
        counter = AttemptCounter(self.ledger)
        # Producers attach to the client instance of their nameserver list: this one, with the counting transport.
        instance = ClientInstance.acquire(self.cluster.namesrv_addr, transport=counter)
        try:
            idem = self.report.idempotent
            with Producer(PRODUCER_GROUP, self.cluster.namesrv_addr, idempotent=idem) as batch_p, \
                    Producer(PRODUCER_GROUP + "-single", self.cluster.namesrv_addr, idempotent=idem) as single_p:
                self._produce_under_faults(batch_p, single_p)
        finally:
            instance.release()
        if counter.sends == 0:
            self.report.errors.append("the attempt counter saw no send: the producers bypassed it")

    def _create_topic(self) -> None:
        with Admin(self.cluster.namesrv_addr) as admin:
            admin.create_topic(TOPIC, queue_nums=self.p.queues_per_group)
        deadline = time.monotonic() + 30
        for g in self.groups:  # a slave serves a topic once its metadata sync brought the config
            addr = self.cluster.slave(g).addr
            while TOPIC not in self.cluster.get_json(addr, "/topics").get("topicConfigTable", {}):
                if time.monotonic() > deadline:
                    raise ChaosClusterError(f"topic {TOPIC} not on the slave of {g} within 30 s")
                time.sleep(0.05)  # polling the slave with a deadline

    def _producers(self, batch_p: Producer, single_p: Producer) -> list[ProducerThread]:
        index = {g: i for i, g in enumerate(self.groups)}
        pad = b"x" * self.p.pad_bytes
        threads = [ProducerThread(i, batch_p, TOPIC, self.ledger, index, batch=self.p.batch,
                                  rate=self.p.batch_rate, pad=pad) for i in range(self.p.batch_producers)]
        threads += [ProducerThread(self.p.batch_producers + i, single_p, TOPIC, self.ledger, index, batch=1,
                                   rate=self.p.single_rate, pad=pad) for i in range(self.p.single_producers)]
        return threads

    def _produce_under_faults(self, batch_p: Producer, single_p: Producer) -> None:
        producers = self._producers(batch_p, single_p)
        consumers = Consumers(self.cluster.namesrv_addr, self.mqs, CONSUMER_GROUP,
                              deadline_s=self.p.time_limit_s + 600)
        index = {g: i for i, g in enumerate(self.groups)}
        stored: dict[MessageQueue, int] = {}

        def high(mq: MessageQueue) -> int:  # acknowledged, or stored on the master when last asked
            return max(self.ledger.high(index[mq.broker_name], mq.queue_id), stored.get(mq, 0))

        monitor = StallMonitor(consumers, high)
        sampling = threading.Thread(target=self._sample, args=(monitor, stored), name="chaos-monitor", daemon=True)
        consumers.start()
        for t in producers:
            t.start()
        sampling.start()
        t0 = time.monotonic()
        settle = False
        try:
            self._faults()
            settle = True
        finally:  # also on Ctrl-C: the workers stop, the settle and drain are skipped
            for t in producers:
                t.halt.set()
            for t in producers:
                t.join(PRODUCER_JOIN_S)
            self.report.produce_s = time.monotonic() - t0
            try:
                if settle:
                    self._settle_and_drain(consumers)
            except (ChaosClusterError, ClusterError, ClientError) as e:
                self.report.errors.append(f"after the last fault: {e}")  # the checks still run, on what is there
            finally:
                consumers.abort.set()
                self.abort.set()
                consumers.join(30)
                sampling.join(5)
        self._collect(producers, consumers, monitor)

    def _sample(self, monitor: StallMonitor, stored: dict[MessageQueue, int]) -> None:
        """Every sampling period: each queue's max offset on its master (kept when the master does not answer),
        then a stall sample."""
        with BrokerClient(self.cluster.namesrv_addr, config=ClientConfig(request_timeout_s=1.0)) as client:
            while not self.abort.wait(0.25):  # the sampling period
                for mq in self.mqs:
                    with contextlib.suppress(ClientError):
                        stored[mq] = client.queue_offset(self.cluster.master(mq.broker_name).addr, "max", mq)
                monitor.sample()

    def _faults(self) -> None:
        p = self.p
        nemesis = Nemesis(self.cluster, heal_timeout_s=p.heal_timeout_s, abort=self.abort, exposure=self._exposure)
        specs = plan(self.rng, self.groups, hold_s=p.hold_s, gap_s=p.gap_s)
        deadline = time.monotonic() + p.time_limit_s
        faults = self.report.faults
        while len(faults) < p.faults or self.ledger.acknowledged < p.acknowledged:
            if time.monotonic() > deadline:
                self.report.errors.append(f"time limit {p.time_limit_s:.0f} s reached with {len(faults)} faults "
                                          f"and {self.ledger.acknowledged} acknowledged messages")
                return
            spec = next(specs)
            try:
                faults.append(nemesis.run(spec))
            except (ChaosClusterError, ClusterError, ClientError, OSError) as e:
                self.report.errors.append(f"fault {len(faults) + 1} ({spec.kind.value} on {spec.group}): {e}")
                return
            if len(faults) % 10 == 0:
                self.progress(f"chaos: {len(faults)} faults, {self.ledger.acknowledged:,} acknowledged")

    def _exposure(self, group: str) -> int | None:
        """Acknowledged messages of ``group`` beyond its slave's commit log (asked while its master is down)."""
        slave_max = self.cluster.max_offset(self.cluster.slave(group))
        return None if slave_max < 0 else self.ledger.acked_from(self.groups.index(group), slave_max)

    def _settle_and_drain(self, consumers: Consumers) -> None:
        """Whole again, slaves caught up, dispatch done; then every consumer reaches its queue's end."""
        resume_all(self.cluster)
        self.cluster.wait_healthy(self.p.heal_timeout_s)
        self.cluster.wait_settled(self.p.settle_timeout_s)
        with BrokerClient(self.cluster.namesrv_addr) as client:
            consumers.targets = {mq: client.queue_offset(self.cluster.master(mq.broker_name).addr, "max", mq)
                                 for mq in self.mqs}
        deadline = time.monotonic() + self.p.drain_timeout_s
        while not consumers.finished() and time.monotonic() < deadline and consumers.crash is None:
            time.sleep(0.05)  # polling the consumers with a deadline

    def _collect(self, producers: list[ProducerThread], consumers: Consumers, monitor: StallMonitor) -> None:
        r = self.report
        r.errors += [f"producer {t.index} crashed: {t.crash!r}" for t in producers if t.crash is not None]
        r.errors += [f"producer {t.index} did not stop" for t in producers if t.is_alive()]
        if consumers.crash is not None:
            r.errors.append(f"consumers crashed: {consumers.crash!r}")
        r.outcomes = dict(self.ledger.outcomes)
        index = {g: i for i, g in enumerate(self.groups)}
        r.stuck = [f"{mq.broker_name}/{mq.queue_id} ended at {q.offset} of {(consumers.targets or {}).get(mq)}"
                   for mq, q in consumers.queues.items() if not q.done]
        r.stalls = {f"{mq.broker_name}/{mq.queue_id}": s for mq, s in monitor.longest.items()}
        r.consumed_from_slaves = sum(q.from_slave for q in consumers.queues.values())
        r.consumer_gaps = sum(q.gaps for q in consumers.queues.values())
        r.consumer_rereads_differ = sum(q.reread_mismatches for q in consumers.queues.values())
        consumed = {(index[mq.broker_name], mq.queue_id): q.keys for mq, q in consumers.queues.items()}
        masters: dict[tuple[int, int], array[int]] = {}
        slaves: dict[tuple[int, int], array[int]] = {}
        with BrokerClient(self.cluster.namesrv_addr) as client:
            for mq in self.mqs:
                q = (index[mq.broker_name], mq.queue_id)
                for member, out in ((self.cluster.master(mq.broker_name), masters),
                                    (self.cluster.slave(mq.broker_name), slaves)):
                    try:
                        out[q] = read_back(client, member.addr, mq, CHECKER_GROUP)
                    except (ClientError, AssertionError) as e:
                        r.errors.append(f"reading {mq} back from {member!r}: {e}")
        r.verdict = judge(self.ledger, masters, slaves, consumed, sync=self.cluster.spec.mode == "sync",
                          lag_windows=lag_windows(r.faults, self.groups))
        for g in self.groups:
            m, s = self.cluster.master(g), self.cluster.slave(g)
            end = min(int(self.cluster.get_json(b.addr, "/runtime")["commitLogMaxOffset"]) for b in (m, s))
            r.commitlog_diffs += compare_commitlogs(m.store_dir / "commitlog", s.store_dir / "commitlog", end)


def lag_windows(faults: list[FaultRecord], groups: list[str]) -> list[LagWindow]:
    """The unreplicated bytes of each group when a fault hit its master (ASYNC losses are allowed there)."""
    index = {g: i for i, g in enumerate(groups)}
    return [LagWindow(index[f.spec.group], max(f.lag.slave_ack_offset, 0), f.lag.master_max_offset)
            for f in faults if f.lag is not None and f.spec.kind.role == "master"]
