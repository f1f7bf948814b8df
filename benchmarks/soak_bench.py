"""Soak under retention (issue 13): a broker group that rolls and deletes commit-log files for minutes must not
leak memory, file descriptors or maps, and a consumer that keeps up must lose nothing.

Two entries:

* ``python -m benchmarks soak`` (:func:`run`, :func:`run_soak`): one group (master + one slave) with 4 MiB
  commit-log files that expire a few seconds after their last write and a cleaner that runs every second. The
  maximum ``send_batch`` rate of one producer thread is measured first (a few seconds, on a topic nobody reads);
  then one thread produces at half of it while a :class:`client.GroupConsumer` reads, for 10 minutes (``--quick``:
  60 s). Every 30 s (10 s) the master's and the slave's RSS (``VmRSS``), open descriptors and maps of deleted files
  are sampled from ``/proc``, with the files each has deleted (``GET /runtime`` ``retentionFilesDeleted``). RSS and
  descriptor growth are least-squares slopes over the samples after a warm-up (the first minute; 20 s quick):
  the warm-up holds the first file rolls, the preallocation of the next file and the first deletions, which
  grow the process once and for all. At the end every acknowledged message must have been consumed (its key
  seen), unless retention deleted it first -- with a consumer that keeps up, nothing.
* ``python -m benchmarks retention`` (:func:`run_cleaner_overhead`): the ``send_batch`` rate (64 x 1 KiB) on a
  broker whose cleaner deletes files while it writes, against a broker whose files never expire
  (``fileReservedTime`` 10000 h, the cleaner still running every second: only the deletions differ), in
  interleaved rounds, medians compared.

``tests/broker/test_soak_short.py`` runs a 35 s profile of :func:`run_soak` and asserts on the result.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from benchmarks import Row
from client import Admin, GroupConsumer, Message, MessageQueue, Producer
from client.cluster import BrokerHandle, LocalCluster
from client.errors import ClientError

__all__ = ["ProcSample", "SoakResult", "SoakSample", "averaged", "proc_sample", "run", "run_cleaner_overhead", "run_soak",
           "slope_per_min"]

log = logging.getLogger(__name__)

MIB = 1 << 20
FILE_BYTES = 4 * MIB
BODY_BYTES = 1024
BATCH = 64
QUEUES = 4
TOPIC = "Soak"
PROBE_TOPIC = "SoakProbe"
#: Files expire this long after their last write (fileReservedTime is in hours).
RESERVED_S = 3.6
ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))
#: Small consume-queue and index files, so they roll and are deleted too (3,000 entries per queue file; about
#: 0.8 MB per index file). The duplicate window of idempotent sends (the SDK's producers are idempotent) keeps
#: keys as long as files are kept: with its default 120 s it would hold every message of a short run -- growth
#: by design, bounded by ``duplicateWindowMaxKeys`` -- while at 3.6 s it is full within the warm-up and a key it
#: failed to let go shows as growth.
SOAK_PROPS = {
    "fileReservedTime": f"{RESERVED_S / 3600:.6f}", "deleteWhen": ALL_HOURS, "cleanResourceInterval": "1000",
    "duplicateWindowMs": f"{RESERVED_S * 1000:.0f}",
    "deleteCommitLogFilesInterval": "10", "deleteFileBatchMax": "10", "mappedFileSizeConsumeQueue": "60000",
    "maxHashSlotNum": "10000", "maxIndexNum": "40000",
}
#: Readings per sample, and their spacing: one cleaner period (cleanResourceInterval) in all.
_READINGS = 10
_READING_EVERY_S = 0.1
_GROUP_FAST = {"rebalance_interval_s": 1.0, "heartbeat_interval_s": 1.0, "pull_suspend_s": 1.0,
               "consume_from_where": "FIRST_OFFSET", "auto_commit_interval_s": 1.0}


# --- sampling ---------------------------------------------------------------------------------------------------

@attrs.frozen
class ProcSample:
    """One look at a process in ``/proc``."""

    rss_bytes: int
    """``VmRSS``: the heap plus the pages of mapped files it touched. The file-backed part follows the files the
    store keeps (a few seconds of writes here), so it swings by a few files from one sample to the next."""
    anon_bytes: int
    """``RssAnon``: the heap alone (a leak of Python objects shows here, without the swing of the files)."""
    store_rss_bytes: int
    """Of ``rss_bytes``, the pages of store files (``/proc/<pid>/smaps``), also deleted ones not yet unmapped: the
    swing of the files kept."""
    fds: int
    """Open file descriptors, all of them."""
    store_fds: int
    """Of ``fds``, those on files of the store (they follow the files kept, like the file-backed RSS)."""
    deleted_fds: int
    """Of ``store_fds``, those on deleted files: a file retention unlinked that is still open."""
    sockets: int
    """Of ``fds``, the sockets (clients, the HA link, the nameserver)."""
    deleted_maps: int
    """Lines of ``/proc/<pid>/maps`` naming a deleted file: unlinked but still mapped (for a moment while a
    reader holds it; a steady climb is a leak)."""

    @property
    def rss_beyond_store_bytes(self) -> int:
        """RSS less the store files' pages: the heap and the code -- flat unless something leaks, whatever the
        write rate (a deleted file kept mapped shows in ``deleted_maps``)."""
        return self.rss_bytes - self.store_rss_bytes

    @property
    def other_fds(self) -> int:
        """Descriptors that are not store files: sockets, pipes, logs -- flat unless leaked."""
        return self.fds - self.store_fds


def proc_sample(pid: int, store_dir: Path) -> ProcSample:
    """RSS, descriptors (by kind) and deleted-file maps of ``pid``, whose store is under ``store_dir``."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(rest.split()[0]) * 1024
    store = f"{store_dir.resolve()}/"
    fds = store_fds = deleted_fds = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed since the listing
            continue
        fds += 1
        if target.startswith("socket:"):
            sockets += 1
        elif target.startswith(store):
            store_fds += 1
            deleted_fds += target.endswith(" (deleted)")
    store_rss, deleted_maps = _smaps(pid, store)
    return ProcSample(fields.get("VmRSS", 0), fields.get("RssAnon", 0), store_rss, fds, store_fds, deleted_fds,
                      sockets, deleted_maps)


def _smaps(pid: int, store_prefix: str) -> tuple[int, int]:
    """Resident bytes of the mappings of store files (live or deleted), and how many mappings name a deleted
    file."""
    store_rss = deleted = 0
    in_store = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
            path = head[5] if len(head) == 6 else ""
            deleted += path.endswith(" (deleted)")
            in_store = path.startswith(store_prefix)
        elif in_store and head and head[0] == "Rss:":
            store_rss += int(head[1]) * 1024
    return store_rss, deleted


def averaged(samples: list[ProcSample]) -> ProcSample:
    """Several readings taken over one retention period as one: the mean of each figure, but the least of the
    deleted files held (a file deleted a moment ago is in some readings; one kept for good is in all)."""
    def mean(f: Callable[[ProcSample], int]) -> int:
        return round(statistics.fmean(f(x) for x in samples))

    return ProcSample(mean(lambda x: x.rss_bytes), mean(lambda x: x.anon_bytes), mean(lambda x: x.store_rss_bytes),
                      mean(lambda x: x.fds), mean(lambda x: x.store_fds), min(x.deleted_fds for x in samples),
                      mean(lambda x: x.sockets), min(x.deleted_maps for x in samples))


@attrs.frozen
class SoakSample:
    """The state of the run at ``t_s`` seconds into the steady phase."""

    t_s: float
    master: ProcSample
    slave: ProcSample
    master_deleted: int
    """Commit-log files the master's retention has deleted so far."""
    slave_deleted: int
    acked: int
    """Messages acknowledged to the producer so far."""
    consumed: int
    """Distinct keys the consumer has seen so far."""


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per minute (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    mt = statistics.fmean(t for t, _ in points)
    mv = statistics.fmean(v for _, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den


@attrs.frozen
class SoakResult:
    """What :func:`run_soak` saw."""

    max_rate: float
    """``send_batch`` messages per second of one thread, measured first."""
    target_rate: float
    """Half of ``max_rate``: the steady phase's pace."""
    seconds: float
    """Length of the steady phase."""
    warmup_s: float
    samples: tuple[SoakSample, ...]
    acked: int
    consumed: int
    """Distinct acknowledged keys the consumer received."""
    duplicates: int
    """Deliveries beyond the first of a key (at-least-once: a rebalance may repeat a few)."""
    missing: int
    """Acknowledged keys never received."""
    missing_deleted: int
    """Of ``missing``, those below their queue's min offset when the run ended (retention took them)."""
    send_errors: tuple[str, ...]
    consumer_errors: tuple[str, ...]
    """Exceptions from ``poll`` and the SDK's warnings (failed pulls, offsets moved past deleted messages)."""
    max_lag: int
    """Most acknowledged messages not yet consumed, checked every second."""

    def after_warmup(self) -> list[SoakSample]:
        return [s for s in self.samples if s.t_s >= self.warmup_s]

    def slope(self, value: Callable[[SoakSample], float]) -> float:
        """Per-minute least-squares slope of ``value`` over the samples after the warm-up."""
        return slope_per_min([(s.t_s, value(s)) for s in self.after_warmup()])

    def growth(self, value: Callable[[SoakSample], float]) -> float:
        """``value`` at the last sample minus at the first one after the warm-up."""
        kept = self.after_warmup()
        return value(kept[-1]) - value(kept[0]) if kept else 0.0

    @property
    def max_lag_s(self) -> float:
        """``max_lag`` in seconds of production."""
        return self.max_lag / self.target_rate if self.target_rate else 0.0


# --- the soak ---------------------------------------------------------------------------------------------------

def _body(seq: int) -> bytes:
    return b"%012d" % seq + b"s" * (BODY_BYTES - 12)


def measure_send_rate(namesrv: str, topic: str, seconds: float) -> float:
    """Messages per second of ``send_batch`` (``BATCH`` x 1 KiB) from one thread for ``seconds``."""
    msgs = [Message(topic, _body(i)) for i in range(BATCH)]
    sent = 0
    with Producer(f"rate_{topic}", namesrv) as producer:
        producer.send_batch(msgs)  # route and connection
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < seconds:
            producer.send_batch(msgs)
            sent += BATCH
    return sent / elapsed


class _Ledger:
    """Who was acknowledged and who was received, one byte per sequence number (a set of 10^7 ints would weigh
    more than the brokers)."""

    def __init__(self) -> None:
        self.acked = bytearray()
        self.seen = bytearray()
        self.acked_count = 0
        self.seen_count = 0
        self.duplicates = 0
        self.where: dict[int, tuple[int, int]] = {}
        """seq -> (queue, offset), kept only for messages not yet received (to tell deleted from lost)."""
        self.lock = threading.Lock()

    @staticmethod
    def _mark(arr: bytearray, seq: int) -> int:
        if seq >= len(arr):
            arr.extend(bytes(seq + 1 - len(arr) + (1 << 20)))
        arr[seq] = min(arr[seq] + 1, 255)
        return arr[seq]

    def ack(self, seq: int, queue: int, offset: int) -> None:
        with self.lock:
            self._mark(self.acked, seq)
            self.acked_count += 1
            if seq < len(self.seen) and self.seen[seq]:
                self.seen_count += 1  # the consumer got it before the producer got its answer
            else:
                self.where[seq] = (queue, offset)

    def receive(self, seq: int) -> None:
        with self.lock:
            if self._mark(self.seen, seq) == 1:
                self.where.pop(seq, None)
                if seq < len(self.acked) and self.acked[seq]:
                    self.seen_count += 1
            else:
                self.duplicates += 1

    def lag(self) -> int:
        return self.acked_count - self.seen_count


class _WarningCounter(logging.Handler):
    """Counts the SDK's warnings (a failed pull, an offset moved past deleted messages) during the run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}"[:300])


def _produce(namesrv: str, rate: float, ledger: _Ledger, stop: threading.Event, errors: list[str]) -> None:
    """Send ``BATCH`` messages every ``BATCH / rate`` seconds until ``stop`` (a late batch does not make the next
    ones burst: past one second behind, the schedule restarts from now)."""
    interval = BATCH / rate
    seq = 0
    with Producer("soak_p", namesrv) as producer:
        due = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < due:
                stop.wait(due - now)  # pacing, not synchronisation
                continue
            msgs = [Message(TOPIC, _body(seq + i), keys=f"k{seq + i}") for i in range(BATCH)]
            try:
                results = producer.send_batch(msgs)
            except ClientError as e:
                errors.append(f"{type(e).__name__}: {e}"[:300])
            else:
                for i, res in enumerate(results):
                    ledger.ack(seq + i, res.message_queue.queue_id, res.queue_offset)
            seq += BATCH
            due = max(due + interval, time.monotonic() - 1.0)


def _consume(consumer: GroupConsumer, ledger: _Ledger, stop: threading.Event, errors: list[str]) -> None:
    while not stop.is_set():
        try:
            msgs = consumer.poll(timeout_s=0.5)
        except ClientError as e:
            errors.append(f"poll: {type(e).__name__}: {e}"[:300])
            stop.wait(0.5)  # back off before the next poll
            continue
        for m in msgs:
            key = m.keys[0] if m.keys else ""
            if key.startswith("k") and key[1:].isdigit():
                ledger.receive(int(key[1:]))
            else:
                errors.append(f"a message without a soak key: {m.msg_id} keys={m.keys}")


def _sample(t_s: float, master: BrokerHandle, slave: BrokerHandle, ledger: _Ledger) -> SoakSample:
    """Readings of both brokers every 0.1 s for one ``cleanResourceInterval`` (1 s), averaged: retention draws a
    sawtooth of that period in the file-backed RSS and the store's descriptors (files pile up, a pass deletes
    them), and one reading would land anywhere on it."""
    assert master.pid is not None and slave.pid is not None
    readings: dict[int, list[ProcSample]] = {0: [], 1: []}
    for _ in range(_READINGS):
        readings[0].append(proc_sample(master.pid, master.store_dir))
        readings[1].append(proc_sample(slave.pid, slave.store_dir))
        time.sleep(_READING_EVERY_S)  # spreading the readings over one retention period
    return SoakSample(t_s, averaged(readings[0]), averaged(readings[1]),
                      int(master.runtime()["retentionFilesDeleted"]), int(slave.runtime()["retentionFilesDeleted"]),
                      ledger.acked_count, ledger.seen_count)


def run_soak(*, duration_s: float = 600.0, sample_every_s: float = 30.0, warmup_s: float = 60.0,
             probe_s: float = 5.0, drain_timeout_s: float = 30.0, root: Path | None = None,
             on_sample: Callable[[SoakSample], None] | None = None) -> SoakResult:
    """One soak run (see the module docstring).

    Args:
        duration_s: length of the steady phase (produce and consume at half the measured rate).
        sample_every_s: period of the ``/proc`` samples (one more at the start and one at the end).
        warmup_s: samples before this are left out of the growth slopes.
        probe_s: length of the maximum-rate measurement.
        drain_timeout_s: after the producer stops, how long the consumer may take to receive the rest.
        root: where the cluster lives (a new temporary directory when None).
        on_sample: called with each sample as it is taken (the benchmark prints them as they come).

    Returns:
        The samples and the delivery figures.
    """
    with tempfile.TemporaryDirectory(prefix="splitmq-soak-") as tmp:
        cluster = LocalCluster(root or Path(tmp), slaves_per_group=1, commitlog_file_size_bytes=FILE_BYTES,
                               broker_config=SOAK_PROPS).start()
        try:
            return _soak(cluster, duration_s, sample_every_s, warmup_s, probe_s, drain_timeout_s, on_sample)
        finally:
            cluster.stop()


def _soak(cluster: LocalCluster, duration_s: float, sample_every_s: float, warmup_s: float, probe_s: float,
          drain_timeout_s: float, on_sample: Callable[[SoakSample], None] | None) -> SoakResult:
    ns = cluster.namesrv_addr
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queue_nums=QUEUES)
        admin.create_topic(PROBE_TOPIC, queue_nums=QUEUES)
    max_rate = measure_send_rate(ns, PROBE_TOPIC, probe_s)
    rate = max_rate / 2
    ledger = _Ledger()
    send_errors: list[str] = []
    consumer_errors: list[str] = []
    warnings = _WarningCounter()
    client_log = logging.getLogger("client")
    old_level = client_log.level
    client_log.addHandler(warnings)
    if client_log.getEffectiveLevel() > logging.WARNING:
        client_log.setLevel(logging.WARNING)
    stop_producer, stop_consumer = threading.Event(), threading.Event()
    consumer = GroupConsumer("soak_c", ns, **_GROUP_FAST)  # type: ignore[arg-type]
    consumer.subscribe(TOPIC)
    consumer.start()
    threads = [threading.Thread(target=_consume, args=(consumer, ledger, stop_consumer, consumer_errors),
                                name="soak-consume", daemon=True),
               threading.Thread(target=_produce, args=(ns, rate, ledger, stop_producer, send_errors),
                                name="soak-produce", daemon=True)]
    samples: list[SoakSample] = []
    max_lag = 0
    try:
        for t in threads:
            t.start()
        began = time.monotonic()
        next_sample = began
        while True:
            now = time.monotonic()
            if now >= next_sample or now - began >= duration_s:
                s = _sample(now - began, master, slave, ledger)
                samples.append(s)
                if on_sample:
                    on_sample(s)
                next_sample += sample_every_s
                if now - began >= duration_s:
                    break
            max_lag = max(max_lag, ledger.lag())
            if not threads[0].is_alive() or not threads[1].is_alive():
                raise RuntimeError("a soak thread died; see its traceback above")
            time.sleep(min(1.0, max(0.0, next_sample - time.monotonic()),
                           max(0.0, began + duration_s - time.monotonic())))  # sampling period
        seconds = time.monotonic() - began
        stop_producer.set()
        threads[1].join(30)
        deadline = time.monotonic() + drain_timeout_s
        while ledger.lag() > 0 and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the consumer's progress with a deadline
    finally:
        stop_producer.set()
        stop_consumer.set()
        threads[0].join(5)
        consumer.close()
        client_log.removeHandler(warnings)
        client_log.setLevel(old_level)
    missing_deleted = _deleted_among(ns, ledger)
    return SoakResult(max_rate, rate, seconds, warmup_s, tuple(samples), ledger.acked_count, ledger.seen_count,
                      ledger.duplicates, len(ledger.where), missing_deleted, tuple(send_errors[:20]),
                      tuple(consumer_errors[:20] + warnings.messages[:20]), max_lag)


def _deleted_among(ns: str, ledger: _Ledger) -> int:
    """How many unreceived messages sit below their queue's min offset now (retention took them)."""
    if not ledger.where:
        return 0
    with Admin(ns) as admin:
        mins = {q: admin.min_offset(MessageQueue(TOPIC, "broker-a", q)) for q in range(QUEUES)}
    return sum(1 for q, off in ledger.where.values() if off < mins[q])


# --- the entries ------------------------------------------------------------------------------------------------

#: Columns of the sample table, per broker: RSS, anonymous RSS and RSS of store files (MiB), all fds, fds on store files,
#: sockets, fds on deleted files, maps of deleted files, commit-log files deleted so far.
_PROC_COLS = ("RSS", "anon", "files", "fds", "store", "sock", "delfd", "delmap", "deleted")
_WIDTH = 8


def _sample_header() -> str:
    cols = ["t (s)", *(f"m.{c}" for c in _PROC_COLS), *(f"s.{c}" for c in _PROC_COLS)]
    return "  " + " ".join(c.rjust(_WIDTH) for c in cols) + f" {'acked':>11} {'received':>11}"


def _print_sample(s: SoakSample) -> None:
    def one(p: ProcSample, deleted: int) -> list[str]:
        return [f"{p.rss_bytes / MIB:.1f}", f"{p.anon_bytes / MIB:.1f}", f"{p.store_rss_bytes / MIB:.1f}",
                *(str(v) for v in (p.fds, p.store_fds, p.sockets, p.deleted_fds, p.deleted_maps, deleted))]

    cells = [f"{s.t_s:.0f}", *one(s.master, s.master_deleted), *one(s.slave, s.slave_deleted)]
    print("  " + " ".join(c.rjust(_WIDTH) for c in cells) + f" {s.acked:11,} {s.consumed:11,}", flush=True)


def _process_rows(res: SoakResult, name: str, who: Callable[[SoakSample], ProcSample]) -> list[Row]:
    kept = res.after_warmup()
    first, last = (who(kept[0]), who(kept[-1])) if kept else (ProcSample(0, 0, 0, 0, 0, 0, 0, 0),) * 2
    return [
        Row(f"{name} RSS growth after warm-up (least squares)", res.slope(lambda s: who(s).rss_bytes / MIB),
            "MiB/min", target="< 1"),
        Row(f"{name} anonymous RSS growth after warm-up", res.slope(lambda s: who(s).anon_bytes / MIB),
            "MiB/min", target="< 1"),
        Row(f"{name} RSS beyond store files, growth", res.slope(lambda s: who(s).rss_beyond_store_bytes / MIB),
            "MiB/min", target="< 1"),
        Row(f"{name} RSS at the end", last.rss_bytes / MIB, "MiB", "RSS after warm-up", first.rss_bytes / MIB),
        Row(f"{name} fd growth after warm-up (least squares)", res.slope(lambda s: who(s).fds), "fds/min",
            target="~0"),
        Row(f"{name} fds at the end", float(last.fds), "fds", "fds after warm-up", float(first.fds), "~1.00x"),
        Row(f"{name} fds other than store files, growth", res.slope(lambda s: who(s).other_fds), "fds/min",
            target="0"),
        Row(f"{name} fds other than store files, at the end", float(last.other_fds), "fds",
            "after warm-up", float(first.other_fds), "1.00x"),
        Row(f"{name} fds on deleted files at the end", float(last.deleted_fds), "fds", target="0"),
        Row(f"{name} maps of deleted files at the end", float(last.deleted_maps), "maps",
            "after warm-up", float(first.deleted_maps), "small, flat"),
    ]


def soak_rows(res: SoakResult) -> list[Row]:
    """The summary rows of a soak run."""
    rows = [Row("steady produce rate (one thread, paced)", res.acked / res.seconds if res.seconds else 0.0,
                "msgs/s", "max send_batch rate, same run", res.max_rate, "~0.50x")]
    rows += _process_rows(res, "master", lambda s: s.master)
    rows += _process_rows(res, "slave", lambda s: s.slave)
    end = res.samples[-1] if res.samples else None
    rows += [
        Row("commit-log files deleted (master)", float(end.master_deleted if end else 0), "files", target="> 0"),
        Row("commit-log files deleted (slave)", float(end.slave_deleted if end else 0), "files", target="> 0"),
        Row("messages consumed (distinct keys)", float(res.consumed), "msgs", "acknowledged", float(res.acked),
            "1.00x"),
        Row("acknowledged, never consumed", float(res.missing), "msgs", target="0"),
        Row("  of which deleted by retention first", float(res.missing_deleted), "msgs"),
        Row("duplicate deliveries", float(res.duplicates), "msgs", "consumed", float(res.consumed)),
        Row("consumer lag, most seen (checked each second)", res.max_lag_s, "s of production",
            "fileReservedTime", RESERVED_S, "< 1.00x"),
        Row("consumer errors and SDK warnings", float(len(res.consumer_errors)), "errors", target="0"),
        Row("send errors", float(len(res.send_errors)), "errors", target="0"),
    ]
    return rows


def run(quick: bool) -> list[Row]:
    """``python -m benchmarks soak``: 10 minutes, a sample every 30 s, growth after the first minute
    (``--quick``: 60 s, every 10 s, after 20 s)."""
    duration, every, warmup = (60.0, 10.0, 20.0) if quick else (600.0, 30.0, 60.0)
    print(f"soak: {duration:.0f} s at half the maximum send_batch rate, samples every {every:.0f} s\n"
          f"{_sample_header()}", flush=True)
    res = run_soak(duration_s=duration, sample_every_s=every, warmup_s=warmup, probe_s=3.0 if quick else 5.0,
                   on_sample=_print_sample)
    for e in (*res.send_errors, *res.consumer_errors)[:10]:
        print(f"  error: {e}")
    return soak_rows(res)


# --- the cleaner's cost -----------------------------------------------------------------------------------------

def run_cleaner_overhead(quick: bool) -> list[Row]:
    """``python -m benchmarks retention``: send_batch throughput while the cleaner deletes vs a broker whose files
    never expire, interleaved rounds (the order alternates), medians."""
    rounds, round_s = (3, 2.0) if quick else (7, 4.0)
    never = dict(SOAK_PROPS, fileReservedTime="10000")
    deleting = dict(SOAK_PROPS, fileReservedTime=f"{0.72 / 3600:.6f}")
    with tempfile.TemporaryDirectory(prefix="splitmq-retention-") as tmp:
        clusters = {
            "deleting": LocalCluster(Path(tmp) / "deleting", slaves_per_group=0, commitlog_file_size_bytes=FILE_BYTES,
                                     broker_config=deleting),
            "never": LocalCluster(Path(tmp) / "never", slaves_per_group=0, commitlog_file_size_bytes=FILE_BYTES,
                                  broker_config=never),
        }
        try:
            for c in clusters.values():
                c.start()
                with Admin(c.namesrv_addr) as admin:
                    admin.create_topic(TOPIC, queue_nums=QUEUES)
                measure_send_rate(c.namesrv_addr, TOPIC, 1.0)  # warm-up: first files, connections
            rates: dict[str, list[float]] = {k: [] for k in clusters}
            deleted = {k: 0 for k in clusters}
            for i in range(rounds):
                for k in (("deleting", "never") if i % 2 == 0 else ("never", "deleting")):
                    b = clusters[k].broker("broker-a", 0)
                    before = int(b.runtime()["retentionFilesDeleted"])
                    rates[k].append(measure_send_rate(clusters[k].namesrv_addr, TOPIC, round_s))
                    deleted[k] += int(b.runtime()["retentionFilesDeleted"]) - before
        finally:
            for c in clusters.values():
                c.stop()
    with_cleaner, without = statistics.median(rates["deleting"]), statistics.median(rates["never"])
    spread = ", ".join(f"{r:,.0f}" for r in rates["deleting"])
    print(f"retention: {rounds} rounds of {round_s:.0f} s; deleting {spread}; never "
          + ", ".join(f"{r:,.0f}" for r in rates["never"]), flush=True)
    return [
        Row("send_batch 64 x 1 KiB, cleaner deleting (median)", with_cleaner, "msgs/s",
            "files never expire (median)", without, ">= 0.95x"),
        Row("files deleted during the measured rounds", float(deleted["deleting"]), "files",
            "files never expire", float(deleted["never"]), target="> 0 vs 0"),
    ]
