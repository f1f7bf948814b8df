"""Table tests of the pure routing state (SEMANTICS.md 3.3, 4.2-4.5, 6.6)."""

from __future__ import annotations

import random

import pytest

from client._routing import (
    BrokerDownTable,
    FaultToleranceConfig,
    FindBrokerResult,
    LatencyFaultTolerance,
    NameServerSelector,
    PullNodeTable,
    QueueSelector,
    RouteCache,
    choose_pull_broker_id,
    default_route_for,
    find_broker_address_in_subscribe,
    topic_route_to_publish_info,
    topic_route_to_subscribe_info,
)
from client.protocol.codes import Perm
from client.protocol.message import MessageQueue
from client.protocol.route import BrokerData, QueueData, TopicRouteData

RW = int(Perm.READ | Perm.WRITE)


def route(*groups: tuple[str, dict[int, str], int, int, int]) -> TopicRouteData:
    """``(name, addrs, read, write, perm)`` per group."""
    return TopicRouteData(
        tuple(QueueData(n, r, w, p) for n, _, r, w, p in groups),
        tuple(BrokerData("C", n, a) for n, a, _, _, _ in groups),
    )


# --- find_broker_address_in_subscribe: every branch ---------------------------------------------------------

M, S1, S2 = "m:1", "s1:1", "s2:1"


@pytest.mark.parametrize(
    ("addrs", "broker_id", "only", "expected"),
    [
        (None, 0, False, None),                                    # unknown group
        ({}, 0, False, None),                                      # empty map
        ({0: M, 1: S1}, 0, False, FindBrokerResult(M, False)),     # exact master
        ({0: M, 1: S1}, 1, False, FindBrokerResult(S1, True)),     # exact slave
        ({0: M, 2: S2}, 1, True, FindBrokerResult(S2, True)),      # brokerId+1 step, slave flag stays True
        ({0: M, 2: S2}, 1, False, FindBrokerResult(S2, True)),     # step wins over the fallback
        ({0: M, 3: S2}, 1, True, None),                            # only one step, only-this: none
        ({0: M, 3: S2}, 1, False, FindBrokerResult(M, False)),     # fallback: first entry = lowest id = master
        ({1: S1, 2: S2}, 0, True, None),                           # master gone, only-this: none
        ({1: S1, 2: S2}, 0, False, FindBrokerResult(S1, True)),    # master gone: first entry, a slave
        ({2: S2, 1: S1}, 0, False, FindBrokerResult(S1, True)),    # ascending id order, whatever the insert order
        ({0: M}, 5, False, FindBrokerResult(M, False)),            # wanted slave absent: master
        ({0: M}, 0, True, FindBrokerResult(M, False)),
        ({1: S1}, 0, False, FindBrokerResult(S1, True)),           # no +1 step for the master id
    ],
)
def test_find_broker_address_in_subscribe(addrs, broker_id, only, expected) -> None:
    assert find_broker_address_in_subscribe(addrs, broker_id, only) == expected


def test_route_cache_publish_and_subscribe() -> None:
    cache = RouteCache()
    r = route(("broker-b", {0: "b0", 1: "b1"}, 2, 2, RW), ("broker-a", {0: "a0"}, 3, 2, RW),
              ("broker-c", {1: "c1"}, 2, 2, RW), ("broker-d", {0: "d0"}, 1, 1, int(Perm.READ)))
    assert cache.apply_route("T", r) is True
    assert cache.apply_route("T", r) is False  # unchanged
    info = cache.publish_info("T")
    assert info is not None
    # writable queues only of groups with a master, groups sorted by name
    assert info.message_queues == (
        MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-b", 0), MessageQueue("T", "broker-b", 1),
    )
    sub = cache.subscribe_info("T")
    assert sub is not None
    assert [(q.broker_name, q.queue_id) for q in sub] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-a", 2), ("broker-b", 0), ("broker-b", 1),
        ("broker-c", 0), ("broker-c", 1), ("broker-d", 0)]
    assert cache.find_broker_address_in_publish("broker-a") == "a0"
    assert cache.find_broker_address_in_publish("broker-c") is None
    assert cache.find_broker_address_in_publish("nope") is None
    assert cache.find_broker_address_in_subscribe("broker-c", 0, False) == FindBrokerResult("c1", True)
    assert cache.all_broker_addrs(include_slaves=False) == [("broker-a", 0, "a0"), ("broker-b", 0, "b0"),
                                                             ("broker-d", 0, "d0")]
    assert ("broker-b", 1, "b1") in cache.all_broker_addrs(include_slaves=True)


def test_route_change_replaces_group_members_wholesale() -> None:
    cache = RouteCache()
    cache.apply_route("T", route(("broker-a", {0: "a0", 1: "a1"}, 2, 2, RW)))
    assert cache.apply_route("T", route(("broker-a", {1: "a1"}, 2, 2, RW))) is True
    assert cache.find_broker_address_in_publish("broker-a") is None
    info = cache.publish_info("T")
    assert info is not None and not info.ok  # master gone: nothing writable
    assert cache.find_broker_address_in_subscribe("broker-a", 0, False) == FindBrokerResult("a1", True)


def test_default_route_cuts_queue_numbers() -> None:
    r = default_route_for(route(("broker-a", {0: "a0"}, 8, 8, RW), ("broker-b", {0: "b0"}, 2, 8, RW)), 4)
    assert [(q.read_queue_nums, q.write_queue_nums) for q in r.queue_datas] == [(4, 4), (2, 2)]
    cache = RouteCache(default_topic_queue_nums=4)
    info = cache.apply_default_route("NEW", route(("broker-a", {0: "a0"}, 8, 8, RW)))
    assert info.from_default_topic and len(info.message_queues) == 4
    assert info.message_queues[0].topic == "NEW"
    # the real route replaces the borrowed one, even if equal in shape
    assert cache.apply_route("NEW", route(("broker-a", {0: "a0"}, 4, 4, RW))) is True
    real = cache.publish_info("NEW")
    assert real is not None and not real.from_default_topic


def test_publish_info_skips_unwritable() -> None:
    info = topic_route_to_publish_info("T", route(("a", {0: "x"}, 2, 2, int(Perm.READ))))
    assert not info.ok
    assert topic_route_to_subscribe_info("T", route(("a", {0: "x"}, 2, 2, int(Perm.WRITE)))) == ()


# --- queue selection ---------------------------------------------------------------------------------------

QUEUES = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(2)]  # a0 a1 b0 b1


def test_round_robin_from_injected_start() -> None:
    sel = QueueSelector(start_index=0)
    picks = [sel.select(QUEUES, None) for _ in range(5)]
    assert [(q.broker_name, q.queue_id) for q in picks] == [("a", 1), ("b", 0), ("b", 1), ("a", 0), ("a", 1)]


@pytest.mark.parametrize("start", range(8))
def test_selection_avoids_last_failed_broker(start: int) -> None:
    sel = QueueSelector(start_index=start)
    for _ in range(10):
        assert sel.select(QUEUES, "a").broker_name == "b"


def test_selection_falls_back_when_only_the_failed_broker_is_left() -> None:
    only_a = [MessageQueue("T", "a", i) for i in range(3)]
    sel = QueueSelector(start_index=1)
    assert sel.select(only_a, "a").broker_name == "a"


def test_selection_with_fault_tolerance_skips_isolated() -> None:
    fault = LatencyFaultTolerance(enabled=True)
    fault.update_fault_item("a", 0, isolation=True, now_ms=1000)  # 600 s isolation with 4.9.3 tables
    sel = QueueSelector(start_index=3)
    for _ in range(6):
        assert sel.select(QUEUES, None, fault=fault, now_ms=2000).broker_name == "b"
    # everything isolated: falls back to round robin avoiding the last broker
    fault.update_fault_item("b", 0, isolation=True, now_ms=1000)
    assert sel.select(QUEUES, "b", fault=fault, now_ms=2000).broker_name == "a"
    # after the window the broker is back
    assert fault.is_available("a", 1000 + 600_000)
    assert not fault.is_available("a", 1000 + 599_999)


def test_selection_of_empty_list_raises() -> None:
    with pytest.raises(ValueError):
        QueueSelector(start_index=0).select([], None)


# --- latency fault tolerance ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("latency", "duration"),
    [(0, 0), (49, 0), (50, 0), (100, 0), (549, 0), (550, 30000), (999, 30000), (1000, 60000), (2000, 120000),
     (3000, 180000), (14999, 180000), (15000, 600000), (30000, 600000)],
)
def test_not_available_duration_4_9_3(latency: int, duration: int) -> None:
    assert LatencyFaultTolerance(enabled=True).compute_not_available_duration(latency) == duration


@pytest.mark.parametrize(
    ("latency", "duration"),
    [(40, 0), (100, 0), (550, 2000), (1799, 2000), (1800, 5000), (3000, 6000), (15000, 30000), (10000, 10000)],
)
def test_not_available_duration_head_tables(latency: int, duration: int) -> None:
    cfg = FaultToleranceConfig((50, 100, 550, 1800, 3000, 5000, 15000), (0, 0, 2000, 5000, 6000, 10000, 30000), 10000)
    assert LatencyFaultTolerance(enabled=True, config=cfg).compute_not_available_duration(latency) == duration


def test_fault_tolerance_off_by_default_records_nothing() -> None:
    fault = LatencyFaultTolerance()
    fault.update_fault_item("a", 99999, isolation=True, now_ms=0)
    assert fault.is_available("a", 1) and fault.available_from_ms("a") is None


def test_fault_item_set_unconditionally_and_latency_based() -> None:
    fault = LatencyFaultTolerance(enabled=True)
    fault.update_fault_item("a", 600, isolation=False, now_ms=0)
    assert fault.available_from_ms("a") == 30000
    fault.update_fault_item("a", 10, isolation=False, now_ms=5)  # 4.9.3: overwritten, even backwards
    assert fault.available_from_ms("a") == 5


def test_fault_config_validation() -> None:
    with pytest.raises(ValueError):
        FaultToleranceConfig((1, 2), (0,))
    with pytest.raises(ValueError):
        FaultToleranceConfig((5, 1), (0, 0))


# --- pull node table, broker down table -----------------------------------------------------------------------

MQ = MessageQueue("T", "broker-a", 0)


def test_pull_node_table_updates_and_recalculates() -> None:
    nodes = PullNodeTable()
    assert nodes.recalculate(MQ) == 0
    nodes.update(MQ, 1)
    assert nodes.recalculate(MQ) == 1 and nodes.table[MQ] == 1
    nodes.update(MQ, 0)
    assert nodes.recalculate(MQ) == 0


def test_pull_node_table_pinned_by_user() -> None:
    nodes = PullNodeTable(connect_broker_by_user=True, default_broker_id=1)
    nodes.update(MQ, 0)
    assert nodes.recalculate(MQ) == 1


@pytest.mark.parametrize(
    ("addrs", "down", "wanted", "now", "expected"),
    [
        ({0: M, 1: S1}, [], 0, 0, 0),
        ({0: M, 1: S1}, [0], 0, 0, 1),            # master down: the slave at once
        ({0: M, 1: S1}, [0], 0, 5000, 0),         # isolation over: master again
        ({0: M, 1: S1}, [1], 1, 0, 0),            # slave down: the master
        ({0: M, 1: S1, 2: S2}, [0, 1], 0, 0, 2),  # lowest member that is up
        ({0: M, 1: S1}, [0, 1], 0, 0, 0),         # all down: keep the wanted id
        ({0: M}, [0], 0, 0, 0),                   # no other member
        (None, [0], 0, 0, 0),
    ],
)
def test_choose_pull_broker_id(addrs, down, wanted, now, expected) -> None:
    table = BrokerDownTable(isolation_ms=5000)
    for bid in down:
        table.mark_down("broker-a", bid, 0)
    assert choose_pull_broker_id("broker-a", addrs, wanted, table, now) == expected


def test_broker_down_table_mark_up() -> None:
    table = BrokerDownTable(isolation_ms=100)
    table.mark_down("a", 0, 10)
    assert table.is_down("a", 0, 109) and not table.is_down("a", 1, 50)
    table.mark_up("a", 0)
    assert not table.is_down("a", 0, 50)


# --- nameserver selection --------------------------------------------------------------------------------------

def test_nameserver_selector_failover_and_settle() -> None:
    sel = NameServerSelector.parse("n1:1; n2:2 ;n3:3", rng=random.Random(7))
    first = sel.current()
    assert sel.rotation()[0] == first and sorted(sel.rotation()) == ["n1:1", "n2:2", "n3:3"]
    nxt = sel.failover()
    assert nxt != first and sel.current() == nxt
    sel.settle("n3:3")
    assert sel.current() == "n3:3"
    with pytest.raises(ValueError):
        NameServerSelector.parse(" ; ")
