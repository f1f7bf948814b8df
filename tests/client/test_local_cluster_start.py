"""How LocalCluster starts its processes: every port bound first and every server started at once (the default),
or, when ``broker_config`` chooses the brokers' addresses, nameservers, masters and slaves in turn. Either way the
brokers restart on the ports they started on."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client import Admin, Message, Producer
from client.cluster import LocalCluster

pytestmark = pytest.mark.integration


def _send_and_replicate(cluster: LocalCluster) -> None:
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("StartT", queue_nums=1)
    with Producer("start-p", cluster.namesrv_addr) as p:
        p.send(Message("StartT", b"x"))
    cluster.wait_slave_caught_up("broker-a", timeout_s=20)


@pytest.mark.parametrize("config", [{}, {"bindAddress": "127.0.0.1"}], ids=["at-once", "in-turn"])
def test_a_cluster_serves_replicates_and_restarts_on_its_ports(cluster_factory: Callable[..., LocalCluster],
                                                               config: dict[str, str]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=1, broker_config=config)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    addrs = (master.addr, master.ha_addr, slave.addr)
    assert all(a.startswith("127.0.0.1:") and not a.endswith(":0") for a in addrs), addrs
    _send_and_replicate(cluster)
    master.stop()
    slave.stop()
    master.start()
    slave.start()
    assert (master.addr, master.ha_addr, slave.addr) == addrs
    cluster.wait_registered()
    _send_and_replicate(cluster)
