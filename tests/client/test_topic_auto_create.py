"""``autoCreateTopicEnable`` is off by default (issue 40 point 1): a send to a topic nobody created fails with an
error naming the topic and how to create it; a cluster that turns the key on still creates topics on a send."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from client import Admin, Message, Producer, SendStatus
from client.cluster import LocalCluster
from client.errors import RouteNotFoundError


def test_a_typo_on_a_default_local_cluster_is_an_error_naming_the_topic(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(slaves_per_group=0)
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("Orders", queue_nums=2)
    with Producer("typo-pg", cluster.namesrv_addr) as p:
        assert p.send(Message("Orders", b"x")).send_status is SendStatus.SEND_OK
        with pytest.raises(RouteNotFoundError) as ei:
            p.send(Message("Ordres", b"x"))
    first_line = str(ei.value).splitlines()[0]
    assert "Ordres" in first_line
    assert f"splitmq -n {cluster.namesrv_addr} topic create -t Ordres" in first_line
    assert "Admin.create_topic('Ordres')" in first_line
    with Admin(cluster.namesrv_addr) as admin:
        assert "Ordres" not in admin.topic_list()


def test_auto_create_still_works_when_turned_on(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(slaves_per_group=0, broker_config={"autoCreateTopicEnable": "true"})
    with Producer("auto-pg", cluster.namesrv_addr) as p:
        assert p.send(Message("MadeBySend", b"x")).send_status is SendStatus.SEND_OK
