"""Route and topic metadata as the nameserver, brokers and SDK exchange them (JSON on the control plane).

``TopicRouteData`` is RocketMQ's: ``queueDatas`` per broker group and ``brokerDatas`` with
``brokerAddrs: {brokerId: "ip:port"}`` (id 0 = master). JSON keys keep RocketMQ's camelCase; ids are JSON
strings in ``brokerAddrs`` (standard JSON, as RocketMQ >= 4.9.4 emits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from common.codes import Perm

__all__ = ["BrokerData", "DataVersion", "QueueData", "TopicConfig", "TopicRouteData"]


@attrs.frozen
class QueueData:
    """The queues one broker group holds for a topic."""

    broker_name: str
    """Broker group."""
    read_queue_nums: int
    """Queues consumers read: ids ``0..read_queue_nums-1``."""
    write_queue_nums: int
    """Queues producers write: ids ``0..write_queue_nums-1``."""
    perm: int = int(Perm.READ | Perm.WRITE)
    """Permission bits (READ 4, WRITE 2)."""
    topic_sys_flag: int = 0
    """Topic system flag."""

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm, "topicSysFlag": self.topic_sys_flag}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> QueueData:
        return cls(str(d["brokerName"]), int(d["readQueueNums"]), int(d["writeQueueNums"]), int(d["perm"]),
                   int(d.get("topicSysFlag", 0)))


def _sorted_addrs(addrs: Mapping[int, str]) -> dict[int, str]:
    return dict(sorted(addrs.items()))


@attrs.frozen
class BrokerData:
    """A broker group: its cluster and its members' addresses by broker id."""

    cluster: str
    """Cluster the group belongs to."""
    broker_name: str
    """Group name."""
    broker_addrs: Mapping[int, str] = attrs.field(converter=_sorted_addrs)
    """``brokerId -> "ip:port"``, ascending ids; 0 is the master."""

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "brokerName": self.broker_name,
                "brokerAddrs": {str(k): v for k, v in self.broker_addrs.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BrokerData:
        return cls(str(d["cluster"]), str(d["brokerName"]),
                   {int(k): str(v) for k, v in dict(d["brokerAddrs"]).items()})

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)


@attrs.frozen
class TopicRouteData:
    """Where a topic lives: queue data per broker group, and those groups' addresses."""

    queue_datas: tuple[QueueData, ...]
    """One entry per broker group holding the topic, sorted by broker name."""
    broker_datas: tuple[BrokerData, ...]
    """The groups named in ``queue_datas``, sorted by broker name."""

    def to_json(self) -> dict[str, Any]:
        return {"queueDatas": [q.to_json() for q in self.queue_datas],
                "brokerDatas": [b.to_json() for b in self.broker_datas]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicRouteData:
        return cls(
            tuple(sorted((QueueData.from_json(q) for q in d.get("queueDatas", [])), key=lambda q: q.broker_name)),
            tuple(sorted((BrokerData.from_json(b) for b in d.get("brokerDatas", [])), key=lambda b: b.broker_name)),
        )

    def broker_data(self, broker_name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None


@attrs.frozen
class TopicConfig:
    """A broker's configuration of one topic (``config/topics.json``)."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = int(Perm.READ | Perm.WRITE)
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"topicName": self.topic_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm, "topicSysFlag": self.topic_sys_flag,
                "order": self.order}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicConfig:
        return cls(str(d["topicName"]), int(d.get("readQueueNums", 8)), int(d.get("writeQueueNums", 8)),
                   int(d.get("perm", 6)), int(d.get("topicSysFlag", 0)), bool(d.get("order", False)))


@attrs.frozen
class DataVersion:
    """``{timestamp, counter}``: changes whenever a broker's topic table (or other metadata table) changes."""

    timestamp: int = 0
    counter: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> DataVersion:
        d = d or {}
        return cls(int(d.get("timestamp", 0)), int(d.get("counter", 0)))

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(now_ms, self.counter + 1)
