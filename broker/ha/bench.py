"""Replication micro benchmark: a master and a slave in one event loop over loopback TCP.

Three figures, each measured end to end through the real HA code (socket, framing, store append):

* ``master_append_only_mb_per_s`` - the master's own append rate (no replication): the live phase's ceiling;
* ``catchup_mb_per_s`` - an empty slave copying a prefilled master (one big last file);
* ``live_mb_per_s`` - the master appending batches of ``batch`` x ``message_size`` while the slave follows;
* ``sync_batches_per_s`` / ``sync_ack_ms_avg`` - SYNC_MASTER style: append a batch, wait for the slave's ack.

Both ends share one core's worth of event loop here, so the figures are a lower bound for two processes.
Uses the file store when :mod:`broker.store.file_store` is importable, else :class:`MemoryCommitLog`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from typing import Any

from broker.ha.client import HAClient
from broker.ha.config import HAConfig
from broker.ha.memlog import MemoryCommitLog
from broker.ha.service import HAService

__all__ = ["run_replication_bench"]

log = logging.getLogger(__name__)

_MIB = 1 << 20
_ACK_TIMEOUT_S = 120.0
_SYNC_ROUNDS_MAX = 300


class _Stores:
    """Makes master/slave stores and writes batches, for the file store or the memory log."""

    def __init__(self, tmpdir: str, file_size: int, prefer_file_store: bool) -> None:
        self.tmpdir = tmpdir
        self.file_size = file_size
        self.made: list[Any] = []
        self.kind = "memory"
        self._file_store_cls: Any = None
        if prefer_file_store:
            try:
                self._file_store_cls = importlib.import_module("broker.store.file_store").FileMessageStore
                self.kind = "file"
            except ImportError:
                log.info("broker.store.file_store not importable: benchmarking on the memory commit log")

    def make(self, name: str) -> Any:
        if self._file_store_cls is None:
            store: Any = MemoryCommitLog(self.file_size)
        else:
            from broker.store.config import StoreConfig

            config = StoreConfig(
                store_path_root_dir=os.path.join(self.tmpdir, name),
                mapped_file_size_commitlog=self.file_size,
                dispatch_in_thread=False,  # measure replication, not consume-queue building
            )
            store = self._file_store_cls(config)
            store.load()
            store.start()
        self.made.append(store)
        return store

    def batch_writer(self, store: Any, batch: int, message_size: int) -> Any:
        """A callable appending one batch and returning the new end offset."""
        if self._file_store_cls is None:
            payload = os.urandom(message_size)

            def write_memory() -> int:
                for _ in range(batch):
                    store.append_record(payload)
                return int(store.max_physical_offset)

            return write_memory
        from client.protocol.codec import decode_batch, encode_batch
        from client.protocol.message import Message

        body = encode_batch([Message("BenchTopic", os.urandom(message_size)) for _ in range(batch)],
                            born_timestamp_ms=int(time.time() * 1000))
        items = decode_batch(body)
        host = b"\x7f\x00\x00\x01\x00\x00\x27\x10"

        def write_file() -> int:
            result = store.append_batch("BenchTopic", 0, items, born_host=host)
            if result.status.name != "PUT_OK":
                raise RuntimeError(f"bench append failed: {result.status.name} {result.remark}")
            return int(result.end_offset)

        return write_file

    def close(self) -> None:
        for store in self.made:
            shutdown = getattr(store, "shutdown", None)
            if shutdown is not None:
                shutdown()


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
        "store": stores.kind,
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
    prefer_file_store: bool = True,
    use_uvloop: bool = False,
) -> dict[str, Any]:
    """Measure replication throughput in-process (see the module docstring).

    Args:
        tmpdir: an empty directory for the two stores (file store only).
        total_bytes: bytes for the catch-up phase and again for the live phase.
        batch: messages per append (a producer's send batch).
        message_size: body bytes per message.
        prefer_file_store: use the file store when it is importable.
        use_uvloop: run on uvloop instead of the default asyncio loop.

    Returns:
        A flat dict of figures (MB/s use MiB = 2^20 bytes).
    """
    if total_bytes <= 0:
        raise ValueError(f"total_bytes must be > 0, got {total_bytes}")
    # One file large enough for the prefill: an empty slave only receives the master's last file.
    file_size = 1 << max(26, (total_bytes + 4 * _MIB).bit_length())
    stores = _Stores(tmpdir, file_size, prefer_file_store)
    try:
        if use_uvloop:
            import uvloop

            return uvloop.run(_bench(stores, total_bytes, batch, message_size))
        return asyncio.run(_bench(stores, total_bytes, batch, message_size))
    finally:
        stores.close()
