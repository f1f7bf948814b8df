"""Replication micro benchmark: a master and a slave file store in one event loop over loopback TCP.

Figures, each measured end to end through the real HA code (socket, framing, store append):

* ``master_append_only_mb_per_s`` - the master's own append rate (no replication): the live phase's ceiling;
* ``catchup_mb_per_s`` - an empty slave copying a prefilled master (one big last file);
* ``live_mb_per_s`` - the master appending batches of ``batch`` x ``message_size`` while the slave follows;
* ``sync_batches_per_s`` / ``sync_ack_ms_avg`` - SYNC_MASTER style: append a batch, wait for the slave's ack.

Both ends share one core's worth of event loop here, so the figures are a lower bound for two processes.
``python -m benchmarks replication`` runs it (``--quick`` with small sizes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks import Row
from broker.ha import HAClient, HAConfig, HAService
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import decode_batch, encode_batch
from common.message import Message

__all__ = ["run", "run_replication_bench"]

_MIB = 1 << 20
_ACK_TIMEOUT_S = 120.0
_SYNC_ROUNDS_MAX = 300
_BORN_HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x10"


class _Stores:
    """Makes the master and slave stores and writes batches to the master."""

    def __init__(self, tmpdir: str, file_size: int) -> None:
        self.tmpdir = tmpdir
        self.file_size = file_size
        self.made: list[FileMessageStore] = []

    def make(self, name: str) -> FileMessageStore:
        # Nothing drives dispatch here: the figures are replication's, not consume-queue building's.
        config = StoreConfig(store_path_root_dir=os.path.join(self.tmpdir, name),
                             mapped_file_size_commitlog=self.file_size)
        store = FileMessageStore(config)
        store.load()
        store.start()
        self.made.append(store)
        return store

    @staticmethod
    def notify_on_append(store: FileMessageStore, service: HAService) -> None:
        """The broker's wiring: each append wakes the HA service (it sends to idle slaves at once)."""
        store.add_append_listener(lambda _end: service.notify_new_data())

    @staticmethod
    def batch_writer(store: FileMessageStore, batch: int, message_size: int) -> Callable[[], int]:
        """A callable appending one batch and returning the new end offset."""
        body = encode_batch([Message("BenchTopic", os.urandom(message_size)) for _ in range(batch)],
                            born_timestamp_ms=int(time.time() * 1000))
        items = decode_batch(body)

        def write() -> int:
            result = store.append_batch("BenchTopic", 0, items, born_host=_BORN_HOST)
            if result.status.name != "PUT_OK":
                raise RuntimeError(f"bench append failed: {result.status.name} {result.remark}")
            return int(result.end_offset)

        return write

    def close(self) -> None:
        for store in self.made:
            store.shutdown()


async def _catch_up(service: HAService, end: int) -> None:
    if not await service.wait_for_ack(end, _ACK_TIMEOUT_S):
        raise RuntimeError(f"slave did not ack offset {end} within {_ACK_TIMEOUT_S}s")


async def _bench(stores: _Stores, total_bytes: int, batch: int, message_size: int) -> dict[str, Any]:
    config = HAConfig()
    master, slave = stores.make("master"), stores.make("slave")
    write = stores.batch_writer(master, batch, message_size)
    end = 0
    t0 = time.perf_counter()
    while end < total_bytes:
        end = write()
    append_s = time.perf_counter() - t0  # the master's append cost alone: the ceiling for the live phase
    service = HAService(master, config)
    stores.notify_on_append(master, service)
    port = await service.start("127.0.0.1", 0)
    client = HAClient(slave, config, f"127.0.0.1:{port}")
    loop = asyncio.get_running_loop()
    try:
        t0 = loop.time()
        await client.start()
        await _catch_up(service, end)
        catchup_s = loop.time() - t0
        catchup_bytes = end - (end - end % stores.file_size)
        end_prefill = end

        start_live = end
        t0 = loop.time()
        while end - start_live < total_bytes:
            end = write()
            await asyncio.sleep(0)  # let the transfer loop and the slave run between batches
        await _catch_up(service, end)
        live_s = loop.time() - t0
        live_bytes = end - start_live

        rounds = min(_SYNC_ROUNDS_MAX, max(10, total_bytes // (batch * message_size * 4)))
        t0 = loop.time()
        for _ in range(rounds):
            end = write()
            await _catch_up(service, end)
        sync_s = loop.time() - t0
        status = service.status()
    finally:
        await client.stop()
        await service.stop()
    return {
        "total_bytes": total_bytes,
        "batch": f"{batch}x{message_size}B",
        "master_append_only_mb_per_s": round(end_prefill / _MIB / append_s, 1),
        "catchup_bytes": catchup_bytes,
        "catchup_mb_per_s": round(catchup_bytes / _MIB / catchup_s, 1),
        "live_bytes": live_bytes,
        "live_mb_per_s": round(live_bytes / _MIB / live_s, 1),
        "sync_rounds": rounds,
        "sync_batches_per_s": round(rounds / sync_s, 1),
        "sync_ack_ms_avg": round(sync_s / rounds * 1000, 3),
        "slave_max_offset": int(slave.max_physical_offset),
        "master_max_offset": status["masterMaxOffset"],
    }


def run_replication_bench(
    tmpdir: str,
    total_bytes: int,
    *,
    batch: int = 64,
    message_size: int = 1024,
    use_uvloop: bool = False,
) -> dict[str, Any]:
    """Measure replication throughput in-process (see the module docstring).

    Args:
        tmpdir: an empty directory for the two stores.
        total_bytes: bytes for the catch-up phase and again for the live phase.
        batch: messages per append (a producer's send batch).
        message_size: body bytes per message.
        use_uvloop: run on uvloop instead of the default asyncio loop.

    Returns:
        A flat dict of figures (MB/s use MiB = 2^20 bytes).
    """
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be > 0, got {total_bytes}")
    # One file large enough for the prefill: an empty slave only receives the master's last file.
    file_size = 1 << max(26, (total_bytes + 4 * _MIB).bit_length())
    stores = _Stores(tmpdir, file_size)
    try:
        if use_uvloop:
            import uvloop

            return uvloop.run(_bench(stores, total_bytes, batch, message_size))
        return asyncio.run(_bench(stores, total_bytes, batch, message_size))
    finally:
        stores.close()


def run(quick: bool) -> list[Row]:
    """The ``replication`` benchmark entry (on uvloop, as the broker runs)."""
    root = tempfile.mkdtemp(prefix="splitmq-bench-repl-")
    try:
        r = run_replication_bench(root, (16 if quick else 256) * _MIB, use_uvloop=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ceiling = "master append-only, same batches"
    append = float(r["master_append_only_mb_per_s"])
    return [
        Row(f"slave catch-up {r['batch']}", float(r["catchup_mb_per_s"]), "MB/s", ceiling, append),
        Row(f"live replication {r['batch']}", float(r["live_mb_per_s"]), "MB/s", ceiling, append),
        Row(f"append + wait for the ack {r['batch']}", float(r["sync_ack_ms_avg"]), "ms"),
    ]
