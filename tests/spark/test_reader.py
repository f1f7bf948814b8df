"""The pull loop of one task against a fake broker group (no Spark, no network)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator

import attrs
import pytest

from client.errors import BrokerConnectError, SystemBusyError
from common.codes import PullStatus
from spark_connector.offsets import QueueKey
from spark_connector.options import SourceOptions
from spark_connector.planning import QueueRange
from spark_connector.reader import DataLossError, RangeReader, parse_tags_filter
from spark_connector.transport import RawPull

from .conftest import build_records

KEY = QueueKey("T", "broker-a", 0)


@attrs.define
class Member:
    min_offset: int = 0
    max_offset: int = 0
    down: bool = False
    busy: bool = False
    tags: dict[int, str] = attrs.field(factory=dict)
    fail_once_at: set[int] = attrs.field(factory=set)
    """Offsets whose first pull fails with a connect error (a transient fault)."""


@attrs.define
class FakeGroup:
    """One broker group: member id -> contents; records every pull as (member, offset)."""

    members: dict[int, Member]
    suggest: Callable[[int, int], int] = lambda member, offset: 0
    route_members: set[int] | None = None
    pulls: list[tuple[int, int]] = attrs.field(factory=list)
    hints: dict[QueueKey, int] = attrs.field(factory=dict)
    refreshes: int = 0
    overshoot: int = 2
    """Records returned past ``max_nums`` (a real broker does so only when a tag filter skips offsets)."""
    cap: int | None = None
    """The broker's count cap per answer (``maxTransferCountOnMessageInMemory``)."""
    gate: threading.Event | None = None
    """When set: pulls after the first block until ``gate_width`` run at once or ``gate_timeout_s`` pass (then
    the gate stays open)."""
    gate_width: int = 1
    gate_timeout_s: float = 2.0
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def addr(self, i: int) -> str:
        return f"10.0.0.1:{100 + i}"

    def broker_addrs(self, topic: str, broker_name: str, *, refresh: bool = False) -> dict[int, str]:
        self.refreshes += refresh
        ids = self.route_members if self.route_members is not None else set(self.members)
        return {i: self.addr(i) for i in sorted(ids)}

    def hint(self, key: QueueKey) -> int:
        return self.hints.get(key, 0)

    def set_hint(self, key: QueueKey, broker_id: int) -> None:
        self.hints[key] = broker_id

    def pull(self, addr: str, key: QueueKey, offset: int, *, max_nums: int, max_bytes: int, sub_expression: str,
             group: str, timeout_s: float) -> RawPull:
        member = int(addr.rsplit(":", 1)[1]) - 100
        m = self.members[member]
        with self.lock:
            self.pulls.append((member, offset))
            gated = self.gate is not None and len(self.pulls) > 1  # a pipelined reader sends its first pull alone
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.gate is not None and self.in_flight >= self.gate_width:
                self.gate.set()
        try:
            # a sequential reader never opens the gate: after the timeout it stays open
            if gated and self.gate is not None and not self.gate.wait(self.gate_timeout_s):
                self.gate.set()
            return self._answer(member, m, offset, max_nums, sub_expression, addr)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _answer(self, member: int, m: Member, offset: int, max_nums: int, sub_expression: str,
                addr: str) -> RawPull:
        if offset in m.fail_once_at:
            m.fail_once_at.discard(offset)
            raise BrokerConnectError("connection reset", broker_addr=addr)
        if m.down:
            raise BrokerConnectError("connection refused", broker_addr=addr)
        if m.busy:
            raise SystemBusyError("busy", broker_addr=addr)
        sug = self.suggest(member, offset)

        def answer(status: PullStatus, nxt: int, raw: bytes = b"", n: int = 0) -> RawPull:
            return RawPull(status, nxt, m.min_offset, m.max_offset, sug, member, n, memoryview(raw))

        if offset < m.min_offset or offset > m.max_offset:
            return answer(PullStatus.OFFSET_ILLEGAL, offset if member else m.min_offset)
        if offset == m.max_offset:
            return answer(PullStatus.NO_NEW_MSG, offset)
        wanted = parse_tags_filter(sub_expression)
        if self.cap is not None:
            max_nums = min(max_nums, self.cap)
        offs = list(range(offset, min(m.max_offset, offset + max_nums + self.overshoot)))
        if wanted is not None:
            offs = [o for o in offs if m.tags.get(o) in wanted]
            if not offs:
                return answer(PullStatus.NO_MATCHED_MSG, min(m.max_offset, offset + max_nums + self.overshoot))
        specs = [{"tags": m.tags.get(o)} for o in offs]
        raw = b"".join(build_records([s], first_offset=o) for s, o in zip(specs, offs, strict=True))
        return answer(PullStatus.FOUND, offs[-1] + 1, raw, len(offs))


def opts(**kw: object) -> SourceOptions:
    base: dict[str, object] = {"nameserver": "h:1", "topics": ("T",), "pull_batch_size": 4, "retry_backoff_s": 0.0,
                               "pull_concurrency": 4}
    base.update(kw)
    return SourceOptions(**base)  # type: ignore[arg-type]


def read(group: FakeGroup, o: SourceOptions, start: int, end: int) -> tuple[list[int], list[int], list[float]]:
    slept: list[float] = []
    rng = QueueRange("T", "broker-a", 0, start, end, tuple(group.broker_addrs("T", "broker-a").items()))
    batches = list(RangeReader(group, o, rng, sleep=slept.append).batches())
    offsets = [o for b in batches for o in b.column("queueOffset").to_pylist()]
    served = [s for b in batches for s in b.column("servedBy").to_pylist()]
    return offsets, served, slept


def test_reads_exactly_the_range_and_trims_past_end() -> None:
    g = FakeGroup({0: Member(0, 100)})
    offsets, served, _ = read(g, opts(), 10, 27)
    assert offsets == list(range(10, 27))
    assert set(served) == {0}


def test_auto_follows_suggestions_between_pulls_and_tasks() -> None:
    g = FakeGroup({0: Member(0, 50), 1: Member(0, 50)}, suggest=lambda member, off: 1)
    offsets, served, _ = read(g, opts(), 0, 20)
    assert offsets == list(range(20))
    assert g.pulls[0][0] == 0 and {m for m, _ in g.pulls[1:]} == {1}
    assert served[:6] == [0] * 6 and set(served[6:]) == {1}  # the fake returns max_nums + 2 records
    assert g.hints[KEY] == 1  # the next task on this worker starts on the slave


def test_master_mode_ignores_suggestions() -> None:
    g = FakeGroup({0: Member(0, 50), 1: Member(0, 50)}, suggest=lambda member, off: 1)
    _, served, _ = read(g, opts(pull_from="master"), 0, 20)
    assert set(served) == {0} and KEY not in g.hints


def test_slave_mode_pins_the_slave() -> None:
    g = FakeGroup({0: Member(0, 50), 1: Member(0, 50)})
    offsets, served, _ = read(g, opts(pull_from="slave"), 0, 20)
    assert offsets == list(range(20)) and set(served) == {1}


def test_slave_mode_without_slave_falls_back_to_the_first_member() -> None:
    g = FakeGroup({0: Member(0, 50)})
    _, served, _ = read(g, opts(pull_from="slave"), 0, 8)
    assert set(served) == {0}


def test_lagging_slave_hands_the_rest_of_the_range_to_the_master() -> None:
    g = FakeGroup({0: Member(0, 30), 1: Member(0, 12)})
    offsets, served, _ = read(g, opts(pull_from="slave"), 0, 30)
    assert offsets == list(range(30))
    assert served[:12] == [1] * 12 and set(served[12:]) == {0}


def test_master_down_falls_back_to_slave() -> None:
    g = FakeGroup({0: Member(0, 30, down=True), 1: Member(0, 30)})
    offsets, served, slept = read(g, opts(), 0, 30)
    assert offsets == list(range(30)) and set(served) == {1}
    assert slept == [] and g.refreshes >= 1


def test_master_down_without_fallback_fails_after_retries() -> None:
    g = FakeGroup({0: Member(0, 30, down=True), 1: Member(0, 30)})
    with pytest.raises(BrokerConnectError):
        read(g, opts(slave_fallback=False, pull_retries=2), 0, 30)
    assert [m for m, _ in g.pulls] == [0, 0, 0]


def test_master_gone_from_route_is_resolved_like_the_sdk() -> None:
    g = FakeGroup({0: Member(0, 30), 1: Member(0, 30)}, route_members={1})
    _, served, _ = read(g, opts(pull_from="master"), 0, 9)
    assert set(served) == {1}


def test_busy_slave_sends_the_reader_to_the_master() -> None:
    g = FakeGroup({0: Member(0, 30), 1: Member(0, 30, busy=True)})
    offsets, served, _ = read(g, opts(pull_from="slave"), 0, 10)
    assert offsets == list(range(10)) and set(served) == {0}


def test_tag_filter_skips_unmatched_offsets() -> None:
    tags = {o: ("A" if o % 5 == 0 else "B") for o in range(40)}
    g = FakeGroup({0: Member(0, 40, tags=tags)})
    offsets, _, _ = read(g, opts(sub_expression="A"), 0, 40)
    assert offsets == [0, 5, 10, 15, 20, 25, 30, 35]


def test_expired_offsets_fail_or_skip() -> None:
    g = FakeGroup({0: Member(10, 30)})
    with pytest.raises(DataLossError, match="expired"):
        read(g, opts(), 0, 20)
    offsets, _, _ = read(g, opts(fail_on_data_loss=False), 0, 20)
    assert offsets == list(range(10, 20))


def test_master_short_of_the_plan_is_data_loss_after_bounded_retries() -> None:
    g = FakeGroup({0: Member(0, 5)})
    with pytest.raises(DataLossError, match="planned range"):
        read(g, opts(pull_retries=2), 0, 10)
    offsets, _, slept = read(g, opts(pull_retries=2, fail_on_data_loss=False), 0, 10)
    assert offsets == list(range(5)) and len(slept) == 2


def test_batches_are_capped_by_rows() -> None:
    g = FakeGroup({0: Member(0, 100)})
    rng = QueueRange("T", "broker-a", 0, 0, 100, ((0, g.addr(0)),))
    batches = list(RangeReader(g, opts(max_batch_rows=7), rng).batches())
    assert all(b.num_rows <= 7 for b in batches)
    assert sum(b.num_rows for b in batches) == 100


def test_closing_early_stops_pulling() -> None:
    g = FakeGroup({0: Member(0, 1000)})
    rng = QueueRange("T", "broker-a", 0, 0, 1000, ((0, g.addr(0)),))
    it = RangeReader(g, opts(max_batch_rows=8), rng).batches()
    assert isinstance(it, Generator)
    next(it)
    it.close()
    assert len(g.pulls) < 10


def test_pipelined_pulls_overlap_and_learn_the_broker_cap() -> None:
    g = FakeGroup({0: Member(0, 200)}, overshoot=0, cap=5, gate=threading.Event(), gate_width=3)
    o = opts(pull_batch_size=64, pull_concurrency=3)
    offsets, _, _ = read(g, o, 7, 190)
    assert offsets == list(range(7, 190))
    assert g.max_in_flight == 3  # the gate opened: three pulls ran at once
    assert g.pulls[0] == (0, 7)
    starts = sorted(off for _, off in g.pulls)
    assert starts == sorted(set(starts)), "an offset was pulled twice"
    assert starts[:3] == [7, 12, 17]  # after the first capped answer, every pull covers what the cap allows


def test_sequential_when_concurrency_is_one() -> None:
    g = FakeGroup({0: Member(0, 100)}, overshoot=0, cap=4, gate=threading.Event(), gate_width=2, gate_timeout_s=0.2)
    offsets, _, _ = read(g, opts(pull_batch_size=4, pull_concurrency=1), 0, 40)
    assert offsets == list(range(40)) and g.max_in_flight == 1
    assert [off for _, off in g.pulls] == list(range(0, 40, 4))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_transient_fault_inside_the_pipeline_loses_and_repeats_nothing(concurrency: int) -> None:
    g = FakeGroup({0: Member(0, 100, fail_once_at={8, 24, 25}), 1: Member(0, 100)}, overshoot=0)
    offsets, _, _ = read(g, opts(pull_concurrency=concurrency, slave_fallback=False), 0, 60)
    assert offsets == list(range(60))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_answers_past_the_segment_restart_the_pipeline_without_duplicates(concurrency: int) -> None:
    tags = {o: ("A" if o % 3 == 0 else "B") for o in range(90)}
    g = FakeGroup({0: Member(0, 90, tags=tags)}, overshoot=3)
    offsets, _, _ = read(g, opts(pull_concurrency=concurrency, sub_expression="A"), 0, 90)
    assert offsets == list(range(0, 90, 3))


def test_batches_never_exceed_the_byte_cap() -> None:
    g = FakeGroup({0: Member(0, 300)}, overshoot=0)
    rng = QueueRange("T", "broker-a", 0, 0, 300, ((0, g.addr(0)),))
    o = opts(pull_batch_size=16, max_batch_bytes=2048, max_batch_rows=1000)
    batches = list(RangeReader(g, o, rng).batches())
    record_size = len(build_records([{"body": b"m100"}]))
    assert sum(b.num_rows for b in batches) == 300
    assert all(b.num_rows * record_size <= 2048 for b in batches), [b.num_rows for b in batches]
    assert len(batches) >= 300 * record_size // 2048
