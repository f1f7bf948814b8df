"""A writer process killed with SIGKILL mid-write: every acknowledged record is readable after restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from broker.store.file_store import FileMessageStore
from common.codec import decode_records

from .conftest import small_config

ROOT = Path(__file__).resolve().parents[3]

WRITER = textwrap.dedent(
    """
    import os, sys
    from broker.store.config import StoreConfig
    from broker.store.file_store import FileMessageStore
    from common.codec import decode_batch, encode_batch
    from common.codes import FlushDiskType
    from common.message import Message

    root, mode = sys.argv[1], sys.argv[2]
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commitlog=256 * 1024,
                      mapped_file_size_consume_queue=200 * 20, max_hash_slot_num=64, max_index_num=256,
                      flush_disk_type=FlushDiskType[mode])
    store = FileMessageStore(cfg)
    store.load()
    store.start()
    i = 0
    while True:
        msgs = [Message("Kill", os.urandom(200 + (i * 37) % 900), keys=f"k{i}-{j}") for j in range(4)]
        items = decode_batch(encode_batch(msgs, born_timestamp_ms=1))
        r = store.append_batch("Kill", i % 2, items, born_host=b"\\x7f\\x00\\x00\\x01\\x00\\x00\\x00\\x01")
        if r.status.value != "PUT_OK":
            print("error", r.remark, flush=True)
            break
        if mode == "SYNC_FLUSH" and not store.flush_future(r.end_offset).result(10):
            continue  # not acknowledged
        print("ok", i % 2, r.queue_offset, " ".join(map(str, r.physical_offsets)), flush=True)
        i += 1
        if i % 3 == 0:
            store.dispatch_available(16 * 1024)  # as the broker's driver: queues and index trail the log a little
    """
)


@pytest.mark.parametrize("mode", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_sigkill_mid_write_loses_no_acknowledged_record(tmp_path: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s"), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    acked: list[tuple[int, int, list[int]]] = []
    try:
        for line in proc.stdout:
            parts = line.split()
            assert parts[0] == "ok", line
            acked.append((int(parts[1]), int(parts[2]), [int(x) for x in parts[3:]]))
            if len(acked) >= 300:  # well past the first file roll (256 KiB)
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
    for line in rest.split("\n")[:-1]:  # the last piece may be a line cut by the kill
        parts = line.split()
        if len(parts) > 3 and parts[0] == "ok":
            acked.append((int(parts[1]), int(parts[2]), [int(x) for x in parts[3:]]))
    assert len(acked) >= 300, err
    store = FileMessageStore(small_config(tmp_path / "s", mapped_file_size_commitlog=256 * 1024,
                                          mapped_file_size_consume_queue=200 * 20, max_hash_slot_num=64,
                                          max_index_num=256))
    store.load()
    try:
        for queue_id, first_offset, phys in acked:
            for k, phy in enumerate(phys):
                rec = store.look_message_by_offset(phy)
                assert rec is not None, f"acknowledged record at {phy} ({mode}) lost"
                (m,) = decode_records(rec, verify_crc=True)
                assert (m.queue_id, m.queue_offset) == (queue_id, first_offset + k)
                got = store.get_message("g", "Kill", queue_id, first_offset + k, 1, 1 << 20)
                assert got.records == [rec], f"consume queue lost offset {first_offset + k} of queue {queue_id}"
    finally:
        store.shutdown()
