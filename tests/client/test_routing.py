"""Table tests of the pure routing state (docs/BEHAVIOUR.md 3.3, 4.2-4.5, 6.6)."""

from __future__ import annotations

import random

import pytest

from client._requests import PullResult
from client._routing import (
    BrokerDownTable,
    FaultToleranceConfig,
    FindBrokerResult,
    LatencyFaultTolerance,
    NameServerSelector,
    PullNodeTable,
    PullTarget,
    QueueSelector,
    RouteCache,
    choose_pull_broker_id,
    default_route_for,
    find_broker_address_in_subscribe,
    plan_pull,
    pull_refused,
    topic_route_to_publish_info,
    topic_route_to_subscribe_info,
)
from common.codes import Perm, PullStatus
from common.message import MessageQueue
from common.route import BrokerData, QueueData, TopicRouteData

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


# --- refusals (decision 6): no pull to a member that will refuse it ---------------------------------------------

@pytest.mark.parametrize(
    ("addrs", "down", "refused", "now", "expected"),
    [
        ({0: M, 1: S1}, [0], [1], 0, 0),          # only a refuser is up: it vouches for the master -> ask it
        ({0: M, 1: S1}, [0], [1], 1000, 1),       # the refusal is forgotten (refusal_ms): the slave again
        ({0: M, 1: S1, 2: S2}, [0], [1], 0, 2),   # another member that did not refuse
        ({0: M, 1: S1, 2: S2}, [0, 2], [1], 0, 0),
        ({0: M, 1: S1}, [], [1], 0, 0),           # master not down: the refusal changes nothing
        ({0: M, 1: S1}, [0, 1], [], 0, 0),        # all down: the wanted id
    ],
)
def test_choose_pull_broker_id_avoids_members_that_refused(addrs, down, refused, now, expected) -> None:
    table = BrokerDownTable(isolation_ms=5000, refusal_ms=1000)
    for bid in refused:
        table.mark_refused("broker-a", bid, 0)
    for bid in down:
        table.mark_down("broker-a", bid, 0)
    assert choose_pull_broker_id("broker-a", addrs, 0, table, now) == expected


def test_broker_down_table_refusals() -> None:
    table = BrokerDownTable(isolation_ms=100)
    assert table.refusal_ms == 100
    table.mark_down("a", 1, 0)
    table.mark_refused("a", 1, 10)  # an answer, even a refusal: the member is reachable
    assert not table.is_down("a", 1, 20) and table.has_refused("a", 1, 109) and not table.has_refused("a", 0, 20)
    assert not table.has_refused("a", 1, 110)
    table.mark_down("a", 0, 0)
    table.mark_refused("a", 1, 200)
    assert table.down_until("a", 0) == 100
    table.mark_served("a", 1)
    table.mark_served("a", 0)
    assert not table.has_refused("a", 1, 201) and table.down_until("a", 0) is None


def pull_result(status: PullStatus, next_begin: int, suggest: int, served_by: int, msgs: int = 0) -> PullResult:
    return PullResult(status, next_begin, 0, 50, [object()] * msgs, suggest, served_by)  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (pull_result(PullStatus.NO_MATCHED_MSG, 7, 0, 1), True),    # slave, slaveReadEnable=false, link up
        (pull_result(PullStatus.NO_MATCHED_MSG, 9, 0, 1), False),   # tag-filtered messages skipped: progress
        (pull_result(PullStatus.NO_MATCHED_MSG, 7, 1, 1), False),   # not sent elsewhere
        (pull_result(PullStatus.NO_MATCHED_MSG, 7, 0, 0), False),   # the master itself
        (pull_result(PullStatus.NO_NEW_MSG, 7, 0, 1), False),
        (pull_result(PullStatus.FOUND, 7, 0, 1, msgs=1), False),
        (pull_result(PullStatus.OFFSET_ILLEGAL, 7, 0, 1), False),
    ],
)
def test_pull_refused(result, expected) -> None:
    assert pull_refused(result, 7) is expected


#: Members of the plan tests: a master and a slave; ``3`` adds a second slave.
TWO = {0: M, 1: S1}
THREE = {0: M, 1: S1, 2: S2}


def run_plan(members, outcomes, *, down=(), refused=(), wanted=0, pinned=False, table=None):
    """Drive one PullPlan: ``outcomes[id]`` is ``fail``, ``refuse`` (suggest 0) or ``serve``. Returns the ids
    asked, in order, and how the pull ended (``served by N``, ``refused``, ``error`` or ``no plan``)."""
    table = table or BrokerDownTable(isolation_ms=5000)
    for bid in refused:
        table.mark_refused("broker-a", bid, 0)
    for bid in down:
        table.mark_down("broker-a", bid, 0)
    plan = plan_pull("broker-a", members, wanted, table, 1, pinned=pinned)
    if plan is None:
        return [], "no plan"
    asked, end = [], "error"
    while (t := plan.next()) is not None:
        assert t == PullTarget(t.broker_id, members[t.broker_id], t.broker_id != 0)
        asked.append(t.broker_id)
        outcome = outcomes[t.broker_id]
        if outcome == "fail":
            plan.failed(t, 2)
        elif plan.answered(t, refused=outcome == "refuse", suggest_which_broker_id=0, now_ms=2):
            return asked, f"served by {t.broker_id}"
        else:
            end = "refused"
    return asked, end


@pytest.mark.parametrize(
    ("members", "outcomes", "down", "refused", "asked", "end"),
    [
        # master up: one request
        (TWO, {0: "serve"}, [], [], [0], "served by 0"),
        # master unreachable: the slave in the same pull; it serves (master link down) or refuses (link up)
        (TWO, {0: "fail", 1: "serve"}, [], [], [0, 1], "served by 1"),
        (TWO, {0: "fail", 1: "refuse"}, [], [], [0, 1], "refused"),
        (TWO, {0: "fail", 1: "fail"}, [], [], [0, 1], "error"),
        # master marked down: the slave; its refusal sends the pull on to the master at once
        (TWO, {1: "refuse", 0: "serve"}, [0], [], [1, 0], "served by 0"),
        (TWO, {1: "refuse", 0: "fail"}, [0], [], [1, 0], "refused"),
        # master marked down and the slave refused lately: the master first, the slave only as the fallback
        (TWO, {0: "serve"}, [0], [1], [0], "served by 0"),
        (TWO, {0: "fail", 1: "refuse"}, [0], [1], [0, 1], "refused"),
        (TWO, {0: "fail", 1: "serve"}, [0], [1], [0, 1], "served by 1"),
        # a slave that did not refuse beats one that did, first choice and fallback alike
        (THREE, {2: "serve"}, [0], [1], [2], "served by 2"),
        (THREE, {0: "fail", 2: "serve"}, [], [1], [0, 2], "served by 2"),
        # the master is not in the route: a refusal has nowhere to send the pull
        ({1: S1}, {1: "refuse"}, [], [], [1], "refused"),
        ({}, {}, [], [], [], "no plan"),
    ],
)
def test_pull_plan(members, outcomes, down, refused, asked, end) -> None:
    assert run_plan(members, outcomes, down=down, refused=refused) == (asked, end)


@pytest.mark.parametrize(
    ("wanted", "outcomes", "asked", "end"),
    [
        (1, {1: "refuse"}, [1], "refused"),   # pinned: the refusal is the answer, no redirect
        (0, {0: "fail"}, [0], "error"),       # pinned: no fallback
        (1, {1: "serve"}, [1], "served by 1"),
    ],
)
def test_pull_plan_pinned(wanted, outcomes, asked, end) -> None:
    assert run_plan(TWO, outcomes, down=[1], refused=[1], wanted=wanted, pinned=True) == (asked, end)


def test_pull_plan_records_what_it_learned() -> None:
    table = BrokerDownTable(isolation_ms=5000)
    # the master was marked down; the slave refused, the master then served: master up, slave a refuser
    assert run_plan(TWO, {1: "refuse", 0: "serve"}, down=[0], table=table) == ([1, 0], "served by 0")
    assert not table.is_down("broker-a", 0, 3) and table.has_refused("broker-a", 1, 3)
    # the next pulls (the master's suggestion is 0) go to the master, not back to the slave
    assert run_plan(TWO, {0: "serve"}, table=table) == ([0], "served by 0")
    # the master fails again, the refusing slave is still tried once: it serves (its master link dropped)
    assert run_plan(TWO, {0: "fail", 1: "serve"}, table=table) == ([0, 1], "served by 1")
    assert table.is_down("broker-a", 0, 3) and not table.has_refused("broker-a", 1, 3)


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
