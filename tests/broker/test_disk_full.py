"""A full disk (or a disk error) answers a send with SERVICE_NOT_AVAILABLE (14, HTTP 503) and a remark saying so,
whether it strikes a write or the creation of the next commit-log file; nothing is written (docs/PROTOCOL.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos.faulty_io import FaultyIO
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import encode_batch
from common.message import Message
from tests.broker.fakes import run_with_broker

FILE = 64 * 1024


def _store(root: Path, io: FaultyIO, clock: Callable[[], int]) -> FileMessageStore:
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commitlog=FILE,
                      mapped_file_size_consume_queue=20 * 1000, max_hash_slot_num=1024, max_index_num=4096,
                      total_physical_memory_bytes=1 << 34, clock_ms=clock)
    store = FileMessageStore(cfg, io)
    store.load()
    store.start()
    return store


async def _send(client: Any, n: int = 1, size: int = 100) -> Any:
    body = encode_batch([Message("T", b"x" * size) for _ in range(n)], born_timestamp_ms=1)
    return await client.post("/send", params={"topic": "T", "queueId": 0}, content=body)


@pytest.mark.parametrize("where", ["write", "next-file"])
def test_disk_full_is_503_service_not_available(tmp_path: Path, where: str) -> None:
    io = FaultyIO()
    now = [1_700_000_000_000]
    store = _store(tmp_path / "store", io, lambda: now[0])

    async def scenario(ctrl: Any, client: Any) -> None:
        assert (await _send(client)).status_code == 200
        if where == "next-file":
            while store.max_physical_offset + 2000 < FILE:
                assert (await _send(client, size=1000)).status_code == 200
            io.enospc_on_allocate = True
            store.commitlog._discard_prepared()  # a file allocated in the background before the disk filled
        else:
            io.enospc_on_write = True
        before = store.max_physical_offset
        r = await _send(client, n=2, size=1000)
        err = r.json()
        assert (r.status_code, err["code"]) == (503, 14), err
        assert "disk full" in err["remark"] and "nothing was written" in err["remark"], err
        assert store.max_physical_offset == before
        io.enospc_on_allocate = io.enospc_on_write = False
        r = await _send(client)  # refused until the next disk check, a second later at the earliest
        assert (r.status_code, r.json()["code"]) == (503, 14) and "the last write failed" in r.json()["remark"]
        now[0] += 1000
        assert (await _send(client)).status_code == 200

    try:
        run_with_broker(tmp_path, scenario, store=store, auto_create_topic_enable=True)
    finally:
        store.shutdown()
