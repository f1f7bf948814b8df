"""DLedger benchmarks (issue 12): what the Raft-replicated commit log costs, how far its followers trail, and how
long a group goes without a master when its leader dies. ``python -m benchmarks dledger [--quick]``.

Every figure comes from processes of a :class:`~client.cluster.LocalCluster` on this machine, driven through the
SDK's public API only (no broker module is imported):

* **send_batch**: 64 x 1 KiB from one and from four threads sharing a :class:`~client.Producer`, against a
  3-member DLedger group and against a SYNC_MASTER with one slave started in the same run -- the two replicate
  to one peer before answering (the DLedger leader needs one follower for its quorum of two), so their ratio is
  what the Raft log costs over the classic HA stream (issue target >= 0.75). Like is compared with like: both
  groups run the brokers' disk defaults (``flushDiskType=ASYNC_FLUSH``: no send waits for an fsync, on the
  master, the slave, the leader or a follower; log files preallocated and faulted in ahead of the writer), which
  is also what a user gets. Rounds alternate between the clusters, each run followed by waiting until every
  member has everything (a run must not leave work behind that the next one pays for); medians. On a loaded
  2-core machine single rounds swing by 2x or more: compare medians of several runs.
* **replication lag** at half the one-thread maximum of the row above, paced, to one queue: the leader's
  ``GET /runtime`` is sampled every few ms (its ``peerProgress`` gives each follower's acked index against its
  ledger end in one answer; each follower's committed index is read just before the leader's, so that lag is an
  upper bound), and one thread per follower long-polls the queue on that follower. The time from a batch's
  SEND_OK to the moment its last message is pullable on a follower is the lag in ms: followers learn the
  commit index from the leader's next push, and only then dispatch to their consume queues.
* **failover**: one thread sends single 1 KiB messages with unique keys at a steady pace through the low-level
  :class:`~client.lowlevel.BrokerClient` (one attempt per call; on any error it asks the nameserver for the
  route again and retries the same message, with its same ``UNIQ_KEY``, every 20 ms for at most 60 s -- the
  SDK's own ride-through of a leader change is not measured here). The current leader is SIGKILLed; the time
  from the kill to the first SEND_OK of a send that *started* after the process was gone is the failover time
  (no reply of the dead leader can count). The dead member is restarted and waited for until it has the
  leader's log as it was at the restart, and the next kill follows. Then every member must hold every
  acknowledged key: each queue is read back from each member and the keys counted (lost must be 0; duplicates
  are retries of sends whose answer was lost). Run with the default timings (heartbeat 2000 ms, 3 missed: ~6 s
  before a vote) and with ``heartBeatTimeIntervalMs=500`` (target < 3 s), each with the dead member's peer port
  *silent* (``LocalCluster`` as it is: 20 kills) and *refusing* (10 kills); see :data:`PORT_KINDS`.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import os
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
from benchmarks._load import send_batch_rate, settle_group, wait_for
from client import Admin, Message, MessageQueue, Producer, PullStatus, SendStatus
from client.cluster import BrokerHandle, ClusterError, LocalCluster
from client.errors import ClientError
from client.lowlevel import BrokerClient
from common.codec import UniqKeyGenerator, decode_records, encode_batch

__all__ = ["FailoverResult", "KillRecord", "failover_rows", "run", "run_failover"]

GROUP = "broker-a"
BODY = b"d" * 1024
BATCH = 64
QUEUES = 4
#: Commit-log file size of the benchmark clusters (the 1 GiB default preallocates a lot of disk).
FILE_SIZE = 64 * 1024 * 1024
#: Brokers register every second (the new master is in the route soon), build no key index (not measured here),
#: serve reads as slaves (the lag and read-back pulls go to followers) and copy topics from their master every
#: second (a topic must exist on a follower before that follower can lead).
_COMMON = {"registerNameServerPeriod": "1000", "registerNameServerPeriodMinMs": "500", "messageIndexEnable": "false",
           "slaveReadEnable": "true", "slaveMetadataSyncInterval": "1000"}
#: The failover clusters answer the read-back with up to 512 messages per pull instead of 32.
_READ_BACK = {"maxTransferCountOnMessageInMemory": "512", "maxTransferBytesOnMessageInMemory": str(1 << 20),
              "maxTransferCountOnMessageInDisk": "512", "maxTransferBytesOnMessageInDisk": str(1 << 20)}
#: Bounds of every wait on the cluster: a breach is reported with the member logs, never waited out.
WAIT_S = 60.0


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


@contextlib.contextmanager
def _cluster(root: Path, label: str, config: Mapping[str, str], **kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(root / f"{label}-{uuid.uuid4().hex[:6]}", broker_config={**_COMMON, **config},
                           commitlog_file_size_bytes=FILE_SIZE, **kwargs)
    with cluster:
        yield cluster


def _master(cluster: LocalCluster) -> BrokerHandle:
    return cluster.leader(GROUP, WAIT_S) if cluster.mode == "dledger" else cluster.broker(GROUP, 0)


def _create_topic(cluster: LocalCluster, prefix: str) -> str:
    """A topic of :data:`QUEUES` queues, once every member knows it (a follower that leads later must have it)."""
    topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, queue_nums=QUEUES)

    def everywhere() -> bool:
        return all(topic in httpx.get(f"http://{b.addr}/topics", timeout=5).json()["topicConfigTable"]
                   for b in cluster.members(GROUP))

    wait_for(everywhere, WAIT_S, f"topic {topic} on every member")
    return topic


# --- send_batch: DLedger vs SYNC_MASTER -------------------------------------------------------------------------

def bench_send_batch(dl: LocalCluster, sync: LocalCluster, *, quick: bool) -> tuple[list[Row], float]:
    """Rows of ``send_batch`` DLedger vs SYNC_MASTER (1 and 4 threads), and the DLedger one-thread median."""
    rounds, seconds = (3, 1.0) if quick else (5, 2.0)
    topics = {"dledger": _create_topic(dl, "BenchDL"), "sync": _create_topic(sync, "BenchDL")}
    clusters = {"dledger": dl, "sync": sync}
    rows: list[Row] = []
    one_thread = 0.0
    with Producer("bench_dl_send_d", dl.namesrv_addr) as pd, Producer("bench_dl_send_s", sync.namesrv_addr) as ps:
        producers = {"dledger": pd, "sync": ps}
        msgs = {k: [Message(t, BODY) for _ in range(BATCH)] for k, t in topics.items()}
        for k in clusters:  # routes, connections, the first commit-log file
            send_batch_rate(producers[k], msgs[k], 0.5, 1)
            settle_group(clusters[k], GROUP, WAIT_S)
        for threads in (1, 4):
            rates: dict[str, list[float]] = {k: [] for k in clusters}
            for i in range(rounds):
                for k in (("dledger", "sync") if i % 2 == 0 else ("sync", "dledger")):
                    rates[k].append(send_batch_rate(producers[k], msgs[k], seconds, threads))
                    settle_group(clusters[k], GROUP, WAIT_S)
            d, s = statistics.median(rates["dledger"]), statistics.median(rates["sync"])
            print(f"dledger: send_batch {threads} thread(s), {rounds} rounds of {seconds:.0f} s: DLedger "
                  + ", ".join(f"{r:,.0f}" for r in rates["dledger"]) + "; SYNC_MASTER "
                  + ", ".join(f"{r:,.0f}" for r in rates["sync"]) + f"; ratio {d / s:.2f}", flush=True)
            rows.append(Row(f"send_batch 64 x 1 KiB, DLedger 3 peers, {threads} thread(s) (median)", d, "msgs/s",
                            "SYNC_MASTER + 1 slave (median)", s, ">= 0.75x"))
            if threads == 1:
                one_thread = d
    return rows, one_thread


# --- replication lag --------------------------------------------------------------------------------------------

def _watch(bc: BrokerClient, addr: str, mq: MessageQueue, offset: int, stop: threading.Event,
           seen: list[tuple[float, int]]) -> None:
    """Long-poll ``mq`` on the member at ``addr`` from ``offset``; note (when, next offset) for every answer."""
    while not stop.is_set():
        r = bc.pull_raw_from(addr, mq, offset, group="bench_dl_lag", max_nums=256, suspend_timeout_ms=500)
        if r.status is PullStatus.FOUND:
            seen.append((time.monotonic(), r.next_begin_offset))
            offset = r.next_begin_offset


def _sample_lag(leader: BrokerHandle, followers: list[BrokerHandle], stop: threading.Event,
                acked: list[float], committed: list[float]) -> None:
    """Every 5 ms: each follower's acked-index lag as the leader sees it (one answer), and each follower's
    committed index against the leader's (the follower read first: an upper bound)."""
    while not stop.is_set():
        mine = [int(f.runtime()["dledger"]["committedIndex"]) for f in followers]
        d = leader.runtime()["dledger"]
        for c in mine:
            committed.append(float(max(0, int(d["committedIndex"]) - c)))
        for peer, progress in d["peerProgress"].items():
            if peer != d["selfId"]:
                acked.append(float(progress["lag"]))
        stop.wait(0.005)


def _visible_lag_ms(acks: list[tuple[float, int]], seen: list[tuple[float, int]]) -> list[float]:
    """For each acknowledged batch (ack time, end offset), ms until a pull answer reached its end offset on the
    follower (0 when the follower had it before the ack came back)."""
    offsets = [o for _, o in seen]
    out = []
    for t_ack, end in acks:
        j = bisect.bisect_left(offsets, end)
        if j < len(seen):
            out.append(max(0.0, seen[j][0] - t_ack) * 1000)
    return out


def bench_replication_lag(dl: LocalCluster, max_rate: float, *, quick: bool) -> list[Row]:
    """Lag of the followers at half ``max_rate``, in entries and in ms to pullable (module docstring)."""
    seconds = 3.0 if quick else 6.0
    topic = _create_topic(dl, "BenchDLLag")
    mq = MessageQueue(topic, GROUP, 0)
    leader = _master(dl)
    followers = [b for b in dl.members(GROUP) if b is not leader]
    rate = max_rate / 2
    msgs = [Message(topic, BODY) for _ in range(BATCH)]
    acks: list[tuple[float, int]] = []
    seen: dict[str, list[tuple[float, int]]] = {f.addr: [] for f in followers}
    acked_lag: list[float] = []
    committed_lag: list[float] = []
    stop = threading.Event()
    with Producer("bench_dl_lag", dl.namesrv_addr) as p, BrokerClient(dl.namesrv_addr) as bc:
        p.send_batch(msgs, queue=mq)
        settle_group(dl, GROUP, WAIT_S)
        start = bc.queue_offset(leader.addr, "max", mq)
        threads = [threading.Thread(target=_watch, args=(bc, f.addr, mq, start, stop, seen[f.addr]), daemon=True,
                                    name=f"bench-dl-watch-{f.broker_id}") for f in followers]
        threads.append(threading.Thread(target=_sample_lag, args=(leader, followers, stop, acked_lag, committed_lag),
                                        daemon=True, name="bench-dl-sample"))
        for t in threads:
            t.start()
        t0 = time.monotonic()
        sent = 0
        while (now := time.monotonic()) - t0 < seconds:
            due = t0 + sent / rate  # paced: batch k leaves at k * 64 / rate
            if now < due:
                time.sleep(due - now)  # pacing the load, not a synchronisation
            res = p.send_batch(msgs, queue=mq)
            acks.append((time.monotonic(), res[-1].queue_offset + 1))
            sent += len(msgs)
        elapsed = time.monotonic() - t0
        last = acks[-1][1]
        wait_for(lambda: all(s and s[-1][1] >= last for s in seen.values()), WAIT_S, "followers pullable to the end")
        stop.set()
        for t in threads:
            t.join(5)
    per_follower = {addr: _visible_lag_ms(acks, s) for addr, s in seen.items()}
    pooled = [v for vs in per_follower.values() for v in vs]
    print("dledger: SEND_OK to pullable, per follower p50/p99 ms: " + "; ".join(
        f"{addr} {_percentile(v, 0.5):.1f}/{_percentile(v, 0.99):.1f}" for addr, v in per_follower.items()),
        flush=True)
    load = f"at {sent / elapsed:,.0f} msgs/s (half of {max_rate:,.0f}), 1 entry = 64 msgs"
    return [
        Row(f"follower lag p50, acked index vs leader's end (leader's view) {load}", _percentile(acked_lag, 0.5),
            "entries"),
        Row("follower lag p99, acked index vs leader's end", _percentile(acked_lag, 0.99), "entries"),
        Row("follower lag p50, committed index vs leader's (upper bound)", _percentile(committed_lag, 0.5),
            "entries"),
        Row("follower lag p99, committed index vs leader's (upper bound)", _percentile(committed_lag, 0.99),
            "entries"),
        Row("SEND_OK to pullable on a follower p50 (both followers)", _percentile(pooled, 0.5), "ms"),
        Row("SEND_OK to pullable on a follower p99 (both followers)", _percentile(pooled, 0.99), "ms"),
        Row(f"lag samples: runtime reads (batches timed: {len(pooled):,})", float(len(committed_lag)), "samples"),
    ]


# --- failover ---------------------------------------------------------------------------------------------------

@attrs.frozen
class _Ack:
    key: str
    started: float
    """Monotonic time the successful attempt was sent."""
    acked: float
    """Monotonic time its SEND_OK came back."""


class _SteadyProducer:
    """One thread sending single messages with unique keys at ``rate_per_s`` through the low-level client; a
    failed attempt is retried (same message) after a route refresh until ``retry_for_s`` runs out."""

    RETRY_PAUSE_S = 0.02

    def __init__(self, namesrv_addr: str, topic: str, rate_per_s: float, retry_for_s: float = WAIT_S) -> None:
        self.namesrv_addr = namesrv_addr
        self.topic = topic
        self.rate_per_s = rate_per_s
        self.retry_for_s = retry_for_s
        self.acks: list[_Ack] = []
        self.attempted: list[str] = []
        """Keys of every message sent at least once (an unanswered attempt may still have been stored)."""
        self.gave_up: list[str] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-dl-steady", daemon=True)
        self._uniq = UniqKeyGenerator()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.retry_for_s + 10)

    def first_ack_started_after(self, t: float) -> _Ack | None:
        """The first acknowledgement of an attempt sent at ``t`` or later (attempts are sequential, so ``acks``
        is sorted by start time)."""
        acks = self.acks
        i = bisect.bisect_left(acks, t, key=lambda a: a.started)
        return acks[i] if i < len(acks) else None

    def _run(self) -> None:
        with BrokerClient(self.namesrv_addr) as bc:
            t0 = time.monotonic()
            n = 0
            while not self._stop.is_set():
                key = f"k{n:09d}"
                body = encode_batch([Message(self.topic, BODY, keys=key)], born_timestamp_ms=int(time.time() * 1000),
                                    uniq_keys=[self._uniq.next()])
                self.attempted.append(key)
                self._send(bc, key, body)
                n += 1
                due = t0 + n / self.rate_per_s
                self._stop.wait(max(0.0, due - time.monotonic()))  # pacing the load

    def _send(self, bc: BrokerClient, key: str, body: bytes) -> None:
        give_up = time.monotonic() + self.retry_for_s
        while True:
            started = time.monotonic()
            try:
                r = bc.send_encoded(self.topic, body, 1, group="bench_dl_steady", timeout_s=3.0, retries=0)
                if r.send_status is SendStatus.SEND_OK:
                    self.acks.append(_Ack(key, started, time.monotonic()))
                    return
                self.errors[r.send_status.value] += 1
            except ClientError as e:
                self.errors[type(e).__name__] += 1
            if time.monotonic() > give_up:
                self.gave_up.append(key)
                return
            with contextlib.suppress(ClientError):
                bc.route(self.topic, refresh=True)
            time.sleep(self.RETRY_PAUSE_S)  # back-off between attempts


@attrs.frozen
class KillRecord:
    """One SIGKILL of the leader."""

    old_leader: str
    new_leader: str
    failover_s: float
    """From the SIGKILL to the SEND_OK of the first send that started after the leader was gone."""
    catch_up_s: float
    """From the restart of the dead member to its log reaching the leader's end at that restart."""


@attrs.frozen
class FailoverResult:
    """What a failover run measured and read back."""

    heartbeat_ms: int
    refuse_dead_port: bool
    kills: tuple[KillRecord, ...]
    acked: int
    attempted: int
    gave_up: int
    errors: Mapping[str, int]
    lost: Mapping[str, int]
    """Member -> acknowledged keys it does not hold."""
    duplicates: Mapping[str, int]
    """Member -> reads of a key beyond its first."""
    stored_unacked: int
    """Keys read back that never got a SEND_OK (an attempt whose answer was lost, or the last one given up)."""
    problems: tuple[str, ...]
    """Waits that ran out (with the member logs to read), members whose queues differ."""


def _member_name(b: BrokerHandle) -> str:
    return f"n{b.broker_id}"


def _wait_flowing(prod: _SteadyProducer, timeout_s: float) -> None:
    n = len(prod.acks)
    wait_for(lambda: len(prod.acks) >= n + 5, timeout_s, "the steady producer's next acknowledgements")


def _kill_once(cluster: LocalCluster, prod: _SteadyProducer, *, refuse_dead_port: bool) -> KillRecord:
    leader = _master(cluster)
    _wait_flowing(prod, WAIT_S)
    t_kill = time.monotonic()
    leader.kill()
    if refuse_dead_port and leader.peer_sock is not None:
        # The harness's copy of the member's listening peer socket would keep accepting for the dead process;
        # closed, the port refuses as a crashed process's does. The restarted broker binds the port itself.
        leader.peer_sock.close()
        leader.peer_sock = None
    gone = time.monotonic()
    deadline = gone + WAIT_S
    while (ack := prod.first_ack_started_after(gone)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no SEND_OK within {WAIT_S} s of killing {_member_name(leader)} "
                               f"(attempt errors so far {dict(prod.errors)})")
        time.sleep(0.005)  # polling the producer's acknowledgements with a deadline
    new = _master(cluster)
    t_restart = time.monotonic()
    leader.start()
    target = int(new.runtime()["dledger"]["ledgerEndIndex"])
    wait_for(lambda: int(leader.runtime()["dledger"]["ledgerEndIndex"]) >= target, WAIT_S,
          f"restarted {_member_name(leader)} catching up to entry {target}")
    return KillRecord(_member_name(leader), _member_name(new), ack.acked - t_kill, time.monotonic() - t_restart)


def _converge(cluster: LocalCluster) -> None:
    """Until every member has committed and dispatched the leader's whole log."""
    leader = _master(cluster)

    def done() -> bool:
        end = int(leader.runtime()["dledger"]["ledgerEndIndex"])
        rts = [b.runtime() for b in cluster.members(GROUP)]
        return all(int(rt["dledger"]["committedIndex"]) >= end and int(rt["dispatchBehindBytes"]) == 0
                   for rt in rts)

    wait_for(done, WAIT_S, "every member committing and dispatching the leader's log")


def _read_keys(bc: BrokerClient, addr: str, topic: str) -> tuple[collections.Counter[str], list[str]]:
    """Every key stored in ``topic`` on the member at ``addr``, and the queues whose read stopped short."""
    keys: collections.Counter[str] = collections.Counter()
    short: list[str] = []
    for q in range(QUEUES):
        mq = MessageQueue(topic, GROUP, q)
        offset, end = bc.queue_offset(addr, "min", mq), bc.queue_offset(addr, "max", mq)
        while offset < end:
            r = bc.pull_raw_from(addr, mq, offset, group="bench_dl_read", max_nums=512)
            if r.status is not PullStatus.FOUND:
                short.append(f"{addr} queue {q}: {r.status.name} at {offset} of {end}")
                break
            for m in decode_records(r.records):
                keys.update(m.keys)
            offset = r.next_begin_offset
    return keys, short


def run_failover(root: str | os.PathLike[str], *, kills: int, heartbeat_ms: int | None = None,
                 refuse_dead_port: bool = False, rate_per_s: float = 400.0,
                 on_kill: Callable[[KillRecord], None] | None = None) -> FailoverResult:
    """SIGKILL the leader of a 3-member group ``kills`` times under a steady produce, restarting the dead member
    each time, then read every queue back from every member (module docstring).

    Args:
        root: where the cluster's stores and logs go (``<root>/failover-*/logs``).
        kills: leaders to kill.
        heartbeat_ms: ``heartBeatTimeIntervalMs`` (None: the broker default, 2000).
        refuse_dead_port: close the harness's copy of a killed member's peer socket (see :data:`PORT_KINDS`).
        rate_per_s: the steady producer's pace.
        on_kill: called after each kill with its record (progress output).

    Returns:
        The result; a wait that ran out ends the kills early and is one of its ``problems``.
    """
    config = dict(_READ_BACK)
    if heartbeat_ms is not None:
        config["heartBeatTimeIntervalMs"] = str(heartbeat_ms)
    records: list[KillRecord] = []
    problems: list[str] = []
    with _cluster(Path(root), "failover", config, mode="dledger", peers_per_group=3) as cluster:
        topic = _create_topic(cluster, "BenchDLFail")
        prod = _SteadyProducer(cluster.namesrv_addr, topic, rate_per_s)
        prod.start()
        try:
            for _ in range(kills):
                try:
                    rec = _kill_once(cluster, prod, refuse_dead_port=refuse_dead_port)
                except (TimeoutError, ClusterError, OSError) as e:
                    problems.append(f"{e}; logs under {cluster.root_dir / 'logs'}")
                    break
                records.append(rec)
                if on_kill is not None:
                    on_kill(rec)
            with contextlib.suppress(TimeoutError, ClusterError):
                _wait_flowing(prod, 10.0)
        finally:
            prod.stop()
        try:
            _converge(cluster)
        except (TimeoutError, ClusterError, OSError) as e:
            problems.append(f"{e}; logs under {cluster.root_dir / 'logs'}")
        acked = {a.key for a in prod.acks}
        lost: dict[str, int] = {}
        dups: dict[str, int] = {}
        everything: set[str] = set()
        with BrokerClient(cluster.namesrv_addr) as bc:
            for b in cluster.members(GROUP):
                if not b.running():
                    problems.append(f"{_member_name(b)} is not running at the read-back")
                    continue
                keys, short = _read_keys(bc, b.addr, topic)
                problems.extend(short)
                lost[_member_name(b)] = len(acked - keys.keys())
                dups[_member_name(b)] = sum(keys.values()) - len(keys)
                everything |= keys.keys()
    return FailoverResult(heartbeat_ms or 2000, refuse_dead_port, tuple(records), len(acked), len(prod.attempted), len(prod.gave_up),
                          dict(prod.errors), lost, dups, len(everything - acked), tuple(problems))


def failover_rows(res: FailoverResult) -> list[Row]:
    """The rows of one failover run."""
    times = [k.failover_s for k in res.kills]
    label = f"heartbeat {res.heartbeat_ms} ms, dead port {'refusing' if res.refuse_dead_port else 'silent'}"
    target = "< 3" if res.heartbeat_ms <= 500 else ""
    return [
        Row(f"failover p50, kill to first SEND_OK, {label} ({len(times)} kills)",
            statistics.median(times) if times else 0.0, "s", target=target),
        Row(f"failover max, {label}", max(times, default=0.0), "s", target=target),
        Row(f"acknowledged messages lost (worst member), {label}", float(max(res.lost.values(), default=0)),
            "msgs", "acknowledged", float(res.acked), "0"),
        Row(f"duplicates read back (worst member), {label}", float(max(res.duplicates.values(), default=0)), "msgs",
            "acknowledged", float(res.acked)),
        Row(f"problems (waits run out, short reads, sends given up), {label}",
            float(len(res.problems) + res.gave_up), "problems", target="0"),
    ]


def _print_kill(rec: KillRecord) -> None:
    print(f"  kill {rec.old_leader}: {rec.new_leader} serves after {rec.failover_s:.2f} s; "
          f"{rec.old_leader} restarted and caught up in {rec.catch_up_s:.2f} s", flush=True)


def _print_failover(res: FailoverResult) -> None:
    catch_up = statistics.median(k.catch_up_s for k in res.kills) if res.kills else 0.0
    print(f"  {res.acked:,} acknowledged of {res.attempted:,} sent, {res.gave_up} given up; lost per member "
          f"{dict(res.lost)}; duplicates {dict(res.duplicates)}; stored without an ack {res.stored_unacked}; "
          f"restart + catch-up p50 {catch_up:.2f} s; attempt errors {dict(res.errors)}", flush=True)
    for p in res.problems:
        print(f"  PROBLEM: {p}", flush=True)


#: The failover runs of the full entry: (heartBeatTimeIntervalMs or None for the default, refuse_dead_port, kills,
#: kills with --quick). A SIGKILLed member's peer port stays *silent* under :class:`LocalCluster` (the harness
#: holds a listening copy of it for the restart: peers connect and never hear back, as from a host that vanished);
#: *refusing* closes that copy at the kill, as a crashed process's port on a live host refuses.
PORT_KINDS = ((None, False, 20, 3), (500, False, 20, 3), (None, True, 10, 2), (500, True, 10, 2))


def run(quick: bool) -> list[Row]:
    """``python -m benchmarks dledger``: every row of the module docstring (``--quick``: shorter rounds, 2-3 kills
    per failover run instead of 10-20). The clusters' stores and logs are deleted at the end unless a failover run
    lost a message or had a problem: then they stay, and their place is printed."""
    rows: list[Row] = []
    root = Path(tempfile.mkdtemp(prefix="splitmq-bench-dledger-"))
    keep = False
    try:
        with _cluster(root, "dledger", {}, mode="dledger", peers_per_group=3) as dl, \
                _cluster(root, "sync", {}, mode="sync", slaves_per_group=1) as sync:
            send_rows, one_thread = bench_send_batch(dl, sync, quick=quick)
            rows += send_rows
            rows += bench_replication_lag(dl, one_thread, quick=quick)
        for heartbeat, refuse, full_kills, quick_kills in PORT_KINDS:
            kills = quick_kills if quick else full_kills
            print(f"dledger: failover, heartBeatTimeIntervalMs={heartbeat or 'default'}, dead peer port "
                  f"{'refusing' if refuse else 'silent'}, {kills} kills", flush=True)
            res = run_failover(root, kills=kills, heartbeat_ms=heartbeat, refuse_dead_port=refuse,
                               on_kill=_print_kill)
            _print_failover(res)
            rows += failover_rows(res)
            keep = keep or bool(res.problems or res.gave_up or any(res.lost.values()))
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"dledger: stores and logs kept under {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return rows
