"""Commit log: file roll with the blank marker, the 8-byte rule, batches, HA data in and out."""

from __future__ import annotations

import os
import struct

from broker.store.api import PutMessageStatus
from common.codec import BLANK_MAGIC, decode_records

from .conftest import BORN_HOST, StoreFactory, batch

FILE = 64 * 1024


def test_files_are_named_by_start_offset_and_preallocated(make_store: StoreFactory, tmp_path) -> None:
    store = make_store()
    store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    thread = store.commitlog._prep_thread
    if thread is not None:
        thread.join(10)  # the next file is allocated in the background
    directory = tmp_path / "store" / "commitlog"
    names = sorted(os.listdir(directory))
    assert names == ["00000000000000000000", f"{FILE:020d}"]
    assert all(os.path.getsize(directory / n) == FILE for n in names)
    assert store.max_physical_offset < FILE and len(store.commitlog.files) == 1


def test_without_preallocation_only_the_current_file_exists(make_store: StoreFactory, tmp_path) -> None:
    store = make_store(preallocate_commitlog=False)
    store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert os.listdir(tmp_path / "store" / "commitlog") == ["00000000000000000000"]


def test_batch_that_does_not_fit_goes_whole_to_next_file_after_blank_marker(make_store: StoreFactory) -> None:
    store = make_store()
    one = batch("T", 1, body=b"a" * 1000)
    size = 91 + 1 + 1000 + len(one[0].properties)
    n = 0
    while store.max_physical_offset + 10 * size + 8 <= FILE:
        store.append_batch("T", 0, batch("T", 1, body=b"a" * 1000, start=n), born_host=BORN_HOST)
        n += 1
    before = store.max_physical_offset
    r = store.append_batch("T", 0, batch("T", 10, body=b"a" * 1000, start=n), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK
    assert r.wrote_offset == FILE and r.physical_offsets[0] == FILE
    first = store.commitlog.files[0]
    remaining, magic = struct.unpack_from(">ii", first.mm, before)
    assert (remaining, magic) == (FILE - before, BLANK_MAGIC)
    assert store.get_commitlog_data(before, 1 << 20).nbytes == FILE - before
    store.dispatch_available()
    first_part = store.get_message("g", "T", 0, n, 32, 1 << 20)  # stops at the end of a consume-queue file
    rest = store.get_message("g", "T", 0, first_part.next_begin_offset, 32, 1 << 20)
    assert first_part.msg_count + rest.msg_count == 10


def test_record_fits_only_with_eight_bytes_left(make_store: StoreFactory) -> None:
    store = make_store()
    items = batch("T", 1, body=b"")
    size = 91 + 1 + len(items[0].properties)
    # Fill so that exactly size + 8 bytes remain: the record fits; the next one does not.
    filler = FILE - (size + 8)
    body_len = filler - 91 - 1 - len(batch("T", 1, body=b"")[0].properties)
    assert store.append_batch("T", 0, batch("T", 1, body=b"f" * body_len), born_host=BORN_HOST).wrote_offset == 0
    assert store.max_physical_offset == filler
    r = store.append_batch("T", 0, items, born_host=BORN_HOST)
    assert r.wrote_offset == filler and store.max_physical_offset == FILE - 8
    r = store.append_batch("T", 0, batch("T", 1, body=b""), born_host=BORN_HOST)
    assert r.wrote_offset == FILE


def test_batch_larger_than_a_file_is_illegal_and_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store(max_message_size=FILE)
    r = store.append_batch("T", 0, batch("T", 70, body=b"z" * 1000), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert "mappedFileSizeCommitLog" in r.remark
    assert store.max_physical_offset == 0


def test_commitlog_data_never_crosses_a_file(make_store: StoreFactory) -> None:
    store = make_store()
    while store.max_physical_offset < FILE + 1000:
        store.append_batch("T", 0, batch("T", 8, body=b"q" * 900), born_host=BORN_HOST)
    data = store.get_commitlog_data(100, 1 << 30)
    assert data is not None and data.nbytes == FILE - 100
    tail = store.get_commitlog_data(FILE, 1 << 30)
    assert tail is not None and tail.nbytes == store.max_physical_offset - FILE
    assert store.get_commitlog_data(store.max_physical_offset, 10) is None
    assert store.get_commitlog_data(5 * FILE, 10) is None


def test_slave_append_is_byte_identical_to_master(make_store: StoreFactory, tmp_path) -> None:
    from common.codes import BrokerRole

    master = make_store(root=tmp_path / "m")
    slave = make_store(root=tmp_path / "s", broker_role=BrokerRole.SLAVE)
    for i in range(40):
        master.append_batch("T", i % 3, batch("T", 5, body=os.urandom(700), start=i * 5), born_host=BORN_HOST)
    # Ship in odd-sized frames, as HA does (32 KiB max, never crossing a file).
    offset = 0
    while offset < master.max_physical_offset:
        data = master.get_commitlog_data(offset, 3001)
        assert data is not None
        slave.append_to_commitlog(offset, data)
        offset += data.nbytes
    assert slave.max_physical_offset == master.max_physical_offset
    for mf_m, mf_s in zip(master.commitlog.files, slave.commitlog.files, strict=True):
        assert mf_m.mm[:] == mf_s.mm[:]
    slave.dispatch_available(1 << 30)
    master.dispatch_available(1 << 30)
    assert slave.topic_queue_max_offsets() == master.topic_queue_max_offsets()
    got = slave.get_message("g", "T", 1, 0, 32, 1 << 20)
    assert [m.queue_offset for m in decode_records(b"".join(got.records))] == list(range(got.msg_count))


def test_slave_append_must_continue_the_log(make_store: StoreFactory) -> None:
    import pytest

    from common.codes import BrokerRole

    slave = make_store(broker_role=BrokerRole.SLAVE)
    with pytest.raises(ValueError, match="file boundary"):
        slave.append_to_commitlog(100, b"x")
    slave.append_to_commitlog(2 * FILE, b"\x00" * 8)  # an empty slave starts at the master's file
    assert slave.min_physical_offset == 2 * FILE
    with pytest.raises(ValueError, match="does not continue"):
        slave.append_to_commitlog(2 * FILE + 16, b"x")


def test_truncate_drops_bytes_and_queue_units(make_store: StoreFactory) -> None:
    store = make_store()
    offsets = []
    for i in range(30):
        offsets.append(store.append_batch("T", 0, batch("T", 4, body=b"t" * 800, start=4 * i),
                                          born_host=BORN_HOST).wrote_offset)
    store.dispatch_available(1 << 30)
    cut = offsets[20]
    store.truncate(cut)
    assert store.max_physical_offset == cut
    assert store.get_max_offset_in_queue("T", 0) == 80
    assert store.look_message_by_offset(cut) is None
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.queue_offset == 80 and r.wrote_offset == cut


def test_appends_and_a_file_roll_go_on_while_a_flush_waits_for_the_disk(make_store: StoreFactory) -> None:
    """The msync runs without the commit log's lock: a slow disk must not stall the put path at a roll."""
    import threading

    from broker.store.io import FileIO

    class SlowDisk(FileIO):
        def __init__(self) -> None:
            self.in_flush = threading.Event()
            self.release = threading.Event()

        def flush(self, mm, path, start, end) -> None:  # type: ignore[no-untyped-def]
            if "commitlog" in path:
                self.in_flush.set()
                assert self.release.wait(20), "the test never released the flush"
            super().flush(mm, path, start, end)

    io = SlowDisk()
    store = make_store(io=io, start=False)  # no flush thread: the test drives the one flush
    first = store.append_batch("T", 0, batch("T", 1, body=b"a" * 1000), born_host=BORN_HOST)
    flusher = threading.Thread(target=store.commitlog.flush)
    flusher.start()
    try:
        assert io.in_flush.wait(10)

        def fill_past_a_roll() -> None:
            n = 1
            while store.max_physical_offset < FILE + 1:
                r = store.append_batch("T", 0, batch("T", 1, body=b"a" * 1000, start=n), born_host=BORN_HOST)
                assert r.status is PutMessageStatus.PUT_OK
                n += 1

        writer = threading.Thread(target=fill_past_a_roll)
        writer.start()
        writer.join(10)
        assert not writer.is_alive(), "the put path waited for the flush's msync"
        assert len(store.commitlog.files) == 2
    finally:
        io.release.set()
        flusher.join(10)
    assert store.commitlog.flushed_where == first.end_offset  # what was there when the flush began
