"""Commit-log preallocation: a roll waits for the next file to exist, never for its pages to be faulted in."""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import threading
from pathlib import Path

import pytest

from broker.store import commitlog as commitlog_module
from broker.store import io as store_io
from broker.store.api import PutMessageStatus

from .conftest import BORN_HOST, StoreFactory, batch

FILE = 64 * 1024


def test_roll_does_not_wait_for_populating(make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """With populating stuck, appends still roll into the prepared file (they used to wait for the whole
    population of the next file, up to 30 s, at every roll); closing the store stops the populater."""
    release = threading.Event()
    entered = threading.Event()

    def stuck_prefault(mm: object, start: int, end: int, *, floor: object = None,
                       stop: threading.Event | None = None) -> None:
        entered.set()
        assert stop is not None
        while not (release.is_set() or stop.is_set()):
            stop.wait(0.01)

    monkeypatch.setattr(commitlog_module, "_PREPARE_WAIT_S", 2.0)
    monkeypatch.setattr(commitlog_module, "prefault", stuck_prefault)
    store = make_store()
    n = 0
    while store.max_physical_offset < 2 * FILE + 4096:
        r = store.append_batch("T", 0, batch("T", 4, body=b"x" * 1000, start=n), born_host=BORN_HOST)
        assert r.status is PutMessageStatus.PUT_OK, r
        n += 4
    assert entered.is_set()
    assert [mf.start for mf in store.commitlog.files] == [0, FILE, 2 * FILE]
    assert not store.commitlog.wait_prepared(0.05)  # still populating
    store.shutdown()  # stops it: returns although the populater is never released
    assert store.commitlog._prep_thread is None


def test_reopened_log_is_prepared_at_start(make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted store populates the rest of its current file and creates the next one at start(), before the
    first append (the writer used to fault in the rest of the file itself, a fault per page, after every restart)."""
    store = make_store()
    r = store.append_batch("T", 0, batch("T", 4, body=b"x" * 1000), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK, r
    store.shutdown()

    calls: list[tuple[int, int]] = []
    real = commitlog_module.prefault

    def spy(mm: mmap.mmap, start: int, end: int, **kw: object) -> None:
        calls.append((len(mm), start))
        real(mm, start, end, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(commitlog_module, "prefault", spy)
    reopened = make_store()
    assert reopened.commitlog.wait_prepared(10.0)
    written = reopened.max_physical_offset
    assert 0 < written < FILE
    assert calls and calls[0] == (FILE, written), calls  # the current file, from the write position on
    prepared = reopened.commitlog._prepared
    assert prepared is not None and prepared.start == FILE and os.path.exists(prepared.path)


def test_populater_behind_the_writer_resumes_at_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A populater that the writer overtook skips what the writer faulted in and resumes at the writer's page,
    then goes on to the end in ``_PREFAULT_CHUNK`` steps."""
    assert store_io._libc_madvise is not None, "libc madvise not found on this POSIX system"
    real = store_io._libc_madvise
    step = store_io._PREFAULT_CHUNK
    size = 2 * step + 5 * mmap.PAGESIZE
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    anchor = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(anchor)
    spans: list[tuple[int, int]] = []

    def spy(addr: int, length: int, advice: int) -> int:
        spans.append((addr - base, length))
        return real(addr, length, advice)

    monkeypatch.setattr(store_io, "_libc_madvise", spy)
    writer_at = 3 * mmap.PAGESIZE + 100
    try:
        store_io.prefault(mm, 0, size, floor=lambda: writer_at)
        assert spans[0][0] == writer_at - writer_at % mmap.PAGESIZE, spans
        for (a, n), (b, _) in itertools.pairwise(spans):
            assert n == step and b == a + n, spans
        assert spans[-1][0] + spans[-1][1] == size, spans
    finally:
        del anchor
        mm.close()
        os.close(fd)
