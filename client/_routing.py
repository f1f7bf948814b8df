"""Routing as pure state: the route cache, queue selection, fault tables and the pull-node decision.

Nothing here does I/O or reads a clock: callers pass ``now_ms`` and inject the random source, so every rule is
table-tested (``tests/client/test_routing.py``). The rules are RocketMQ's (docs/BEHAVIOUR.md 3.3, 3.5, 4.2-4.5):

* :func:`topic_route_to_publish_info` -- writable queues of groups that have a master (id 0), groups sorted by
  name; :func:`topic_route_to_subscribe_info` -- readable queues of every group, master or not.
* :func:`find_broker_address_in_subscribe` -- the ``brokerId + 1`` step and the first-entry fallback.
* :class:`QueueSelector` -- round robin that avoids the broker of the previous failed attempt and, when latency
  fault tolerance is on, brokers still isolated by :class:`LatencyFaultTolerance`.
* :class:`PullNodeTable` -- ``pullFromWhichNodeTable`` and ``recalculatePullFromWhichNode``.
* :class:`BrokerDownTable` -- consumer-side isolation of an unreachable broker for a short time, so the next
  pull goes to another member of the group at once instead of waiting for the route refresh (30 s); and the
  members that refused a pull lately (decision 6), so a pull is not sent again to a member that will refuse it.
* :func:`plan_pull` / :class:`PullPlan` -- the members one pull asks, in order, and what each outcome changes.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from client._requests import PullResult
from common.codes import MASTER_ID, Perm, PullStatus
from common.errors import ConfigError
from common.message import MessageQueue
from common.route import QueueData, TopicRouteData

__all__ = [
    "DEFAULT_TOPIC",
    "BrokerDownTable",
    "FaultToleranceConfig",
    "FindBrokerResult",
    "LatencyFaultTolerance",
    "NameServerSelector",
    "PullNodeTable",
    "PullPlan",
    "PullTarget",
    "QueueSelector",
    "RouteCache",
    "TopicPublishInfo",
    "choose_pull_broker_id",
    "default_route_for",
    "find_broker_address_in_subscribe",
    "normalize_namesrv_addr",
    "parse_namesrv_addr",
    "plan_pull",
    "pull_refused",
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
    """docs/BEHAVIOUR.md 4.2: writable queues of the groups whose ``brokerAddrs`` contain id 0."""
    masters = {bd.broker_name for bd in route.broker_datas if MASTER_ID in bd.broker_addrs}
    queues: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if Perm.writeable(qd.perm) and qd.broker_name in masters:
            queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return TopicPublishInfo(topic, tuple(queues), route, from_default_topic)


def topic_route_to_subscribe_info(topic: str, route: TopicRouteData) -> tuple[MessageQueue, ...]:
    """docs/BEHAVIOUR.md 4.2: readable queues of every group (no check for a master)."""
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
    """docs/BEHAVIOUR.md 3.3 ``findBrokerAddressInSubscribe`` over one group's ``{brokerId: addr}`` map.

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
        """The group's master address, or None (docs/BEHAVIOUR.md 3.3)."""
        members = self._broker_addrs.get(broker_name)
        return members.get(MASTER_ID) if members else None

    def find_broker_address_in_subscribe(
        self, broker_name: str, broker_id: int, only_this_broker: bool
    ) -> FindBrokerResult | None:
        """See :func:`find_broker_address_in_subscribe`."""
        return find_broker_address_in_subscribe(self._broker_addrs.get(broker_name), broker_id, only_this_broker)


@attrs.frozen
class FaultToleranceConfig:
    """Latency fault tolerance tables (RocketMQ 4.9.3 defaults, docs/BEHAVIOUR.md 4.5)."""

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
        self.isolations: dict[str, int] = {}
        """Times each broker was isolated (an attempt that earned a not-available duration; client metrics)."""

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
        if duration:
            self.isolations[broker_name] = self.isolations.get(broker_name, 0) + 1

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
    """Round-robin queue selection that avoids the previous attempt's broker (docs/BEHAVIOUR.md 4.3, 4.4).

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
    """``pullFromWhichNodeTable``: the broker id each queue should be pulled from next (docs/BEHAVIOUR.md 3.3)."""

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
    """What a consumer learned about the members of its broker groups from its own requests.

    * down: a member it could not reach, isolated until ``isolation_ms`` after the failure;
    * refused: a member that answered a pull with a refusal (:func:`pull_refused`: a slave with
      ``slaveReadEnable=false`` whose link to its master is up, decision 6), remembered for ``refusal_ms``
      (``isolation_ms`` when None) or until it serves a pull.

    Args:
        isolation_ms: how long an unreachable member is avoided.
        refusal_ms: how long a refusing member is avoided while another member may serve.
    """

    def __init__(self, *, isolation_ms: int = 5000, refusal_ms: int | None = None) -> None:
        self.isolation_ms = isolation_ms
        self.refusal_ms = isolation_ms if refusal_ms is None else refusal_ms
        self._down: dict[tuple[str, int], int] = {}
        self._refused: dict[tuple[str, int], int] = {}
        self.down_marks: dict[tuple[str, int], int] = {}
        """Times each member was marked down (client metrics)."""

    def mark_down(self, broker_name: str, broker_id: int, now_ms: int) -> None:
        key = (broker_name, broker_id)
        self._down[key] = now_ms + self.isolation_ms
        self.down_marks[key] = self.down_marks.get(key, 0) + 1

    def mark_up(self, broker_name: str, broker_id: int) -> None:
        self._down.pop((broker_name, broker_id), None)

    def is_down(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        return _live(self._down, (broker_name, broker_id), now_ms)

    def down_until(self, broker_name: str, broker_id: int) -> int | None:
        """The end of the member's last isolation (the caller's clock, ms); None when it is known to be up."""
        return self._down.get((broker_name, broker_id))

    def mark_refused(self, broker_name: str, broker_id: int, now_ms: int) -> None:
        """The member answered a pull, refusing to serve it: it is reachable, and will refuse again."""
        self._down.pop((broker_name, broker_id), None)
        self._refused[(broker_name, broker_id)] = now_ms + self.refusal_ms

    def mark_served(self, broker_name: str, broker_id: int) -> None:
        """The member served a pull: neither down nor refusing."""
        self._down.pop((broker_name, broker_id), None)
        self._refused.pop((broker_name, broker_id), None)

    def has_refused(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        """True when the member refused a pull within the last ``refusal_ms`` and has not served one since."""
        return _live(self._refused, (broker_name, broker_id), now_ms)


def _live(deadlines: dict[tuple[str, int], int], key: tuple[str, int], now_ms: int) -> bool:
    until = deadlines.get(key)
    if until is None:
        return False
    if now_ms >= until:
        deadlines.pop(key, None)
        return False
    return True


def choose_pull_broker_id(
    broker_name: str, addrs: Mapping[int, str] | None, wanted_id: int, down: BrokerDownTable, now_ms: int
) -> int:
    """The id to resolve for a pull: ``wanted_id`` unless it is down, else the lowest member that is up and did
    not refuse a pull lately, else ``wanted_id`` again.

    A member that refused lately is a slave whose link to its master was up (decision 6): asking it again brings
    the same refusal at once, and a consumer that re-pulls on it spins. Its refusal also says that the member it
    sends consumers to (the master, ``wanted_id`` after the suggestion it answered) was alive a moment ago as
    far as the group can tell, so that member is asked again although this client marked it down. When every
    member is down (or the group is unknown) the wanted id stays too: failing fast on it again is better than
    inventing an address.
    """
    if not addrs or not down.is_down(broker_name, wanted_id, now_ms):
        return wanted_id
    for bid in sorted(addrs):
        if bid != wanted_id and not down.is_down(broker_name, bid, now_ms) \
                and not down.has_refused(broker_name, bid, now_ms):
            return bid
    return wanted_id


def pull_refused(result: PullResult, requested_offset: int) -> bool:
    """True when ``result`` is a refusal: ``PULL_RETRY_IMMEDIATELY`` (NO_MATCHED_MSG) that read nothing (the next
    offset is the requested one) and sends the consumer to another member.

    That is what a slave with ``slaveReadEnable=false`` answers while its master link is up (decision 6,
    ``broker/read_split.py``). A NO_MATCHED_MSG that skipped messages not matching the tags moves the offset, and
    is an answer like any other.
    """
    return (result.pull_status is PullStatus.NO_MATCHED_MSG and result.next_begin_offset == requested_offset
            and not result.msg_found_list and result.suggest_which_broker_id != result.served_by_broker_id)


@attrs.frozen
class PullTarget:
    """A member a pull is sent to."""

    broker_id: int
    """The member's id in its group (0 = master)."""
    addr: str
    """``host:port``."""
    slave: bool
    """True unless the member is the master (a pull to a slave carries no commit offset)."""


class PullPlan:
    """The members one pull asks, in order; pure (the caller sends and reports each outcome), one per pull.

    * first: :func:`plan_pull`'s choice;
    * after a transport failure (the member is marked down): one other member that is not down, one that did
      not refuse lately first -- a refuser is still worth the request, its master link may have dropped since
      and then it serves (decision 6);
    * after a refusal (the member is remembered as refusing): the member the refuser suggests, unless asked
      already in this pull, even when marked down -- the refuser's link to it was up a moment ago;
    * pinned (``connect_broker_by_user``): the pinned member only.

    At most ``max_attempts`` requests. When no answer served the pull, the caller returns the refusal if there was
    one (NO_MATCHED_MSG, offset unchanged), else raises the transport error; an engine then waits before re-pulling.
    """

    def __init__(self, broker_name: str, members: Mapping[int, str], first: PullTarget, down: BrokerDownTable, *,
                 pinned: bool, max_attempts: int = 2) -> None:
        self.broker_name = broker_name
        self._members = members
        self._down = down
        self._pinned = pinned
        self._next: PullTarget | None = first
        self._tried: set[int] = set()
        self._left = max_attempts

    def next(self) -> PullTarget | None:
        """The member to ask now, or None when the pull is over."""
        t = self._next
        if t is None or self._left <= 0:
            return None
        self._next = None
        self._left -= 1
        self._tried.add(t.broker_id)
        return t

    def failed(self, target: PullTarget, now_ms: int) -> None:
        """``target`` could not be reached (or did not answer in time): mark it down, plan the fallback."""
        self._down.mark_down(self.broker_name, target.broker_id, now_ms)
        if self._pinned:
            return
        name, down = self.broker_name, self._down
        candidates = [bid for bid in sorted(self._members)
                      if bid not in self._tried and not down.is_down(name, bid, now_ms)]
        candidates.sort(key=lambda bid: down.has_refused(name, bid, now_ms))  # stable: lowest id first
        self._next = self._target(candidates[0]) if candidates else None

    def answered(self, target: PullTarget, *, refused: bool, suggest_which_broker_id: int, now_ms: int) -> bool:
        """``target`` answered; True when the answer is the pull's, False when it refused and the pull goes on."""
        if not refused:
            self._down.mark_served(self.broker_name, target.broker_id)
            return True
        self._down.mark_refused(self.broker_name, target.broker_id, now_ms)
        suggest = suggest_which_broker_id
        if not self._pinned and suggest in self._members and suggest not in self._tried:
            self._next = self._target(suggest)
        return False

    def _target(self, broker_id: int) -> PullTarget:
        return PullTarget(broker_id, self._members[broker_id], broker_id != MASTER_ID)


def plan_pull(broker_name: str, members: Mapping[int, str] | None, wanted_id: int, down: BrokerDownTable,
              now_ms: int, *, pinned: bool) -> PullPlan | None:
    """The plan of one pull of a queue of ``broker_name`` (docs/BEHAVIOUR.md 3.3 and decision 6).

    Args:
        broker_name: the queue's group.
        members: the group's ``{brokerId: addr}``; None or empty when unknown.
        wanted_id: :meth:`PullNodeTable.recalculate` of the queue (the pin, or the last suggestion).
        down: the client's member health.
        now_ms: the clock ``down`` uses.
        pinned: ``connect_broker_by_user``: no avoidance of down or refusing members, no fallback.

    Returns:
        The plan, or None when no member can be resolved (the caller refreshes the route).
    """
    if not members:
        return None
    if not pinned:
        wanted_id = choose_pull_broker_id(broker_name, members, wanted_id, down, now_ms)
    found = find_broker_address_in_subscribe(members, wanted_id, False)
    if found is None:
        return None
    first_id = next((bid for bid, a in members.items() if a == found.broker_addr), MASTER_ID)
    return PullPlan(broker_name, members, PullTarget(first_id, found.broker_addr, found.slave), down,
                    pinned=pinned)


def parse_namesrv_addr(namesrv_addr: str) -> list[str]:
    """The ``host:port`` entries of a ``;``-separated nameserver list, each checked.

    Raises:
        ConfigError: the list is empty, or an entry has no port or a port outside 1-65535 (a bare ``localhost``
            would otherwise be dialled at port 80).
    """
    addrs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
    if not addrs:
        raise ConfigError(f"namesrv_addr {namesrv_addr!r} names no nameserver: write 'host:port', several "
                          "separated by ';' (a local cluster prints its own: namesrv=...)")
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"namesrv_addr entry {addr!r} is not 'host:port' with a port in 1-65535: write it "
                              f"as e.g. '{(host or addr).strip(':') or 'localhost'}:9876' (RocketMQ's default port)")
    return addrs


def normalize_namesrv_addr(namesrv_addr: str) -> str:
    """``namesrv_addr`` checked (:func:`parse_namesrv_addr`) and rejoined without blanks: what a client keeps."""
    return ";".join(parse_namesrv_addr(namesrv_addr))


class NameServerSelector:
    """Which nameserver to ask: one at a time, random start, the next one on failure (docs/BEHAVIOUR.md 6.6)."""

    def __init__(self, addrs: Iterable[str], *, rng: random.Random | None = None) -> None:
        self.addrs = parse_namesrv_addr(";".join(addrs))
        self._index = (rng or random.Random()).randrange(999)

    @classmethod
    def parse(cls, namesrv_addr: str, *, rng: random.Random | None = None) -> NameServerSelector:
        """From a ``;``-separated list (see :func:`parse_namesrv_addr`)."""
        return cls(parse_namesrv_addr(namesrv_addr), rng=rng)

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
