"""A consumer whose master stalls while the slave refuses pulls (``slaveReadEnable=false``, decision 6) does not
spin on the slave (issue 10, defect 1).

SIGSTOP keeps the master's sockets open, so the slave's HA link stays up and the slave answers every pull with
PULL_RETRY_IMMEDIATELY (suggest 0), while the consumer's pull to the master times out and marks it down for
``broker_down_isolation_s`` (5 s). Before the fix every following pull went to the slave and was refused at once,
and the engine pulled again at once: thousands of pulls until the isolation ended. The window measured is
between two events the client records: the stalled master marked down, and marked down again (the client asked
it once more). The slave's own counter of PULL_RETRY_IMMEDIATELY answers says how often it was asked meanwhile.
"""

from __future__ import annotations

import attrs
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import ConsumeFromWhere, GroupConsumer, Message, Producer
from client.cluster import BrokerHandle
from common.codes import ResponseCode
from tests.ha.support import create_topic, ha_cluster, poll_until, wait_slave_linked

pytestmark = [pytest.mark.integration, pytest.mark.ha]

TOPIC = "Stall"
#: Pulls the slave may refuse in the window: one after each time the master times out, and the fix asks the
#: master again after ``pull_delay_on_error_s``. Without the fix: thousands.
MAX_REFUSALS = 5


def refusals(slave: BrokerHandle) -> int:
    """Pulls the slave answered with PULL_RETRY_IMMEDIATELY (its ``splitmq_pull_requests`` counter)."""
    text = httpx.get(f"http://{slave.addr}/metrics", timeout=5).text
    code = str(int(ResponseCode.PULL_RETRY_IMMEDIATELY))
    return int(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "splitmq_pull_requests_total" and s.labels.get("code") == code))


def drain(c: GroupConsumer, want: set[bytes], what: str) -> None:
    got: set[bytes] = set()

    def all_in() -> bool:
        got.update(m.body for m in c.poll(timeout_s=0.5))
        return want <= got

    poll_until(all_in, 30, what)


def test_consumer_does_not_spin_on_a_refusing_slave_while_the_master_stalls(cluster_factory) -> None:
    # The slave must keep its link to the paused master for the whole window (housekeeping drops it after this).
    cluster = ha_cluster(cluster_factory, slaves_per_group=1,
                         config={"slaveReadEnable": "false", "haHousekeepingInterval": "60000"})
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, TOPIC, queue_nums=1)
    with Producer("p_stall", cluster.namesrv_addr) as p:
        p.send_batch([Message(TOPIC, b"m%d" % i) for i in range(8)])
        wait_slave_linked(cluster)
        c = GroupConsumer("cg_stall", cluster.namesrv_addr, consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                          auto_commit=False, pull_suspend_s=0.5, pull_thread_nums=1, pull_delay_on_error_s=1.0,
                          instance_name="stall")
        c.subscribe(TOPIC)
        c.start()
        try:
            # Pulls to the stalled master time out after 1.5 s (0.5 s long poll + 1 s) instead of 10 s.
            c.pull_consumer.config = attrs.evolve(c.pull_consumer.config, pull_timeout_s=1.0)
            drain(c, {b"m%d" % i for i in range(8)}, "the first messages, from the master")
            down = c.client.broker_down
            before = refusals(slave)
            marked_after = c.client.clock_ms() + down.isolation_ms
            master.pause()
            try:
                first = poll_until(lambda: (u := down.down_until("broker-a", 0)) and u >= marked_after and u,
                                   20, "the client marking the stalled master down")
                poll_until(lambda: (u := down.down_until("broker-a", 0)) and u > first,
                           30, "the client asking the stalled master again")
                refused = refusals(slave) - before
            finally:
                master.resume()
            assert 1 <= refused <= MAX_REFUSALS, (
                f"the slave refused {refused} pulls while {master} was marked down: the consumer spun on it")
            # The master answers again: the consumer is back on it without waiting for the route.
            p.send(Message(TOPIC, b"after"))
            drain(c, {b"after"}, "a message sent after the master resumed")
        finally:
            c.close()
