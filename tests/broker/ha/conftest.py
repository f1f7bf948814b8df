"""Fixtures for HA tests: stores on both sides (the in-memory commit log of :mod:`tests.broker.ha.memlog`, and the
real file store) and a way to run a coroutine in a fresh loop from a sync test (no pytest-asyncio)."""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

import pytest

from broker.ha.config import HAConfig
from tests.broker.ha.memlog import MemoryCommitLog

FILE_SIZE = 64 * 1024


class StoreKind(Protocol):
    name: str

    def make(self, path: str) -> Any: ...

    def write(self, store: Any, count: int, size: int) -> int: ...

    def read_range(self, store: Any, begin: int, end: int) -> bytes: ...

    def close(self, store: Any) -> None: ...


class FakeKind:
    name = "fake"

    def make(self, path: str) -> MemoryCommitLog:
        return MemoryCommitLog(FILE_SIZE)

    def write(self, store: MemoryCommitLog, count: int, size: int) -> int:
        for i in range(count):
            store.append_record(os.urandom(4) + bytes([i & 0xFF]) * (size - 4))
        return store.max_physical_offset

    def read_range(self, store: MemoryCommitLog, begin: int, end: int) -> bytes:
        return store.read_range(begin, end)

    def close(self, store: MemoryCommitLog) -> None:
        pass


class FileKind:
    """The real file store (``broker.store.file_store.FileMessageStore``), when it exists."""

    name = "file"

    def __init__(self) -> None:
        from broker.store.config import StoreConfig
        from common.codec import decode_batch, encode_batch
        from common.message import Message

        self._cls = importlib.import_module("broker.store.file_store").FileMessageStore
        self._config = StoreConfig
        self._decode, self._encode, self._message = decode_batch, encode_batch, Message

    def make(self, path: str) -> Any:
        store = self._cls(self._config(store_path_root_dir=path, mapped_file_size_commitlog=FILE_SIZE))
        store.load()
        store.start()
        return store

    def write(self, store: Any, count: int, size: int) -> int:
        batch = 16
        for i in range(0, count, batch):
            msgs = [self._message("HaTopic", os.urandom(size)) for _ in range(min(batch, count - i))]
            items = self._decode(self._encode(msgs, born_timestamp_ms=1))
            result = store.append_batch("HaTopic", i % 4, items, born_host=b"\x7f\x00\x00\x01\x00\x00\x27\x10")
            assert result.status.name == "PUT_OK", result
        return int(store.max_physical_offset)

    def read_range(self, store: Any, begin: int, end: int) -> bytes:
        out = bytearray()
        off = begin
        while off < end:
            data = store.get_commitlog_data(off, end - off)
            assert data is not None, f"no data at {off}"
            out += data
            off += len(data)
        return bytes(out)

    def close(self, store: Any) -> None:
        store.shutdown()


@pytest.fixture(params=["fake", "file"])
def kind(request: pytest.FixtureRequest) -> Iterator[StoreKind]:
    if request.param == "fake":
        yield FakeKind()
        return
    yield FileKind()  # the real store: an import error here must fail the tests, not skip them


@pytest.fixture
def stores(kind: StoreKind, tmp_path: Any) -> Iterator[Callable[[str], Any]]:
    """``stores(name)`` makes a store of the current kind in ``tmp_path/name``; all are closed afterwards."""
    made: list[Any] = []

    def make(name: str) -> Any:
        store = kind.make(str(tmp_path / name))
        made.append(store)
        return store

    yield make
    for store in made:
        kind.close(store)


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``run(coro)``: run a coroutine to completion in a fresh event loop."""
    return asyncio.run


@pytest.fixture
def fast_config() -> HAConfig:
    return HAConfig(
        ha_send_heartbeat_interval_ms=200,
        ha_housekeeping_interval_ms=2000,
        reconnect_backoff_min_ms=20,
        reconnect_backoff_max_ms=200,
    )
