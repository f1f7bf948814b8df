"""Pure consumption logic: allocation tables, ProcessQueue, start offsets, tag re-check, offsets, poll cache."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from client._consume_core import GroupConsumerConfig, GroupCore, consume_timestamp_ms
from client._offset_store import LocalFileOffsetStore, OffsetTable
from client._push_consumer import (
    ConsumeStatus,
    InvalidConsumeStatusError,
    check_consume_status,
    retry_message_properties,
)
from client._rebalance import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    ConsumeFromWhere,
    ProcessQueue,
    StartPlan,
    TagFilter,
    plan_start_offset,
    restore_retry_topic,
)
from client._rebalance_clock import Due, RebalanceClock
from client._requests import PullResult
from common.codes import PullStatus
from common.message import MessageExt, MessageQueue
from common.properties import MAX_RECONSUME_TIMES, ORIGIN_MESSAGE_ID, RECONSUME_TIME, RETRY_TOPIC

AVG = AllocateMessageQueueAveragely()
CIRCLE = AllocateMessageQueueAveragelyByCircle()


def mqs(n: int, groups: tuple[str, ...] = ("broker-a",)) -> list[MessageQueue]:
    return [MessageQueue("T", g, i) for g in groups for i in range(n)]


def msg(offset: int, *, body: bytes = b"x", tags: str | None = None, topic: str = "T", reconsume: int = 0,
        props: dict[str, str] | None = None) -> MessageExt:
    return MessageExt(topic, body, tags, (), dict(props or {}), "broker-a", 0, offset, 1000 + offset,
                      f"ID{offset}", f"OFF{offset}", 0, 0, "127.0.0.1:1", "127.0.0.1:2", reconsume, 100)


# --- allocation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_mq", "n_cid", "expected_sizes"), [
    (8, 3, [3, 3, 2]),
    (8, 1, [8]),
    (8, 8, [1] * 8),
    (3, 5, [1, 1, 1, 0, 0]),       # more clients than queues: the last ones idle
    (10, 4, [3, 3, 2, 2]),
    (1, 2, [1, 0]),
    (0, 2, [0, 0]),
])
def test_averagely_sizes_cover_disjoint(n_mq: int, n_cid: int, expected_sizes: list[int]) -> None:
    queues = mqs(n_mq)
    cids = [f"c{i}" for i in range(n_cid)]
    shares = [AVG.allocate("g", c, queues, cids) for c in cids]
    assert [len(s) for s in shares] == expected_sizes
    flat = [q for s in shares for q in s]
    assert sorted(flat) == sorted(queues) and len(set(flat)) == len(flat)


def test_averagely_contiguous_blocks_in_sorted_order() -> None:
    queues = mqs(4, ("broker-a", "broker-b"))
    cids = ["b", "c", "a"]  # order of the answer must not matter
    assert AVG.allocate("g", "a", queues, cids) == queues[0:3]
    assert AVG.allocate("g", "b", list(reversed(queues)), cids) == queues[3:6]
    assert AVG.allocate("g", "c", queues, cids) == queues[6:8]


def test_by_circle_round_robin() -> None:
    queues = mqs(5)
    assert CIRCLE.allocate("g", "a", queues, ["a", "b"]) == [queues[0], queues[2], queues[4]]
    assert CIRCLE.allocate("g", "b", queues, ["b", "a"]) == [queues[1], queues[3]]
    assert CIRCLE.allocate("g", "c", queues, ["c", "a", "b", "d", "e", "f"]) == [queues[2]]


@pytest.mark.parametrize("strategy", [AVG, CIRCLE])
def test_unknown_client_gets_nothing(strategy: AllocateMessageQueueAveragely) -> None:
    assert strategy.allocate("g", "zz", mqs(4), ["a", "b"]) == []
    with pytest.raises(ValueError, match="current_cid"):
        strategy.allocate("g", "", mqs(4), ["a"])


@pytest.mark.parametrize("strategy", [AVG, CIRCLE])
@pytest.mark.parametrize("n_cid", [1, 2, 3, 5, 9, 17])
@pytest.mark.parametrize("n_mq", [1, 4, 8, 16])
def test_every_table_is_a_partition(strategy: AllocateMessageQueueAveragely, n_cid: int, n_mq: int) -> None:
    queues = mqs(n_mq)
    cids = [f"127.0.0.1@{1000 + i}#1" for i in range(n_cid)]
    shares = [strategy.allocate("g", c, queues, cids) for c in cids]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == queues, (strategy.name, n_cid, n_mq, shares)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_removing_one_client_moves_only_its_queues_to_the_others() -> None:
    queues = mqs(8)
    before = {c: set(AVG.allocate("g", c, queues, ["a", "b", "c"])) for c in "abc"}
    after = {c: set(AVG.allocate("g", c, queues, ["a", "c"])) for c in "ac"}
    assert after["a"] | after["c"] == set(queues)
    assert before["b"] <= after["a"] | after["c"]


# --- start offsets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "committed", "topic", "plan"), [
    (ConsumeFromWhere.LAST_OFFSET, 42, "T", StartPlan("offset", 42)),
    (ConsumeFromWhere.LAST_OFFSET, -1, "T", StartPlan("max")),
    (ConsumeFromWhere.LAST_OFFSET, -1, "%RETRY%g", StartPlan("offset", 0)),
    (ConsumeFromWhere.FIRST_OFFSET, -1, "T", StartPlan("offset", 0)),
    (ConsumeFromWhere.FIRST_OFFSET, 7, "T", StartPlan("offset", 7)),
    (ConsumeFromWhere.TIMESTAMP, -1, "T", StartPlan("search")),
    (ConsumeFromWhere.TIMESTAMP, -1, "%RETRY%g", StartPlan("max")),
    (ConsumeFromWhere.TIMESTAMP, 0, "T", StartPlan("offset", 0)),
])
def test_plan_start_offset(where: ConsumeFromWhere, committed: int, topic: str, plan: StartPlan) -> None:
    assert plan_start_offset(where, committed, topic) == plan


def test_plan_start_offset_refuses_read_errors() -> None:
    with pytest.raises(ValueError, match="-2"):
        plan_start_offset(ConsumeFromWhere.LAST_OFFSET, -2, "T")


@pytest.mark.parametrize(("configured", "start"), [(None, 10_000_000 - 30 * 60 * 1000), (0, 0), (1234, 1234)])
def test_consume_timestamp(configured: int | None, start: int) -> None:
    # Both consumers read it here; the async one read 0 as "30 minutes ago".
    cfg = GroupConsumerConfig("g", consume_from_where="TIMESTAMP", consume_timestamp_ms=configured)
    assert consume_timestamp_ms(cfg, 10_000_000) == start


def test_after_pull_is_the_answer_of_both_engines() -> None:
    core = GroupCore(GroupConsumerConfig("g", pull_suspend_s=0, pull_delay_on_error_s=2.0))
    mq = MessageQueue("T", "broker-a", 0)
    pq = core.add_queue(mq, 5)
    assert pq is not None
    found = PullResult(PullStatus.FOUND, 7, 0, 7, [msg(5), msg(6)], 0, 0)
    added, delay = core.after_pull(pq, pq.generation, 5, found, 0.0, "g")
    assert [m.queue_offset for m in added] == [5, 6] and delay == 0.0 and pq.next_pull_offset == 7
    illegal = PullResult(PullStatus.OFFSET_ILLEGAL, 3, 3, 9, [], 0, 0)
    assert core.after_pull(pq, pq.generation, 7, illegal, 0.0, "g") == ([], 0.0)
    assert pq.next_pull_offset == 3
    refused = PullResult(PullStatus.NO_MATCHED_MSG, 3, 0, 9, [], 0, 1)  # a slave sends the pull to the master
    assert core.after_pull(pq, pq.generation, 3, refused, 0.0, "g") == ([], 2.0)
    stale = pq.generation
    core.reset_queue(pq, 0)
    assert core.after_pull(pq, stale, 0, found, 0.0, "g") == ([], 0.0)  # an answer to a pull before the reset


# --- ProcessQueue ------------------------------------------------------------------------------------------


def test_process_queue_commit_offset_is_min_in_flight() -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 10)
    added = pq.put([msg(10), msg(11), msg(12), msg(13)], 14)
    assert [m.queue_offset for m in added] == [10, 11, 12, 13]
    assert (pq.msg_count, pq.msg_size_bytes, pq.next_pull_offset) == (4, 4, 14)
    assert pq.remove([msg(12)]) == 10          # 10 still in flight: nothing past it is committed
    assert pq.remove([msg(10)]) == 11
    assert pq.remove([msg(11), msg(13)]) == 14  # empty: one past the last pulled
    assert pq.msg_count == 0 and pq.min_offset_in_flight() is None


def test_process_queue_ignores_duplicates_and_old_offsets() -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 5)
    assert pq.put([msg(3), msg(5), msg(6)], 7) == [msg(5), msg(6)]
    assert pq.put([msg(6), msg(7)], 8) == [msg(7)]
    assert pq.msg_count == 3


def test_process_queue_filtered_gap_advances_consume_offset() -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 0)
    pq.put([], 50)                   # NO_MATCHED_MSG: 50 offsets filtered away
    assert pq.consume_offset == 50
    pq.put([msg(50)], 60)
    assert pq.consume_offset == 50   # 50 in flight
    assert pq.remove([msg(50)]) == 60


@pytest.mark.parametrize(("count", "size", "max_count", "max_size", "reason"), [
    (3, 3, 4, 100, None),
    (4, 4, 4, 100, "pull_threshold_for_queue=4"),
    (2, 2000, 100, 1000, "pull_threshold_size_for_queue"),
])
def test_process_queue_thresholds(count: int, size: int, max_count: int, max_size: int, reason: str | None) -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 0)
    body = b"x" * (size // count)
    pq.put([msg(i, body=body) for i in range(count)], count)
    why = pq.over_threshold(max_count, max_size)
    assert (why is None) if reason is None else (why is not None and reason in why)


def test_process_queue_orderly_take_commit_return() -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 0)
    pq.put([msg(i) for i in range(5)], 5)
    taken = pq.take(2)
    assert [m.queue_offset for m in taken] == [0, 1]
    assert pq.msg_count == 5 and pq.min_offset_in_flight() == 0
    pq.return_consuming([attrs.evolve(m, reconsume_times=1) for m in taken])
    again = pq.take(3)
    assert [(m.queue_offset, m.reconsume_times) for m in again] == [(0, 1), (1, 1), (2, 0)]
    assert pq.commit_consuming() == 3
    assert pq.msg_count == 2 and pq.msg_size_bytes == 2


def test_process_queue_reset_bumps_generation() -> None:
    pq = ProcessQueue(MessageQueue("T", "a", 0), 0)
    pq.put([msg(0), msg(1)], 2)
    pq.reset(100)
    assert (pq.generation, pq.next_pull_offset, pq.consume_offset, pq.msg_count) == (1, 100, 100, 0)
    with pytest.raises(ValueError):
        pq.reset(-1)
    with pytest.raises(ValueError):
        ProcessQueue(MessageQueue("T", "a", 0), -1)


# --- tags and retry topics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "tags"), [
    ("*", None), ("", None), (None, None), ("  * ", None),
    ("TagA", {"TagA"}), ("TagA || TagB", {"TagA", "TagB"}), (" TagA||TagB ||", {"TagA", "TagB"}),
])
def test_tag_filter_parse(expr: str | None, tags: set[str] | None) -> None:
    f = TagFilter.parse(expr)
    assert f.tags == (None if tags is None else frozenset(tags))


@pytest.mark.parametrize("bad", ["||", " || ", "A\x01"])
def test_tag_filter_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        TagFilter.parse(bad)


def test_tag_filter_matches_rechecks_collisions() -> None:
    f = TagFilter.parse("TagA || TagB")
    assert f.matches(msg(0, tags="TagA")) and not f.matches(msg(0, tags="TagC")) and not f.matches(msg(0))
    assert TagFilter.parse("*").matches(msg(0))


def test_restore_retry_topic() -> None:
    m = msg(0, topic="%RETRY%g", props={RETRY_TOPIC: "Orders"})
    assert restore_retry_topic(m, "g").topic == "Orders"
    assert restore_retry_topic(m, "other").topic == "%RETRY%g"
    assert restore_retry_topic(msg(0), "g").topic == "T"


# --- push consumer pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, True, 0, "CONSUME_SUCCESS", [ConsumeStatus.CONSUME_SUCCESS]])
def test_wrong_callback_return_type_is_an_error(bad: object) -> None:
    with pytest.raises(InvalidConsumeStatusError, match="must return ConsumeStatus") as info:
        check_consume_status(bad)
    assert type(bad).__name__ in str(info.value)
    assert isinstance(info.value, TypeError)


def test_check_consume_status_passes_statuses() -> None:
    for s in ConsumeStatus:
        assert check_consume_status(s) is s


def test_retry_message_properties() -> None:
    first = retry_message_properties(msg(0, topic="Orders", reconsume=0, props={"k": "v", "TAGS": "A"}), 16)
    assert first == {"k": "v", RETRY_TOPIC: "Orders", ORIGIN_MESSAGE_ID: "ID0", RECONSUME_TIME: "1",
                     MAX_RECONSUME_TIMES: "16"}
    again = retry_message_properties(
        msg(0, topic="Orders", reconsume=2, props={RETRY_TOPIC: "Orig", ORIGIN_MESSAGE_ID: "FIRST"}), 3)
    assert (again[RETRY_TOPIC], again[ORIGIN_MESSAGE_ID], again[RECONSUME_TIME]) == ("Orig", "FIRST", "3")


# --- offsets -----------------------------------------------------------------------------------------------


def test_offset_table_increase_only_and_dirty() -> None:
    t = OffsetTable()
    q0, q1 = mqs(2)
    assert t.update(q0, 5) and not t.update(q0, 3) and t.read(q0) == 5
    assert t.update(q0, 3, increase_only=False) and t.read(q0) == 3
    t.update(q1, 1)
    assert t.take_dirty() == {q0: 3, q1: 1} and t.take_dirty() == {}
    t.mark_dirty([q1])
    assert t.take_dirty() == {q1: 1}
    assert t.remove(q0) == 3 and t.read(q0) == -1
    with pytest.raises(ValueError, match="must be >= 0"):
        t.update(q0, -1)


def test_local_file_offset_store_roundtrip(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(tmp_path, "inst", "g")
    store.load()
    q0, q1 = mqs(2)
    store.table.update(q0, 10)
    store.table.update(q1, 20)
    store.persist()
    store.table.update(q0, 11)
    store.persist()                      # the previous file becomes .bak
    again = LocalFileOffsetStore(tmp_path, "inst", "g")
    again.load()
    assert (again.read(q0), again.read(q1)) == (11, 20)
    store.path.write_bytes(b"{not json")
    with pytest.raises(ValueError, match="malformed"):
        LocalFileOffsetStore(tmp_path, "inst", "g").load()
    with pytest.raises(ValueError, match="instance_name"):
        LocalFileOffsetStore(tmp_path, "../x", "g")


# --- GroupCore poll cache ----------------------------------------------------------------------------------


def test_core_poll_acks_only_on_next_poll() -> None:
    core = GroupCore(GroupConsumerConfig("g"))
    q0 = mqs(1)[0]
    pq = core.add_queue(q0, 0)
    assert pq is not None and core.add_queue(q0, 0) is None
    core.offsets.take_dirty()
    added = core.on_pulled(pq, pq.generation, [msg(0), msg(1), msg(2)], 3, "g")
    core.offer(pq, pq.generation, added)
    assert [m.queue_offset for m in core.take_polled(2)] == [0, 1]
    assert core.offsets.read(q0) == 0            # returned, not yet acknowledged
    core.ack_polled()
    assert core.offsets.read(q0) == 2
    assert [m.queue_offset for m in core.take_polled(10)] == [2]
    assert core.drop_queue(q0) == 2              # hand-over commits what is consumed, not what is polled
    core.ack_polled()                            # a late ack of a dropped queue changes nothing
    assert core.offsets.read(q0) == -1


def test_core_reset_makes_cached_batches_stale_and_pause_stashes() -> None:
    core = GroupCore(GroupConsumerConfig("g"))
    q0, q1 = mqs(2)
    p0, p1 = core.add_queue(q0, 0), core.add_queue(q1, 0)
    assert p0 is not None and p1 is not None
    core.offer(p0, p0.generation, core.on_pulled(p0, p0.generation, [msg(0)], 1, "g"))
    core.offer(p1, p1.generation, core.on_pulled(p1, p1.generation, [msg(0)], 1, "g"))
    core.reset_queue(p0, 0)
    core.set_paused([q1], True)
    assert core.take_polled(10) == [] and not core.has_cached()
    core.set_paused([q1], False)
    assert len(core.take_polled(10)) == 1


def test_core_subscribe_and_assign_are_exclusive() -> None:
    core = GroupCore(GroupConsumerConfig("g"))
    core.subscribe("T", "A || B")
    with pytest.raises(ValueError, match="exclusive"):
        core.assign(mqs(1))
    other = GroupCore(GroupConsumerConfig("g"))
    other.assign(mqs(1))
    with pytest.raises(ValueError, match="exclusive"):
        other.subscribe("T", "*")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rebalance_interval_s": 0}, "rebalance_interval_s"),
    ({"pull_threshold_for_queue": 0}, "pull_threshold_for_queue"),
    ({"message_model": "NOPE"}, "NOPE"),
    ({"allocate_strategy": object()}, "allocate"),
])
def test_config_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GroupConsumerConfig("g", **kwargs)  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rebalance_clock_periods_and_rebalances_out_of_period() -> None:
    """Both engines wait for this clock: a rebalance at start, then once a period; out of period at once when
    asked, after a gap doubling up to the period when a topic could not be allocated, at most once a second when
    a send-back expects queues."""
    t = _Clock()
    cfg = GroupConsumerConfig("g", rebalance_interval_s=20, auto_commit_interval_s=60)
    clock = RebalanceClock(cfg, lock_renewal=False, clock=t)
    assert clock.take_due() == Due(rebalance=True, commit=False, lock=False)
    assert clock.wait_s() == 20
    gaps = []
    for _ in range(6):  # a topic still without a route, round after round
        clock.retry_soon()
        gaps.append(clock.wait_s())
        t.now += clock.wait_s()
        assert clock.take_due() == Due(rebalance=True, commit=False, lock=False)
    assert gaps == [1, 2, 4, 8, 16, 20]  # never beyond the period
    t.now += 9
    assert clock.take_due() == Due(rebalance=False, commit=True, lock=False)
    clock.allocated_all()
    clock.retry_soon()
    assert clock.wait_s() == 1
    clock.asked_now()
    assert clock.take_due().rebalance  # a subscription changed: at once
    clock.expect()
    assert clock.wait_s() == 1  # a send-back: not within a second of the last rebalance out of period
    t.now += 1
    assert clock.take_due().rebalance
