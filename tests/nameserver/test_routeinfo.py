"""Table tests of the pure route table (docs/BEHAVIOUR.md sections 2.2, 3.5, 6.3, 6.4, 6.5)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.route import BrokerData, DataVersion, QueueData, TopicConfig, TopicRouteData
from nameserver.routeinfo import BrokerLiveInfo, RegisterResult, RouteInfo

A0, A1, A2 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
B0, B1 = "10.0.1.1:10911", "10.0.1.2:10911"
HA = {A0: "10.0.0.1:10912", A1: "10.0.0.2:10912", A2: "10.0.0.3:10912", B0: "10.0.1.1:10912", B1: "10.0.1.2:10912"}
V1, V2 = DataVersion(1, 1), DataVersion(2, 2)
EXPIRY = 120_000


def topics(*names: str, rq: int = 4, wq: int = 4, perm: int = 6) -> list[TopicConfig]:
    return [TopicConfig(n, rq, wq, perm) for n in names]


def reg(ri: RouteInfo, addr: str, name: str, bid: int, tcs: list[TopicConfig] | None = None,
        dv: DataVersion = V1, now: int = 0, cluster: str = "DefaultCluster") -> RegisterResult:
    result = ri.register_broker(cluster, addr, name, bid, HA[addr], tcs, dv, now)
    ri.check_invariants()
    return result


def route_of(ri: RouteInfo, topic: str) -> TopicRouteData:
    route = ri.get_route(topic)
    assert route is not None, f"no route for {topic}"
    return route


def addrs(ri: RouteInfo, topic: str, name: str) -> dict[int, str] | None:
    bd = route_of(ri, topic).broker_data(name)
    return None if bd is None else dict(bd.broker_addrs)


# ---------------------------------------------------------------------- registration


def test_master_registration_creates_route_and_returns_empty_result() -> None:
    ri = RouteInfo()
    assert reg(ri, A0, "broker-a", 0, topics("T1", "T2")) == RegisterResult(None, None)
    route = ri.get_route("T1")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0),)
    assert route.broker_datas == (BrokerData("DefaultCluster", "broker-a", {0: A0}),)
    assert ri.topic_list() == ["T1", "T2"]


@pytest.mark.parametrize(
    ("master_present", "master_expired", "expected"),
    [
        (True, False, RegisterResult(A0, HA[A0])),
        (False, False, RegisterResult(None, None)),
        (True, True, RegisterResult(None, None)),
    ],
    ids=["master-live", "no-master", "master-expired"],
)
def test_slave_gets_master_only_when_master_is_live(
    master_present: bool, master_expired: bool, expected: RegisterResult
) -> None:
    ri = RouteInfo()
    if master_present:
        reg(ri, A0, "broker-a", 0, topics("T"), now=0)
    now = EXPIRY + 1 if master_expired else 1000
    if master_expired:
        reg(ri, A1, "broker-a", 1, now=now - 10)  # slave keeps itself alive
        assert ri.scan_not_active_brokers(now, EXPIRY) == [A0]
    assert reg(ri, A1, "broker-a", 1, topics("T"), now=now) == expected


def test_slave_never_creates_queue_data() -> None:
    ri = RouteInfo()
    reg(ri, A1, "broker-a", 1, topics("SLAVE_ONLY"))
    assert ri.get_route("SLAVE_ONLY") is None
    assert ri.topic_list() == []
    reg(ri, A0, "broker-a", 0, topics("T", perm=6))
    reg(ri, A1, "broker-a", 1, topics("T", rq=99, wq=99, perm=4), dv=V2)
    route = ri.get_route("T")
    assert route is not None and route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0),)
    assert ri.get_route("SLAVE_ONLY") is None


@pytest.mark.parametrize(
    ("second_version", "second_addr", "expect_queue_nums"),
    [
        (V1, A0, 4),   # same version, same address: the topic table is not re-read
        (V2, A0, 16),  # new version: re-read
        (V1, A2, 16),  # another process took id 0: first registration of that address, re-read
    ],
    ids=["same-version", "new-version", "new-master-address"],
)
def test_master_queue_data_updates_only_on_version_change_or_first_registration(
    second_version: DataVersion, second_addr: str, expect_queue_nums: int
) -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"), dv=V1)
    reg(ri, second_addr, "broker-a", 0, topics("T", rq=16, wq=16), dv=second_version, now=5)
    route = ri.get_route("T")
    assert route is not None
    assert route.queue_datas[0].read_queue_nums == expect_queue_nums
    assert route.queue_datas[0].write_queue_nums == expect_queue_nums


def test_master_registration_without_topics_keeps_queue_data() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    reg(ri, A0, "broker-a", 0, None, dv=V2)
    assert ri.topic_list() == ["T"]


def test_role_switch_on_same_address_removes_old_id() -> None:
    ri = RouteInfo()
    reg(ri, A1, "broker-a", 1)
    reg(ri, A1, "broker-a", 0, topics("T"))
    assert addrs(ri, "T", "broker-a") == {0: A1}


def test_new_address_under_same_id_drops_old_address_from_live_table() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    reg(ri, A2, "broker-a", 0, topics("T"))
    assert addrs(ri, "T", "broker-a") == {0: A2}
    assert set(ri.cluster_info().broker_live_table) == {A2}


def test_group_moving_to_another_cluster_leaves_the_old_one() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"), cluster="c1")
    reg(ri, B0, "broker-b", 0, topics("T"), cluster="c1")
    reg(ri, A0, "broker-a", 0, topics("T"), cluster="c2")
    assert dict(ri.cluster_info().cluster_addr_table) == {"c1": ("broker-b",), "c2": ("broker-a",)}


# ---------------------------------------------------------------------- unregister and expiry


def test_unregister_master_keeps_queue_data_while_slave_remains() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T", perm=6))
    reg(ri, A1, "broker-a", 1)
    assert ri.unregister_broker("DefaultCluster", A0, "broker-a", 0) is True
    ri.check_invariants()
    route = ri.get_route("T")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0),)
    assert addrs(ri, "T", "broker-a") == {1: A1}
    assert ri.unregister_broker("DefaultCluster", A1, "broker-a", 1) is True
    ri.check_invariants()
    assert ri.get_route("T") is None
    assert ri.topic_list() == []
    info = ri.cluster_info()
    assert dict(info.broker_addr_table) == {} and dict(info.cluster_addr_table) == {}
    assert dict(info.broker_live_table) == {}


def test_unregister_unknown_broker_is_harmless() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    assert ri.unregister_broker("DefaultCluster", A2, "broker-a", 0) is False
    assert ri.unregister_broker("DefaultCluster", A0, "broker-zzz", 0) is False
    ri.check_invariants()
    assert addrs(ri, "T", "broker-a") == {0: A0}


def test_late_goodbye_of_old_master_does_not_remove_new_master() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    reg(ri, A2, "broker-a", 0, topics("T"))
    ri.unregister_broker("DefaultCluster", A0, "broker-a", 0)
    ri.check_invariants()
    assert addrs(ri, "T", "broker-a") == {0: A2}


def test_removing_one_group_keeps_topic_on_the_other() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T", "ONLY_A"))
    reg(ri, B0, "broker-b", 0, topics("T"))
    ri.unregister_broker("DefaultCluster", A0, "broker-a", 0)
    ri.check_invariants()
    route = ri.get_route("T")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert [b.broker_name for b in route.broker_datas] == ["broker-b"]
    assert ri.get_route("ONLY_A") is None


def test_expiry_boundary_is_strict() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"), now=1000)
    assert ri.scan_not_active_brokers(1000 + EXPIRY, EXPIRY) == []
    assert ri.scan_not_active_brokers(1000 + EXPIRY + 1, EXPIRY) == [A0]
    ri.check_invariants()
    assert ri.get_route("T") is None


def test_master_expired_slave_alive_keeps_queue_data_and_perm() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T", perm=6), now=0)
    reg(ri, A1, "broker-a", 1, now=0)
    reg(ri, B0, "broker-b", 0, topics("T"), now=0)
    now = EXPIRY + 1
    reg(ri, A1, "broker-a", 1, now=now - 1)
    reg(ri, B0, "broker-b", 0, topics("T"), now=now - 1)
    assert ri.scan_not_active_brokers(now, EXPIRY) == [A0]
    ri.check_invariants()
    route = ri.get_route("T")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0), QueueData("broker-b", 4, 4, 6, 0))
    assert addrs(ri, "T", "broker-a") == {1: A1}
    # The master comes back: queue data is re-read (first registration of its id) and id 0 reappears.
    assert reg(ri, A0, "broker-a", 0, topics("T"), now=now) == RegisterResult()
    assert addrs(ri, "T", "broker-a") == {0: A0, 1: A1}
    assert reg(ri, A1, "broker-a", 1, now=now) == RegisterResult(A0, HA[A0])


def test_expiry_of_whole_group_removes_group_topics_and_cluster() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"), now=0)
    reg(ri, A1, "broker-a", 1, now=10)
    assert ri.scan_not_active_brokers(EXPIRY + 11, EXPIRY) == [A0, A1]
    ri.check_invariants()
    assert ri.get_route("T") is None
    assert ri.topic_list() == []
    assert dict(ri.cluster_info().cluster_addr_table) == {}
    assert ri.live_broker_count() == 0


# ---------------------------------------------------------------------- write permission


def test_wipe_and_add_write_perm() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T1", "T2", perm=6) + topics("RO", perm=4))
    reg(ri, B0, "broker-b", 0, topics("T1", perm=6))
    assert ri.wipe_write_perm("broker-a") == 3
    perms = {t: route_of(ri, t).queue_datas for t in ("T1", "T2", "RO")}
    assert [q.perm for q in perms["T1"]] == [4, 6]  # broker-b untouched
    assert [q.perm for q in perms["T2"]] == [4]
    assert [q.perm for q in perms["RO"]] == [4]
    # An unchanged data version does not restore the perm on re-registration (4.9.3).
    reg(ri, A0, "broker-a", 0, topics("T1", "T2", perm=6) + topics("RO", perm=4), now=5)
    assert route_of(ri, "T2").queue_datas[0].perm == 4
    assert ri.add_write_perm("broker-a") == 3
    assert route_of(ri, "RO").queue_datas[0].perm == 6
    assert route_of(ri, "T1").queue_datas[0].perm == 6
    assert ri.wipe_write_perm("broker-none") == 0
    assert ri.add_write_perm("broker-none") == 0


# ---------------------------------------------------------------------- snapshots


def test_cluster_info_json_shape() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"), now=7)
    reg(ri, A1, "broker-a", 1, now=8)
    assert ri.cluster_info().to_json() == {
        "brokerAddrTable": {"broker-a": {"cluster": "DefaultCluster", "brokerName": "broker-a",
                                         "brokerAddrs": {"0": A0, "1": A1}}},
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
        "brokerLiveTable": {A0: {"lastUpdateTimestamp": 7, "haServerAddr": HA[A0]},
                            A1: {"lastUpdateTimestamp": 8, "haServerAddr": HA[A1]}},
    }
    assert ri.cluster_info().broker_live_table[A0] == BrokerLiveInfo(7, V1, HA[A0])


def test_route_snapshot_is_not_changed_by_later_operations() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    reg(ri, A1, "broker-a", 1)
    before = ri.get_route("T")
    ri.unregister_broker("DefaultCluster", A0, "broker-a", 0)
    ri.wipe_write_perm("broker-a")
    assert before is not None
    assert dict(before.broker_datas[0].broker_addrs) == {0: A0, 1: A1}
    assert before.queue_datas[0].perm == 6


def test_check_invariants_detects_corruption() -> None:
    ri = RouteInfo()
    reg(ri, A0, "broker-a", 0, topics("T"))
    ri._clusters["ghost"] = {"broker-a"}
    with pytest.raises(AssertionError, match="cluster table"):
        ri.check_invariants()


# ---------------------------------------------------------------------- property test

GROUPS = {"broker-a": [A0, A1, A2], "broker-b": [B0, B1]}
CLUSTERS = ["c1", "c2"]
TOPIC_NAMES = ["T1", "T2", "T3"]

op_register = st.tuples(
    st.just("register"), st.sampled_from(CLUSTERS), st.sampled_from(sorted(GROUPS)), st.integers(0, 2),
    st.integers(0, 2), st.lists(st.sampled_from(TOPIC_NAMES), unique=True), st.integers(0, 3),
    st.integers(0, 60_000),
)
op_unregister = st.tuples(st.just("unregister"), st.sampled_from(sorted(GROUPS)), st.integers(0, 2))
op_expire = st.tuples(st.just("expire"), st.integers(0, 200_000))
op_perm = st.tuples(st.sampled_from(["wipe", "add"]), st.sampled_from(sorted(GROUPS)))
ops = st.lists(st.one_of(op_register, op_unregister, op_expire, op_perm), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_random_operation_sequences_keep_invariants(sequence: list[tuple[Any, ...]]) -> None:
    ri = RouteInfo()
    now = 0
    for op in sequence:
        kind = op[0]
        if kind == "register":
            _, cluster, name, addr_i, bid, names, version, dt = op
            now += dt
            addr = GROUPS[name][addr_i % len(GROUPS[name])]
            result = ri.register_broker(cluster, addr, name, bid, HA[addr], topics(*names),
                                        DataVersion(version, version), now)
            live = ri.cluster_info().broker_live_table
            master = ri.cluster_info().broker_addr_table[name].master_addr
            if bid == 0 or master is None or master not in live:
                assert result == RegisterResult()
            else:
                assert result == RegisterResult(master, live[master].ha_server_addr)
        elif kind == "unregister":
            _, name, addr_i = op
            addr = GROUPS[name][addr_i % len(GROUPS[name])]
            ri.unregister_broker("c1", addr, name, 0)
        elif kind == "expire":
            now += op[1]
            expired = ri.scan_not_active_brokers(now, EXPIRY)
            live = ri.cluster_info().broker_live_table
            assert not set(expired) & set(live)
            assert all(info.last_update_ms + EXPIRY >= now for info in live.values())
        else:
            _, name = op
            n = ri.wipe_write_perm(name) if kind == "wipe" else ri.add_write_perm(name)
            holding = [t for t in ri.topic_list() if name in {q.broker_name for q in route_of(ri, t).queue_datas}]
            assert n == len(holding)
        ri.check_invariants()
        for t in ri.topic_list():
            route = ri.get_route(t)
            assert route is not None, f"topic {t} listed without a route"
            assert {q.broker_name for q in route.queue_datas} == {b.broker_name for b in route.broker_datas}
            assert all(b.broker_addrs for b in route.broker_datas)
