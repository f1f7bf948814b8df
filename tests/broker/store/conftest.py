"""Helpers for store tests: small configs, batches, a store that is always shut down."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from broker.store.io import FileIO
from common.codec import BatchItem, decode_batch, encode_batch
from common.message import Message

BORN_HOST = b"\x7f\x00\x00\x01\x00\x00\x30\x39"


class FakeClock:
    """A settable wall clock in ms."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def no_memory_limit() -> None:
    """A memory cgroup without a limit (the store's reads then count on RAM alone, whatever runs the tests)."""
    return None


def small_config(root: Path | str, **kw: Any) -> StoreConfig:
    """64 KiB commit-log files, 50-unit consume-queue files, tiny index, no memory-cgroup limit."""
    base: dict[str, Any] = dict(
        memory_limit_bytes=no_memory_limit,
        store_path_root_dir=str(root),
        mapped_file_size_commitlog=64 * 1024,
        mapped_file_size_consume_queue=50 * 20,
        max_hash_slot_num=16,
        max_index_num=64,
        flush_interval_commitlog_ms=20,
        flush_interval_consume_queue_ms=20,
    )
    base.update(kw)
    return StoreConfig(**base)


def batch(topic: str, n: int = 1, *, body: bytes = b"x" * 100, tags: str | None = "TagA",
          keys: str | None = None, delay_level: int = 0, uniq_prefix: str = "U", start: int = 0,
          properties: dict[str, str] | None = None) -> list[BatchItem]:
    """Decoded send-batch items (as the broker hands them to the store)."""
    msgs = [Message(topic, body, tags=tags, keys=keys or f"k{start + i}", delay_level=delay_level,
                    properties=properties) for i in range(n)]
    uniq = [f"{uniq_prefix}{start + i:08d}" for i in range(n)]
    return decode_batch(encode_batch(msgs, born_timestamp_ms=1_600_000_000_000, uniq_keys=uniq))


StoreFactory = Callable[..., FileMessageStore]


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """``make(io=None, root=None, start=True, **config) -> loaded (and started) FileMessageStore``; all stores
    are shut down at teardown."""
    made: list[FileMessageStore] = []

    def make(*, io: FileIO | None = None, root: Path | str | None = None, start: bool = True,
             **kw: Any) -> FileMessageStore:
        store = FileMessageStore(small_config(root or tmp_path / "store", **kw), io)
        made.append(store)
        store.load()
        if start:
            store.start()
        return store

    yield make
    for s in made:
        s.shutdown()
