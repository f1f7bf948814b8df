"""Small in-memory stand-ins for the store and the HA objects, for unit tests of the broker's processors.

``FakeStore`` follows ``broker.store.api.MessageStore`` closely enough for the broker: records are encoded with
the shared codec, dispatch is explicit (``dispatch_available``), and ``get_message`` returns the statuses and
next offsets of docs/BEHAVIOUR.md 3.1 (master rules).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from broker.store.api import (
    AppendResult,
    GetMessageResult,
    GetMessageStatus,
    PutMessageStatus,
    QueryResult,
    RecordFilter,
    StoredKey,
    TagFilter,
)
from broker.store.idempotent import record_keys
from broker.store.retention import CleanDecision, DeletedFile, DiskState, DiskUsage, RetentionStats
from common.codec import BatchItem, parse_dispatch_info, record_size, write_batch_records
from common.codes import BrokerRole

STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"


class FakeCleaner:
    """Retention that never deletes: a disk always empty."""

    def __init__(self) -> None:
        self.state = DiskState(True)
        self.usage = DiskUsage(0.0, 0.0, 0.0)
        self.stats = RetentionStats()

    @property
    def writeable(self) -> bool:
        return self.state.writeable

    def check_disk(self) -> DiskUsage:
        return self.usage

    def decide(self, manual: bool) -> CleanDecision:
        return CleanDecision(None)

    def deletable(self, decision: CleanDecision) -> int:
        return 0

    def delete_oldest(self) -> DeletedFile | None:
        return None

    def close_retired(self) -> int:
        return 0


class FakeStore:
    def __init__(self, role: BrokerRole = BrokerRole.ASYNC_MASTER, *, flush_ok: bool | None = True,
                 suggest_slave: bool = False) -> None:
        self.role = role
        self.log = bytearray()
        self.queues: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        self.reput = 0
        self.flush_ok = flush_ok
        self.suggest_slave = suggest_slave
        self.append_listeners: list[Callable[[int], None]] = []
        self.dispatch_listeners: list[Callable[[str, int, int], None]] = []
        self.next_queue_offset: dict[tuple[str, int], int] = {}
        self.shut = False
        self.fail_next: PutMessageStatus | None = None
        self.cleaner = FakeCleaner()
        self.max_message_size = 4 << 20
        """The broker's ``maxMessageSize`` (set by :func:`make_controller`): a store refuses a larger record."""
        self.store_ts = 1000
        """Store time of every record (ms)."""

    # lifecycle
    def load(self) -> None: ...
    def start(self) -> None: ...

    def shutdown(self) -> None:
        self.dispatch_available(1 << 40)
        self.shut = True

    # writes
    def append_batch(self, topic: str, queue_id: int, items: Sequence[BatchItem], *, born_host: bytes,
                     reconsume_times: int = 0) -> AppendResult:
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return AppendResult(status, remark=f"injected {status.value}")
        if self.role is BrokerRole.SLAVE:
            return AppendResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="role is SLAVE")
        key = (topic, queue_id)
        first = self.next_queue_offset.get(key, 0)
        raw_topic = topic.encode()
        sizes = [record_size(len(i.body), len(raw_topic), len(i.properties)) for i in items]
        for n, one in enumerate(sizes):
            if one > self.max_message_size:
                return AppendResult(PutMessageStatus.MESSAGE_ILLEGAL,
                                    remark=f"message {n} to topic {topic} is {one} bytes stored, more than "
                                           f"maxMessageSize {self.max_message_size}")
        size = sum(sizes)
        pos = len(self.log)
        self.log.extend(bytes(size))
        if len(born_host) != 8:
            born_host = STORE_HOST
        offsets = write_batch_records(self.log, pos, 0, topic=raw_topic, queue_id=queue_id, first_queue_offset=first,
                                      items=items, born_host=born_host, store_timestamp=self.store_ts, store_host=STORE_HOST,
                                      reconsume_times=reconsume_times)
        self.next_queue_offset[key] = first + len(items)
        for cb in self.append_listeners:
            cb(len(self.log))
        return AppendResult(PutMessageStatus.PUT_OK, wrote_offset=pos, wrote_bytes=size, queue_offset=first,
                            msg_count=len(items), store_timestamp=self.store_ts, physical_offsets=tuple(offsets))

    def idempotent_keys(self, since_ms: int) -> Iterator[StoredKey]:
        return record_keys(self.log, 0, len(self.log), 0, since_ms)

    def flush_future(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = Future()
        if self.flush_ok is not None:
            fut.set_result(self.flush_ok)
        return fut

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        self.append_listeners.append(callback)

    def add_dispatch_listener(self, callback: Callable[[str, int, int], None]) -> None:
        self.dispatch_listeners.append(callback)

    def dispatch_available(self, max_bytes: int = 4 << 20) -> int:
        start = self.reput
        while self.reput < len(self.log) and self.reput - start < max_bytes:
            size = int.from_bytes(self.log[self.reput:self.reput + 4], "big")
            info = parse_dispatch_info(memoryview(self.log), self.reput, size)
            units = self.queues.setdefault((info.topic, info.queue_id), [])
            units.append((info.physical_offset, size, info.tags_code, info.store_timestamp))
            self.reput += size
            for cb in self.dispatch_listeners:
                cb(info.topic, info.queue_id, len(units))
        return self.reput - start

    @property
    def dispatch_behind_bytes(self) -> int:
        return len(self.log) - self.reput

    @property
    def dispatch_handover_bytes(self) -> int:
        return 0  # every record is parsed back from the log

    # reads
    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int, max_bytes: int,
                    tag_filter: TagFilter | None = None, record_filter: RecordFilter | None = None
                    ) -> GetMessageResult:
        units = self.queues.get((topic, queue_id), [])
        mx = len(units)
        if mx == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset == mx:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, 0, mx)
        if offset > mx:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, mx, 0, mx)
        records: list[bytes] = []
        qoffs: list[int] = []
        total = 0
        i = offset
        while i < mx and len(records) < max_nums:
            phy, size, tags, _ = units[i]
            if records and total + size > max_bytes:
                break
            i += 1
            if tag_filter is not None and not tag_filter(tags):
                continue
            rec = bytes(self.log[phy:phy + size])
            if record_filter is not None and not record_filter(rec):
                continue
            records.append(rec)
            qoffs.append(i - 1)
            total += size
        status = GetMessageStatus.FOUND if records else GetMessageStatus.NO_MATCHED_MESSAGE
        return GetMessageResult(status, i, 0, mx, b"".join(records), qoffs, self.suggest_slave and bool(records))

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return len(self.queues.get((topic, queue_id), []))

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        units = self.queues.get((topic, queue_id), [])
        for i, u in enumerate(units):
            if u[3] >= timestamp_ms:
                return i
        return len(units)

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        return 1000

    def look_message_by_offset(self, physical_offset: int, size: int | None = None) -> bytes | None:
        if not 0 <= physical_offset < len(self.log):
            return None
        n = int.from_bytes(self.log[physical_offset:physical_offset + 4], "big")
        return bytes(self.log[physical_offset:physical_offset + n])

    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryResult:
        out = []
        for (t, _), units in self.queues.items():
            if t != topic:
                continue
            for phy, size, _, _ in units:
                rec = bytes(self.log[phy:phy + size])
                info = parse_dispatch_info(rec, 0, size)
                if key in info.keys.split() or key == info.uniq_key:
                    out.append(rec)
        return QueryResult(out[:max_num])

    def get_commitlog_data(self, physical_offset: int, max_bytes: int) -> memoryview | None:
        return None

    @property
    def memory_bytes_for_reads(self) -> int:
        return 1 << 40

    @property
    def max_physical_offset(self) -> int:
        return len(self.log)

    @property
    def min_physical_offset(self) -> int:
        return 0

    @property
    def flushed_physical_offset(self) -> int:
        return len(self.log)

    @property
    def mapped_file_size_commitlog(self) -> int:
        return 1 << 30

    def topic_queue_max_offsets(self) -> dict[tuple[str, int], int]:
        return {k: len(v) for k, v in self.queues.items()}


class FakeHAService:
    def __init__(self, *, slave_ok: bool = True, ack: bool | None = True) -> None:
        self.slave_ok = slave_ok
        self.ack = ack
        self.notified = 0
        self.started_on: tuple[str, int] | None = None
        self.waits: list[tuple[int, float]] = []

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        self.started_on = (host, port)
        return 20912

    async def stop(self) -> None: ...

    def notify_new_data(self) -> None:
        self.notified += 1

    def is_slave_ok(self, master_put_where: int) -> bool:
        return self.slave_ok

    def wait_for_ack(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool]:
        self.waits.append((end_offset, timeout_s))
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.ack is not None:
            fut.set_result(self.ack)
        else:
            def expire() -> None:
                if not fut.done():
                    fut.set_result(False)

            asyncio.get_running_loop().call_later(timeout_s, expire)
        return fut

    def wait_for_replicas(self, end_offset: int, timeout_s: float) -> asyncio.Future[bool] | None:
        return self.wait_for_ack(end_offset, timeout_s) if self.slave_ok else None

    def status(self) -> dict[str, Any]:
        return {"masterMaxOffset": 0, "connectionCount": 1 if self.slave_ok else 0, "slaves": []}


class FakeHAClient:
    def __init__(self, connected: bool = True) -> None:
        self.connected = connected
        self.master: str | None = None

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def update_master_address(self, addr: str | None) -> None:
        self.master = addr

    @property
    def is_connected(self) -> bool:
        return self.connected

    def status(self) -> dict[str, Any]:
        return {"connected": self.connected, "masterAddress": self.master}


def make_controller(tmp_path: Any, *, role: BrokerRole = BrokerRole.ASYNC_MASTER, store: FakeStore | None = None,
                    ha_service: FakeHAService | None = None, ha_client: FakeHAClient | None = None,
                    http_client: Any = None, **config: Any) -> Any:
    """A BrokerController over fakes (not started).

    Unlike a real broker (``autoCreateTopicEnable`` is off by default), it creates a topic on its first send
    unless the test passes ``auto_create_topic_enable=False``: these tests drive the send and pull processors on
    throw-away topics, not topic administration (tests/client/test_topic_auto_create.py covers the default).
    """
    from broker.config import BrokerConfig

    config.setdefault("auto_create_topic_enable", True)
    from broker.controller import BrokerController

    if role is BrokerRole.SLAVE:
        config.setdefault("broker_id", 1)
        ha_client = ha_client or FakeHAClient(connected=True)
    cfg = BrokerConfig(store_path_root_dir=str(tmp_path), broker_role=role, broker_name="broker-a",
                       listen_port=0, ha_listen_port=0, **config)
    fake_store: Any = store or FakeStore(role)
    fake_store.max_message_size = cfg.max_message_size
    return BrokerController(cfg, fake_store, addr="127.0.0.1:10911", store_host=STORE_HOST,
                            ha_service=ha_service or FakeHAService(), ha_client=ha_client, http_client=http_client)


def http_client(ctrl: Any) -> Any:
    """An async context manager: ``ctrl``'s router served on loopback (tests/serving.py), yielding an
    ``httpx.AsyncClient`` bound to it."""
    from tests.serving import serving

    return serving(ctrl.router)


def run_with_broker(tmp_path: Any, scenario: Callable[[Any, Any], Any], **kwargs: Any) -> Any:
    """Start a controller over fakes, serve its router on loopback, run ``await scenario(ctrl, client)``, stop it;
    returns the result."""

    async def main() -> Any:
        ctrl = make_controller(tmp_path, **kwargs)
        await ctrl.start()
        try:
            async with http_client(ctrl) as client:
                return await scenario(ctrl, client)
        finally:
            await ctrl.stop()

    return asyncio.run(main())
