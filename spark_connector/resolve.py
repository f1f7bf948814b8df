"""Driver-side offset resolution: which queues a topic has and where each range starts and ends.

Offsets come from each group's master, like RocketMQ's admin offset queries; when the master does not answer,
the group's slaves are asked in id order. A slave's max offset lags the master's, so a range planned from it
only ends earlier, which is safe: the next batch or micro-batch picks up the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from client.errors import BrokerError, ClientError, TransportError
from common.codes import Perm
from common.message import MessageQueue
from common.route import TopicRouteData
from spark_connector.offsets import (
    EARLIEST,
    EARLIEST_MARKER,
    LATEST,
    LATEST_MARKER,
    OffsetMap,
    OffsetSpec,
    QueueKey,
)
from spark_connector.options import OptionError, SourceOptions

log = logging.getLogger(__name__)

__all__ = [
    "OffsetClient",
    "fetch_offsets",
    "queue_keys",
    "resolve_end",
    "resolve_start",
    "route_snapshot",
]


class OffsetClient(Protocol):
    """What resolution needs from a client (the pooled :class:`~spark_connector.transport.BrokerClient`)."""

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData: ...

    def queue_offset(self, addr: str, kind: str, mq: MessageQueue, *, timestamp_ms: int | None = None) -> int: ...


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


def _group_offsets(
    client: OffsetClient, route: TopicRouteData, broker_name: str, keys: list[QueueKey], kind: str,
    timestamp_ms: int | None,
) -> dict[QueueKey, int]:
    data = route.broker_data(broker_name)
    members = sorted(data.broker_addrs.items()) if data else []
    last: ClientError | None = None
    for broker_id, addr in members:
        try:
            return {k: client.queue_offset(addr, kind, k.message_queue, timestamp_ms=timestamp_ms) for k in keys}
        except (TransportError, BrokerError) as e:
            if isinstance(e, BrokerError) and not e.retriable:
                raise
            log.warning("%s offsets of %s from broker id %d (%s) failed: %s; trying the next member",
                        kind, broker_name, broker_id, addr, e)
            last = e
    if last is not None:
        raise last
    raise TransportError(f"broker group {broker_name} has no member in the route")


def fetch_offsets(
    client: OffsetClient, route: TopicRouteData, keys: Iterable[QueueKey], kind: str,
    *, timestamp_ms: int | None = None,
) -> OffsetMap:
    """``min`` / ``max`` / ``search`` offsets of ``keys``, one broker group at a time (master, else slaves)."""
    by_group: dict[str, list[QueueKey]] = {}
    for k in keys:
        by_group.setdefault(k.broker_name, []).append(k)
    out: OffsetMap = {}
    for broker_name, group_keys in sorted(by_group.items()):
        out.update(_group_offsets(client, route, broker_name, group_keys, kind, timestamp_ms))
    return out


def _check_named_queues(spec: Mapping[QueueKey, int], keys: list[QueueKey], option: str, topic: str) -> None:
    known = set(keys)
    for k in spec:
        if k.topic != topic:
            raise OptionError(f"option {option} names topic {k.topic!r}, but this query reads {topic!r}")
        if k not in known:
            raise OptionError(f"option {option} names queue {k}, which the route of {topic} does not have")


def resolve_start(
    client: OffsetClient, route: TopicRouteData, keys: list[QueueKey], opts: SourceOptions,
    *, spec: OffsetSpec | None = None, lows: OffsetMap | None = None, highs: OffsetMap | None = None,
) -> OffsetMap:
    """First offset per queue from ``startingTimestamp`` / ``startingOffsets`` (queues a JSON spec leaves out
    start at the earliest offset). Starts below a queue's min offset are data loss (see ``failOnDataLoss``).
    """
    spec = opts.starting_offsets if spec is None else spec
    if opts.starting_timestamp_ms is not None:
        return fetch_offsets(client, route, keys, "search", timestamp_ms=opts.starting_timestamp_ms)
    lows = lows if lows is not None else fetch_offsets(client, route, keys, "min")
    if spec == EARLIEST:
        return dict(lows)
    highs = highs if highs is not None else fetch_offsets(client, route, keys, "max")
    if spec == LATEST:
        return dict(highs)
    assert isinstance(spec, dict)
    _check_named_queues(spec, keys, "startingOffsets", opts.topic)
    out: OffsetMap = {}
    for k in keys:
        v = spec.get(k, EARLIEST_MARKER)
        if v == EARLIEST_MARKER:
            out[k] = lows[k]
        elif v == LATEST_MARKER:
            out[k] = highs[k]
        elif v < lows[k]:
            if opts.fail_on_data_loss:
                raise OptionError(f"option startingOffsets: {k} starts at {v}, below its min offset {lows[k]} "
                                  "(expired); set failOnDataLoss=false to start at the min offset")
            log.warning("startingOffsets for %s is %d, below the min offset %d: starting there", k, v, lows[k])
            out[k] = lows[k]
        else:
            out[k] = v
    return out


def resolve_end(
    client: OffsetClient, route: TopicRouteData, keys: list[QueueKey], opts: SourceOptions,
    *, highs: OffsetMap | None = None,
) -> OffsetMap:
    """Exclusive end per queue from ``endingTimestamp`` / ``endingOffsets``, never beyond the max offset."""
    highs = highs if highs is not None else fetch_offsets(client, route, keys, "max")
    if opts.ending_timestamp_ms is not None:
        found = fetch_offsets(client, route, keys, "search", timestamp_ms=opts.ending_timestamp_ms)
        return {k: min(found[k], highs[k]) for k in keys}
    spec = opts.ending_offsets
    if spec == LATEST:
        return dict(highs)
    assert isinstance(spec, dict)
    _check_named_queues(spec, keys, "endingOffsets", opts.topic)
    out: OffsetMap = {}
    for k in keys:
        v = spec.get(k, LATEST_MARKER)
        if v == LATEST_MARKER or v > highs[k]:
            if v > highs[k]:
                log.warning("endingOffsets for %s is %d, beyond its max offset %d: ending there", k, v, highs[k])
            out[k] = highs[k]
        else:
            out[k] = v
    return out
