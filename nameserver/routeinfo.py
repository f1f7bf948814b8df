"""The nameserver's route table as pure state: no I/O, no clock (callers pass ``now_ms``), no locks.

Tables (docs/BEHAVIOUR.md section 6.1, RocketMQ 4.9.3 ``RouteInfoManager``)::

    clusterAddrTable   cluster     -> {brokerName}
    brokerAddrTable    brokerName  -> (cluster, {brokerId -> "ip:port"})
    topicQueueTable    topic       -> {brokerName -> QueueData}
    brokerLiveTable    "ip:port"   -> BrokerLiveInfo(lastUpdateTimestamp, dataVersion, haServerAddr)

Invariants kept by every operation (the property tests check them):

* every ``brokerName`` that holds queue data of a topic has a group with at least one address;
* no topic has an empty queue-data map;
* ``clusterAddrTable`` is exactly the groups' ``cluster`` fields, grouped (no empty cluster);
* every address of every group is in the live table.

The server runs all operations on one event loop thread, so no lock is needed here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from common.codes import MASTER_ID, Perm
from common.route import BrokerData, DataVersion, QueueData, TopicConfig, TopicRouteData

__all__ = ["BrokerLiveInfo", "ClusterInfo", "RegisterResult", "RouteInfo"]

log = logging.getLogger(__name__)


@attrs.frozen
class RegisterResult:
    """What a registration returns (docs/BEHAVIOUR.md section 2.2).

    Both fields are set only for a slave whose master (id 0 of the same group) is live; a master, or a slave
    whose master is absent or expired, gets both ``None``.
    """

    master_addr: str | None = None
    """The group's master address."""
    ha_server_addr: str | None = None
    """The HA address the master registered (where the slave's HA client connects)."""

    def to_json(self) -> dict[str, Any]:
        return {"masterAddr": self.master_addr, "haServerAddr": self.ha_server_addr}


@attrs.frozen
class BrokerLiveInfo:
    """One registered broker address as the liveness scan sees it."""

    last_update_ms: int
    """When the broker last registered (epoch ms of the nameserver's clock)."""
    data_version: DataVersion
    """The topic-table version the broker sent; a change makes a master's topics be re-read."""
    ha_server_addr: str
    """The broker's HA listen address (given to its slaves)."""

    def to_json(self) -> dict[str, Any]:
        return {"lastUpdateTimestamp": self.last_update_ms, "haServerAddr": self.ha_server_addr}


@attrs.frozen
class ClusterInfo:
    """A snapshot of the cluster tables (``GET /cluster``)."""

    broker_addr_table: Mapping[str, BrokerData]
    """``brokerName -> BrokerData``, sorted by name."""
    cluster_addr_table: Mapping[str, tuple[str, ...]]
    """``cluster -> sorted broker names``."""
    broker_live_table: Mapping[str, BrokerLiveInfo]
    """``"ip:port" -> BrokerLiveInfo``, sorted by address."""

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: bd.to_json() for name, bd in self.broker_addr_table.items()},
            "clusterAddrTable": {c: list(names) for c, names in self.cluster_addr_table.items()},
            "brokerLiveTable": {addr: live.to_json() for addr, live in self.broker_live_table.items()},
        }


@attrs.define
class _Group:
    """Mutable ``BrokerData`` kept inside the table (snapshots are frozen ``BrokerData``)."""

    cluster: str
    addrs: dict[int, str] = attrs.Factory(dict)

    def snapshot(self, broker_name: str) -> BrokerData:
        return BrokerData(self.cluster, broker_name, dict(self.addrs))


class RouteInfo:
    """The route table. Every method is a pure state transition; time comes in as ``now_ms``."""

    def __init__(self) -> None:
        self._clusters: dict[str, set[str]] = {}
        self._groups: dict[str, _Group] = {}
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._live: dict[str, BrokerLiveInfo] = {}

    # ------------------------------------------------------------------ registration

    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_configs: Iterable[TopicConfig] | None,
        data_version: DataVersion,
        now_ms: int,
    ) -> RegisterResult:
        """Register (or refresh) one broker, RocketMQ 4.9.3 rules (docs/BEHAVIOUR.md section 6.3).

        Args:
            cluster: the broker's ``brokerClusterName``.
            broker_addr: its ``ip:port``.
            broker_name: its group.
            broker_id: 0 for the master, > 0 for a slave.
            ha_server_addr: its HA listen address.
            topic_configs: its whole topic table; ``None`` registers without topics.
            data_version: the version of that topic table.
            now_ms: the nameserver's clock.

        Returns:
            For a slave whose master is live, the master's address and HA address; otherwise both ``None``.
        """
        group = self._groups.get(broker_name)
        register_first = group is None
        if group is None:
            group = self._groups[broker_name] = _Group(cluster)
        elif group.cluster != cluster:
            # RocketMQ would list the group under both clusters; moving it keeps one answer per group.
            log.warning("broker group %s moves from cluster %s to %s", broker_name, group.cluster, cluster)
            self._remove_from_cluster(group.cluster, broker_name)
            group.cluster = cluster
        self._clusters.setdefault(cluster, set()).add(broker_name)

        # The same ip:port under another id means the broker switched role (slave -> master or back).
        for other_id in [i for i, a in group.addrs.items() if a == broker_addr and i != broker_id]:
            del group.addrs[other_id]
        previous = group.addrs.get(broker_id)
        group.addrs[broker_id] = broker_addr
        if previous is None:
            register_first = True
        elif previous != broker_addr:
            # A new process took this id; the old address is gone from the group, so drop its liveness too.
            log.warning("broker %s id=%d moved from %s to %s", broker_name, broker_id, previous, broker_addr)
            self._forget_address_if_unused(previous)

        if topic_configs is not None and broker_id == MASTER_ID:
            old_live = self._live.get(broker_addr)
            changed = old_live is None or old_live.data_version != data_version
            if changed or register_first:
                for tc in topic_configs:
                    self._put_queue_data(tc, broker_name)

        if broker_addr not in self._live:
            log.info("new broker registered: cluster=%s name=%s id=%d addr=%s ha=%s",
                     cluster, broker_name, broker_id, broker_addr, ha_server_addr)
        self._live[broker_addr] = BrokerLiveInfo(now_ms, data_version, ha_server_addr)
        if broker_id == MASTER_ID:
            return RegisterResult()
        master = group.addrs.get(MASTER_ID)
        master_live = self._live.get(master) if master is not None else None
        if master is None or master_live is None:
            return RegisterResult()
        return RegisterResult(master, master_live.ha_server_addr)

    def _put_queue_data(self, tc: TopicConfig, broker_name: str) -> None:
        qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
        by_broker = self._topics.setdefault(tc.topic_name, {})
        old = by_broker.get(broker_name)
        if old != qd:
            if old is None:
                log.info("new topic route: topic=%s broker=%s %s", tc.topic_name, broker_name, qd)
            else:
                log.info("topic route changed: topic=%s broker=%s %s -> %s", tc.topic_name, broker_name, old, qd)
            by_broker[broker_name] = qd

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """A broker's goodbye (docs/BEHAVIOUR.md section 6.4).

        The group entry is removed by address value (as HEAD and the expiry path do) rather than by id, so a
        late goodbye from an old master cannot remove a newer master registered under the same id.

        Args:
            cluster: the broker's cluster (the group's own cluster is used to clean the cluster table).
            broker_addr: its ``ip:port``.
            broker_name: its group.
            broker_id: its id (informative; see above).

        Returns:
            Whether the address was registered in that group.
        """
        group = self._groups.get(broker_name)
        found = False
        if group is not None:
            ids = [i for i, a in group.addrs.items() if a == broker_addr]
            found = bool(ids)
            for i in ids:
                del group.addrs[i]
            if not group.addrs:
                self._remove_group(broker_name)
        self._forget_address_if_unused(broker_addr)
        log.info("broker unregistered: cluster=%s name=%s id=%d addr=%s found=%s",
                 cluster, broker_name, broker_id, broker_addr, found)
        return found

    def scan_not_active_brokers(self, now_ms: int, expiry_ms: int) -> list[str]:
        """Expire every address whose last registration is older than ``expiry_ms``.

        A broker is expired when ``last_update_ms + expiry_ms < now_ms``. Its address leaves every group; a
        group that still has a slave keeps its queue data and perm (docs/BEHAVIOUR.md sections 3.5 and 6.5); a group
        left empty is removed with its queue data, and topics left without queue data disappear.

        Returns:
            The expired addresses, sorted.
        """
        expired = sorted(a for a, live in self._live.items() if live.last_update_ms + expiry_ms < now_ms)
        for addr in expired:
            del self._live[addr]
            for name in [n for n, g in self._groups.items() if addr in g.addrs.values()]:
                group = self._groups[name]
                group.addrs = {i: a for i, a in group.addrs.items() if a != addr}
                if not group.addrs:
                    self._remove_group(name)
            log.warning("broker expired: addr=%s (no registration for %d ms)", addr, expiry_ms)
        return expired

    def _remove_group(self, broker_name: str) -> None:
        group = self._groups.pop(broker_name)
        self._remove_from_cluster(group.cluster, broker_name)
        for topic in list(self._topics):
            by_broker = self._topics[topic]
            if by_broker.pop(broker_name, None) is not None and not by_broker:
                del self._topics[topic]
                log.info("topic %s has no broker left; route removed", topic)

    def _remove_from_cluster(self, cluster: str, broker_name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[cluster]

    def _forget_address_if_unused(self, addr: str) -> None:
        if not any(addr in g.addrs.values() for g in self._groups.values()):
            self._live.pop(addr, None)

    # ------------------------------------------------------------------ permissions

    def wipe_write_perm(self, broker_name: str) -> int:
        """Clear the WRITE bit of every queue data of ``broker_name`` (``WIPE_WRITE_PERM_OF_BROKER``).

        Returns:
            The number of topics that have queue data on that group.
        """
        return self._operate_write_perm(broker_name, wipe=True)

    def add_write_perm(self, broker_name: str) -> int:
        """Set the WRITE bit of every queue data of ``broker_name`` (``ADD_WRITE_PERM_OF_BROKER``).

        Returns:
            The number of topics that have queue data on that group.
        """
        return self._operate_write_perm(broker_name, wipe=False)

    def _operate_write_perm(self, broker_name: str, *, wipe: bool) -> int:
        touched = 0
        for by_broker in self._topics.values():
            qd = by_broker.get(broker_name)
            if qd is None:
                continue
            perm = qd.perm & ~int(Perm.WRITE) if wipe else qd.perm | int(Perm.WRITE)
            by_broker[broker_name] = attrs.evolve(qd, perm=perm)
            touched += 1
        log.info("%s write perm of %s: %d topics", "wiped" if wipe else "added", broker_name, touched)
        return touched

    # ------------------------------------------------------------------ queries

    def get_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``; ``None`` (TOPIC_NOT_EXIST) when unknown or no group of it has an address.

        Queue data and broker data are sorted by broker name.
        """
        by_broker = self._topics.get(topic)
        if not by_broker:
            return None
        broker_datas = tuple(
            self._groups[name].snapshot(name) for name in sorted(by_broker) if name in self._groups
        )
        if not broker_datas:
            return None
        queue_datas = tuple(by_broker[name] for name in sorted(by_broker))
        return TopicRouteData(queue_datas, broker_datas)

    def cluster_info(self) -> ClusterInfo:
        """A snapshot of the group, cluster and live tables."""
        return ClusterInfo(
            {name: self._groups[name].snapshot(name) for name in sorted(self._groups)},
            {c: tuple(sorted(names)) for c, names in sorted(self._clusters.items())},
            {addr: self._live[addr] for addr in sorted(self._live)},
        )

    def topic_list(self) -> list[str]:
        """Every topic with queue data, sorted."""
        return sorted(self._topics)

    def has_group(self, broker_name: str) -> bool:
        """Whether any broker of ``broker_name`` is registered (an emptied group is removed at once)."""
        return broker_name in self._groups

    def group_count(self) -> int:
        """Broker groups registered."""
        return len(self._groups)

    def live_broker_count(self) -> int:
        """How many broker addresses are registered and not expired."""
        return len(self._live)

    def topic_count(self) -> int:
        """How many topics have a route."""
        return len(self._topics)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (for tests and simulations)."""
        for topic, by_broker in self._topics.items():
            if not by_broker:
                raise AssertionError(f"topic {topic} has an empty queue-data map")
            for name, qd in by_broker.items():
                if qd.broker_name != name:
                    raise AssertionError(f"topic {topic}: queue data under {name} names {qd.broker_name}")
                group = self._groups.get(name)
                if group is None or not group.addrs:
                    raise AssertionError(f"topic {topic}: broker {name} has queue data but no address")
        derived: dict[str, set[str]] = {}
        for name, group in self._groups.items():
            if not group.addrs:
                raise AssertionError(f"broker group {name} has no address")
            derived.setdefault(group.cluster, set()).add(name)
            for addr in group.addrs.values():
                if addr not in self._live:
                    raise AssertionError(f"broker group {name}: address {addr} is not in the live table")
        if derived != self._clusters:
            raise AssertionError(f"cluster table {self._clusters} does not match the groups {derived}")
