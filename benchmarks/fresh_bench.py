"""The first minute of a fresh store with production-size commit-log files (issue 13, item 7).

A broker that has just been created writes into a first commit-log file that nobody prepared, while the
background preparer faults in the rest of it and then creates and faults in the next one (1 GiB each by
default). A warm broker (its current file already faulted in, the next one ready) does not pay for that. This
entry measures both in the same run, one after the other in fresh temporary directories on the real disk:

* fresh: ``load()`` + ``start()`` on an empty directory, and the clock starts with the very first append;
* warm: the same, then one batch appended and ``commitlog.wait_prepared`` waited for before the clock starts.

Each phase is one writer thread calling ``append_batch`` with 64 x 1 KiB messages (ASYNC_FLUSH, the flush thread
running) for a fixed time. Rows: msgs/s over the whole phase and per slice (fresh as the value, warm as the
baseline, target ratio >= 0.8), and the page faults the writer thread itself took (``RUSAGE_THREAD``), the
cost a fresh file puts on the put path.

The full profile is 1 GiB files for 60 s in 10 s slices (about 20 GB written per phase: it needs that much free
disk); ``--quick`` is 64 MiB files for 5 s in 1 s slices, twice each in the order fresh, warm, warm, fresh.
The full profile first writes for 20 s unmeasured (the first phase of a process ran at half speed, fresh or warm). The directories are made under ``SPLITMQ_BENCH_DIR``
(default: the system's temporary directory, which must be on a real disk, not a tmpfs) and removed after.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time

import attrs

from benchmarks import Row
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import decode_batch, encode_batch
from common.message import Message

__all__ = ["Phase", "measure_phase", "run"]

BORN_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"
TOPIC = "FreshTopic"
BATCH = 64
BODY_BYTES = 1024
#: Bound on the warm store's background preparation (faulting in up to 2 GiB).
WARM_WAIT_S = 120.0
#: The unmeasured phase before the full profile's pair (see :func:`run`).
SETTLE_S = 20.0


@attrs.frozen
class Phase:
    """What one timed phase measured."""

    msgs: int
    """Messages appended within the phase."""
    seconds: float
    """Its length."""
    slice_rates: tuple[float, ...]
    """msgs/s in each slice, in order."""
    writer_faults: int
    """Minor page faults taken by the writer thread during the phase."""
    files: int
    """Commit-log files written to (rolls + 1)."""

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds else 0.0


def _pool(count: int = 16) -> list[list]:
    body = os.urandom(BODY_BYTES)
    out = []
    for b in range(count):
        msgs = [Message(TOPIC, body, tags="TagA", keys=f"key-{b}-{i}") for i in range(BATCH)]
        uniq = [f"0A0000010F2B{b:012X}{i:08X}" for i in range(BATCH)]
        out.append(decode_batch(encode_batch(msgs, born_timestamp_ms=1_700_000_000_000, uniq_keys=uniq)))
    return out


def _thread_minflt() -> int:
    # RUSAGE_THREAD counts this thread alone, not the preparer's faults (Linux); elsewhere the whole process.
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    return resource.getrusage(who).ru_minflt


def measure_phase(root: str, *, file_size: int, duration_s: float, slice_s: float, warm: bool) -> Phase:
    """Append for ``duration_s`` into a new store at ``root``; ``warm`` waits for its preparation first.

    Raises:
        RuntimeError: an append failed, or the warm store's preparation did not finish in time.
    """
    pool = _pool()
    store = FileMessageStore(StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog=file_size))
    store.load()
    store.start()
    try:
        if warm:
            store.append_batch(TOPIC, 0, pool[0], born_host=BORN_HOST)
            if not store.commitlog.wait_prepared(WARM_WAIT_S):
                raise RuntimeError(f"warm store: preparation not done after {WARM_WAIT_S} s")
        n_slices = max(1, round(duration_s / slice_s))
        counts = [0] * n_slices
        first_offset = store.max_physical_offset
        faults0 = _thread_minflt()
        t0 = time.perf_counter()
        deadline = t0 + duration_s
        i = 0
        now = t0
        while now < deadline:
            r = store.append_batch(TOPIC, 0, pool[i % len(pool)], born_host=BORN_HOST)
            if r.msg_count != BATCH:
                raise RuntimeError(f"append failed: {r}")
            now = time.perf_counter()
            counts[min(int((now - t0) / slice_s), n_slices - 1)] += BATCH
            i += 1
        seconds = now - t0
        faults = _thread_minflt() - faults0
        files = (store.max_physical_offset - 1) // file_size - first_offset // file_size + 1
        # The slice boundaries are fixed; the last one ends with the last append.
        last = seconds - slice_s * (n_slices - 1)
        rates = tuple(c / (slice_s if k < n_slices - 1 else max(last, 1e-9)) for k, c in enumerate(counts))
        return Phase(sum(counts), seconds, rates, faults, files)
    finally:
        # The directory is deleted next: skip the clean shutdown's dispatch and flush of gigabytes (minutes).
        store.crash()


def _phase_in(parent: str, name: str, **kw: object) -> Phase:
    root = os.path.join(parent, name)
    try:
        return measure_phase(root, **kw)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _merge(phases: list[Phase]) -> Phase:
    """Repeats of one kind as one phase: totals, and each slice's rate averaged."""
    slices = tuple(sum(p.slice_rates[k] for p in phases) / len(phases) for k in range(len(phases[0].slice_rates)))
    return Phase(sum(p.msgs for p in phases), sum(p.seconds for p in phases), slices,
                 sum(p.writer_faults for p in phases), sum(p.files for p in phases))


def run(quick: bool) -> list[Row]:
    """The ``fresh`` benchmark entry."""
    file_size = (64 << 20) if quick else (1 << 30)
    duration_s = 5.0 if quick else 60.0
    slice_s = 1.0 if quick else 10.0
    # Fresh and warm alternate (ABBA when repeated) so a drift of the machine's state over the run (page cache,
    # other load) weighs on both alike; the full profile has time for one pair only, after a settling phase.
    order = ("fresh", "warm", "warm", "fresh") if quick else ("fresh", "warm")
    # Page faults on a disk-backed shared mapping are what this measures: where /tmp is a tmpfs, point
    # SPLITMQ_BENCH_DIR at a directory on the real disk.
    parent = tempfile.mkdtemp(prefix="splitmq-bench-fresh-", dir=os.environ.get("SPLITMQ_BENCH_DIR"))
    got: dict[str, list[Phase]] = {"fresh": [], "warm": []}
    try:
        kw = {"file_size": file_size, "duration_s": duration_s, "slice_s": slice_s}
        if not quick:
            # Unmeasured: on the 2-core VM this was written on, the first ~20 GB written in a process ran at half
            # speed whatever the store's state (order fresh, warm: 0.61x; warm, fresh: 1.26x, same code), so
            # both measured phases come after one.
            _phase_in(parent, "settle", warm=False, file_size=file_size, duration_s=SETTLE_S, slice_s=SETTLE_S)
        for k, kind in enumerate(order):
            got[kind].append(_phase_in(parent, f"{kind}-{k}", warm=kind == "warm", **kw))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    fresh, warm = _merge(got["fresh"]), _merge(got["warm"])
    size = f"{file_size >> 30} GiB" if file_size >= 1 << 30 else f"{file_size >> 20} MiB"
    base = f"warm store, same {duration_s:g} s"
    rows = [Row(f"fresh store, {size} files, first {duration_s:g} s", fresh.rate, "msgs/s", base, warm.rate,
                "ratio >= 0.8")]
    for k, (f, w) in enumerate(zip(fresh.slice_rates, warm.slice_rates, strict=True)):
        rows.append(Row(f"  slice {k * slice_s:g}-{(k + 1) * slice_s:g} s", f, "msgs/s", "warm, same slice", w,
                        "ratio >= 0.8"))
    rows.append(Row("writer thread page faults", float(fresh.writer_faults), "faults", "warm store",
                    float(warm.writer_faults)))
    rows.append(Row("commit-log files written", float(fresh.files), "files", "warm store", float(warm.files)))
    return rows
