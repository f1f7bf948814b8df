"""What the ACL costs on the data path (issue 14): the same work against a cluster with ACL off and one with ACL on.

Two one-group clusters (no slave) run side by side: ``LocalCluster(tls=True)`` and ``LocalCluster(tls=True,
acl=True)`` (issue 39: where TLS protects the channel, the SDK signs the first request of each connection as the
admin account and the broker binds the connection to it; later requests carry no signature and are checked
against the connection's account and the route's rule). ``measure(..., tls=False)`` compares plaintext clusters,
where every request is signed (HMAC-SHA256 over the request and a digest of its body on the client; the same plus
the account lookup, the replay guard and the permission rule on the broker). Figures:

* ``send_batch`` -- ``Producer.send_batch`` of 64 messages of 1 KiB from one thread, msgs/s;
* ``pull``       -- ``PullConsumer.pull`` of 32 per request from one thread over every queue of a pre-filled
  topic, every message decoded, msgs/s.

The rounds interleave (off, on, on, off, ...) so that a noisy neighbour on a shared machine weighs on both sides
alike; each figure is the median of its rounds, and the row's ratio is ACL on / ACL off (target >= 0.95). The
ratio of each round's two runs, which ran back to back, is shown too (median, min, max): a neighbour's burst that
falls on one side's run in one round moves a single pair, where it can move a side's median rate. The CPU
the work cost, summed over the rounds, is reported per message too: on a busy machine it moves much less than the
wall-clock rates do. The client's is the measuring thread's (``time.thread_time``: the synchronous SDK does each
request on the calling thread, and the other side's background threads must not be billed to this one); the
broker's is the sum of its threads' run time in ``/proc/<pid>/task/*/schedstat`` (nanoseconds, where psutil's
``cpu_times`` counts 10 ms ticks), else psutil's. Commit-log files are sized so that no file is created and
pre-faulted in the background during the rounds (which billed tens of ms to whichever round it fell in).

The ACL's own work of a *signed* request (the plaintext path, and a TLS connection's first request) is also timed
on its own, in this process and on one thread, where neighbours disturb it far
less (:func:`acl_work`): the SDK signing the very requests of the rounds and a gate verifying them. Added to the
ACL-off side's CPU per message, it says what the ACL's own work costs. It is a lower bound: timed in a loop, the
code and data stay in the CPU's caches, where in the servers other work runs between two requests (measured inside
a broker, the gate of a send_batch took about 55 µs where this loop says 37). ``python -m benchmarks acl [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from benchmarks import Row
from benchmarks.client_bench import CpuMeter
from client import Admin, ClientConfig, Credentials, Message, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from common.codec import encode_batch
from common.requests import PullRequestHeader, SendRequestHeader, parse_query
from common.signing import SCHEME_BLAKE3, SIGNING_SCHEME, RequestSigner, body_digest
from remoting.acl import parse_acl
from remoting.acl_gate import SIGNED, AclGate
from remoting.router import Request

__all__ = ["AclFigures", "AclWork", "Profile", "Side", "acl_work", "interleave", "measure", "rows", "run"]

BODY = b"x" * 1024
#: The body digest the SDK signs with (common/signing.py), timed on its own by :func:`acl_work`.
DIGEST_NAME = "BLAKE3" if SIGNING_SCHEME == SCHEME_BLAKE3 else "SHA-256"

BATCH = 64
PULL_NUMS = 32
QUEUES = 4


@attrs.frozen
class Profile:
    """How much work each round does."""

    rounds: int
    """Rounds per side (each round: one send_batch run and one pull run)."""
    batches: int
    """``send_batch`` calls of 64 per send run."""
    pull_messages: int
    """Messages in the pull topic, all of them read by each pull run."""


#: 21 short rounds rather than 7 long ones (same work): a round's ratio swings by +-15 % on a 2-vCPU machine with
#: both clusters on it, so the median of 7 moved by +-6 % between identical runs; 21 pairs hold it within +-3 %.
FULL = Profile(rounds=21, batches=150, pull_messages=16_384)
QUICK = Profile(rounds=7, batches=40, pull_messages=8_192)
#: ``mappedFileSizeCommitLog`` of both clusters: more than FULL writes (~250 MB), so no file rolls mid-round.
COMMITLOG_FILE_BYTES = 512 << 20


@attrs.frozen
class AclFigures:
    """Per-round msgs/s of each side (``off`` = ACL off, ``on`` = ACL on), and the CPU µs per message (client plus
    broker) over all rounds of each."""

    send_off: tuple[float, ...]
    send_on: tuple[float, ...]
    pull_off: tuple[float, ...]
    pull_on: tuple[float, ...]
    cpu_us: dict[str, float] = attrs.field(factory=dict)
    """``send_off``, ``send_on``, ``pull_off``, ``pull_on`` -> client + broker CPU µs per message."""

    @property
    def send_ratio(self) -> float:
        return statistics.median(self.send_on) / statistics.median(self.send_off)

    @property
    def pull_ratio(self) -> float:
        return statistics.median(self.pull_on) / statistics.median(self.pull_off)


class Side:
    """One cluster, its producer and its pull topic; every client built with ``config`` (the ACL account, TLS;
    None: the defaults). The TLS benchmark (:mod:`benchmarks.tls_bench`) uses it too."""

    def __init__(self, namesrv_addr: str, config: ClientConfig | None, pull_messages: int,
                 broker_pid: int | None, name: str = "AclBench") -> None:
        self.ns = namesrv_addr
        self.meter = CpuMeter(broker_pid)
        self.cpu_s: dict[str, float] = {"send": 0.0, "pull": 0.0}
        self.messages: dict[str, int] = {"send": 0, "pull": 0}
        self.config = config
        suffix = uuid.uuid4().hex[:8]
        self.send_topic, self.pull_topic = f"{name}Send_{suffix}", f"{name}Pull_{suffix}"
        with Admin(namesrv_addr, client_config=config) as admin:
            admin.create_topic(self.send_topic, queue_nums=QUEUES)
            admin.create_topic(self.pull_topic, queue_nums=QUEUES)
        self.producer = Producer("acl_bench", namesrv_addr, client_config=config).start()
        self.batch = [Message(self.send_topic, BODY) for _ in range(BATCH)]
        per_queue = pull_messages // QUEUES
        for mq in self.producer.client.try_to_find_topic_publish_info(self.pull_topic).message_queues:
            msgs = [Message(self.pull_topic, BODY) for _ in range(min(256, per_queue))]
            for _ in range(per_queue // len(msgs)):
                self.producer.send_batch(msgs, mq)
        self.producer.send_batch(self.batch)  # warm: route cached, connection open, commit-log file created

    def _bill(self, what: str, messages: int, client0: float, broker0: float) -> None:
        self.cpu_s[what] += time.thread_time() - client0 + self.meter.broker_cpu_s() - broker0
        self.messages[what] += messages

    def send(self, batches: int) -> float:
        c0, b0, t0 = time.thread_time(), self.meter.broker_cpu_s(), time.perf_counter()
        for _ in range(batches):
            self.producer.send_batch(self.batch)
        wall = time.perf_counter() - t0
        self._bill("send", batches * BATCH, c0, b0)
        return batches * BATCH / wall

    def pull(self) -> float:
        with PullConsumer(f"acl_bench_{uuid.uuid4().hex[:6]}", self.ns, client_config=self.config) as c:
            mqs = sorted(c.fetch_subscribe_message_queues(self.pull_topic))
            want = sum(c.max_offset(mq) for mq in mqs)
            got = 0
            c0, b0, t0 = time.thread_time(), self.meter.broker_cpu_s(), time.perf_counter()
            for mq in mqs:
                offset = 0
                while True:
                    r = c.pull(mq, offset, max_nums=PULL_NUMS)
                    if r.pull_status is not PullStatus.FOUND:
                        break
                    got += len(r.msg_found_list)
                    offset = r.next_begin_offset
            wall = time.perf_counter() - t0
            self._bill("pull", got, c0, b0)
        if got != want:
            raise RuntimeError(f"pulled {got} messages of {self.pull_topic}, expected {want}")
        return got / wall

    def close(self) -> None:
        self.producer.close()


def measure(root: Path, profile: Profile, *, tls: bool = True) -> AclFigures:
    """Start both clusters under ``root`` (both TLS by default: there the SDK signs once per connection and the
    broker checks later requests against the connection's account), run ``profile``'s interleaved rounds, stop
    them.

    Raises:
        RuntimeError: a pull run read another number of messages than the topic holds.
    """
    with LocalCluster(root / "off", broker_groups=1, slaves_per_group=0, tls=tls,
                      commitlog_file_size_bytes=COMMITLOG_FILE_BYTES) as off_cluster, \
            LocalCluster(root / "on", broker_groups=1, slaves_per_group=0, acl=True, tls=tls,
                         commitlog_file_size_bytes=COMMITLOG_FILE_BYTES) as on_cluster:
        off = Side(off_cluster.namesrv_addr, ClientConfig(tls_ca_file=off_cluster.tls_ca_file) if tls else None,
                   profile.pull_messages, off_cluster.broker("broker-a", 0).pid)
        on = Side(on_cluster.namesrv_addr, ClientConfig(credentials=on_cluster.admin_credentials,
                                                        tls_ca_file=on_cluster.tls_ca_file),
                  profile.pull_messages, on_cluster.broker("broker-a", 0).pid)
        return interleave(off, on, profile)


def interleave(off: Side, on: Side, profile: Profile) -> AclFigures:
    """``profile``'s rounds on both sides, alternating which goes first so a noisy neighbour weighs on both;
    closes both sides. Shared with the TLS benchmark (:mod:`benchmarks.tls_bench`)."""
    figures: dict[str, list[float]] = {"send_off": [], "send_on": [], "pull_off": [], "pull_on": []}
    try:
        for side in (off, on):  # a fresh commit-log file is pre-faulted in the background: not billed to a round
            side.meter.settle()
        for i in range(profile.rounds):
            order = [("off", off), ("on", on)] if i % 2 == 0 else [("on", on), ("off", off)]
            for name, side in order:
                figures[f"send_{name}"].append(side.send(profile.batches))
            for name, side in order:
                figures[f"pull_{name}"].append(side.pull())
    finally:
        off.close()
        on.close()
    cpu = {f"{what}_{name}": side.cpu_s[what] / max(1, side.messages[what]) * 1e6
           for name, side in (("off", off), ("on", on)) for what in ("send", "pull")}
    return AclFigures(**{k: tuple(v) for k, v in figures.items()}, cpu_us=cpu)


@attrs.frozen
class AclWork:
    """CPU µs per request of the ACL's own work, one thread (median of a few runs)."""

    sign_us: float
    """The SDK's :meth:`~common.signing.RequestSigner.sign`."""
    verify_us: float
    """A gate letting the signed request in (header, signature, replay guard; an admin account, as the ACL-on
    side signs with)."""
    body_hash_us: float
    """Of the two, the digest of the body (once on each side; BLAKE3 where the SDK signs with it)."""

    @property
    def total_us(self) -> float:
        return self.sign_us + self.verify_us


def acl_work(method: str, target: str, body: bytes, requests: int = 2_000, runs: int = 5) -> AclWork:
    """Time signing ``requests`` requests as the SDK does and a gate verifying them, in this thread."""
    creds = Credentials("acl-bench", os.urandom(16).hex())
    config = parse_acl(f'[[accounts]]\naccessKey = "acl-bench"\nsecretKey = "{creds.secret_key}"\nadmin = true\n')
    signer = RequestSigner(creds)
    signs, verifies, hashes = [], [], []
    for _ in range(runs):
        gate = AclGate(config, {(method, target.partition("?")[0]): SIGNED})
        t0 = time.thread_time()
        signed = [signer.sign(method, target, body, "127.0.0.1:10911") for _ in range(requests)]
        t1 = time.thread_time()
        batch = []
        for sent, header in signed:
            path, _, qs = sent.partition("?")
            batch.append((Request(method, path, parse_query(qs.encode()), body, ("127.0.0.1", 1), qs.encode(),
                                  host="127.0.0.1:10911"), header.encode()))
        t2 = time.thread_time()
        for request, header_bytes in batch:
            gate(request, header_bytes)
        t3 = time.thread_time()
        for _ in range(requests):
            body_digest(body)
        t4 = time.thread_time()
        signs.append(t1 - t0)
        verifies.append(t3 - t2)
        hashes.append(2 * (t4 - t3) if body else 0.0)
    med = statistics.median
    return AclWork(med(signs) / requests * 1e6, med(verifies) / requests * 1e6, med(hashes) / requests * 1e6)


def _work_rows(f: AclFigures) -> list[Row]:
    """The ACL's own work of a send_batch and of a pull request, and what it adds to the ACL-off CPU per message."""
    send_target = SendRequestHeader("AclBenchSend_0123abcd", 1).target()
    send_body = encode_batch([Message("AclBenchSend_0123abcd", BODY) for _ in range(BATCH)],
                             born_timestamp_ms=int(time.time() * 1000))
    pull_target = PullRequestHeader.of("acl_bench_0123ab", "AclBenchPull_0123abcd", 1, 4096, PULL_NUMS).target()
    out = []
    for kind, per_request, work in (("send_batch", BATCH, acl_work("POST", send_target, send_body)),
                                    ("pull", PULL_NUMS, acl_work("GET", pull_target, b""))):
        off = f.cpu_us[f"{'send' if kind == 'send_batch' else 'pull'}_off"]
        what = f"sign {work.sign_us:.1f} + verify {work.verify_us:.1f} us a request"
        if work.body_hash_us:
            what += f", {work.body_hash_us:.1f} of it the body's {DIGEST_NAME}"
        out.append(Row(f"{kind}: ACL off CPU per msg + the ACL's own work ({what}; in a loop: a lower bound)",
                       off + work.total_us / per_request, "us", "ACL off", off, "<= 1.05x"))
    return out


def run(quick: bool) -> list[Row]:
    """Runner entry (``python -m benchmarks acl``)."""
    profile = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as d:
        f = measure(Path(d), profile)
    return [*rows(f, profile, "ACL", ratio_target=">= 0.95x", cpu_target="<= 1.05x"), *_work_rows(f)]


def rows(f: AclFigures, profile: Profile, what: str, *, ratio_target: str, cpu_target: str) -> list[Row]:
    """The table of an on/off comparison (``what``: "ACL", "TLS")."""
    med: Callable[[tuple[float, ...]], float] = statistics.median
    rounds = f"median of {profile.rounds} interleaved rounds"

    def per_round(kind: str, bound: Callable[[Iterable[float]], float], name: str) -> Row:
        on, off = getattr(f, f"{kind}_on"), getattr(f, f"{kind}_off")
        return Row(f"{name}, {what} on / off per round: {bound.__name__}",
                   bound(a / b for a, b in zip(on, off, strict=True)), "x")

    return [
        Row(f"send_batch 64 x 1 KiB, {what} on ({rounds})", med(f.send_on), "msgs/s", f"same, {what} off",
            med(f.send_off), ratio_target),
        Row(f"pull 32/request, decoded, {what} on ({rounds})", med(f.pull_on), "msgs/s", f"same, {what} off",
            med(f.pull_off), ratio_target),
        per_round("send", statistics.median, "send_batch"), per_round("send", min, "send_batch"),
        per_round("send", max, "send_batch"),
        per_round("pull", statistics.median, "pull"), per_round("pull", min, "pull"), per_round("pull", max, "pull"),
        Row(f"send_batch: client + broker CPU per msg, {what} on", f.cpu_us["send_on"], "us", f"same, {what} off",
            f.cpu_us["send_off"], cpu_target),
        Row(f"pull: client + broker CPU per msg, {what} on", f.cpu_us["pull_on"], "us", f"same, {what} off",
            f.cpu_us["pull_off"], cpu_target),
    ]
