"""A hypothesis state machine: the file store against a list model, across puts, reads, clean restarts,
process crashes and power losses (unsynced bytes dropped by the fault layer)."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from benchmarks.chaos.faulty_io import FaultyIO
from broker.store.api import GetMessageStatus, PutMessageStatus
from broker.store.file_store import FileMessageStore
from common.codec import decode_records
from common.codes import FlushDiskType

from .conftest import BORN_HOST, batch, small_config

QUEUES = 3


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="splitmq-stateful-")
        self.io = FaultyIO(track_unsynced=True)
        # SYNC_FLUSH without start(): flush_future flushes synchronously, so durability is deterministic.
        self.config = small_config(self.root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
        self.store = self._open()
        #: per queue: (physical offset, body) of each message, in queue order
        self.queues: list[list[tuple[int, bytes]]] = [[] for _ in range(QUEUES)]
        #: every message in log order: (physical offset, end offset, queue)
        self.log: list[tuple[int, int, int]] = []
        self.durable = 0
        self.counter = 0

    def _open(self) -> FileMessageStore:
        store = FileMessageStore(self.config, self.io)
        store.load()
        return store

    def teardown(self) -> None:
        self.store.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(queue=st.integers(0, QUEUES - 1), n=st.integers(1, 6), size=st.integers(0, 3000))
    def put(self, queue: int, n: int, size: int) -> None:
        body = bytes([self.counter % 251]) * size
        items = batch("T", n, body=body, start=self.counter)
        self.counter += n
        r = self.store.append_batch("T", queue, items, born_host=BORN_HOST)
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.queue_offset == len(self.queues[queue])
        ends = [*r.physical_offsets[1:], r.end_offset]
        for phy, end in zip(r.physical_offsets, ends, strict=True):
            self.queues[queue].append((phy, body))
            self.log.append((phy, end, queue))

    @rule()
    def flush(self) -> None:
        end = self.store.max_physical_offset
        assert self.store.flush_future(end).result(5) is True
        self.durable = end

    @rule(queue=st.integers(0, QUEUES - 1), data=st.data())
    def read(self, queue: int, data: st.DataObject) -> None:
        self.store.dispatch_available(1 << 30)
        model = self.queues[queue]
        offset = data.draw(st.integers(0, len(model) + 2))
        r = self.store.get_message("g", "T", queue, offset, 32, 1 << 20)
        if not model:
            assert r.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
            return
        if offset >= len(model):
            assert r.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY)
            return
        assert r.status is GetMessageStatus.FOUND and r.msg_count >= 1
        msgs = decode_records(b"".join(r.records), verify_crc=True)
        for k, m in enumerate(msgs):
            assert (m.commit_log_offset, m.body) == model[offset + k]
            assert m.queue_offset == offset + k

    @rule()
    def clean_restart(self) -> None:
        self.store.shutdown()
        self.store = self._open()
        self.durable = self.store.max_physical_offset

    @rule()
    def process_crash(self) -> None:
        self.store.crash()
        self.store = self._open()  # the page cache survives a killed process

    @precondition(lambda self: self.log)
    @rule()
    def power_loss(self) -> None:
        self.store.crash()
        self.io.drop_unsynced()
        self.store = self._open()
        end = self.store.max_physical_offset
        assert end >= self.durable, f"lost flushed data: durable {self.durable}, recovered {end}"
        keep = sum(1 for _, e, _ in self.log if e <= end)
        if keep < len(self.log):
            assert self.log[keep][0] >= end, f"recovered end {end} cuts the record at {self.log[keep][0]}"
        for _, _, queue in self.log[keep:]:
            self.queues[queue].pop()
        self.log = self.log[:keep]
        self.durable = end

    @invariant()
    def queues_match_the_model_once_dispatched(self) -> None:
        self.store.dispatch_available(1 << 30)
        got = self.store.topic_queue_max_offsets()
        for queue, model in enumerate(self.queues):
            assert got.get(("T", queue), 0) == len(model), (queue, got)


StoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestStoreMachine = StoreMachine.TestCase
