"""Prometheus metrics of one broker, in its own registry (so tests can run several brokers in a process).

Names follow RocketMQ 5's exporter (``rocketmq_messages_in_total`` ... with ``cluster``, ``node_type``,
``node_id``, ``topic`` labels); ``splitmq_pull_served_total{role}`` counts messages served by role, which shows
read/write splitting at work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["CONTENT_TYPE", "BrokerMetrics", "RateMeter"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ("cluster", "node_type", "node_id", "topic")
#: Topics whose label children are cached (beyond it, children are looked up per call).
_MAX_CACHED_TOPICS = 10_000


class BrokerMetrics:
    """Counters the processors bump; :meth:`render` is the ``GET /metrics`` body.

    Args:
        cluster: ``brokerClusterName``.
        node_id: ``brokerName`` (the group); ``broker_id`` tells master and slaves apart in ``runtime``.
        role: the broker's role, for ``splitmq_pull_served_total``.
    """

    def __init__(self, cluster: str, node_id: str, role: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._base = (cluster, "broker", node_id)
        self._role = role
        r = self.registry
        self.messages_in = Counter("rocketmq_messages_in", "Messages stored", _LABELS, registry=r)
        self.messages_out = Counter("rocketmq_messages_out", "Messages served to consumers", _LABELS, registry=r)
        self.throughput_in = Counter("rocketmq_throughput_in", "Bytes stored", _LABELS, registry=r)
        self.throughput_out = Counter("rocketmq_throughput_out", "Bytes served to consumers", _LABELS, registry=r)
        self.pull_served = Counter("splitmq_pull_served", "Messages served by pulls, by serving role", ("role",),
                                   registry=r)
        self.send_requests = Counter("splitmq_send_requests", "Send requests by response code", ("code",),
                                     registry=r)
        self.pull_requests = Counter("splitmq_pull_requests", "Pull requests by response code", ("code",),
                                     registry=r)
        self.parked_pulls = Gauge("splitmq_parked_pulls", "Pulls waiting in long polling", registry=r)
        self.commitlog_max_offset = Gauge("splitmq_commitlog_max_offset", "Commit-log max physical offset",
                                          registry=r)
        self.dispatch_behind_bytes = Gauge("splitmq_dispatch_behind_bytes", "Commit-log bytes not yet dispatched",
                                           registry=r)

        # Label children cached: ``labels()`` costs a few µs a call, several calls per request on the data path.
        self._in: dict[str, tuple[Any, Any]] = {}
        self._out: dict[str, tuple[Any, Any]] = {}
        self._codes: dict[tuple[int, bool], Any] = {}
        self._served_by_role = self.pull_served.labels(role)

    def _children(self, cache: dict[str, tuple[Any, Any]], msgs: Counter, size: Counter, topic: str
                  ) -> tuple[Any, Any]:
        pair = cache.get(topic)
        if pair is None:
            labels = (*self._base, topic)
            pair = (msgs.labels(*labels), size.labels(*labels))
            if len(cache) < _MAX_CACHED_TOPICS:
                cache[topic] = pair
        return pair

    def stored(self, topic: str, count: int, size: int) -> None:
        msgs, nbytes = self._children(self._in, self.messages_in, self.throughput_in, topic)
        msgs.inc(count)
        nbytes.inc(size)

    def served(self, topic: str, count: int, size: int) -> None:
        msgs, nbytes = self._children(self._out, self.messages_out, self.throughput_out, topic)
        msgs.inc(count)
        nbytes.inc(size)
        self._served_by_role.inc(count)

    def count_request(self, code: int, *, pull: bool) -> None:
        """One send (``pull=False``) or pull request answered with ``code``."""
        child = self._codes.get((code, pull))
        if child is None:
            child = self._codes[(code, pull)] = (self.pull_requests if pull else self.send_requests).labels(str(int(code)))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
