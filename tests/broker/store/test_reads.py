"""Reads: get_message statuses and next offsets (docs/BEHAVIOUR.md 3.1), limits, filters, lookups, dispatch."""

from __future__ import annotations

import threading

import attrs
import pytest

from broker.store.api import GetMessageStatus as S
from common.codec import decode_records, tags_hash
from common.codes import BrokerRole

from .conftest import BORN_HOST, FakeClock, StoreFactory, batch


def _fill(store, n: int, topic: str = "T", queue_id: int = 0, **kw) -> None:
    done = 0
    while done < n:
        k = min(16, n - done)
        store.append_batch(topic, queue_id, batch(topic, k, start=done, **kw), born_host=BORN_HOST)
        done += k
    store.dispatch_available(1 << 30)


@pytest.mark.parametrize(
    ("role", "offset", "status", "next_offset"),
    [
        (BrokerRole.ASYNC_MASTER, 10, S.OFFSET_OVERFLOW_ONE, 10),
        (BrokerRole.ASYNC_MASTER, 15, S.OFFSET_OVERFLOW_BADLY, 0),  # 4.9.3: min when min == 0
        (BrokerRole.ASYNC_MASTER, 3, S.FOUND, 10),
        (BrokerRole.SLAVE, 15, S.OFFSET_OVERFLOW_BADLY, 15),  # slaves keep the requested offset
        (BrokerRole.SLAVE, 3, S.FOUND, 10),
    ],
)
def test_statuses_and_next_offsets(make_store: StoreFactory, role, offset, status, next_offset) -> None:
    store = make_store()
    _fill(store, 10)
    store.set_broker_role(role)
    r = store.get_message("g", "T", 0, offset, 32, 1 << 20)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (status, next_offset, 0, 10)


def test_empty_queue(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.get_message("g", "Nope", 0, 5, 32, 1 << 20)
    assert (r.status, r.next_begin_offset) == (S.NO_MESSAGE_IN_QUEUE, 0)
    store.set_broker_role(BrokerRole.SLAVE)
    assert store.get_message("g", "Nope", 0, 5, 32, 1 << 20).next_begin_offset == 5


def test_offset_too_small_after_blank_start(make_store: StoreFactory, tmp_path) -> None:
    store = make_store()
    cq = store.cqs.get_or_create("T", 0)
    assert cq is not None
    cq.put(0, 100, 0, 7)  # a queue starting at 7 is padded with blank units
    assert (store.get_min_offset_in_queue("T", 0), store.get_max_offset_in_queue("T", 0)) == (7, 8)
    r = store.get_message("g", "T", 0, 2, 32, 1 << 20)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, 7)
    store.set_broker_role(BrokerRole.SLAVE)
    assert store.get_message("g", "T", 0, 2, 32, 1 << 20).next_begin_offset == 2


def test_in_memory_batch_limits(make_store: StoreFactory) -> None:
    store = make_store(mapped_file_size_consume_queue=2000 * 20)
    _fill(store, 100)
    assert store.get_message("g", "T", 0, 0, 64, 1 << 20).msg_count == 32  # maxTransferCountOnMessageInMemory
    assert store.get_message("g", "T", 0, 0, 5, 1 << 20).msg_count == 5
    one = len(store.get_message("g", "T", 0, 0, 1, 1 << 20).records[0])
    r = store.get_message("g", "T", 0, 0, 32, 3 * one)
    assert (r.msg_count, r.next_begin_offset) == (3, 3)
    r = store.get_message("g", "T", 0, 0, 32, 1)  # the first message is always taken
    assert r.msg_count == 1


def test_on_disk_limits_and_suggest_from_slave(make_store: StoreFactory) -> None:
    # memory = total RAM * ratio / 100: with 1000 bytes of "RAM" and ratio 40, anything 400+ bytes behind is
    # on disk and pulling should move to a slave.
    store = make_store(total_physical_memory_bytes=1000, mapped_file_size_consume_queue=2000 * 20)
    _fill(store, 100)
    r = store.get_message("g", "T", 0, 0, 32, 1 << 20)
    assert r.msg_count == 8  # maxTransferCountOnMessageInDisk
    assert r.suggest_pulling_from_slave is True
    tail = store.get_message("g", "T", 0, 99, 32, 1 << 20)
    assert tail.msg_count == 1 and tail.suggest_pulling_from_slave is False


def test_suggest_is_diff_greater_than_memory_exactly(make_store: StoreFactory) -> None:
    store = make_store(mapped_file_size_consume_queue=2000 * 20, access_message_in_memory_max_ratio=100)
    _fill(store, 3)
    unit = store.cqs.get("T", 0).unit(2)
    assert unit is not None
    # maxPhyOffsetPulling is the last unit examined: diff = max physical offset - its offset.
    diff = store.max_physical_offset - unit[0]
    for memory_bytes, expect in ((diff, False), (diff - 1, True)):
        store.config = attrs.evolve(store.config, total_physical_memory_bytes=memory_bytes)
        assert store.get_message("g", "T", 0, 2, 32, 1 << 20).suggest_pulling_from_slave is expect
    # Outside the scan branch the hint is always false.
    assert store.get_message("g", "T", 0, 3, 32, 1 << 20).suggest_pulling_from_slave is False


def test_a_memory_cgroup_limit_below_ram_makes_reads_cold_sooner(make_store: StoreFactory) -> None:
    # 16 GiB of RAM, but a cgroup limit of 1000 bytes: memory = 400, as in the test above.
    store = make_store(total_physical_memory_bytes=1 << 34, memory_limit_bytes=lambda: 1000,
                       mapped_file_size_consume_queue=2000 * 20)
    _fill(store, 100)
    assert store.memory_bytes_for_reads == 400
    r = store.get_message("g", "T", 0, 0, 32, 1 << 20)
    assert (r.msg_count, r.suggest_pulling_from_slave) == (8, True)
    tail = store.get_message("g", "T", 0, 99, 32, 1 << 20)
    assert (tail.msg_count, tail.suggest_pulling_from_slave) == (1, False)


def test_the_limit_is_read_again_once_the_refresh_interval_passed(make_store: StoreFactory) -> None:
    clock = FakeClock()
    limits = iter([1 << 20, 1000])
    store = make_store(clock_ms=clock, memory_limit_bytes=lambda: next(limits), memory_limit_refresh_ms=15_000)
    _fill(store, 100)
    far = store.get_message("g", "T", 0, 0, 1, 1 << 20)  # 1 MiB limit: 400 KiB of memory, a ~15 KiB log
    assert (store.memory_bytes_for_reads, far.suggest_pulling_from_slave) == (419_430, False)
    clock.now_ms += 14_999
    assert store.get_message("g", "T", 0, 0, 1, 1 << 20).suggest_pulling_from_slave is False  # not read again
    clock.now_ms += 1
    assert store.get_message("g", "T", 0, 0, 1, 1 << 20).suggest_pulling_from_slave is True  # 1000 now
    assert store.memory_limit.reads == 2


def test_scan_examines_at_most_800_units(make_store: StoreFactory) -> None:
    store = make_store(mapped_file_size_consume_queue=2000 * 20)
    _fill(store, 900, tags="Other")
    want = tags_hash("TagA")
    r = store.get_message("g", "T", 0, 0, 32, 1 << 20, lambda code: code == want)
    assert (r.status, r.msg_count, r.next_begin_offset) == (S.NO_MATCHED_MESSAGE, 0, 800)


def test_tag_filter(make_store: StoreFactory) -> None:
    store = make_store()
    store.append_batch("T", 0, batch("T", 2, tags="A") + batch("T", 2, tags="B", start=2), born_host=BORN_HOST)
    store.dispatch_available()
    want = tags_hash("B")
    r = store.get_message("g", "T", 0, 0, 32, 1 << 20, lambda code: code == want)
    assert r.status is S.FOUND and r.queue_offsets == [2, 3] and r.next_begin_offset == 4


def test_offset_by_time_and_store_timestamp(make_store: StoreFactory) -> None:
    clock = FakeClock(1_000_000)
    store = make_store(clock_ms=clock)
    for i in range(10):
        clock.now_ms = 1_000_000 + i * 1000
        store.append_batch("T", 0, batch("T", 2, start=2 * i), born_host=BORN_HOST)
    store.dispatch_available()
    assert store.get_offset_in_queue_by_time("T", 0, 0) == 0
    assert store.get_offset_in_queue_by_time("T", 0, 1_003_000) == 6
    assert store.get_offset_in_queue_by_time("T", 0, 1_003_001) == 8
    assert store.get_offset_in_queue_by_time("T", 0, 9_999_999) == 20
    assert store.get_store_timestamp("T", 0, 7) == 1_003_000
    assert store.get_store_timestamp("T", 0, 70) == -1


def test_query_by_key_and_unique_key(make_store: StoreFactory) -> None:
    store = make_store()
    store.append_batch("T", 0, batch("T", 3, keys="order-1 shared", uniq_prefix="A"), born_host=BORN_HOST)
    store.append_batch("Other", 0, batch("Other", 2, keys="order-1"), born_host=BORN_HOST)
    store.dispatch_available()
    res = store.query_message("T", "order-1", 32, 0, 1 << 62)
    msgs = decode_records(b"".join(res.records))
    assert len(msgs) == 3 and {m.topic for m in msgs} == {"T"}
    assert [m.queue_offset for m in msgs] == [2, 1, 0]  # newest first
    assert len(store.query_message("T", "order-1", 2, 0, 1 << 62).records) == 2
    uniq = store.query_message("T", "A00000001", 32, 0, 1 << 62)
    assert [m.msg_id for m in decode_records(b"".join(uniq.records))] == ["A00000001"]
    assert store.query_message("T", "missing", 32, 0, 1 << 62).records == []
    assert res.index_last_update_phy_offset > 0


def test_index_rolls_to_new_file_when_full(make_store: StoreFactory) -> None:
    store = make_store(max_index_num=8)
    for i in range(10):
        store.append_batch("T", 0, batch("T", 1, keys=f"key{i}", start=i), born_host=BORN_HOST)
    store.dispatch_available()
    assert store.index is not None and len(store.index.files) >= 3
    for i in range(10):
        assert len(store.query_message("T", f"key{i}", 4, 0, 1 << 62).records) == 1


def test_look_message_by_offset(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.append_batch("T", 0, batch("T", 2), born_host=BORN_HOST)
    rec = store.look_message_by_offset(r.physical_offsets[1])
    assert rec is not None and decode_records(rec)[0].commit_log_offset == r.physical_offsets[1]
    assert store.look_message_by_offset(r.physical_offsets[1] + 1) is None
    assert store.look_message_by_offset(10**9) is None


def test_dispatch_runs_when_asked_and_notifies_listeners_on_the_calling_thread(make_store: StoreFactory) -> None:
    store = make_store()
    seen: list[tuple[str, int, int, int]] = []
    store.add_dispatch_listener(lambda t, q, mx: seen.append((t, q, mx, threading.get_ident())))
    store.append_batch("T", 3, batch("T", 5), born_host=BORN_HOST)
    store.append_batch("U", 0, batch("U", 2), born_host=BORN_HOST)
    assert seen == [] and store.dispatch_behind_bytes == store.max_physical_offset  # no thread of its own
    assert store.dispatch_available() == store.max_physical_offset
    me = threading.get_ident()
    assert sorted(seen) == [("T", 3, 5, me), ("U", 0, 2, me)] and store.dispatch_behind_bytes == 0


def test_dispatch_available_is_bounded_and_resumable(make_store: StoreFactory) -> None:
    store = make_store()
    for i in range(10):
        store.append_batch("T", 0, batch("T", 4, start=4 * i), born_host=BORN_HOST)
    total = store.max_physical_offset
    first = store.dispatch_available(1000)
    assert 0 < first < total and store.dispatch_behind_bytes == total - first
    while store.dispatch_available(1000):
        pass
    assert store.get_max_offset_in_queue("T", 0) == 40 and store.dispatch_behind_bytes == 0
    assert store.dispatch_available() == 0
