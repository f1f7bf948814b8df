"""Commit-log preallocation: a roll waits for the next file to exist, never for its pages to be faulted in."""

from __future__ import annotations

import threading

import pytest

from broker.store import commitlog as commitlog_module
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
