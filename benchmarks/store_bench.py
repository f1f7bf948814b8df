"""Message store benchmarks (in-process, a temporary directory).

* append: ``append_batch`` of 1 KiB messages in batches of 64, ASYNC_FLUSH with the flush thread running;
  baseline: copying the same record bytes into an mmap.
* dispatch from the log: building consume queues and the index from the appended log after all the appends
  (what a slave, recovery and a dispatch backlog do: every record parsed from its bytes); same baseline.
* dispatch after each append: as the broker's dispatch driver runs it on a master (woken by each append event,
  the batch handed over by the send path); baseline: the append rate of the same run (target >= 0.8x).
* read: ``get_message`` 32 per call, data in the page cache; baseline: slicing the same records out of the map.
* recovery: abnormal start on the whole log with a zeroed checkpoint (every record CRC-checked and replayed),
  and with consume queues and index deleted (full rebuild); baseline: reading + CRC of the same bytes.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
import zlib

from benchmarks import Row
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import decode_batch, encode_batch, write_batch_records
from common.message import Message

__all__ = ["bench_append_read", "bench_live_dispatch", "bench_recovery", "run"]

BORN_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"
TOPIC = "BenchTopic"


def _batches(count: int, batch: int, body_size: int) -> list[bytes]:
    body = os.urandom(body_size)
    out = []
    for b in range(count):
        msgs = [Message(TOPIC, body, tags="TagA", keys=f"key-{b}-{i}") for i in range(batch)]
        uniq = [f"0A0000010F2A{b:012X}{i:08X}" for i in range(batch)]
        out.append(encode_batch(msgs, born_timestamp_ms=1_700_000_000_000, uniq_keys=uniq))
    return out


def _config(root: str, file_size: int, **kw: object) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog=file_size, **kw)  # type: ignore[arg-type]


def _raw_write_rate(items_batch: list, n_msgs: int, batch: int, file_size: int, root: str) -> float:
    buf = bytearray(4 << 20)
    offs = write_batch_records(buf, 0, 0, topic=TOPIC.encode(), queue_id=0, first_queue_offset=0,
                               items=items_batch, born_host=BORN_HOST, store_timestamp=1, store_host=BORN_HOST)
    blob = bytes(buf[: offs[-1] + (offs[-1] - offs[-2])])
    path = os.path.join(root, "raw")
    with open(path, "wb") as f:
        f.truncate(file_size)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), file_size)
        t0 = time.perf_counter()
        pos = done = 0
        n = len(blob)
        while done < n_msgs:
            if pos + n > file_size:
                pos = 0
            mm[pos : pos + n] = blob
            pos += n
            done += batch
        dt = time.perf_counter() - t0
        mm.close()
    os.unlink(path)
    return done / dt


def bench_append_read(root: str, *, n_msgs: int, file_size: int, body_size: int = 1024, batch: int = 64,
                      read_msgs: int | None = None) -> dict[str, float]:
    """Append ``n_msgs`` messages, dispatch them, read them back; rates in msgs/s (and the baselines)."""
    pool = [decode_batch(b) for b in _batches(64, batch, body_size)]
    cfg = _config(root, file_size)
    store = FileMessageStore(cfg)
    store.load()
    store.start()
    out: dict[str, float] = {}
    # Steady state, as in a running broker: the first append creates the file and the background preparer
    # faults its pages in (and prepares the next file) before the clock starts.
    store.append_batch(TOPIC, 0, pool[0], born_host=BORN_HOST)
    store.commitlog.wait_prepared(60.0)
    t0 = time.perf_counter()
    done = batch
    i = 1
    while done < n_msgs:
        r = store.append_batch(TOPIC, 0, pool[i % len(pool)], born_host=BORN_HOST)
        if r.msg_count != batch:
            raise RuntimeError(f"append failed: {r}")
        done += batch
        i += 1
    out["append"] = done / (time.perf_counter() - t0)
    out["raw_write"] = _raw_write_rate(pool[0], n_msgs, batch, file_size, root)
    # The path of a slave, recovery and a backlog: every record parsed from the log (not the batches the
    # appends handed over, which cover the last ones only).
    store.dispatcher.drop_handovers()
    t0 = time.perf_counter()
    while store.dispatch_available(64 << 20):
        pass
    out["dispatch"] = done / (time.perf_counter() - t0)
    read_n = min(read_msgs or done, done)
    t0 = time.perf_counter()
    offset = got = 0
    while got < read_n:
        res = store.get_message("g", TOPIC, 0, offset, 32, 1 << 20)
        got += res.msg_count
        offset = res.next_begin_offset
    out["read"] = got / (time.perf_counter() - t0)
    # Baseline: the same records sliced out of the map with known offsets.
    units = [store.cqs.get(TOPIC, 0).unit(o) for o in range(min(read_n, 32 * 1024))]  # type: ignore[union-attr]
    files = store.commitlog.files
    t0 = time.perf_counter()
    got = 0
    while got < read_n:
        for k in range(0, len(units), 32):
            chunk = []
            for phy, size, _ in units[k : k + 32]:  # type: ignore[misc]
                f = files[(phy - files[0].start) // file_size]
                rp = phy - f.start
                chunk.append(f.mm[rp : rp + size])
            got += len(chunk)
            if got >= read_n:
                break
    out["raw_read"] = got / (time.perf_counter() - t0)
    store.shutdown()
    return out


def bench_live_dispatch(root: str, *, n_msgs: int, file_size: int, body_size: int = 1024,
                        batch: int = 64) -> dict[str, float]:
    """Append ``n_msgs`` messages, dispatching after each batch as the broker's driver does; the time of each
    side measured apart (msgs/s), and the CPU time per message of each (µs, less noisy on a shared machine)."""
    pool = [decode_batch(b) for b in _batches(64, batch, body_size)]
    store = FileMessageStore(_config(root, file_size))
    store.load()
    store.start()
    store.append_batch(TOPIC, 0, pool[0], born_host=BORN_HOST)
    store.dispatch_available(64 << 20)
    store.commitlog.wait_prepared(60.0)
    clock, cpu = time.perf_counter, time.process_time
    t_append = t_dispatch = c_append = c_dispatch = 0.0
    done = 0
    i = 1
    while done < n_msgs:
        t0, c0 = clock(), cpu()
        r = store.append_batch(TOPIC, 0, pool[i % len(pool)], born_host=BORN_HOST)
        t1, c1 = clock(), cpu()
        while store.dispatch_available(64 << 20):
            pass
        t2, c2 = clock(), cpu()
        if r.msg_count != batch:
            raise RuntimeError(f"append failed: {r}")
        t_append += t1 - t0
        t_dispatch += t2 - t1
        c_append += c1 - c0
        c_dispatch += c2 - c1
        done += batch
        i += 1
    store.shutdown()
    return {"append": done / t_append, "dispatch": done / t_dispatch, "append_cpu_us": c_append / done * 1e6,
            "dispatch_cpu_us": c_dispatch / done * 1e6}


def bench_recovery(root: str, *, log_bytes: int, file_size: int, body_size: int = 1024,
                   batch: int = 64) -> dict[str, float]:
    """Abnormal recovery times (s) of ``log_bytes`` of commit log, and the read+CRC baseline."""
    pool = [decode_batch(b) for b in _batches(64, batch, body_size)]
    cfg = _config(root, file_size)
    store = FileMessageStore(cfg)
    store.load()
    i = 0
    while store.max_physical_offset < log_bytes:
        store.append_batch(TOPIC, i % 4, pool[i % len(pool)], born_host=BORN_HOST)
        i += 1
    while store.dispatch_available(64 << 20):
        pass
    store.shutdown()
    out = {"log_bytes": float(log_bytes)}
    # Baseline: read every commit-log byte and CRC it.
    t0 = time.perf_counter()
    for name in sorted(os.listdir(os.path.join(root, "commitlog"))):
        with open(os.path.join(root, "commitlog", name), "rb") as f:
            while chunk := f.read(1 << 20):
                zlib.crc32(chunk)
    out["raw_crc"] = time.perf_counter() - t0
    for label, wipe in (("recover_replay", False), ("recover_rebuild", True)):
        with open(os.path.join(root, "abort"), "w") as f:
            f.write("1")
        with open(os.path.join(root, "checkpoint"), "r+b") as f:
            f.write(bytes(40))  # worst case: nothing known to be flushed
        if wipe:
            shutil.rmtree(os.path.join(root, "consumequeue"))
            shutil.rmtree(os.path.join(root, "index"))
        store = FileMessageStore(cfg)
        t0 = time.perf_counter()
        store.load()
        out[label] = time.perf_counter() - t0
        if store.get_max_offset_in_queue(TOPIC, 0) == 0:
            raise RuntimeError("recovery lost the consume queue")
        store.shutdown()
    return out


def run(quick: bool) -> list[Row]:
    """The ``store`` benchmark entry."""
    n_msgs = 64 * 1024 if quick else 512 * 1024
    log_bytes = (64 << 20) if quick else (1 << 30)
    file_size = (16 << 20) if quick else (1 << 30)
    root = tempfile.mkdtemp(prefix="splitmq-bench-store-")
    try:
        a = bench_append_read(os.path.join(root, "a"), n_msgs=n_msgs, file_size=file_size)
        shutil.rmtree(os.path.join(root, "a"))
        live = bench_live_dispatch(os.path.join(root, "l"), n_msgs=n_msgs, file_size=file_size)
        shutil.rmtree(os.path.join(root, "l"))
        r = bench_recovery(os.path.join(root, "r"), log_bytes=log_bytes, file_size=file_size)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = log_bytes >> 20
    raw = "raw mmap copy, same bytes, fresh pages"
    return [
        Row("append_batch 1 KiB x64, ASYNC_FLUSH", a["append"], "msgs/s", raw, a["raw_write"], ">= 300,000"),
        Row("dispatch from the log (consume queue + index)", a["dispatch"], "msgs/s", raw, a["raw_write"]),
        Row(f"dispatch after each append ({live['dispatch_cpu_us']:.2f} µs CPU/msg)", live["dispatch"], "msgs/s",
            f"append_batch, same run ({live['append_cpu_us']:.2f} µs CPU/msg)", live["append"], ">= 0.8x"),
        Row("get_message 32/call, page cache", a["read"], "msgs/s", "raw mmap slices, same records",
            a["raw_read"], ">= 500,000"),
        Row(f"abnormal recovery {mib} MiB, replay", r["recover_replay"], "s", "read + crc32 of the log",
            r["raw_crc"], "< 10 s per GiB"),
        Row(f"abnormal recovery {mib} MiB, rebuild CQ+index", r["recover_rebuild"], "s", "read + crc32 of the log",
            r["raw_crc"]),
    ]
