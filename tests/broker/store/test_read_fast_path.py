"""An unfiltered read whose records are one run in memory takes them without a step per record
(``reader._take_run``): it must answer exactly what the step-by-step scan answers, and be taken where it applies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store import reader
from broker.store.api import GetMessageResult
from broker.store.file_store import FileMessageStore

from .conftest import BORN_HOST, StoreFactory, batch

_ONE_RUN = dict(max_transfer_count_on_message_in_memory=1000, max_transfer_bytes_on_message_in_memory=1 << 30,
                mapped_file_size_consume_queue=2000 * 20)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the reads that went the step-by-step way."""
    calls: list[int] = []
    scan = reader._scan

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return scan(*args, **kwargs)

    monkeypatch.setattr(reader, "_scan", spy)
    yield calls


def _answer(r: GetMessageResult) -> dict[str, object]:
    return attrs.asdict(r)


def _both(store: FileMessageStore, queue_id: int, offset: int, max_nums: int, max_bytes: int,
          monkeypatch: pytest.MonkeyPatch) -> tuple[GetMessageResult, GetMessageResult]:
    fast = store.get_message("g", "T", queue_id, offset, max_nums, max_bytes)
    with monkeypatch.context() as m:
        m.setattr(reader, "_take_run", lambda *a, **k: None)
        slow = store.get_message("g", "T", queue_id, offset, max_nums, max_bytes)
    return fast, slow


def test_a_queue_written_in_batches_is_read_without_a_step_per_record(make_store: StoreFactory, scans: list[int],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(**_ONE_RUN, mapped_file_size_commitlog=1 << 20)  # every record in one file
    for i in range(4):
        store.append_batch("T", 0, batch("T", 25, start=25 * i), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    r = store.get_message("g", "T", 0, 10, 64, 1 << 30)
    assert (r.msg_count, r.next_begin_offset, r.queue_offsets[0], scans) == (64, 74, 10, [])
    assert len(r.records) == 64
    for i in range(12):  # a read of units of three unpacks (reader._CHUNK each)
        store.append_batch("T", 0, batch("T", 50, start=100 + 50 * i), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    fast, slow = _both(store, 0, 3, 650, 1 << 30, monkeypatch)
    assert attrs.asdict(fast) == attrs.asdict(slow)
    assert (fast.msg_count, fast.next_begin_offset, scans) == (650, 653, [1])  # the [1]: _both's own scan


def test_interleaved_queues_and_filters_go_the_step_by_step_way(make_store: StoreFactory, scans: list[int]) -> None:
    store = make_store(**_ONE_RUN)
    store.append_batch("T", 0, batch("T", 3), born_host=BORN_HOST)
    store.append_batch("T", 1, batch("T", 3), born_host=BORN_HOST)
    store.append_batch("T", 0, batch("T", 3, start=3), born_host=BORN_HOST)
    store.dispatch_available(1 << 30)
    assert store.get_message("g", "T", 0, 0, 32, 1 << 30).msg_count == 6
    assert scans == [1]
    assert store.get_message("g", "T", 0, 0, 2, 1 << 30, lambda code: True).msg_count == 2
    assert scans == [1, 1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    appends=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 12), st.integers(0, 700)), min_size=1, max_size=12),
    offset=st.integers(0, 40),
    max_nums=st.integers(1, 40),
    max_bytes=st.integers(1, 20_000),
    count_cap=st.integers(1, 40),
    bytes_cap=st.integers(1, 20_000),
    memory=st.sampled_from([None, 6_000, 30_000]),
)
def test_the_same_answer_as_the_step_by_step_scan(make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path,
                                                   appends: list[tuple[int, int, int]], offset: int, max_nums: int,
                                                   max_bytes: int, count_cap: int, bytes_cap: int,
                                                   memory: int | None) -> None:
    """Batches of two queues with bodies of many sizes (across 64 KiB commit-log files), read at any offset with
    any caps, part of the log on disk or not: the same status, offsets, bytes and suggestion either way."""
    config: dict[str, object] = dict(_ONE_RUN, max_transfer_count_on_message_in_memory=count_cap,
                                     max_transfer_bytes_on_message_in_memory=bytes_cap)
    if memory is not None:
        config["total_physical_memory_bytes"] = memory * 100 // 40  # accessMessageInMemoryMaxRatio 40 %
    store = make_store(root=tmp_path / uuid.uuid4().hex, **config)  # one fixture, many examples
    done = [0, 0]
    for queue_id, n, body in appends:
        store.append_batch("T", queue_id, batch("T", n, body=b"b" * body, start=done[queue_id]), born_host=BORN_HOST)
        done[queue_id] += n
    store.dispatch_available(1 << 30)
    for queue_id in (0, 1):
        fast, slow = _both(store, queue_id, offset, max_nums, max_bytes, monkeypatch)
        assert _answer(fast) == _answer(slow)
    store.shutdown()
