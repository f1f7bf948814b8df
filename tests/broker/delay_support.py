"""Shared helpers of the delay / retry / DLQ tests: a settable clock, a small real file store, puts and reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.metadata.delay_offsets import DelayOffsetManager
from broker.schedule import ScheduleMessageService
from broker.store.api import AppendResult, PutMessageStatus
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import decode_records, pack_host
from common.message import MessageExt
from common.properties import DELAY, UNIQ_KEY

LEVELS = "1s 2s 3s"
BORN_HOST = pack_host("10.1.2.3", 40123)
T0 = 1_700_000_000_000


class FakeClock:
    """A wall clock in ms that only moves when told."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_store(root: Path, clock: FakeClock | None = None, *, file_size: int = 1 << 20) -> FileMessageStore:
    kwargs: dict[str, Any] = {"clock_ms": clock} if clock is not None else {}
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commitlog=file_size,
                      mapped_file_size_consume_queue=20 * 1000, message_delay_level=LEVELS,
                      max_hash_slot_num=1024, max_index_num=4096,
                      total_physical_memory_bytes=1 << 34, **kwargs)
    store = FileMessageStore(cfg)
    store.load()
    store.start()
    return store


def make_service(store: FileMessageStore, root: Path, clock: FakeClock, *, journal: bool = True,
                 **kwargs: object) -> tuple[ScheduleMessageService, DelayOffsetManager]:
    """A service over ``root/config`` (offsets loaded from disk, as after a restart), wired to the store's
    dispatch listener."""
    offsets = DelayOffsetManager(root / "config")
    offsets.load()
    svc = ScheduleMessageService(store, offsets, delay_levels_ms=store.config.delay_levels_ms, clock_ms=clock,
                                 journal_path=root / "config" / "delayDelivery.json" if journal else None,
                                 **kwargs)  # type: ignore[arg-type]

    def listener(topic: str, queue_id: int, max_offset: int) -> None:
        if topic == "SCHEDULE_TOPIC_XXXX":
            svc.notify_dispatched(queue_id, max_offset)

    store.add_dispatch_listener(listener)
    return svc, offsets


def put(store: FileMessageStore, topic: str, body: bytes, *, level: int = 0, queue_id: int = 0,
        props: dict[str, str] | None = None, reconsume_times: int = 0, flag: int = 0) -> AppendResult:
    p = dict(props or {})
    if level:
        p[DELAY] = str(level)
    r = store.put_message(topic, queue_id, body, p, born_host=BORN_HOST, born_timestamp=T0 - 5, flag=flag,
                          reconsume_times=reconsume_times)
    assert r.status is PutMessageStatus.PUT_OK, r
    return r


def put_delayed(store: FileMessageStore, n: int, level: int, *, topic: str = "T", prefix: str = "m") -> list[str]:
    """``n`` delayed messages with unique keys ``<prefix><i>``; dispatched."""
    keys = [f"{prefix}{i}" for i in range(n)]
    for i, key in enumerate(keys):
        put(store, topic, key.encode(), level=level, queue_id=i % 2, props={UNIQ_KEY: key, "user": "u"})
    drain(store)
    return keys


def drain(store: FileMessageStore) -> None:
    while store.dispatch_available():
        pass


def read_all(store: FileMessageStore, topic: str, queue_id: int) -> list[MessageExt]:
    drain(store)
    out: list[MessageExt] = []
    offset = 0
    while True:
        res = store.get_message("test", topic, queue_id, offset, 32, 1 << 24)
        if not res.records:
            return out
        out.extend(decode_records(b"".join(res.records)))
        offset = res.next_begin_offset


def delivered_keys(store: FileMessageStore, topic: str = "T", queues: int = 2) -> list[str]:
    return sorted(m.properties[UNIQ_KEY] for q in range(queues) for m in read_all(store, topic, q))
