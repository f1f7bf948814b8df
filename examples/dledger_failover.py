"""DLedger failover: SIGKILL the leader of a Raft broker group while a producer sends; a follower takes the writes.

    python examples/dledger_failover.py --messages 400

Starts a throw-away local cluster whose broker group ``broker-a`` is a DLedger group of three members
(docs/DLEDGER.md): the elected leader is the group's master (broker id 0), the others its slaves. Every send
waits until two of the three members hold it, so a message acknowledged with SEND_OK survives the leader's
death. With heartbeats every 500 ms the followers notice a dead leader after 1.5 s and elect a new one among
themselves; the producer finds it in the nameserver's route and carries on. The old leader, restarted, rejoins
as a follower and catches up. At the end every message is read back and checked against the acknowledgements.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from client import Admin, Message, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import ClientError
from common.codec import decode_offset_msg_id

TOPIC = "RaftFailoverTopic"
GROUP = "broker-a"
#: The leader's heartbeat period: followers campaign after 3 silent periods (maxHeartBeatLeak), 1.5 s here.
BROKER_CONFIG = {"heartBeatTimeIntervalMs": "500"}
#: Bound on any single wait of this example (an election, a restart, catching up).
WAIT_S = 30.0


def show(admin: Admin, label: str) -> dict[int, dict[str, Any]]:
    """Print each member of the group as the nameserver's route gives it (id 0 = the leader serving as master)."""
    status = admin.dledger_status(GROUP)
    print(f"{label}:")
    leader = next((st for st in status.values() if st.get("role") == "LEADER"), {})
    lag = {peer: p["lag"] for peer, p in (leader.get("peerProgress") or {}).items()}
    seen = set()
    for bid, st in sorted(status.items()):
        if "error" in st:
            print(f"  id {bid}: not answering ({st['addr']}: crashed, still in the route until it expires)")
            continue
        seen.add(st["selfId"])
        print(f"  {st['selfId']} id {bid}: {st['role']:<9} term {st['term']}, end index {st['ledgerEndIndex']}, "
              f"committed {st['committedIndex']}, lag {lag.get(st['selfId'], '-')}")
    # A member that is not in the route only shows in the others' peer lists.
    peers = set().union(*(st.get("peers", {}) for st in status.values()))
    for peer in sorted(peers - seen):
        print(f"  {peer}: not in the route (down), lag {lag.get(peer, '-')}")
    return status


class SteadyProducer(threading.Thread):
    """Sends ``seq 0``, ``seq 1``, ... one at a time; records which were acknowledged and where they were stored.

    It sends ``count`` messages at least, and goes on after them until a broker other than the killed leader has
    acknowledged one sent after the kill (:meth:`killed`): the kill comes while it sends, however fast it sends.
    """

    def __init__(self, namesrv: str, count: int) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.namesrv = namesrv
        self.count = count
        self.acked: dict[int, str] = {}
        """seq -> the address of the broker that stored it (from its offset msgId)."""
        self.acked_at: dict[int, float] = {}
        self.sent = 0
        """Messages sent (``seq`` 0 to ``sent - 1``)."""
        self.retries = 0
        self.error: BaseException | None = None
        self.progress = threading.Condition()
        self._killed: tuple[str, float] | None = None

    def killed(self, addr: str, at: float) -> None:
        """The leader at ``addr`` was killed at ``at`` (``time.monotonic``)."""
        with self.progress:
            self._killed = (addr, at)

    def moved(self) -> list[tuple[float, int]]:
        """``(acknowledged at, seq)`` of the sends a broker other than the killed leader acknowledged after the kill,
        in order."""
        with self.progress:
            if self._killed is None:
                return []
            addr, at = self._killed
            return sorted((t, seq) for seq, t in self.acked_at.items() if t > at and self.acked[seq] != addr)

    def run(self) -> None:
        try:
            # send_timeout_s: a send that meets the election waits for the new leader to register, up to this.
            with Producer("raft-failover-producer", self.namesrv, send_timeout_s=10.0) as producer:
                for seq in range(self.count):
                    self._send(producer, seq)
                    self.sent += 1
                deadline = time.monotonic() + WAIT_S
                while not self.moved() and time.monotonic() < deadline:  # the kill came after the last of them
                    self._send(producer, self.sent)
                    self.sent += 1
        except BaseException as e:  # reported by main()
            self.error = e
        finally:
            with self.progress:
                self.progress.notify_all()

    def _send(self, producer: Producer, seq: int) -> None:
        deadline = time.monotonic() + WAIT_S
        msg = Message(TOPIC, f"seq {seq}".encode())  # one object: a re-send of it is the same message
        while True:
            try:
                result = producer.send(msg)
                break
            except ClientError as e:
                # The SDK rides through a leader change by itself within send_timeout_s; a send that still fails
                # (an election longer than that) is sent again here. The producer is idempotent (the default): a
                # message the dying leader stored without answering is answered by the new leader from its
                # duplicate window, not stored twice (docs/GUIDE.md, "Idempotent sends").
                if time.monotonic() > deadline:
                    raise
                self.retries += 1
                print(f"  send of seq {seq} failed during the election ({type(e).__name__}); sending it again")
                time.sleep(0.2)
        with self.progress:
            self.acked[seq] = decode_offset_msg_id(result.offset_msg_id)[0]
            self.acked_at[seq] = time.monotonic()
            self.progress.notify_all()

    def wait_acked(self, n: int) -> None:
        """Until ``n`` sends were acknowledged (or the thread ended)."""
        with self.progress:
            if not self.progress.wait_for(lambda: len(self.acked) >= n or not self.is_alive(), WAIT_S):
                raise SystemExit(f"only {len(self.acked)} of {n} sends acknowledged within {WAIT_S} s")


def wait_rejoined(admin: Admin, peer: str) -> None:
    """Until ``peer`` follows the leader again and has every entry (the leader's lag for it is 0)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            status = admin.dledger_status(GROUP)
        except ClientError:
            status = {}
        roles = {st.get("selfId"): st.get("role") for st in status.values()}
        leader = status.get(0, {})
        if roles.get(peer) == "FOLLOWER" and (leader.get("peerProgress") or {}).get(peer, {}).get("lag") == 0:
            return
        time.sleep(0.1)  # polling the members with a deadline
    raise SystemExit(f"{peer} did not rejoin as a caught-up follower within {WAIT_S} s")


def read_all(namesrv: str) -> list[int]:
    """Every ``seq`` stored in the topic, from each queue's first offset to its end."""
    seqs: list[int] = []
    with PullConsumer("raft-failover-reader", namesrv) as consumer:
        for mq in sorted(consumer.fetch_subscribe_message_queues(TOPIC)):
            offset, end = consumer.min_offset(mq), consumer.max_offset(mq)
            while offset < end:
                r = consumer.pull(mq, offset, max_nums=32)
                if r.pull_status is PullStatus.FOUND:
                    seqs += [int(m.body.split()[1]) for m in r.msg_found_list]
                elif r.next_begin_offset == offset:
                    raise SystemExit(f"{mq}: pull at {offset} answered {r.pull_status.name}, end is {end}")
                offset = r.next_begin_offset
    return seqs


def wait_topic_on_every_member(cluster: LocalCluster) -> None:
    """Until every member of the group knows TOPIC. Topics reach followers by the metadata sync from the leader,
    not through the Raft log, and a send never creates a topic (``autoCreateTopicEnable`` is off): a follower
    elected before it has the topic would refuse the sends (TOPIC_NOT_EXIST)."""
    deadline = time.monotonic() + WAIT_S
    for member in cluster.members(GROUP):
        while True:
            try:
                with urllib.request.urlopen(f"http://{member.addr}/topics", timeout=5) as resp:
                    if TOPIC in json.loads(resp.read())["topicConfigTable"]:
                        break
            except OSError:
                pass  # a member still starting: asked again below
            if time.monotonic() > deadline:
                raise SystemExit(f"dledger_failover: member {member.addr} did not get topic {TOPIC} within {WAIT_S} s")
            time.sleep(0.1)
    print(f"topic {TOPIC} is on every member (a follower elected later must know it)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=200, metavar="N",
                   help="how many messages to send at least (default 200; the leader is killed after half of them, "
                        "and the producer goes on until the new leader has taken one)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="splitmq-raft-") as root, \
            LocalCluster(root, mode="dledger", peers_per_group=3, broker_config=BROKER_CONFIG) as cluster, \
            Admin(cluster.namesrv_addr) as admin:
        old = cluster.leader(GROUP)
        print(f"started a 3-member DLedger group {GROUP}; nameserver {cluster.namesrv_addr}")
        admin.create_topic(TOPIC, queue_nums=4)
        wait_topic_on_every_member(cluster)
        show(admin, "before the kill")

        producer = SteadyProducer(cluster.namesrv_addr, args.messages)
        producer.start()
        producer.wait_acked(args.messages // 2)
        killed = cluster.kill_master(GROUP)  # SIGKILL while the producer keeps sending
        killed_at = time.monotonic()
        producer.killed(killed.addr, killed_at)
        old_peer = f"n{killed.broker_id}"
        print(f"killed the leader {old_peer} ({old.addr}) after {len(producer.acked)} acknowledged sends")

        producer.join(WAIT_S * 2)
        if producer.error is not None or producer.is_alive():
            raise SystemExit(f"the producer did not finish: {producer.error!r}")
        moved = producer.moved()
        if not moved:
            raise SystemExit("no send was acknowledged by a new leader")
        took = moved[0][0] - killed_at
        new = cluster.leader(GROUP)
        print(f"the new leader n{new.broker_id} ({new.addr}) acknowledged its first send {took:.2f} s after the kill")
        show(admin, "after the kill")

        killed.start()  # same store, same ports
        wait_rejoined(admin, old_peer)
        show(admin, f"after restarting {old_peer}")

        seqs = read_all(cluster.namesrv_addr)
        missing = sorted(set(producer.acked) - set(seqs))
        duplicates = len(seqs) - len(set(seqs))
        print(f"read back {len(seqs)} messages: {len(set(producer.acked))} acknowledged, {len(missing)} of them "
              f"missing {missing[:10]}, {duplicates} duplicate(s) (the producer is idempotent: a send the dying "
              f"leader stored without answering is answered by the new leader, not stored again)")
    print(f"dledger_failover: the new leader took writes {took:.2f} s after the kill; {len(producer.acked)} of "
          f"{producer.sent} messages acknowledged and read back, {len(missing)} missing; {old_peer} rejoined as a "
          f"follower")
    return 0 if not missing else 1


if __name__ == "__main__":
    sys.exit(main())
