"""Index file layout (docs/BEHAVIOUR.md 7.3)."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.index import INT_MAX, IndexFile, _abs_hash, _TopicHasher, key_hash
from broker.store.io import FileIO
from broker.store.mapped_file import MappedFile
from common.codec import UniqKeyGenerator, batch_item, decode_records, tags_hash

from .conftest import BORN_HOST, FakeClock, StoreFactory, batch


def test_key_hash_and_slot_of_the_spec_example() -> None:
    assert key_hash("FooBar#KEY1") == 2081429752
    assert key_hash("FooBar#KEY1") % 5_000_000 == 1429752
    # abs(Integer.MIN_VALUE) overflows: RocketMQ maps it to 0.
    assert key_hash("polygenelubricants") == 0


def test_file_layout_header_slots_items(make_store: StoreFactory) -> None:
    store = make_store(max_hash_slot_num=16, max_index_num=64)
    r = store.append_batch("T", 0, batch("T", 1, keys="KEY1", uniq_prefix="Q"), born_host=BORN_HOST)
    store.dispatch_available()
    assert store.index is not None
    assert store.index.flush()  # the header reaches the map at flush
    f = store.index.files[0]
    mm = f.mf.mm
    assert len(mm) == IndexFile.file_size(16, 64) == 40 + 16 * 4 + 64 * 20
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = struct.unpack_from(">qqqqii", mm, 0)
    assert (begin_phy, end_phy, index_count) == (r.wrote_offset, r.wrote_offset, 3)  # uniq key + KEY1, from 1
    assert begin_ts == end_ts == r.store_timestamp
    h = key_hash("T#KEY1")
    slot_value = struct.unpack_from(">i", mm, 40 + (h % 16) * 4)[0]
    item_h, phy, diff, _prev = struct.unpack_from(">iqii", mm, 40 + 16 * 4 + slot_value * 20)
    assert (item_h, phy, diff) == (h, r.wrote_offset, 0)
    assert slot_count in (1, 2)


def test_unique_id_hash_with_cached_head_equals_the_plain_java_hash() -> None:
    hasher = _TopicHasher("TopicA")
    gen = UniqKeyGenerator()
    for key in [gen.next() for _ in range(500)] + ["short", "x" * 32, "é" * 16]:
        raw = key.encode()
        assert hasher.uniq(raw) == key_hash(f"TopicA#{key}") == hasher(raw), key


def test_dispatch_and_key_lookup_read_properties_as_consumers_do(make_store: StoreFactory) -> None:
    """The dispatcher (tag code, index), the reader's key match and decode_records read a property string
    alike: a name given twice keeps its last value; no trailing separator, empty pairs, names without a value
    and look-alike names are read, not refused."""
    store = make_store()
    props = [b"KEYS\x01old\x02XKEYS\x01decoy\x02KEYS\x01k1 k2\x02TAGS\x01A\x02TAGS\x01B",
             b"lonely\x02UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01U1\x02\x02KEYS\x01k3\x02"]
    items = [batch_item(f"m{i}".encode(), p, born_timestamp=1) for i, p in enumerate(props)]
    r = store.append_batch("T", 0, items, born_host=BORN_HOST)
    store.dispatch_available()
    msgs = decode_records(b"".join(store.get_message("g", "T", 0, 0, 32, 1 << 20).records))
    assert [(m.tags, m.keys, m.msg_id) for m in msgs] == [("B", ("k1", "k2"), msgs[0].offset_msg_id),
                                                          (None, ("k3",), "U1")]
    cq = store.cqs.get("T", 0)
    assert cq is not None
    assert [unit[2] for unit in (cq.unit(0), cq.unit(1)) if unit is not None] == [tags_hash("B"), 0]
    found = {key: [bytes(rec) for rec in store.query_message("T", key, 8, 0, 1 << 62).records]
             for key in ("k1", "k2", "k3", "U1", "old", "decoy", "lonely")}
    first, second = (store.look_message_by_offset(o) for o in r.physical_offsets)
    assert found == {"k1": [first], "k2": [first], "k3": [second], "U1": [second], "old": [], "decoy": [],
                     "lonely": []}


def test_batch_hashes_column_by_column_equal_the_plain_java_hash() -> None:
    """The column-by-column hashing of a uniform batch (every record an SDK unique id and one ASCII key, or
    only one of the two) and the record-by-record one give the index's ``abs(javaHash("topic#key"))``."""
    hasher = _TopicHasher("TopicA")
    gen = UniqKeyGenerator()
    uniqs = [gen.next().encode() for _ in range(300)]
    keys = [f"order-{i * 7919}".encode() for i in range(300)]
    phys = list(range(1000, 1300))
    want = [key_hash(f"TopicA#{k.decode()}") for pair in zip(uniqs, keys, strict=True) for k in pair]
    for u, k in ((uniqs, keys), (uniqs, [b""] * 300), ([b""] * 300, keys), (uniqs[:1], keys[:1])):
        hs: list[int] = []
        ps: list[int] = []
        at: list[int] = []
        hasher.hashes(u, k, phys[: len(u)], hs, ps, at)
        expected = [key_hash(f"TopicA#{x.decode()}") for pair in zip(u, k, strict=True) for x in pair if x]
        assert hs == expected
        assert ps == [phys[i] for i in at] and len(at) == len(hs)
    hs = []
    hasher.hashes(uniqs, keys, phys, hs, [])
    assert hs == want
    edges = [0, 1, INT_MAX, INT_MAX + 1, INT_MAX + 2, (1 << 32) - 1]
    assert [_abs_hash(h) for h in edges] == [0, 1, INT_MAX, 0, INT_MAX, 1]


def test_single_sends_index_as_the_batch_path_does(make_store: StoreFactory, tmp_path: Path) -> None:
    """A single send's entries (put one by one from its hand-over) are the bytes the batch path writes for the
    same records parsed from the log: items, slot chains, header -- across a file that fills up."""
    clock = FakeClock()
    single = make_store(root=tmp_path / "single", clock_ms=clock, max_hash_slot_num=8, max_index_num=40)
    parsed = make_store(root=tmp_path / "parsed", clock_ms=clock, max_hash_slot_num=8, max_index_num=40)
    for i in range(30):
        keys = f"k{i} k{i}b" if i % 3 == 0 else (None if i % 5 == 0 else f"k{i}")
        items = batch("T", 1, keys=keys, start=i) if keys else batch("T", 1, start=i)
        clock.now_ms += 1500
        single.append_batch("T", 0, items, born_host=BORN_HOST)
        single.dispatch_available()
        parsed.append_batch("T", 0, items, born_host=BORN_HOST)
    parsed.dispatcher.drop_handovers()
    parsed.dispatch_available()
    assert single.index is not None and parsed.index is not None
    single.index.flush()
    parsed.index.flush()
    assert len(single.index.files) == len(parsed.index.files) == 2
    for a, b in zip(single.index.files, parsed.index.files, strict=True):
        assert bytes(a.mf.mm) == bytes(b.mf.mm)


def _index_file(path: Path, slot_num: int, index_num: int) -> IndexFile:
    mf = MappedFile.open(FileIO(), str(path), 0, IndexFile.file_size(slot_num, index_num), create=True)
    mf.wrote = mf.size
    return IndexFile(mf, slot_num, index_num)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, INT_MAX), min_size=1, max_size=80), min_size=1, max_size=5),
       garbage=st.lists(st.tuples(st.integers(0, 511), st.integers(-(2**31), 2**31 - 1)), max_size=6))
def test_a_batch_of_keys_writes_what_one_put_at_a_time_does(batches: list[list[int]],
                                                              garbage: list[tuple[int, int]]) -> None:
    """put_keys (a batch of distinct slots read and written column by column, any other key by key) writes the
    same file as put_key one key at a time: items, slot chains and the garbage slots a crash can leave (read as
    empty)."""
    with tempfile.TemporaryDirectory() as d:
        col, one = _index_file(Path(d) / "col", 512, 400), _index_file(Path(d) / "one", 512, 400)
        for f in (col, one):
            for slot, value in garbage:
                struct.pack_into(">i", f.mf.mm, 40 + 4 * slot, value)
        phy = 1000
        for hs in batches:
            phys = list(range(phy, phy + len(hs)))
            assert col.put_keys(hs, phys, 1_700_000_000_000, 0) == len(hs)
            for h, p in zip(hs, phys, strict=True):
                assert one.put_key(h, p, 1_700_000_000_000)
            phy += len(hs)
        for f in (col, one):
            f.flush()
        assert bytes(col.mf.mm) == bytes(one.mf.mm)
        assert (col.index_count, col.slot_count) == (one.index_count, one.slot_count)
        col.close()
        one.close()

