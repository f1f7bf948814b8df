"""DLedger broker groups as real processes (``LocalCluster(mode="dledger")``): election and route, write failover
under SIGKILL, no SEND_OK without a quorum, a restart of every member, reads across leader changes.

The long profiles (20 leader kills in a row, failover times) are in ``python -m benchmarks dledger``.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import pytest

from client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import BrokerHandle, LocalCluster
from client.errors import ClientError
from common.codec import encode_batch
from tests.ha.support import FAST, create_topic, get_json, poll_until

pytestmark = [pytest.mark.integration, pytest.mark.ha]

TOPIC = "Raft"
GROUP = "broker-a"
#: Fast elections: a follower campaigns after 3 x 500 ms without the leader.
QUICK = {**FAST, "heartBeatTimeIntervalMs": "500", "slaveReadEnable": "true"}


def dledger_cluster(factory: Any, **config: str) -> LocalCluster:
    return factory(mode="dledger", broker_config={**QUICK, **config}, commitlog_file_size_bytes=4 << 20)


def make_topic(cluster: LocalCluster, queue_nums: int) -> None:
    """Create ``TOPIC`` on the leader and wait until every member has it: topics reach the followers through the
    slave metadata sync, not through the log, so a leader elected before that would not know the topic."""
    create_topic(cluster, TOPIC, queue_nums=queue_nums)
    for b in cluster.members(GROUP):
        poll_until(lambda b=b: TOPIC in get_json(b.addr, "/topics")["topicConfigTable"] or None, 15,
                   f"{b} to have topic {TOPIC}")


def status(b: BrokerHandle) -> dict[str, Any]:
    obj = get_json(b.addr, "/dledger")
    assert isinstance(obj, dict)
    return obj


def route_addrs(cluster: LocalCluster) -> dict[int, str]:
    info = get_json(cluster.namesrv_addr.split(";")[0], "/cluster")
    return {int(k): v for k, v in info["brokerAddrTable"][GROUP]["brokerAddrs"].items()}


def expected_route(cluster: LocalCluster, leader: BrokerHandle) -> dict[int, str]:
    """docs/BEHAVIOUR.md 9.8: the leader is id 0, follower nN registers N + 1."""
    return {(0 if b is leader else b.broker_id + 1): b.addr for b in cluster.members(GROUP) if b.running()}


class Sender:
    """Sends single messages with unique keys in a thread; a failed send is retried (same key) until it is
    acknowledged, so every key that got SEND_OK is in ``acked``; duplicates can come only from those retries."""

    def __init__(self, namesrv: str) -> None:
        self.producer = Producer("pg", namesrv, send_timeout_s=2.0, retry_times_when_send_failed=0)
        self.producer.start()
        self.acked: list[str] = []
        self.errors = 0
        self.first_ok_after: dict[float, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            key = f"k{seq}"
            try:
                r = self.producer.send(Message(TOPIC, key.encode(), keys=key))
            except ClientError:
                self.errors += 1
                continue
            if r.send_status.name == "SEND_OK":
                self.acked.append(key)
                seq += 1

    def __enter__(self) -> Sender:
        self._thread.start()
        return self

    def wait_acked(self, n: int, timeout_s: float) -> None:
        have = len(self.acked)
        poll_until(lambda: len(self.acked) >= have + n or None, timeout_s, f"{n} more acknowledged sends")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.producer.close()


def keys_on(b: BrokerHandle, broker_id: int, namesrv: str) -> list[str]:
    """Every message key of ``TOPIC`` as stored by the member registered as ``broker_id``, queue by queue."""
    keys: list[str] = []
    with PullConsumer("reader", namesrv, connect_broker_by_user=True, default_broker_id=broker_id) as c:
        for mq in c.fetch_subscribe_message_queues(TOPIC):
            offset = 0
            while True:
                r = c.pull(mq, offset, max_nums=32)
                if r.pull_status is not PullStatus.FOUND:
                    assert r.pull_status is PullStatus.NO_NEW_MSG, (b, broker_id, mq, offset, r)
                    break
                assert all(m.broker_name == GROUP for m in r.msg_found_list)
                assert r.served_by_broker_id == broker_id
                keys += [k for m in r.msg_found_list for k in m.keys]
                offset = r.next_begin_offset
    return keys


def committed_bytes(b: BrokerHandle, upto: int) -> bytes:
    """The first ``upto`` bytes of the member's DLedger data files."""
    files = sorted((b.store_dir / f"dledger-n{b.broker_id}" / "data").iterdir(), key=lambda p: int(p.name))
    out = bytearray()
    for p in files:
        if len(out) >= upto:
            break
        out += p.read_bytes()[: upto - len(out)]
    return bytes(out)


def settle(cluster: LocalCluster) -> BrokerHandle:
    """Until one leader serves and every running member has committed and dispatched all of its log."""
    leader = cluster.leader(GROUP)
    cluster.wait_slave_caught_up(GROUP, timeout_s=20)
    poll_until(lambda: route_addrs(cluster) == expected_route(cluster, leader) or None, 15,
               "the route to show the leader as 0 and the followers as N + 1")
    return leader


def check_everything_everywhere(cluster: LocalCluster, acked: list[str]) -> None:
    """Every acknowledged key is readable from every member; the committed logs are byte-identical."""
    leader = settle(cluster)
    ids = {b: (0 if b is leader else b.broker_id + 1) for b in cluster.members(GROUP)}
    for b, bid in ids.items():
        keys = keys_on(b, bid, cluster.namesrv_addr)
        missing = set(acked) - set(keys)
        assert not missing, (f"{b} (id {bid}) lacks {len(missing)} of {len(acked)} acknowledged messages, e.g. "
                             f"{sorted(missing)[:5]}; it has {len(keys)}: {b.runtime()}")
    committed = min(int(status(b)["committedIndex"]) for b in ids)
    assert committed >= 0
    ends = {b: int(b.runtime()["commitLogMaxOffset"]) for b in ids}
    upto = min(ends.values())
    images = {b: committed_bytes(b, upto) for b in ids}
    assert len(set(images.values())) == 1, f"committed logs differ below {upto}"


def test_a_group_elects_one_leader_shown_as_the_master_in_the_route(cluster_factory) -> None:
    cluster = dledger_cluster(cluster_factory)
    leader = settle(cluster)
    roles = sorted(status(b)["role"] for b in cluster.members(GROUP))
    assert roles == ["FOLLOWER", "FOLLOWER", "LEADER"]
    assert leader.runtime()["role"] == "SYNC_MASTER"
    assert {b.runtime()["role"] for b in cluster.members(GROUP) if b is not leader} == {"SLAVE"}
    follower = next(b for b in cluster.members(GROUP) if b is not leader)
    r = httpx.post(f"http://{follower.addr}/send", params={"topic": TOPIC, "queueId": 0, "producerGroup": "pg"},
                   content=b"", timeout=5)
    assert r.status_code == 503 and r.json()["code"] == 14 and "SLAVE" in r.json()["remark"]
    metrics = httpx.get(f"http://{leader.addr}/metrics", timeout=5).text
    term = status(leader)["term"]
    assert any(line.startswith("splitmq_dledger_is_leader{") and line.endswith(" 1.0") for line in metrics.splitlines())
    assert any(line.startswith("splitmq_dledger_term{") and line.endswith(f" {float(term)}")
               for line in metrics.splitlines())
    assert sum(line.startswith("splitmq_dledger_peer_lag_entries{") for line in metrics.splitlines()) == 3
    assert f'node_id="{GROUP}-n{leader.broker_id}"' in metrics  # stable across elections


def test_every_acknowledged_message_survives_leader_kills(cluster_factory) -> None:
    cluster = dledger_cluster(cluster_factory)
    settle(cluster)
    make_topic(cluster, 2)
    with Sender(cluster.namesrv_addr) as sender:
        for _ in range(2):
            sender.wait_acked(50, 30)
            dead = cluster.kill_master(GROUP)
            sender.wait_acked(20, 30)  # acknowledged by a new leader
            dead.start()
        sender.wait_acked(20, 30)
    acked = sender.acked
    assert len(set(acked)) == len(acked)
    check_everything_everywhere(cluster, acked)


def test_without_a_quorum_a_send_fails_and_the_pending_bound_answers_at_once(cluster_factory) -> None:
    # Default heartbeats (2 s): the paused followers must not make the leader step down during the check.
    cluster = dledger_cluster(cluster_factory, heartBeatTimeIntervalMs="2000", maxWaitAckTimeMs="1000",
                              maxPendingRequestsNum="3")
    leader = settle(cluster)
    make_topic(cluster, 1)
    followers = [b for b in cluster.members(GROUP) if b is not leader]
    target = f"http://{leader.addr}/send"
    params = {"topic": TOPIC, "queueId": 0, "producerGroup": "pg"}
    # A plain producer: its three attempts at "alone" append three entries, which fill maxPendingRequestsNum (an
    # idempotent one's retries are answered from the first entry, which appends nothing more).
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=10, idempotent=False) as p:
        p.send(Message(TOPIC, b"before", keys="before"))
        for f in followers:
            f.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(ClientError) as e:
                p.send(Message(TOPIC, b"alone", keys="alone"))
            took = time.monotonic() - t0
            assert "quorum" in str(e.value) or "SYSTEM_BUSY" in str(e.value) or "busy" in str(e.value).lower()
            assert took < 3 * (1.0 + 0.5), took  # maxWaitAckTimeMs per attempt (1 + 2 retries), with slack
            results: list[tuple[int, bytes]] = []

            def one() -> None:
                body = encode_one(f"burst{threading.get_ident()}")
                r = httpx.post(target, params=params, content=body, timeout=10)
                results.append((r.status_code, r.content))

            threads = [threading.Thread(target=one) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(code != 200 for code, _ in results), results
            # past maxPendingRequestsNum=3 the leader answers at once, naming the bound (not after a quorum wait;
            # read from the answer, not a wall clock a loaded machine stretches)
            bounded = [body for code, body in results if b"maxPendingRequestsNum" in body]
            assert len(bounded) >= 3, results
        finally:
            for f in followers:
                f.resume()
        poll_until(lambda: (lambda st: st["committedIndex"] == st["ledgerEndIndex"])(status(leader)) or None, 15,
                   "the entries appended without a quorum to commit once the followers are back")
        p.send(Message(TOPIC, b"after", keys="after"))
    check_everything_everywhere(cluster, ["before", "after"])


def encode_one(key: str) -> bytes:
    """The wire form of a one-message send."""
    return encode_batch([Message(TOPIC, key.encode(), keys=key)], born_timestamp_ms=1)


def test_killing_every_member_mid_produce_loses_no_acknowledged_message(cluster_factory) -> None:
    cluster = dledger_cluster(cluster_factory)
    settle(cluster)
    make_topic(cluster, 2)
    with Sender(cluster.namesrv_addr) as sender:
        sender.wait_acked(100, 30)
        for b in cluster.members(GROUP):
            b.kill()
        for b in cluster.members(GROUP):
            b.start()
        sender.wait_acked(20, 30)
    check_everything_everywhere(cluster, sender.acked)
    for b in cluster.members(GROUP):  # across both lives of every member, one vote per term at most
        votes: dict[int, set[str]] = {}
        for m in re.finditer(r"voted for (\S+) in term (\d+)", b.log_path.read_text()):
            votes.setdefault(int(m.group(2)), set()).add(m.group(1))
        assert votes and all(len(v) == 1 for v in votes.values()), (b, votes)


def test_a_reader_gets_every_message_once_in_order_across_leader_changes(cluster_factory) -> None:
    cluster = dledger_cluster(cluster_factory, accessMessageInMemoryMaxRatio="0")
    leader = settle(cluster)
    make_topic(cluster, 1)
    got: list[int] = []
    served: set[int] = set()
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=10) as p, \
            PullConsumer("cg", cluster.namesrv_addr) as c:
        mq: MessageQueue = c.fetch_subscribe_message_queues(TOPIC)[0]
        offset = seq = 0
        for change in range(5):
            p.send_batch([Message(TOPIC, b"%d" % (seq + i)) for i in range(40)])
            seq += 40
            cluster.wait_slave_caught_up(GROUP, timeout_s=10)  # a follower serves what it knows is committed
            while len(got) < seq:
                r = c.pull(mq, offset, max_nums=16)
                if r.pull_status is PullStatus.FOUND:
                    got += [int(m.body) for m in r.msg_found_list]
                    served.add(r.served_by_broker_id)
                    offset = r.next_begin_offset
            others = [b for b in cluster.members(GROUP) if b is not leader]
            target = others[change % len(others)]
            # the subject is the reader, not how fast a loaded machine elects: a generous bound on the transfer
            r2 = httpx.post(f"http://{leader.addr}/dledger/transfer",
                            params={"peer": f"n{target.broker_id}", "timeoutMs": "20000"}, timeout=30)
            assert r2.status_code == 200, r2.text
            leader = cluster.leader(GROUP)
            assert leader is target
    assert got == list(range(seq))
    assert served - {0}, f"cold reads (accessMessageInMemoryMaxRatio=0) never moved to a follower: {served}"
