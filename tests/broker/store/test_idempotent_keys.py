"""Reading the idempotent records back from a classic commit log (``FileMessageStore.idempotent_keys``), which
fills the duplicate window of a broker that starts as a master: every record appended with the bit, dispatched
or not, after a crash too; none without it; the real topic and queue of a parked (delayed) one; the window's
start found by file."""

from __future__ import annotations

from pathlib import Path

from broker.store.api import PutMessageStatus, StoredKey
from broker.store.file_store import FileMessageStore
from common.codec import BatchItem, decode_batch, encode_batch
from common.codes import SysFlag
from common.message import Message
from tests.broker.store.conftest import BORN_HOST, FakeClock, StoreFactory

IDEM = int(SysFlag.IDEMPOTENT)
HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x10"


def items(keys: list[str], *, idempotent: bool = True, delay_level: int = 0, body: bytes = b"b" * 200
          ) -> list[BatchItem]:
    msgs = [Message("T", body, delay_level=delay_level) for _ in keys]
    return decode_batch(encode_batch(msgs, born_timestamp_ms=1, uniq_keys=keys, sys_flag=IDEM if idempotent else 0))


def put(store: FileMessageStore, keys: list[str], queue_id: int = 0, **kw: object) -> list[StoredKey]:
    """Append ``keys`` as one batch; the StoredKeys the scan must give for them (when idempotent)."""
    r = store.append_batch("T", queue_id, items(keys, **kw), born_host=BORN_HOST)  # type: ignore[arg-type]
    assert r.status is PutMessageStatus.PUT_OK
    sizes = [b - a for a, b in zip(r.physical_offsets, [*r.physical_offsets[1:], r.end_offset], strict=True)]
    return [StoredKey("T", queue_id, r.queue_offset + i, off, size, r.store_timestamp, k.encode(),
                      store.config.store_host)
            for i, (k, off, size) in enumerate(zip(keys, r.physical_offsets, sizes, strict=True))]


def test_every_idempotent_record_is_read_back_after_a_crash(make_store: StoreFactory, tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(clock_ms=clock, store_host=HOST)
    want: list[StoredKey] = []
    for i in range(200):  # ~300 B records in 64 KiB files: several files, each ending with a blank marker
        clock.now_ms += 10
        idem = i % 3 != 0
        got = put(store, [f"k{i}-{j}" for j in range(3)], queue_id=i % 2, idempotent=idem)
        if idem:
            want += got
    assert len(store.commitlog.files) >= 3
    store.crash()  # dispatch behind or not, the log is what counts
    again = make_store(clock_ms=clock, store_host=HOST)
    assert list(again.idempotent_keys(0)) == want
    since = want[100].store_ts
    assert list(again.idempotent_keys(since)) == [k for k in want if k.store_ts > since]
    assert list(again.idempotent_keys(clock.now_ms)) == []


def test_a_parked_record_names_the_topic_and_queue_of_its_send(make_store: StoreFactory) -> None:
    """A delayed message is stored in SCHEDULE_TOPIC_XXXX; the send's answer named its own queue."""
    store = make_store(store_host=HOST)
    r = store.append_batch("T", 3, items(["d1"], delay_level=2), born_host=BORN_HOST)
    (found,) = list(store.idempotent_keys(0))
    assert (found.topic, found.queue_id, found.queue_offset, found.offset, found.key) == (
        "T", 3, r.queue_offset, r.wrote_offset, b"d1")
