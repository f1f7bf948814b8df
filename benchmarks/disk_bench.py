"""Disk pressure on a real small filesystem (issue 13): a broker whose store sits on a tmpfs of a few dozen MiB,
fed by a producer that never stops.

The run goes through every stage of the disk guards, in order:

1. fill to about 70 %, then age the commit-log files already written (their mtime set 100 h back, so they have
   expired): past ``diskMaxUsedSpaceRatio`` (75 %) the broker deletes them, whatever the hour;
2. go on with young files: past ``diskSpaceCleanForciblyRatio`` (85 %) the broker deletes the oldest anyway, one
   file per pass (``deleteFileBatchMax=1``), slower than the producer writes;
3. past ``diskSpaceWarningLevelRatio`` (90 %) sends are refused with SERVICE_NOT_AVAILABLE and a "disk full"
   message, until the forced deletions bring usage back under 90 % and sends are taken again;
4. SIGKILL the broker, restart it and read every queue back from its min offset: every acknowledged message not
   deleted by retention is there, with its body, exactly once.

:func:`run_pressure` returns the figures (how long it ran, how many bytes went through a disk of that size,
refusals, deletions); ``python -m benchmarks disk`` prints them, ``tests/broker/test_disk_pressure.py`` runs a
short profile and asserts on them. Needs root and a container that allows mounting a tmpfs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from benchmarks import Row
from benchmarks.chaos.cluster import pick_disk_mode
from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import BrokerError

__all__ = ["PressureResult", "can_mount_tmpfs", "run", "run_pressure"]

FILE = 4 << 20
BODY_BYTES = 4000
BATCH = 16
TOPIC = "DiskPressure"
QUEUES = 2


def can_mount_tmpfs() -> bool:
    """Root, and a container that lets root mount a tmpfs (the chaos suite's probe)."""
    return pick_disk_mode("auto") == "tmpfs"


@contextlib.contextmanager
def tmpfs(size_mib: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="splitmq-disk-") as d:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", d], check=True)
        try:
            yield Path(d)
        finally:
            subprocess.run(["umount", "-l", d], check=False)


def used_ratio(path: Path) -> float:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bavail) / st.f_blocks


@attrs.frozen
class PressureResult:
    seconds: float
    disk_mib: int
    bytes_acked: int
    acked: int
    refused: int
    refusal_remarks: tuple[str, ...]
    """The distinct refusal messages (their first 200 characters)."""
    expired_deletions_below_85: int
    """Files deleted while usage was between 75 % and 85 % (expired files only)."""
    files_deleted: int
    peak_used_ratio: float
    accepted_after_refusal: int
    """Messages acknowledged after the first refusal (writes resumed by themselves)."""
    broker_alive: bool
    checked: int
    """Acknowledged messages at or above the min offsets after the restart, each read back."""
    missing: int
    duplicated: int
    corrupt: int


def _props(hour_now: int) -> dict[str, str]:
    return {
        "cleanResourceInterval": "300", "deleteFileBatchMax": "1", "deleteCommitLogFilesInterval": "0",
        "deleteWhen": f"{(hour_now + 12) % 24:02d}",  # never during the run: disk usage decides
        "messageIndexEnable": "true", "maxHashSlotNum": "1000", "maxIndexNum": "4000",
        "mappedFileSizeConsumeQueue": "60000", "flushIntervalCommitLog": "100",
        "registerNameServerPeriod": "1000", "registerNameServerPeriodMinMs": "500",
    }


def run_pressure(*, disk_mib: int = 64, refused_phase_s: float = 4.0, timeout_s: float = 120.0) -> PressureResult:
    """One run (see the module docstring); ``refused_phase_s``: how long to keep writing after the first
    refusal."""
    with tmpfs(disk_mib) as root:
        cluster = LocalCluster(root / "cluster", slaves_per_group=0, commitlog_file_size_bytes=FILE,
                               broker_config=_props(time.localtime().tm_hour)).start()
        try:
            return _drive(cluster, root, disk_mib, refused_phase_s, timeout_s)
        finally:
            cluster.stop()


def _drive(cluster: LocalCluster, root: Path, disk_mib: int, refused_phase_s: float,
           timeout_s: float) -> PressureResult:
    broker = cluster.broker("broker-a", 0)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(TOPIC, queue_nums=QUEUES)
    acked: dict[int, tuple[int, int]] = {}  # seq -> (queue, offset)
    refused = accepted_after = expired_deletions = 0
    remarks: dict[str, None] = {}
    peak = 0.0
    aged = False
    seq = 0
    started = time.monotonic()
    first_refusal = None
    with Producer("disk-pressure", cluster.namesrv_addr) as producer:
        while True:
            now = time.monotonic()
            if now - started > timeout_s:
                raise AssertionError(f"disk pressure run did not reach its stages in {timeout_s} s "
                                     f"(peak {peak:.1%}, refused {refused}, aged {aged})")
            if first_refusal is not None and now - first_refusal > refused_phase_s:
                break
            used = used_ratio(root)
            peak = max(peak, used)
            if not aged and used > 0.70:
                old = time.time() - 100 * 3600
                for f in (broker.store_dir / "commitlog").iterdir():
                    os.utime(f, (old, old))
                aged = True
            if aged and not expired_deletions and used < 0.85:
                expired_deletions = int(broker.runtime()["retentionFilesDeleted"])
            msgs = [Message(TOPIC, b"%012d" % (seq + i) + b"x" * (BODY_BYTES - 12)) for i in range(BATCH)]
            try:
                results = producer.send_batch(msgs)
            except BrokerError as e:
                refused += 1
                if len(remarks) < 10:
                    remarks.setdefault(str(e)[:200])
                if first_refusal is None:
                    first_refusal = time.monotonic()
                continue
            for i, res in enumerate(results):
                acked[seq + i] = (res.message_queue.queue_id, res.queue_offset)
            if first_refusal is not None:
                accepted_after += BATCH
            seq += BATCH
    seconds = time.monotonic() - started
    alive = broker.running()
    deleted = int(broker.runtime()["retentionFilesDeleted"])
    broker.kill()
    broker.start()
    checked, missing, dup, corrupt = _read_back(cluster, acked)
    return PressureResult(seconds, disk_mib, len(acked) * BODY_BYTES, len(acked), refused, tuple(remarks),
                          expired_deletions, deleted, peak, accepted_after, alive, checked, missing, dup, corrupt)


def _read_back(cluster: LocalCluster, acked: dict[int, tuple[int, int]]) -> tuple[int, int, int, int]:
    """Every acknowledged message at or above its queue's min offset, read back after the restart."""
    seen: dict[int, int] = {}
    corrupt = 0
    mins: dict[int, int] = {}
    with PullConsumer("disk-check", cluster.namesrv_addr) as pc:
        for qid in range(QUEUES):
            mq = MessageQueue(TOPIC, "broker-a", qid)
            offset = mins[qid] = pc.min_offset(mq)
            end = pc.max_offset(mq)
            while offset < end:
                r = pc.pull(mq, offset, 32)
                if r.pull_status is not PullStatus.FOUND:
                    offset = max(r.next_begin_offset, offset + 1)
                    continue
                for m in r.msg_found_list:
                    body = m.body
                    s = int(body[:12]) if body[:12].isdigit() else -1
                    if s < 0 or body[12:] != b"x" * (BODY_BYTES - 12) or acked.get(s) != (qid, m.queue_offset):
                        corrupt += 1
                    else:
                        seen[s] = seen.get(s, 0) + 1
                offset = r.next_begin_offset
    want = [s for s, (qid, off) in acked.items() if off >= mins[qid]]
    missing = sum(1 for s in want if s not in seen)
    dup = sum(n - 1 for n in seen.values() if n > 1)
    return len(want), missing, dup, corrupt


def run(quick: bool) -> list[Row]:
    """``python -m benchmarks disk``: one run on a 64 MiB tmpfs (``--quick``: a shorter refused phase)."""
    if not can_mount_tmpfs():
        print("disk: skipped -- needs root and a container that allows mounting a tmpfs")
        return []
    res = run_pressure(disk_mib=64, refused_phase_s=3.0 if quick else 15.0)
    rows: list[dict[str, Any]] = [
        dict(name=f"ran on a {res.disk_mib} MiB tmpfs", value=res.seconds, unit="s"),
        dict(name="bytes acknowledged through it", value=res.bytes_acked / (1 << 20), unit="MiB",
             baseline_name="disk size", baseline=float(res.disk_mib)),
        dict(name="peak disk usage (the next file is preallocated: 6 % of this disk)", value=res.peak_used_ratio * 100,
             unit="%", target="< 97"),
        dict(name="expired files deleted between 75 and 85 %", value=res.expired_deletions_below_85, unit="files",
             target=">= 1"),
        dict(name="files deleted in all", value=res.files_deleted, unit="files"),
        dict(name="sends refused (disk full)", value=res.refused, unit="batches", target=">= 1"),
        dict(name="messages taken after the first refusal", value=res.accepted_after_refusal, unit="msgs",
             target=">= 1"),
        dict(name="acked messages checked after SIGKILL + restart", value=res.checked, unit="msgs"),
        dict(name="missing / duplicated / corrupt", value=res.missing + res.duplicated + res.corrupt, unit="msgs",
             target="0"),
    ]
    return [Row(**r) for r in rows]
