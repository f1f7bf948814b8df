"""Routing as pure state: the route cache, queue selection, fault tables and the pull-node decision.

Nothing here does I/O or reads a clock: callers pass ``now_ms`` and inject the random source, so every rule is
table-tested (``tests/client/test_routing.py``). The rules are RocketMQ's (SEMANTICS.md 3.3, 3.5, 4.2-4.5):

* :func:`topic_route_to_publish_info` -- writable queues of groups that have a master (id 0), groups sorted by
  name; :func:`topic_route_to_subscribe_info` -- readable queues of every group, master or not.
* :func:`find_broker_address_in_subscribe` -- the ``brokerId + 1`` step and the first-entry fallback.
* :class:`QueueSelector` -- round robin that avoids the broker of the previous failed attempt and, when latency
  fault tolerance is on, brokers still isolated by :class:`LatencyFaultTolerance`.
* :class:`PullNodeTable` -- ``pullFromWhichNodeTable`` and ``recalculatePullFromWhichNode``.
* :class:`BrokerDownTable` -- consumer-side isolation of an unreachable broker for a short time, so the next
  pull goes to another member of the group at once instead of waiting for the route refresh (30 s).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from client.protocol.codes import MASTER_ID, Perm
from client.protocol.message import MessageQueue
from client.protocol.route import QueueData, TopicRouteData

__all__ = [
    "DEFAULT_TOPIC",
    "BrokerDownTable",
    "FaultToleranceConfig",
    "FindBrokerResult",
    "LatencyFaultTolerance",
    "NameServerSelector",
    "PullNodeTable",
    "QueueSelector",
    "RouteCache",
    "TopicPublishInfo",
    "choose_pull_broker_id",
    "default_route_for",
    "find_broker_address_in_subscribe",
    "topic_route_to_publish_info",
    "topic_route_to_subscribe_info",
]

#: RocketMQ's ``createTopicKey``: the route a producer borrows for a topic the nameserver does not know yet.
DEFAULT_TOPIC = "TBW102"


@attrs.frozen
class FindBrokerResult:
    """Where to send a request for a broker group (RocketMQ's ``FindBrokerResult``)."""

    broker_addr: str
    """``host:port`` of the chosen member."""
    slave: bool
    """True when the chosen member is not the master (id != 0)."""


@attrs.frozen
class TopicPublishInfo:
    """The queues a producer may write for one topic."""

    topic: str
    """Topic name."""
    message_queues: tuple[MessageQueue, ...]
    """Writable queues of groups with a master, groups sorted by name, ids ascending within a group."""
    route: TopicRouteData
    """The route this was built from."""
    from_default_topic: bool = False
    """Built from the ``TBW102`` route: the broker will create the topic on the first send."""

    @property
    def ok(self) -> bool:
        """True when there is at least one queue to write."""
        return bool(self.message_queues)

    def write_queue_nums(self, broker_name: str) -> int:
        """``writeQueueNums`` of ``broker_name`` in the route (0 when absent)."""
        for qd in self.route.queue_datas:
            if qd.broker_name == broker_name:
                return qd.write_queue_nums
        return 0


def topic_route_to_publish_info(topic: str, route: TopicRouteData, *, from_default_topic: bool = False) -> TopicPublishInfo:
    """SEMANTICS.md 4.2: writable queues of the groups whose ``brokerAddrs`` contain id 0."""
    masters = {bd.broker_name for bd in route.broker_datas if MASTER_ID in bd.broker_addrs}
    queues: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if Perm.writeable(qd.perm) and qd.broker_name in masters:
            queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return TopicPublishInfo(topic, tuple(queues), route, from_default_topic)


def topic_route_to_subscribe_info(topic: str, route: TopicRouteData) -> tuple[MessageQueue, ...]:
    """SEMANTICS.md 4.2: readable queues of every group (no check for a master)."""
    queues: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if Perm.readable(qd.perm):
            queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return tuple(queues)


def default_route_for(route: TopicRouteData, default_queue_nums: int) -> TopicRouteData:
    """The ``TBW102`` route cut to ``default_queue_nums`` queues per group (RocketMQ ``isDefault`` path)."""
    qds = tuple(
        attrs.evolve(
            qd,
            read_queue_nums=min(default_queue_nums, qd.read_queue_nums),
            write_queue_nums=min(default_queue_nums, qd.read_queue_nums),
        )
        for qd in route.queue_datas
    )
    return TopicRouteData(qds, route.broker_datas)


def find_broker_address_in_subscribe(
    addrs: Mapping[int, str] | None, broker_id: int, only_this_broker: bool
) -> FindBrokerResult | None:
    """SEMANTICS.md 3.3 ``findBrokerAddressInSubscribe`` over one group's ``{brokerId: addr}`` map.

    Args:
        addrs: the group's members; None or empty when the group is unknown.
        broker_id: the wanted member.
        only_this_broker: when True, never fall back to another member (except the ``brokerId + 1`` step).

    Returns:
        The address and whether it is a slave, or None.
    """
    if not addrs:
        return None
    addr = addrs.get(broker_id)
    slave = broker_id != MASTER_ID
    if addr is None and slave:
        addr = addrs.get(broker_id + 1)
    if addr is None and not only_this_broker:
        first_id = min(addrs)  # RocketMQ's HashMap of small Long keys iterates in ascending id order
        addr, slave = addrs[first_id], first_id != MASTER_ID
    return FindBrokerResult(addr, slave) if addr else None


class RouteCache:
    """Routes of the topics a client uses, and ``brokerAddrTable`` built from them.

    Mutations happen under one lock (the client's refresh thread and callers both write); readers take
    references to immutable values, so they need no lock.
    """

    def __init__(self, *, default_topic_queue_nums: int = 4) -> None:
        self._lock = threading.Lock()
        self._routes: dict[str, TopicRouteData] = {}
        self._publish: dict[str, TopicPublishInfo] = {}
        self._subscribe: dict[str, tuple[MessageQueue, ...]] = {}
        self._broker_addrs: dict[str, dict[int, str]] = {}
        self._default_queue_nums = default_topic_queue_nums

    @property
    def topics(self) -> list[str]:
        """Topics with a cached route."""
        return list(self._routes)

    def route(self, topic: str) -> TopicRouteData | None:
        """The cached route of ``topic``."""
        return self._routes.get(topic)

    def apply_route(self, topic: str, route: TopicRouteData) -> bool:
        """Cache ``route`` for ``topic``; returns True when it differs from the cached one."""
        with self._lock:
            old_info = self._publish.get(topic)
            if self._routes.get(topic) == route and not (old_info and old_info.from_default_topic):
                return False
            self._routes[topic] = route
            for bd in route.broker_datas:
                # Replaced wholesale, as RocketMQ does: members gone from the route disappear at once.
                self._broker_addrs[bd.broker_name] = dict(bd.broker_addrs)
            self._publish[topic] = topic_route_to_publish_info(topic, route)
            self._subscribe[topic] = topic_route_to_subscribe_info(topic, route)
            return True

    def apply_default_route(self, topic: str, default_route: TopicRouteData) -> TopicPublishInfo:
        """Publish info for a topic the nameserver does not know, borrowed from the ``TBW102`` route."""
        route = default_route_for(default_route, self._default_queue_nums)
        info = topic_route_to_publish_info(topic, route, from_default_topic=True)
        with self._lock:
            for bd in route.broker_datas:
                self._broker_addrs[bd.broker_name] = dict(bd.broker_addrs)
            if topic not in self._routes or self._publish[topic].from_default_topic:
                self._publish[topic] = info
                self._routes[topic] = route
        return info

    def publish_info(self, topic: str) -> TopicPublishInfo | None:
        """Cached publish info of ``topic``."""
        return self._publish.get(topic)

    def subscribe_info(self, topic: str) -> tuple[MessageQueue, ...] | None:
        """Cached subscribe set of ``topic``."""
        return self._subscribe.get(topic)

    def broker_addrs(self, broker_name: str) -> Mapping[int, str] | None:
        """``{brokerId: addr}`` of a group, as last seen in any route."""
        return self._broker_addrs.get(broker_name)

    def all_broker_addrs(self, *, include_slaves: bool) -> list[tuple[str, int, str]]:
        """``(broker_name, broker_id, addr)`` of every known member (masters only unless ``include_slaves``)."""
        out = []
        for name, members in sorted(self._broker_addrs.items()):
            for bid, addr in sorted(members.items()):
                if include_slaves or bid == MASTER_ID:
                    out.append((name, bid, addr))
        return out

    def find_broker_address_in_publish(self, broker_name: str) -> str | None:
        """The group's master address, or None (SEMANTICS.md 3.3)."""
        members = self._broker_addrs.get(broker_name)
        return members.get(MASTER_ID) if members else None

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int, only_this_broker: bool
    ) -> FindBrokerResult | None:
        """See :func:`find_broker_address_in_subscribe`."""
        return find_broker_address_in_subscribe(self._broker_addrs.get(broker_name), broker_id, only_this_broker)


@attrs.frozen
class FaultToleranceConfig:
    """Latency fault tolerance tables (RocketMQ 4.9.3 defaults, SEMANTICS.md 4.5)."""

    latency_max_ms: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
    """Latency thresholds, ascending."""
    not_available_duration_ms: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)
    """Isolation for a latency at or above the threshold of the same index."""
    isolation_latency_ms: int = 30000
    """Latency charged for a failed attempt (maps to 600000 ms with the 4.9.3 tables)."""

    def __attrs_post_init__(self) -> None:
        if len(self.latency_max_ms) != len(self.not_available_duration_ms) or not self.latency_max_ms:
            raise ValueError("latency_max_ms and not_available_duration_ms must be non-empty and equally long")
        if list(self.latency_max_ms) != sorted(self.latency_max_ms):
            raise ValueError("latency_max_ms must be ascending")


class LatencyFaultTolerance:
    """Per-broker isolation after slow or failed sends; inert unless ``enabled`` (the RocketMQ default)."""

    def __init__(self, *, enabled: bool = False, config: FaultToleranceConfig | None = None) -> None:
        self.enabled = enabled
        self.config = config or FaultToleranceConfig()
        self._items: dict[str, tuple[int, int]] = {}  # broker -> (current latency ms, available from ms)

    def compute_not_available_duration(self, latency_ms: int) -> int:
        """Scan the thresholds from the largest down; the first one ``latency_ms`` reaches decides."""
        cfg = self.config
        for i in range(len(cfg.latency_max_ms) - 1, -1, -1):
            if latency_ms >= cfg.latency_max_ms[i]:
                return cfg.not_available_duration_ms[i]
        return 0

    def update_fault_item(self, broker_name: str, latency_ms: int, *, isolation: bool, now_ms: int) -> None:
        """Record an attempt's outcome; ``isolation`` charges the isolation latency (a failed attempt)."""
        if not self.enabled:
            return
        latency = self.config.isolation_latency_ms if isolation else latency_ms
        duration = self.compute_not_available_duration(latency)
        self._items[broker_name] = (latency, now_ms + duration)  # 4.9.3: set unconditionally

    def is_available(self, broker_name: str, now_ms: int) -> bool:
        """True unless the broker is inside its isolation window."""
        item = self._items.get(broker_name)
        return item is None or now_ms >= item[1]

    def available_from_ms(self, broker_name: str) -> int | None:
        """When the broker becomes available again (None when it has no fault item)."""
        item = self._items.get(broker_name)
        return item[1] if item else None

    def remove(self, broker_name: str) -> None:
        self._items.pop(broker_name, None)


class QueueSelector:
    """Round-robin queue selection that avoids the previous attempt's broker (SEMANTICS.md 4.3, 4.4).

    The shape is HEAD's scan (look at ``n`` positions from the next index for a queue passing the filters)
    with 4.9.3's fault tables. The index is shared by the threads of one producer (RocketMQ keeps one per
    thread; only the spread matters).

    Args:
        start_index: first index (random when None) -- tests inject it.
        rng: random source for the start index.
    """

    def __init__(self, *, start_index: int | None = None, rng: random.Random | None = None) -> None:
        if start_index is None:
            start_index = (rng or random.Random()).randrange(1 << 16)
        self._counter = itertools.count(start_index + 1)  # pre-increment, as ThreadLocalIndex

    def next_index(self) -> int:
        return next(self._counter) & 0x7FFFFFFF

    def select(
        self,
        queues: Sequence[MessageQueue],
        last_broker_name: str | None,
        *,
        fault: LatencyFaultTolerance | None = None,
        now_ms: int = 0,
    ) -> MessageQueue:
        """Choose a queue for the next attempt.

        Raises:
            ValueError: ``queues`` is empty (the caller reports "No route info of this topic").
        """
        n = len(queues)
        if n == 0:
            raise ValueError("no queue to select from")
        if fault is not None and fault.enabled:
            q = self._scan(queues, lambda m: m.broker_name != last_broker_name
                           and fault.is_available(m.broker_name, now_ms))
            if q is None:
                q = self._scan(queues, lambda m: fault.is_available(m.broker_name, now_ms))
            if q is not None:
                return q
        if last_broker_name is not None:
            q = self._scan(queues, lambda m: m.broker_name != last_broker_name)
            if q is not None:
                return q
        return queues[self.next_index() % n]

    def _scan(self, queues: Sequence[MessageQueue], accept: Callable[[MessageQueue], bool]) -> MessageQueue | None:
        n = len(queues)
        start = self.next_index()
        for i in range(n):
            q = queues[(start + i) % n]
            if accept(q):
                return q
        return None


class PullNodeTable:
    """``pullFromWhichNodeTable``: the broker id each queue should be pulled from next (SEMANTICS.md 3.3)."""

    def __init__(self, *, connect_broker_by_user: bool = False, default_broker_id: int = MASTER_ID) -> None:
        self.connect_broker_by_user = connect_broker_by_user
        self.default_broker_id = default_broker_id
        self._table: dict[MessageQueue, int] = {}

    @property
    def table(self) -> Mapping[MessageQueue, int]:
        """The live table (callers wrap it read-only)."""
        return self._table

    def update(self, mq: MessageQueue, suggest_which_broker_id: int) -> None:
        """Called after every pull response, whatever its status."""
        self._table[mq] = suggest_which_broker_id

    def recalculate(self, mq: MessageQueue) -> int:
        """``defaultBrokerId`` when the user pinned it, else the table value, else the master."""
        if self.connect_broker_by_user:
            return self.default_broker_id
        return self._table.get(mq, MASTER_ID)


class BrokerDownTable:
    """Members a consumer found unreachable, isolated until a deadline (``isolation_ms`` after the failure)."""

    def __init__(self, *, isolation_ms: int = 5000) -> None:
        self.isolation_ms = isolation_ms
        self._down: dict[tuple[str, int], int] = {}

    def mark_down(self, broker_name: str, broker_id: int, now_ms: int) -> None:
        self._down[(broker_name, broker_id)] = now_ms + self.isolation_ms

    def mark_up(self, broker_name: str, broker_id: int) -> None:
        self._down.pop((broker_name, broker_id), None)

    def is_down(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        until = self._down.get((broker_name, broker_id))
        if until is None:
            return False
        if now_ms >= until:
            self._down.pop((broker_name, broker_id), None)
            return False
        return True


def choose_pull_broker_id(
    broker_name: str, addrs: Mapping[int, str] | None, wanted_id: int, down: BrokerDownTable, now_ms: int
) -> int:
    """The id to resolve for a pull: ``wanted_id`` unless it is down, else the lowest member that is up.

    When every member is down (or the group is unknown) the wanted id stays: failing fast on it again is
    better than inventing an address.
    """
    if not addrs or not down.is_down(broker_name, wanted_id, now_ms):
        return wanted_id
    for bid in sorted(addrs):
        if bid != wanted_id and not down.is_down(broker_name, bid, now_ms):
            return bid
    return wanted_id


class NameServerSelector:
    """Which nameserver to ask: one at a time, random start, the next one on failure (SEMANTICS.md 6.6)."""

    def __init__(self, addrs: Iterable[str], *, rng: random.Random | None = None) -> None:
        self.addrs = [a.strip() for a in addrs if a.strip()]
        if not self.addrs:
            raise ValueError("namesrv_addr names no nameserver")
        self._index = (rng or random.Random()).randrange(999)

    @classmethod
    def parse(cls, namesrv_addr: str, *, rng: random.Random | None = None) -> NameServerSelector:
        """From a ``;``-separated list."""
        return cls(namesrv_addr.split(";"), rng=rng)

    def current(self) -> str:
        return self.addrs[self._index % len(self.addrs)]

    def failover(self) -> str:
        """Move to the next nameserver and return it."""
        self._index += 1
        return self.current()

    def rotation(self) -> list[str]:
        """Every nameserver once, starting from the current one."""
        n = len(self.addrs)
        return [self.addrs[(self._index + i) % n] for i in range(n)]

    def settle(self, addr: str) -> None:
        """Keep using ``addr`` (the one that answered)."""
        self._index = self.addrs.index(addr)


def queue_data_of(route: TopicRouteData, broker_name: str) -> QueueData | None:
    for qd in route.queue_datas:
        if qd.broker_name == broker_name:
            return qd
    return None
