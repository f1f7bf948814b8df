"""A slave knows its master at once (issue 40, docs/HA.md "How a slave finds its master", docs/DLEDGER.md), against
real processes with the default ``registerNameServerPeriod`` (30 s):

* a SYNC pair started slave first (the slave takes its master's HA address from the nameserver, no
  ``haMasterAddress``): the first ``SEND_OK`` comes within 5 s of the master serving, not at the slave's next
  registration period (before: 28 s of ``SLAVE_NOT_AVAILABLE``);
* a DLedger follower, after its leader was SIGKILLed: its master address is the new leader's, and a topic created
  on the new leader reaches it, within 5 s of the election (before: the dead leader's address until the next
  registration, 20-28 s).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from client import Message, Producer, SendStatus
from client.cluster import BrokerHandle, LocalCluster
from client.errors import ClientError
from common.route import TopicConfig
from tests.ha.support import SMALL_FILES, create_topic, get_json, poll_until

pytestmark = [pytest.mark.integration, pytest.mark.ha]

#: Within this of its master serving (or of an election), a slave must have found it.
FOUND_WITHIN_S = 5.0
#: Bound of each wait below: long enough to see how late the registration period would have been.
LATE_S = 40.0

QUIET = {"messageIndexEnable": "false", "slaveReadEnable": "false"}


def test_sync_pair_started_slave_first_sends_ok_within_5s_of_the_master(cluster_factory: Any) -> None:
    cluster: LocalCluster = cluster_factory(
        slaves_per_group=1, mode="sync", commitlog_file_size_bytes=SMALL_FILES,
        # No haMasterAddress: the slave takes the master's HA address from the nameserver, as in a deployment.
        broker_config={**QUIET, "haMasterAddress": ""})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "SlaveFirst")
    master.stop()  # graceful: it leaves the nameserver
    slave.stop()
    slave.start()
    # The slave registered and was told there is no master.
    poll_until(lambda: slave.runtime()["registrationRounds"] >= 1, 10, "the restarted slave registered")
    assert slave.runtime()["masterAddr"] is None
    master.start()
    ready = time.monotonic()
    statuses: list[str] = []
    with Producer("pg", cluster.namesrv_addr, send_timeout_s=3.0, retry_times_when_send_failed=0) as p:

        def send_ok() -> bool:
            try:
                r = p.send(Message("SlaveFirst", b"first"))
            except ClientError as e:
                statuses.append(type(e).__name__)
                return False
            statuses.append(r.send_status.name)
            return r.send_status is SendStatus.SEND_OK

        poll_until(send_ok, LATE_S, "a SEND_OK from the SYNC_MASTER started after its slave", interval_s=0.05)
    took = time.monotonic() - ready
    assert took < FOUND_WITHIN_S, f"first SEND_OK {took:.1f} s after the master served ({len(statuses)} sends: " \
                                  f"{sorted(set(statuses))})"
    assert slave.runtime()["masterAddr"] == master.addr


def _runtime(b: BrokerHandle) -> dict[str, Any] | None:
    try:
        return b.runtime()
    except (OSError, ValueError):
        return None


def test_dledger_follower_follows_a_new_leader_within_5s(cluster_factory: Any) -> None:
    cluster: LocalCluster = cluster_factory(
        mode="dledger", peers_per_group=3, commitlog_file_size_bytes=SMALL_FILES,
        broker_config={**QUIET, "heartBeatTimeIntervalMs": "500"})
    old = cluster.leader("broker-a")
    followers = [b for b in cluster.members("broker-a") if b is not old]
    for f in followers:  # each follower knows the first leader
        poll_until(lambda f=f: (_runtime(f) or {}).get("masterAddr") == old.addr, LATE_S,
                   f"{f} follows the first leader {old.addr}")
    cluster.kill_master("broker-a")
    new = cluster.leader("broker-a")
    elected = time.monotonic()
    follower = next(b for b in followers if b is not new)
    # A topic made on the new leader after the election.
    r = httpx.post(f"http://{new.addr}/topic", json=TopicConfig("AfterElection", 2, 2).to_json(), timeout=5.0)
    r.raise_for_status()

    def followed() -> bool:
        rt = _runtime(follower) or {}
        topics = get_json(follower.addr, "/topics")["topicConfigTable"]
        return rt.get("masterAddr") == new.addr and "AfterElection" in topics

    poll_until(followed, LATE_S, f"the follower {follower} follows the new leader {new.addr} and has its topic")
    took = time.monotonic() - elected
    assert took < FOUND_WITHIN_S, f"the follower followed the new leader {took:.1f} s after the election"
    # And it writes on the new leader with the follower in the quorum.
    with Producer("pg", cluster.namesrv_addr) as p:
        assert p.send(Message("AfterElection", b"x")).send_status is SendStatus.SEND_OK
