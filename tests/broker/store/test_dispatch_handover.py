"""Dispatch of appended batches from what the send path read (the hand-over) builds exactly what dispatch from
the record bytes builds (a slave, recovery): the same consume-queue units and the same index files, byte for byte,
across commit-log, consume-queue and index file rolls, tags, keys, unique keys, delays and transactions."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.store import dispatch as dispatch_module
from broker.store.file_store import FileMessageStore
from common.codec import (
    BatchItem,
    UniqKeyGenerator,
    batch_item,
    decode_batch,
    encode_batch,
    tags_hash,
)
from common.message import Message

from .conftest import BORN_HOST, FakeClock, StoreFactory

_PREPARED, _COMMIT, _ROLLBACK = 0x4, 0x8, 0xC


def _items(topic: str, specs: Sequence[tuple[str | None, str | None]], uniq: UniqKeyGenerator, *,
           delay_level: int = 0) -> list[BatchItem]:
    """Items with the given ``(tags, keys)`` and SDK unique keys (their hash takes the cached-head path)."""
    msgs = [Message(topic, f"body-{i}".encode() * 20, tags=tags, keys=keys, delay_level=delay_level)
            for i, (tags, keys) in enumerate(specs)]
    return decode_batch(encode_batch(msgs, born_timestamp_ms=1_600_000_000_000,
                                     uniq_keys=[uniq.next() for _ in msgs]))


def _tx_item(sys_flag: int, key: str) -> BatchItem:
    props = f"KEYS\x01{key}\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01TX{key}\x02PGROUP\x01g\x02".encode()
    return batch_item(b"tx-body", props, sys_flag=sys_flag, born_timestamp=1)


def _snapshot(store: FileMessageStore) -> tuple[dict[tuple[str, int], list[tuple[int, int, int]]], list[tuple]]:
    """Every queue's units, and every index file's header fields and slot + item bytes."""
    units = {}
    for key, cq in sorted(store.cqs.queues.items()):
        units[key] = [u[1:] for u in cq.iter_units(cq.first_offset)]
    files = []
    assert store.index is not None
    for f in store.index.files:
        files.append((f.begin_ts, f.end_ts, f.begin_phy, f.end_phy, f.slot_count, f.index_count,
                      bytes(f.mf.mm[40:])))
    return units, files


def _append_mixed(store: FileMessageStore, clock: FakeClock, *, dispatch_each: bool) -> list[int]:
    """A mix of batches; returns the offsets of the records with key ``pick``."""
    uniq = UniqKeyGenerator(clock_ms=clock)
    picks: list[int] = []
    for round_no in range(12):
        clock.now_ms += 1_700  # index time diffs in whole seconds
        specs: list[tuple[str | None, str | None]] = [
            ("TagA", f"k{round_no}-{i}") for i in range(6)
        ] + [(None, "two keys"), ("TagB", None), ("TagA", "ключ"), (None, None), ("TagC", " pick  ")]
        r = store.append_batch("TopicA", round_no % 2, _items("TopicA", specs, uniq), born_host=BORN_HOST)
        assert r.status.name == "PUT_OK", r
        picks.append(r.physical_offsets[-1])
        uniform = [("TagA", f"u{round_no}-{i}") for i in range(8)]  # hashed column by column
        r = store.append_batch("TopicA", round_no % 2, _items("TopicA", uniform, uniq), born_host=BORN_HOST)
        assert r.status.name == "PUT_OK", r
        r = store.append_batch("TopicB", 0, _items("TopicB", [("D", "late")] * 3, uniq, delay_level=2),
                               born_host=BORN_HOST)
        assert r.status.name == "PUT_OK", r
        for flag in (_PREPARED, _COMMIT, _ROLLBACK):
            r = store.append_batch("TopicT", 1, [_tx_item(flag, f"tx{round_no}-{flag}")], born_host=BORN_HOST)
            assert r.status.name == "PUT_OK", r
        if dispatch_each:
            while store.dispatch_available():
                pass
    while store.dispatch_available():
        pass
    return picks


@pytest.mark.parametrize("held", [dispatch_module.HANDOVER_MAX_MESSAGES, 20])
def test_hand_over_builds_what_the_bytes_build(make_store: StoreFactory, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, held: int) -> None:
    """``held`` 20: most batches are dropped from the hand-over (the bound) and parsed, mixed with handed-over
    ones, when dispatch runs after all the appends."""
    monkeypatch.setattr(dispatch_module, "HANDOVER_MAX_MESSAGES", held)
    clock = FakeClock()
    root = tmp_path / "master"
    store = make_store(root=root, clock_ms=clock, max_hash_slot_num=16, max_index_num=64)
    picks = _append_mixed(store, clock, dispatch_each=held > 20)
    built = _snapshot(store)
    assert len(built[1]) > 3  # several index files, several consume-queue files per queue (50 units each)
    assert max(len(u) for u in built[0].values()) > 50
    assert [store.look_message_by_offset(o) for o in picks] == [
        bytes(r) for r in reversed(store.query_message("TopicA", "pick", 64, 0, 1 << 62).records)]
    store.shutdown()

    # The same log, dispatched from its bytes by recovery.
    copy = tmp_path / "rebuilt"
    shutil.copytree(root / "commitlog", copy / "commitlog")
    rebuilt = make_store(root=copy, clock_ms=clock, max_hash_slot_num=16, max_index_num=64)
    again = _snapshot(rebuilt)
    assert again[0] == built[0]
    assert again[1] == built[1]


def test_a_truncated_batch_is_not_handed_over(make_store: StoreFactory) -> None:
    """The hand-over of a batch cut from the log is dropped: the records written in its place are dispatched
    with their own tags and keys."""
    store = make_store()
    uniq = UniqKeyGenerator()
    first = store.append_batch("T", 0, _items("T", [("Old", "old-key")] * 3, uniq), born_host=BORN_HOST)
    store.truncate(first.wrote_offset)
    second = store.append_batch("T", 0, _items("T", [("New", "new-key")] * 3, uniq), born_host=BORN_HOST)
    assert second.wrote_offset == first.wrote_offset
    while store.dispatch_available():
        pass
    cq = store.cqs.get("T", 0)
    assert cq is not None
    assert [u[3] for u in cq.iter_units(0)] == [tags_hash("New")] * 3
    assert store.query_message("T", "old-key", 8, 0, 1 << 62).records == []
    assert len(store.query_message("T", "new-key", 8, 0, 1 << 62).records) == 3


def test_index_items_are_the_java_layout(make_store: StoreFactory) -> None:
    """A batch's items, written in one go, chain through their slots as single puts would (newest first)."""
    store = make_store(max_hash_slot_num=1, max_index_num=64)
    uniq = UniqKeyGenerator()
    r = store.append_batch("T", 0, _items("T", [(None, "a"), (None, "b")], uniq), born_host=BORN_HOST)
    while store.dispatch_available():
        pass
    assert store.index is not None
    f = store.index.files[0]
    mm = f.mf.mm
    assert struct.unpack_from(">i", mm, 40)[0] == 4  # one slot: the last of 4 items (2 unique keys, 2 keys)
    chain = []
    at = 4
    while at:
        _, phy, _, prev = struct.unpack_from(">iqii", mm, 44 + at * 20)
        chain.append(phy)
        at = prev
    offs = r.physical_offsets
    assert chain == [offs[1], offs[1], offs[0], offs[0]]
    assert (f.index_count, f.slot_count, f.begin_phy, f.end_phy) == (5, 1, offs[0], offs[1])


def test_abnormal_recovery_replays_nothing_twice(make_store: StoreFactory, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash with everything dispatched: recovery re-reads the log from the checkpoint's file and skips the
    records its queues and index hold (without reading their properties), so queues and index files are
    unchanged, and what was appended after the checkpoint is still found by key."""
    clock = FakeClock()
    root = tmp_path / "crashed"
    store = make_store(root=root, clock_ms=clock, max_hash_slot_num=64, max_index_num=4096)
    _append_mixed(store, clock, dispatch_each=True)
    before = _snapshot(store)
    assert store.index is not None
    store.index.flush()  # the index header on disk (the flush thread's job), so it tells what is indexed
    store.crash()
    scanned: list[bytes] = []
    real_scan = dispatch_module.scan_properties

    def counting(raw: bytes) -> object:
        scanned.append(raw)
        return real_scan(raw)

    monkeypatch.setattr(dispatch_module, "scan_properties", counting)
    again = make_store(root=root, clock_ms=clock, max_hash_slot_num=64, max_index_num=4096)
    assert (root / "abort").exists()  # the abnormal path ran
    assert len(scanned) <= 1  # the last record: its index entries are the index's end
    after = _snapshot(again)
    assert after[0] == before[0]
    assert [f[:4] for f in after[1]] == [f[:4] for f in before[1]]
    assert after[1][-1][5] <= before[1][-1][5] + 2  # at most the last indexed record's 2 entries once more
    assert len(again.query_message("TopicA", "pick", 64, 0, 1 << 62).records) == 12


def test_hand_over_holds_at_most_its_byte_bound(make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held batches keep their requests' bodies alive: past HANDOVER_MAX_BYTES the oldest are dropped (and
    parsed from the log), and what is built is the same."""
    monkeypatch.setattr(dispatch_module, "HANDOVER_MAX_BYTES", 2000)
    store = make_store()
    uniq = UniqKeyGenerator()
    for i in range(6):
        store.append_batch("T", 0, _items("T", [(f"Tag{i}", f"key-{i}")] * 3, uniq), born_host=BORN_HOST)
        held = store.dispatcher._handover_bytes
        assert 0 < held <= 2000 or len(store.dispatcher._handovers) == 1
    assert len(store.dispatcher._handovers) < 6
    while store.dispatch_available():
        pass
    assert store.dispatcher._handover_bytes == store.dispatcher._handover_msgs == 0
    cq = store.cqs.get("T", 0)
    assert cq is not None
    assert [u[3] for u in cq.iter_units(0)] == [tags_hash(f"Tag{i}") for i in range(6) for _ in range(3)]
    assert len(store.query_message("T", "key-0", 8, 0, 1 << 62).records) == 3


def test_a_gap_without_hand_over_is_parsed_up_to_the_next_one(make_store: StoreFactory,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch without a hand-over (dropped, as past the bound or after a restart) is parsed from the log, and
    parsing stops where the next hand-over starts, even when the pass's byte budget reaches into that batch: the
    batches after it are still built from their hand-overs, not parsed for as long as dispatch is behind."""
    store = make_store()
    uniq = UniqKeyGenerator()
    gap = store.append_batch("T", 0, _items("T", [("Tag0", "key-0")] * 3, uniq), born_host=BORN_HOST)
    store.dispatcher.drop_handovers()
    for i in range(1, 6):
        store.append_batch("T", 0, _items("T", [(f"Tag{i}", f"key-{i}")] * 3, uniq), born_host=BORN_HOST)
    parsed: list[int] = []
    handed: list[int] = []
    dispatcher = store.dispatcher
    real_file, real_handover = dispatcher._dispatch_file, dispatcher._dispatch_handover

    def from_file(mm, file_start, file_size, pos, limit, budget_end, notify):  # type: ignore[no-untyped-def]
        new_pos, blank = real_file(mm, file_start, file_size, pos, limit, budget_end, notify)
        parsed.append(new_pos - pos)
        return new_pos, blank

    def from_handover(entry, notify):  # type: ignore[no-untyped-def]
        handed.append(entry[0])
        real_handover(entry, notify)

    monkeypatch.setattr(dispatcher, "_dispatch_file", from_file)
    monkeypatch.setattr(dispatcher, "_dispatch_handover", from_handover)
    budget = gap.wrote_bytes * 3 // 2  # ends inside the second batch
    while store.dispatch_available(budget):
        pass
    assert parsed == [gap.wrote_bytes]
    assert len(handed) == 5
    cq = store.cqs.get("T", 0)
    assert cq is not None
    assert [u[3] for u in cq.iter_units(0)] == [tags_hash(f"Tag{i}") for i in range(6) for _ in range(3)]
