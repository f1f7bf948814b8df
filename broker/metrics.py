"""Prometheus metrics of one broker, in its own registry (so tests can run several brokers in a process).

RocketMQ 5's names where they exist, with its labels ``cluster``, ``node_type`` (``broker``), ``node_id``
(``<brokerName>-<brokerId>``, so a master and its slaves are told apart), ``topic``, ``consumer_group``:

* counters bumped on the data path: ``rocketmq_messages_in_total``, ``rocketmq_messages_out_total``,
  ``rocketmq_throughput_in_total``, ``rocketmq_throughput_out_total`` (bytes), and the histogram
  ``rocketmq_rpc_latency`` (seconds per HTTP request, by ``request_code`` = path and ``response_code`` = status);
* read at scrape time from the broker's state (:class:`BrokerState`): ``rocketmq_consumer_lag_messages``,
  ``rocketmq_storage_size`` (bytes), ``rocketmq_storage_flush_behind_bytes``,
  ``rocketmq_storage_dispatch_behind_bytes``.

SplitMQ's own (not RocketMQ's): ``splitmq_pull_served_total{role}`` (messages served by pulls, by the serving
broker's role: read/write splitting at work), ``splitmq_send_requests_total{code}``,
``splitmq_pull_requests_total{code}``, ``splitmq_parked_pulls``, ``splitmq_commitlog_max_offset``, and for HA
``splitmq_ha_slave_ack_offset{slave}``, ``splitmq_ha_slave_diff_bytes{slave}``, ``splitmq_ha_in_sync_slaves``,
``splitmq_ha_transfer_bytes_total{slave}`` (master side; ``slave`` is the slave's connection address), and for
idempotent sends ``splitmq_duplicate_window_keys``, ``splitmq_duplicates_total`` and
``splitmq_duplicate_window_evicted_early_total``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from itertools import accumulate
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE", "BrokerMetrics", "BrokerState", "RateMeter"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ("cluster", "node_type", "node_id", "topic")
#: Buckets of ``rocketmq_rpc_latency`` in seconds (50 µs .. 10 s; long polls land in the top ones).
_LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0)


@attrs.frozen
class BrokerState:
    """What the scrape-time gauges read; built by the controller on each ``GET /metrics``."""

    storage_size_bytes: int
    flush_behind_bytes: int
    dispatch_behind_bytes: int
    consumer_lag: Mapping[tuple[str, str], int]
    """``(consumer_group, topic) -> messages`` not yet consumed (broker max offset - committed offset)."""
    ha: Mapping[str, Any] | None
    """The HA service's ``status()`` (master side), or None."""
    commitlog_min_offset: int = 0
    disk_used_ratio: Mapping[str, float] = attrs.field(factory=dict)
    """``store part (commitlog, consumequeue, index) -> used fraction of its partition`` at the last disk check."""
    store_writeable: bool = True
    retention_files_deleted: int = 0
    retention_bytes_reclaimed: int = 0
    dledger: Mapping[str, Any] | None = None
    """The DLedger member's ``status()`` (DLedger mode), or None."""
    dedup: Mapping[str, int] | None = None
    """The duplicate window's figures (``BrokerController.dedup_status``), or None when it is off."""


class _StateCollector(Collector):
    def __init__(self, base: tuple[str, str, str], state: Callable[[], BrokerState]) -> None:
        self._base = base
        self._state = state

    def describe(self) -> list[Any]:
        return []  # the families are read at scrape time; the broker may not be fully built at registration

    def collect(self) -> Iterator[Any]:
        st = self._state()
        names = ("cluster", "node_type", "node_id")
        for name, doc, value in (
            ("rocketmq_storage_size", "Commit-log bytes held by the store", st.storage_size_bytes),
            ("rocketmq_storage_flush_behind_bytes", "Commit-log bytes written but not flushed", st.flush_behind_bytes),
            ("rocketmq_storage_dispatch_behind_bytes", "Commit-log bytes not yet dispatched to consume queues",
             st.dispatch_behind_bytes),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(self._base, value)
            yield g
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Messages the group has not consumed yet",
                                labels=(*names, "consumer_group", "topic"))
        for (group, topic), n in sorted(st.consumer_lag.items()):
            lag.add_metric((*self._base, group, topic), n)
        yield lag
        yield from self._retention(st)
        if st.dedup is not None:
            yield from self._dedup(st.dedup)
        yield from self._ha(st.ha or {})
        if st.dledger is not None:
            yield from self._dledger(st.dledger)

    def _retention(self, st: BrokerState) -> Iterator[Any]:
        names = ("cluster", "node_type", "node_id")
        disk = GaugeMetricFamily("splitmq_disk_used_ratio", "Used fraction of the partition holding each store part "
                                 "(at the last disk check)", labels=(*names, "part"))
        for part, ratio in sorted(st.disk_used_ratio.items()):
            disk.add_metric((*self._base, part), ratio)
        yield disk
        for name, doc, value in (
            ("splitmq_commitlog_min_offset", "Commit-log min physical offset (moves when retention deletes files)",
             st.commitlog_min_offset),
            ("splitmq_store_writeable", "1 while the store takes writes, 0 while it refuses them (disk full or a "
             "write error)", int(st.store_writeable)),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(self._base, value)
            yield g
        for name, doc, value in (
            ("splitmq_retention_files_deleted", "Commit-log files deleted by retention", st.retention_files_deleted),
            ("splitmq_retention_bytes_reclaimed", "Commit-log bytes deleted by retention",
             st.retention_bytes_reclaimed),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(self._base, value)
            yield c

    def _dedup(self, d: Mapping[str, int]) -> Iterator[Any]:
        names = ("cluster", "node_type", "node_id")
        keys = GaugeMetricFamily("splitmq_duplicate_window_keys", "Unique keys of idempotent sends the duplicate "
                                 "window holds", labels=names)
        keys.add_metric(self._base, d.get("keys", 0))
        yield keys
        for name, doc, value in (
            ("splitmq_duplicates", "Messages of idempotent sends answered with their first copy instead of being "
             "stored again", d.get("duplicates", 0)),
            ("splitmq_duplicate_window_evicted_early", "Keys that left the duplicate window before "
             "duplicateWindowMs because it held duplicateWindowMaxKeys", d.get("evictedEarly", 0)),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(self._base, value)
            yield c

    def _ha(self, ha: Mapping[str, Any]) -> Iterator[Any]:
        slaves = ha.get("slaves", [])
        names = ("cluster", "node_type", "node_id", "slave")
        ack = GaugeMetricFamily("splitmq_ha_slave_ack_offset", "Commit-log offset the slave acknowledged",
                                labels=names)
        diff = GaugeMetricFamily("splitmq_ha_slave_diff_bytes", "Bytes the slave is behind the master", labels=names)
        sent = CounterMetricFamily("splitmq_ha_transfer_bytes", "Commit-log bytes streamed to the slave",
                                   labels=names)
        for sl in slaves:
            labels = (*self._base, str(sl.get("addr", "")))
            ack.add_metric(labels, sl.get("ackOffset", -1))
            diff.add_metric(labels, sl.get("diff", 0))
            sent.add_metric(labels, sl.get("transferredBytes", 0))
        in_sync = GaugeMetricFamily("splitmq_ha_in_sync_slaves", "Connected slaves within haMaxGapNotInSync",
                                    labels=("cluster", "node_type", "node_id"))
        in_sync.add_metric(self._base, sum(1 for sl in slaves if sl.get("inSync")))
        yield from (ack, diff, sent, in_sync)


    def _dledger(self, d: Mapping[str, Any]) -> Iterator[Any]:
        names = ("cluster", "node_type", "node_id")
        for name, doc, value in (
            ("splitmq_dledger_term", "The member's current term", d.get("term", 0)),
            ("splitmq_dledger_is_leader", "1 while the member leads its group", int(d.get("role") == "LEADER")),
            ("splitmq_dledger_ledger_end_index", "Index of the last entry of the member's log",
             d.get("ledgerEndIndex", -1)),
            ("splitmq_dledger_committed_index", "Index of the member's last committed entry",
             d.get("committedIndex", -1)),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(self._base, value)
            yield g
        elections = CounterMetricFamily("splitmq_dledger_elections", "Elections this member campaigned in",
                                        labels=names)
        elections.add_metric(self._base, d.get("elections", 0))
        yield elections
        lag = GaugeMetricFamily("splitmq_dledger_peer_lag_entries", "Entries a peer lacks (on the leader)",
                                labels=(*names, "peer"))
        for peer, progress in sorted(d.get("peerProgress", {}).items()):
            lag.add_metric((*self._base, peer), progress.get("lag", 0))
        yield lag


class BrokerMetrics(Collector):
    """Counters the processors bump; :meth:`render` is the ``GET /metrics`` body.

    The data path's counts (messages and bytes in and out, requests by code, the request latency histogram) are
    plain ints, bumped on the broker's event loop, which is the only thread that calls these methods (the
    processors, the router's hook, the schedule and timer services all run on it): a prometheus_client child
    takes a lock per bump, and the six or so bumps of a request cost about 2 µs that way. This object is also
    the collector that turns them into metric families at scrape time (:meth:`collect`).

    Args:
        cluster: ``brokerClusterName``.
        node_id: ``<brokerName>-<brokerId>``.
        role: the broker's role, for ``splitmq_pull_served_total``.
        state: returns the state the scrape-time gauges read (None: those gauges are left out).
    """

    def __init__(self, cluster: str, node_id: str, role: str,
                 state: Callable[[], BrokerState] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._base = (cluster, "broker", node_id)
        self._role = role
        self._stored: dict[str, list[int]] = {}  # topic -> [messages, bytes] stored
        self._served: dict[str, list[int]] = {}  # topic -> [messages, bytes] served to consumers
        self._served_by_pulls = 0
        self._requests: dict[tuple[bool, int], int] = {}  # (pull, response code) -> requests
        # (path, status) -> [count per bucket of _LATENCY_BUCKETS and +Inf (not cumulative)..., sum of seconds]
        self._latency: dict[tuple[str, int], list[float]] = {}
        r = self.registry
        r.register(self)
        self.parked_pulls = Gauge("splitmq_parked_pulls", "Pulls waiting in long polling", registry=r)
        self.commitlog_max_offset = Gauge("splitmq_commitlog_max_offset", "Commit-log max physical offset",
                                          registry=r)
        if state is not None:
            r.register(_StateCollector(self._base, state))

    def stored(self, topic: str, count: int, size: int) -> None:
        _add(self._stored, topic, count, size)

    def served(self, topic: str, count: int, size: int) -> None:
        _add(self._served, topic, count, size)
        self._served_by_pulls += count

    def count_request(self, code: int, *, pull: bool) -> None:
        """One send (``pull=False``) or pull request answered with ``code``."""
        key = (pull, code)
        requests = self._requests
        requests[key] = requests.get(key, 0) + 1

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """Router hook: one answered HTTP request."""
        counts = self._latency.get((path, status))
        if counts is None:
            counts = self._latency[(path, status)] = [0] * (len(_LATENCY_BUCKETS) + 2)
        counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1  # (le is inclusive: the first bound >= seconds)
        counts[-1] += seconds

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def describe(self) -> list[Any]:
        return list(self.collect())  # (the registry checks names; docs/gen_operations.py lists the families)

    def collect(self) -> Iterator[Any]:
        """The data-path counts as metric families (the registry calls it at each scrape)."""
        base = self._base
        for (name, doc), by_topic, at in (
            (("rocketmq_messages_in", "Messages stored"), self._stored, 0),
            (("rocketmq_messages_out", "Messages served to consumers"), self._served, 0),
            (("rocketmq_throughput_in", "Bytes stored"), self._stored, 1),
            (("rocketmq_throughput_out", "Bytes served to consumers"), self._served, 1),
        ):
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            for topic, pair in sorted(by_topic.items()):
                family.add_metric((*base, topic), pair[at])
            yield family
        served = CounterMetricFamily("splitmq_pull_served", "Messages served by pulls, by serving role",
                                     labels=("role",))
        served.add_metric((self._role,), self._served_by_pulls)
        yield served
        for pull, name, doc in ((False, "splitmq_send_requests", "Send requests by response code"),
                                (True, "splitmq_pull_requests", "Pull requests by response code")):
            family = CounterMetricFamily(name, doc, labels=("code",))
            for (is_pull, code), n in sorted(self._requests.items()):
                if is_pull is pull:
                    family.add_metric((str(int(code)),), n)
            yield family
        latency = HistogramMetricFamily("rocketmq_rpc_latency", "Seconds to answer an HTTP request",
                                        labels=("cluster", "node_type", "node_id", "request_code", "response_code"))
        bounds = [floatToGoString(b) for b in _LATENCY_BUCKETS] + ["+Inf"]
        for (path, status), counts in sorted(self._latency.items()):
            cumulative = list(accumulate(counts[:-1]))
            latency.add_metric((*base, path, str(status)), list(zip(bounds, cumulative, strict=True)), counts[-1])
        yield latency


def _add(by_topic: dict[str, list[int]], topic: str, count: int, size: int) -> None:
    pair = by_topic.get(topic)
    if pair is None:
        pair = by_topic[topic] = [0, 0]
    pair[0] += count
    pair[1] += size


class RateMeter:
    """Events per second over a sliding window of whole seconds (``putTps`` in ``/runtime``).

    Args:
        clock_ms: wall clock in ms (injected in tests).
        window_s: seconds averaged; also the bound on buckets kept.
    """

    def __init__(self, *, clock_ms: Callable[[], int], window_s: int = 10) -> None:
        self._clock_ms = clock_ms
        self._window_s = window_s
        self._buckets: deque[list[int]] = deque(maxlen=window_s + 1)

    def add(self, n: int) -> None:
        sec = self._clock_ms() // 1000
        if self._buckets and self._buckets[-1][0] == sec:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([sec, n])

    def per_second(self) -> float:
        """Average over the last ``window_s`` complete seconds."""
        now = self._clock_ms() // 1000
        total = sum(n for sec, n in self._buckets if now - self._window_s <= sec < now)
        return round(total / self._window_s, 1)
