"""Driver-side resolution: which queues a read covers, where each range starts and ends, and what the cluster
holds now (each queue's min and max offset, each broker group's store identity).

Offsets come from each group's master, like RocketMQ's admin offset queries; when the master does not answer,
the group's slaves are asked in id order. A slave's max offset lags the master's, so a range planned from it
only ends earlier, which is safe: the next batch or micro-batch picks up the rest. Because of that lag, a
checkpointed offset above a *slave's* max is not taken for data loss (:mod:`spark_connector.checks`); above a
master's it is.

Explicit offsets outside what a queue holds follow the rules of ``failOnDataLoss`` for batch reads too: a start
or an end below the queue's min offset (expired) or above its max offset fails the read, naming the queue, the
offsets and the option; with ``failOnDataLoss=false`` it is logged and the range starts at the earliest offset
still there (an end is clamped into the queue).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from client.errors import BrokerError, ClientError, RouteNotFoundError, TransportError
from common.codes import Perm
from common.message import MessageQueue
from common.route import TopicRouteData
from spark_connector.errors import ClusterUnreachableError, DataLossError, OptionError
from spark_connector.offsets import (
    EARLIEST,
    EARLIEST_MARKER,
    LATEST,
    LATEST_MARKER,
    OffsetMap,
    QueueKey,
)
from spark_connector.options import SourceOptions

log = logging.getLogger(__name__)

__all__ = [
    "ClusterView",
    "OffsetClient",
    "QueueState",
    "cluster_view",
    "fetch_offsets",
    "fetch_state",
    "is_system_topic",
    "queue_keys",
    "resolve_end",
    "resolve_start",
    "route_snapshot",
]

#: RocketMQ's own topics, never matched by ``subscribePattern`` (Kafka skips internal topics the same way).
_SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "OFFSET_MOVED_EVENT", "rmq_sys_wheel_timer",
                            "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"})
_SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "RMQ_SYS_", "rmq_sys_")
#: How many problems one data-loss message spells out before "and N more".
_SHOWN = 3


class OffsetClient(Protocol):
    """What resolution needs from a client (the pooled :class:`~spark_connector.transport.BrokerClient`)."""

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData: ...

    def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None) -> int: ...

    def group_identity(self, addr: str) -> str | None: ...


Brokers = Mapping[str, Mapping[int, str]]


def is_system_topic(topic: str) -> bool:
    """A RocketMQ system topic (retry and dead-letter topics included)."""
    return topic in _SYSTEM_TOPICS or topic.startswith(_SYSTEM_PREFIXES)


def queue_keys(route: TopicRouteData, topic: str) -> list[QueueKey]:
    """Every readable queue of ``topic`` in ``route``, sorted."""
    keys = [
        QueueKey(topic, qd.broker_name, qid)
        for qd in route.queue_datas
        if qd.perm & Perm.READ and route.broker_data(qd.broker_name) is not None
        for qid in range(qd.read_queue_nums)
    ]
    return sorted(keys)


def route_snapshot(route: TopicRouteData) -> dict[str, dict[int, str]]:
    """``brokerName -> {brokerId: addr}`` for shipping inside partitions."""
    return {b.broker_name: dict(b.broker_addrs) for b in route.broker_datas}


@dataclass(frozen=True)
class ClusterView:
    """The queues a read covers now: its topics, their readable queues and the members of their broker groups."""

    topics: tuple[str, ...]
    keys: list[QueueKey]
    """Every readable queue of every topic, sorted."""
    brokers: dict[str, dict[int, str]]
    """``brokerName -> {brokerId: addr}`` of the groups the topics live on."""


def cluster_view(client: OffsetClient, opts: SourceOptions, *, refresh: bool,
                 list_topics: Callable[[], list[str]]) -> ClusterView:
    """The topics of ``opts`` (a ``subscribePattern`` matched against the nameserver's topic list now) and their
    queues and broker groups.

    Args:
        client: asks for routes.
        opts: the source options.
        refresh: ask the nameserver for every route now (planning); else cached routes may serve.
        list_topics: the nameserver's topics (only called for ``subscribePattern``).

    Raises:
        ClusterUnreachableError: no nameserver answers, or a named topic has no route; the message says which.
    """
    if opts.topic_pattern is not None:
        rx = re.compile(opts.topic_pattern)
        try:
            topics = tuple(sorted(t for t in list_topics() if rx.fullmatch(t) and not is_system_topic(t)))
        except TransportError as e:
            raise ClusterUnreachableError(
                f"listing the topics for subscribePattern: no nameserver of option nameserver={opts.nameserver} "
                f"answers ({e}); check the address and that the nameserver runs") from None
    else:
        topics = tuple(opts.topics)
    keys: list[QueueKey] = []
    brokers: dict[str, dict[int, str]] = {}
    for topic in topics:
        try:
            route = client.route(topic, refresh=refresh)
        except RouteNotFoundError as e:
            if opts.topic_pattern is not None:
                log.warning("topic %s matches subscribePattern but has no route now: skipped (%s)", topic, e)
                continue
            raise _no_route(topic, opts, list_topics, e) from None
        keys.extend(queue_keys(route, topic))
        for name, members in route_snapshot(route).items():
            brokers.setdefault(name, {}).update(members)
    return ClusterView(topics, sorted(keys), brokers)


def _no_route(topic: str, opts: SourceOptions, list_topics: Callable[[], list[str]],
              e: RouteNotFoundError) -> ClusterUnreachableError:
    """Why ``topic`` has no route: no nameserver answers, or the nameservers do not know it."""
    try:
        known = list_topics()
    except ClientError as down:
        return ClusterUnreachableError(
            f"planning the read of topic {topic}: no nameserver of option nameserver={opts.nameserver} answers "
            f"({' '.join(str(down).split())}); check the address and that the nameserver runs")
    hint = "" if topic in known else " (the nameserver does not know it)"
    return ClusterUnreachableError(
        f"topic {topic} has no route{hint}: check options topic/subscribe, create the topic, or start a broker "
        f"group that holds it ({' '.join(str(e).split())})")


def _members(brokers: Brokers, broker_name: str) -> list[tuple[int, str]]:
    return sorted(brokers.get(broker_name, {}).items())


def _brokers_of(where: Brokers | TopicRouteData) -> Brokers:
    return route_snapshot(where) if isinstance(where, TopicRouteData) else where


def _by_group(keys: Iterable[QueueKey]) -> dict[str, list[QueueKey]]:
    out: dict[str, list[QueueKey]] = {}
    for k in keys:
        out.setdefault(k.broker_name, []).append(k)
    return out


def _ask_group(brokers: Brokers, broker_name: str, what: str, ask: Callable[[int, str], object]) -> None:
    """Run ``ask(broker_id, addr)`` on the first member of the group that answers (master first)."""
    last: ClientError | None = None
    for broker_id, addr in _members(brokers, broker_name):
        try:
            ask(broker_id, addr)
            return
        except (TransportError, BrokerError) as e:
            if isinstance(e, BrokerError) and not e.retriable:
                raise
            log.warning("%s of %s from broker id %d (%s) failed: %s; trying the next member", what, broker_name,
                        broker_id, addr, e)
            last = e
    if last is not None:
        raise last
    raise TransportError(f"broker group {broker_name} has no member in the route")


def fetch_offsets(
    client: OffsetClient, brokers: Brokers | TopicRouteData, keys: Iterable[QueueKey], kind: str,
    *, timestamp_ms: int | None = None, timestamps: Mapping[QueueKey, int] | None = None,
) -> OffsetMap:
    """``min`` / ``max`` / ``search`` offsets of ``keys``, one broker group at a time (master, else slaves).

    Args:
        client: asks the brokers.
        brokers: ``brokerName -> {brokerId: addr}`` (or a route).
        keys: the queues.
        kind: ``min``, ``max`` or ``search``.
        timestamp_ms: the time of a ``search`` for every queue.
        timestamps: the time of a ``search`` per queue (beats ``timestamp_ms``).
    """
    members = _brokers_of(brokers)
    out: OffsetMap = {}
    for broker_name, group_keys in sorted(_by_group(keys).items()):
        def ask(_id: int, addr: str, group_keys: list[QueueKey] = group_keys) -> None:
            found = {}
            for k in group_keys:
                ts = (timestamps or {}).get(k, timestamp_ms) if kind == "search" else None
                found[k] = client.queue_offset(addr, kind, k.message_queue, timestamp_ms=ts)
            out.update(found)

        _ask_group(members, broker_name, f"{kind} offsets", ask)
    return out


@dataclass
class QueueState:
    """What the cluster holds now, for the queues of a read."""

    mins: OffsetMap = field(default_factory=dict)
    maxs: OffsetMap = field(default_factory=dict)
    from_master: set[str] = field(default_factory=set)
    """Broker groups whose offsets the master gave (a slave's max may trail the master's)."""
    identities: dict[str, str | None] = field(default_factory=dict)
    """``brokerName -> group identity`` (None: the member asked does not know it yet, or is too old to tell)."""


def fetch_state(client: OffsetClient, brokers: Brokers, keys: Iterable[QueueKey]) -> QueueState:
    """Min and max offset of every queue and the identity of every group, each group asked at one member (the
    master, else its slaves in id order), so its offsets and its identity come from the same store."""
    state = QueueState()
    for broker_name, group_keys in sorted(_by_group(keys).items()):
        def ask(broker_id: int, addr: str, broker_name: str = broker_name, group_keys: list[QueueKey] = group_keys
                ) -> None:
            mins = {k: client.queue_offset(addr, "min", k.message_queue) for k in group_keys}
            maxs = {k: client.queue_offset(addr, "max", k.message_queue) for k in group_keys}
            try:
                identity = client.group_identity(addr)
            except BrokerError as e:  # a broker from before group identities: no check for this group
                log.info("broker %s (%s) does not tell its group identity (%s)", broker_name, addr, e)
                identity = None
            state.mins.update(mins)
            state.maxs.update(maxs)
            state.identities[broker_name] = identity
            if broker_id == 0:
                state.from_master.add(broker_name)

        _ask_group(brokers, broker_name, "offsets and identity", ask)
    return state


def _check_named_queues(spec: Mapping[QueueKey, int], keys: list[QueueKey], option: str,
                        topics: Iterable[str]) -> None:
    known, read = set(keys), set(topics)
    for k in spec:
        if k.topic not in read:
            raise OptionError(f"option {option} names topic {k.topic!r}, but this query reads "
                              f"{', '.join(sorted(read)) or 'no topic'}")
        if k not in known:
            raise OptionError(f"option {option} names queue {k}, which the route of {k.topic} does not have")


def _out_of_range(option: str, problems: list[str], *, fail: bool, fix: str) -> None:
    shown = "; ".join(problems[:_SHOWN]) + (f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else "")
    if fail:
        raise DataLossError(f"option {option}: {shown}. Set failOnDataLoss=false to {fix}, or change {option}")
    log.warning("option %s: %s (failOnDataLoss=false: %s)", option, shown, fix)


def resolve_start(client: OffsetClient, view: ClusterView, opts: SourceOptions, state: QueueState) -> OffsetMap:
    """First offset per queue: ``startingTimestamp``, else ``startingOffsetsByTimestamp`` for the queues it names,
    else ``startingOffsets`` (queues a JSON spec leaves out start at the earliest offset).

    An explicit start below a queue's min offset (expired) or above its max offset is data loss: it fails
    (``failOnDataLoss=true``) or starts at the min offset.

    Raises:
        OptionError: a JSON option names a queue or topic the read does not have.
        DataLossError: see above; the message names the queues, the offsets and the option.
    """
    keys = view.keys
    if opts.starting_timestamp_ms is not None:
        return fetch_offsets(client, view.brokers, keys, "search", timestamp_ms=opts.starting_timestamp_ms)
    by_time = opts.starting_offsets_by_timestamp or {}
    _check_named_queues(by_time, keys, "startingOffsetsByTimestamp", view.topics)
    spec = opts.starting_offsets
    if isinstance(spec, dict):
        _check_named_queues(spec, keys, "startingOffsets", view.topics)
    out = fetch_offsets(client, view.brokers, [k for k in keys if k in by_time], "search", timestamps=by_time)
    problems: list[str] = []
    for k in keys:
        if k in out:
            continue
        v = spec if not isinstance(spec, dict) else spec.get(k, EARLIEST_MARKER)
        if v in (EARLIEST, EARLIEST_MARKER):
            out[k] = state.mins[k]
        elif v in (LATEST, LATEST_MARKER):
            out[k] = state.maxs[k]
        else:
            assert isinstance(v, int)
            if v < state.mins[k]:
                problems.append(f"{k} starts at {v}, below its min offset {state.mins[k]} (expired)")
                out[k] = state.mins[k]
            elif v > state.maxs[k]:
                problems.append(f"{k} starts at {v}, beyond its max offset {state.maxs[k]}")
                out[k] = state.mins[k]
            else:
                out[k] = v
    if problems:
        _out_of_range("startingOffsets", problems, fail=opts.fail_on_data_loss,
                      fix="start such queues at their earliest offset still there")
    return out


def resolve_end(client: OffsetClient, view: ClusterView, opts: SourceOptions, state: QueueState) -> OffsetMap:
    """Exclusive end per queue: ``endingTimestamp``, else ``endingOffsetsByTimestamp`` for the queues it names,
    else ``endingOffsets``; a time-found end never passes the max offset.

    An explicit end beyond a queue's max offset, or below its min offset, is data loss as for starts
    (``failOnDataLoss=false`` clamps it into the queue).

    Raises:
        OptionError: a JSON option names a queue or topic the read does not have.
        DataLossError: see above.
    """
    keys = view.keys
    highs = state.maxs
    if opts.ending_timestamp_ms is not None:
        found = fetch_offsets(client, view.brokers, keys, "search", timestamp_ms=opts.ending_timestamp_ms)
        return {k: min(found[k], highs[k]) for k in keys}
    by_time = opts.ending_offsets_by_timestamp or {}
    _check_named_queues(by_time, keys, "endingOffsetsByTimestamp", view.topics)
    found = fetch_offsets(client, view.brokers, [k for k in keys if k in by_time], "search", timestamps=by_time)
    out: OffsetMap = {k: min(v, highs[k]) for k, v in found.items()}
    spec = opts.ending_offsets
    if isinstance(spec, dict):
        _check_named_queues(spec, keys, "endingOffsets", view.topics)
    problems: list[str] = []
    for k in keys:
        if k in out:
            continue
        v = spec.get(k, LATEST_MARKER) if isinstance(spec, dict) else LATEST_MARKER
        if v == LATEST_MARKER:
            out[k] = highs[k]
        elif v > highs[k]:
            problems.append(f"{k} ends at {v}, beyond its max offset {highs[k]}")
            out[k] = highs[k]
        elif v < state.mins[k]:
            problems.append(f"{k} ends at {v}, below its min offset {state.mins[k]} (expired)")
            out[k] = state.mins[k]
        else:
            out[k] = v
    if problems:
        _out_of_range("endingOffsets", problems, fail=opts.fail_on_data_loss,
                      fix="end such queues at their max (or min) offset")
    return out
