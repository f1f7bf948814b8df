"""``Admin.dledger_status`` and ``Admin.transfer_leadership`` against a real 3-peer DLedger group on loopback.

One group (heartbeats every 500 ms) serves the module; each test finds the current leader itself, so the order
of the tests does not matter. docs/BEHAVIOUR.md 9.8: the leader registers id 0, follower ``nN`` id ``N + 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from client import Admin, Message, Producer
from client.cluster import BrokerHandle, LocalCluster
from client.errors import BrokerNotFoundError, InvalidParameterError, ServiceNotAvailableError
from common import codec
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

GROUP = "broker-a"
PEERS = ["n0", "n1", "n2"]


@pytest.fixture(scope="module")
def raft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("raft"), mode="dledger", peers_per_group=3,
                     broker_config={"heartBeatTimeIntervalMs": "500"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def admin(raft: LocalCluster) -> Iterator[Admin]:
    with Admin(raft.namesrv_addr) as adm:
        yield adm


def settled(adm: Admin, members: int = 3) -> dict[int, dict[str, Any]] | None:
    """The group's status once ``members`` members answer, one leads at id 0 and every other follows it in its
    term at id N + 1 (route registrations land a moment after a role change)."""
    status = adm.dledger_status(GROUP)
    answered = {bid: st for bid, st in status.items() if "error" not in st}
    if len(answered) != members or answered.get(0, {}).get("role") != "LEADER":
        return None
    leader = answered[0]
    for bid, st in answered.items():
        if bid != 0 and (st["role"] != "FOLLOWER" or st["leaderId"] != leader["selfId"]
                         or st["term"] != leader["term"] or bid != int(st["selfId"][1:]) + 1):
            return None
    return answered


def wait_settled(adm: Admin, members: int = 3) -> dict[int, dict[str, Any]]:
    return poll_until(lambda: settled(adm, members), 30, f"{members} members of {GROUP} settled under one leader",
                      ignore=(Exception,))


def member(raft: LocalCluster, peer: str) -> BrokerHandle:
    return raft.broker(GROUP, int(peer[1:]))


def test_status_gives_each_member_by_its_registered_id(admin: Admin) -> None:
    status = wait_settled(admin)
    leader = status[0]
    assert sorted(st["selfId"] for st in status.values()) == PEERS
    assert sorted(leader["peers"]) == PEERS
    assert (leader["brokerId"], leader["brokerRole"], leader["leaderId"]) == (0, "SYNC_MASTER", leader["selfId"])
    for bid, st in status.items():
        assert st["group"] == GROUP and st["brokerName"] == GROUP and st["brokerId"] == bid
        assert st["ledgerEndIndex"] >= st["committedIndex"] >= -1
        if bid:
            assert st["brokerRole"] == "SLAVE" and st["peerProgress"] == {}
    followers = sorted(st["selfId"] for bid, st in status.items() if bid)
    assert set(followers) <= set(leader["peerProgress"])


def test_transfer_moves_the_master_and_the_next_send_goes_there(raft: LocalCluster, admin: Admin) -> None:
    before = wait_settled(admin)[0]
    target = next(p for p in PEERS if p != before["selfId"])
    new = admin.transfer_leadership(GROUP, target)
    assert (new["selfId"], new["role"], new["brokerId"]) == (target, "LEADER", 0)
    assert new["term"] > before["term"]
    assert admin.cluster_info().master_addrs()[GROUP] == new["addr"] == member(raft, target).addr

    admin.create_topic("AdminRaftTransfer", queue_nums=2)
    with Producer("admin-raft-transfer", raft.namesrv_addr) as producer:
        result = producer.send(Message("AdminRaftTransfer", b"after the transfer"))
    assert codec.decode_offset_msg_id(result.offset_msg_id)[0] == new["addr"]

    again = admin.transfer_leadership(GROUP, target)  # the leader itself: nothing moves
    assert (again["selfId"], again["term"]) == (target, new["term"])
    old = wait_settled(admin)
    assert old[int(before["selfId"][1:]) + 1]["leaderId"] == target


def test_unknown_group_peer_and_classic_group_are_clear_errors(
        admin: Admin, cluster_factory: Callable[..., LocalCluster]) -> None:
    with pytest.raises(BrokerNotFoundError, match="broker-x"):
        admin.dledger_status("broker-x")
    with pytest.raises(BrokerNotFoundError, match="broker-x"):
        admin.transfer_leadership("broker-x", "n1")
    wait_settled(admin)
    with pytest.raises(InvalidParameterError, match=r"'n7' is not a member of DLedger group broker-a "
                                                    r"\(peers: n0, n1, n2\)"):
        admin.transfer_leadership(GROUP, "n7")

    classic = cluster_factory(slaves_per_group=0)
    with Admin(classic.namesrv_addr) as other:
        with pytest.raises(InvalidParameterError, match="not in DLedger mode"):
            other.dledger_status(GROUP)
        with pytest.raises(InvalidParameterError, match="not in DLedger mode"):
            other.transfer_leadership(GROUP, "n1")


def test_a_member_down_shows_as_an_error_or_is_missing_and_rejoins(raft: LocalCluster, admin: Admin) -> None:
    status = wait_settled(admin)
    leader = status[0]
    bid, follower = max((b, st) for b, st in status.items() if b)
    peer = follower["selfId"]
    handle = member(raft, peer)

    handle.kill()  # a crash: the nameserver keeps the member in the route until it expires
    crashed = admin.dledger_status(GROUP)
    assert "error" in crashed[bid] and crashed[bid]["addr"] == handle.addr

    handle.start()
    wait_settled(admin)
    handle.stop()  # a clean stop unregisters: the member leaves the route, only the peer lists still name it

    def without_it() -> dict[int, dict[str, Any]] | None:
        now = admin.dledger_status(GROUP)
        return now if bid not in now else None

    gone = poll_until(without_it, 10, f"{peer} leaving the route")
    assert sorted(st["selfId"] for st in gone.values()) == sorted(set(PEERS) - {peer})
    assert peer in gone[0]["peers"]

    with pytest.raises(ServiceNotAvailableError, match=f"{peer} of broker group {GROUP} is not registered"):
        admin.transfer_leadership(GROUP, peer)
    admin.create_topic("AdminRaftDown", queue_nums=1)
    with Producer("admin-raft-down", raft.namesrv_addr) as producer:
        for i in range(5):
            producer.send(Message("AdminRaftDown", b"m%d" % i))
    lag = admin.dledger_status(GROUP)[0]["peerProgress"][peer]["lag"]
    assert lag >= 5, admin.dledger_status(GROUP)[0]

    handle.start()
    back = wait_settled(admin)
    assert back[bid]["selfId"] == peer and back[0]["selfId"] == leader["selfId"]
    poll_until(lambda: admin.dledger_status(GROUP)[0]["peerProgress"][peer]["lag"] == 0, 10,
               f"{peer} catching up with the leader")


def test_a_transfer_is_bounded_by_its_timeout_ms(raft: LocalCluster, admin: Admin) -> None:
    """``POST /dledger/transfer`` honours ``timeoutMs`` (Admin.transfer_leadership passes what is left of its
    ``timeout_s``): a transfer to a member that can't take over fails within it, not after the default 5 s."""
    leader = wait_settled(admin)[0]
    follower = max((b, st) for b, st in wait_settled(admin).items() if b)[1]
    peer, handle = follower["selfId"], member(raft, follower["selfId"])
    handle.kill()  # still one of the leader's peers: the transfer waits for a catch-up that can't come
    try:
        admin.create_topic("AdminRaftBound", queue_nums=1)
        with Producer("admin-raft-bound", raft.namesrv_addr) as producer:
            producer.send(Message("AdminRaftBound", b"the dead member lacks this one"))
        url = f"http://{leader['addr']}/dledger/transfer"
        for bad in ("50", "60001", "soon"):
            r = httpx.post(url, params={"peer": peer, "timeoutMs": bad}, timeout=10)
            assert r.status_code == 400 and "timeoutMs" in r.text, (bad, r.status_code, r.text)
        t0 = time.monotonic()
        r = httpx.post(url, params={"peer": peer, "timeoutMs": "300"}, timeout=10)
        elapsed = time.monotonic() - t0
        assert r.status_code == 503 and f"{peer} did not catch up" in r.text and "within 0.3 s" in r.text, r.text
        assert elapsed < 2.5, elapsed
    finally:
        handle.start()
    assert wait_settled(admin)[0]["selfId"] == leader["selfId"]
