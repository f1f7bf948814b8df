"""The dashboard's view of a cluster: one sweep a second through :class:`client.Admin`, kept as plain data with
bounded history (ring buffers), served as one JSON snapshot.

Only the SDK's public API is used, so what the page shows is what any program could learn. A member the
nameserver forgets (its registration expired, or it was never seen again) is still listed as ``down``: the sweep
remembers every member it saw, so a killed master stays on the page in red instead of silently vanishing. Up or
down is decided by asking each member directly (``GET /runtime``, connect bound ``probe_timeout_s``), not by the
nameserver, whose view lags a crash by its expiry time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from client import Admin, QueueProgress
from common.errors import AccessDeniedError, ClientError, InvalidParameterError

__all__ = ["BROWSER_GROUP", "DOWNSAMPLE", "HISTORY_SAMPLES", "MAX_DRAWN", "Collector", "system_group",
           "system_topic"]

log = logging.getLogger(__name__)

#: Samples kept per series (one a sweep: five minutes at the default interval).
HISTORY_SAMPLES = 300
#: Topics and consumer groups the sweep follows at most (the rest are counted, not polled).
MAX_TOPICS = 64
MAX_GROUPS = 64
#: Transitions of the member serving a queue's pulls kept per queue.
SERVED_BY_CHANGES = 8
#: Seconds over which a queue's write rate is measured.
RATE_WINDOW_S = 5.0
#: Seconds between two liveness probes of one member (each member is probed on its own: a hung one delays
#: no other).
PROBE_INTERVAL_S = 0.25
#: Members probed at once at most.
MAX_PROBES = 16
#: The group the message browser pulls with; it never commits an offset.
BROWSER_GROUP = "SPLITMQ_DASHBOARD_BROWSER"
#: Topics RocketMQ (and SplitMQ's brokers) create for themselves; the views leave them out (listed apart).
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "OFFSET_MOVED_EVENT", "RMQ_SYS_TRACE_TOPIC",
                           "BenchmarkTest", "SELF_TEST_TOPIC", "DefaultCluster", "TRANS_CHECK_MAX_TIME_TOPIC"})
#: Consumer groups of RocketMQ's own machinery and of tools (the transaction check's ``CID_SYS_RMQ_TRANS``...).
SYSTEM_GROUPS = frozenset({"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "__MONITOR_CONSUMER", "SELF_TEST_C_GROUP",
                           "CID_ONS-HTTP-PROXY", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL",
                           "CID_RMQ_SYS_TRANS", BROWSER_GROUP})


def system_topic(name: str) -> bool:
    """A topic of the cluster's own machinery (``TBW102``, ``RMQ_SYS_TRANS_HALF_TOPIC``, ``%RETRY%g``,
    ``%DLQ%g``...): left out of the topic and consumer views."""
    return (name in SYSTEM_TOPICS or name.startswith(("%RETRY%", "%DLQ%", "%SYS%"))
            or name.upper().startswith("RMQ_SYS_"))


def system_group(name: str) -> bool:
    """A consumer group of the cluster's own machinery or of a tool (``CID_SYS_*``, ``CID_RMQ_SYS_*``, the
    dashboard's browser...): listed apart from the applications' groups."""
    return name in SYSTEM_GROUPS or name.startswith(("CID_SYS_", "CID_RMQ_SYS_", "%RETRY%", "%DLQ%"))


#: Long history: the samples that leave a total's recent ring are folded, ``factor`` at a time, into a coarser
#: ring of ``points`` (their maximum, stamped with the last one's time), and so on down the tiers. At the default
#: 1 s interval: 5 minutes at full rate, then 1 hour at 10 s, then 6 hours at 1 minute.
DOWNSAMPLE = ((360, 10), (360, 6))
#: Points of one series in an answer at most (a longer range is thinned to this, keeping each stretch's maximum).
MAX_DRAWN = 360
_HISTORY_LOCK = threading.Lock()
"""Guards every series: the sweep thread adds, the page's requests read."""


class _Series:
    """A bounded ``[(t_ms, value)]`` ring buffer; with ``long``, older samples are kept downsampled
    (:data:`DOWNSAMPLE`)."""

    __slots__ = ("_pending", "points", "tiers")

    def __init__(self, long: bool = False) -> None:
        self.points: deque[tuple[int, float]] = deque(maxlen=HISTORY_SAMPLES)
        self.tiers: list[deque[tuple[int, float]]] = [deque(maxlen=n) for n, _ in DOWNSAMPLE] if long else []
        self._pending: list[list[tuple[int, float]]] = [[] for _ in self.tiers]

    def add(self, t_ms: int, value: float) -> None:
        with _HISTORY_LOCK:
            if self.tiers and len(self.points) == HISTORY_SAMPLES:
                self._fold(0, self.points[0])
            self.points.append((t_ms, value))

    def _fold(self, level: int, point: tuple[int, float]) -> None:
        pending = self._pending[level]
        pending.append(point)
        if len(pending) < DOWNSAMPLE[level][1]:
            return
        folded = (pending[-1][0], max(p[1] for p in pending))
        pending.clear()
        tier = self.tiers[level]
        if len(tier) == tier.maxlen and level + 1 < len(self.tiers):
            self._fold(level + 1, tier[0])
        tier.append(folded)

    def rate(self, now_ms: int) -> float:
        """Increase per second over the last :data:`RATE_WINDOW_S` (0 with fewer than two samples)."""
        with _HISTORY_LOCK:
            pts = [p for p in self.points if now_ms - p[0] <= RATE_WINDOW_S * 1000]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return max(0.0, (pts[-1][1] - pts[0][1]) * 1000.0 / (pts[-1][0] - pts[0][0]))

    def to_json(self) -> list[list[float]]:
        with _HISTORY_LOCK:
            return [[t, v] for t, v in self.points]

    def render(self, since_ms: int, max_points: int = MAX_DRAWN) -> list[list[float]]:
        """The points at or after ``since_ms``, oldest first, from every tier; thinned to ``max_points`` (each
        stretch's maximum, so a peak is never thinned away)."""
        with _HISTORY_LOCK:
            chain: list[tuple[int, float]] = []
            for level in reversed(range(len(self.tiers))):
                chain.extend(self.tiers[level])
                chain.extend(self._pending[level])
            chain.extend(self.points)
        pts = [p for p in chain if p[0] >= since_ms]
        if len(pts) > max_points:
            step = len(pts) / max_points
            pts = [(pts[min(len(pts), int((i + 1) * step)) - 1][0],
                    max(p[1] for p in pts[int(i * step):int((i + 1) * step)]))
                   for i in range(max_points)]
        return [[t, v] for t, v in pts]


class Collector:
    """Sweeps the cluster every ``interval_s`` on a background thread and keeps the last snapshot.

    Args:
        admin: the admin session (its client config bounds every request of a sweep).
        namesrv_addr: shown on the page and in errors.
        interval_s: pause between sweeps.
        clock_ms: wall clock in ms (injected in tests).
    """

    def __init__(self, admin: Admin, namesrv_addr: str, *, interval_s: float = 1.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.admin = admin
        self.namesrv_addr = namesrv_addr
        self.interval_s = interval_s
        self.admin_lock = threading.Lock()
        """Held around every use of ``admin`` (the sweep thread and the page's queries share it)."""
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prober: threading.Thread | None = None
        self._live: dict[str, dict[str, Any]] = {}
        """Member address -> its newest probe: ``{"up", "runtime" | "error", "checkedMs"}`` (``up`` with an
        ``error``: it answered, but refused this account)."""
        self._snapshot: dict[str, Any] = {"namesrv": namesrv_addr, "ok": False, "error": "first sweep pending",
                                          "updatedMs": 0, "groups": [], "replication": [], "topics": [],
                                          "consumers": [], "systemTopics": [], "systemGroups": [],
                                          "deadLetters": []}
        # State that outlives one sweep: the members ever seen, and the bounded history.
        self._known: dict[str, dict[str, int]] = {}
        """Group -> member address -> the broker id it last registered with. Keyed by address, the member's
        identity: in a DLedger group ids move with the leadership, and a dead leader must stay listed."""
        self._cluster_of: dict[str, str] = {}
        self._series: dict[str, _Series] = {}
        self._touched: set[str] = set()
        self._served_by: dict[str, deque[list[int]]] = {}
        self._master_max: dict[str, _Series] = {}

    # --- lifecycle ---

    def start(self) -> None:
        """Start the sweep thread (a first sweep runs at once)."""
        if self._thread is not None:
            raise RuntimeError("collector already started")
        self._thread = threading.Thread(target=self._run, name="dashboard-sweep", daemon=True)
        self._prober = threading.Thread(target=self._probe_loop, name="dashboard-probe", daemon=True)
        self._thread.start()
        self._prober.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the sweep thread; bounded by ``timeout_s``. Idempotent."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in (self._thread, self._prober):
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sweep()
            except Exception as e:  # a sweep must never end the thread; the page shows the error
                log.exception("dashboard sweep failed")
                self._set_error(f"sweep failed: {type(e).__name__}: {e}")
            self._stop.wait(max(0.05, self.interval_s - (time.monotonic() - started)))

    def _probe_loop(self) -> None:
        """Probe every known member every :data:`PROBE_INTERVAL_S`, each on its own: a member is ``up`` when
        it answers ``GET /runtime`` within the request timeout. Apart from the sweep, so that a slow sweep (a
        paused broker costs it a timeout per call) never delays the news that a master died."""
        pending: dict[str, Future[None]] = {}
        with ThreadPoolExecutor(max_workers=MAX_PROBES, thread_name_prefix="dashboard-probe") as pool:
            while not self._stop.wait(PROBE_INTERVAL_S):
                addrs = self.known_addrs()
                for addr in list(pending):
                    if addr not in addrs and pending[addr].done():
                        del pending[addr]
                for addr in sorted(addrs):
                    f = pending.get(addr)
                    if f is None or f.done():
                        pending[addr] = pool.submit(self.probe, addr)

    def probe(self, addr: str) -> None:
        """Ask one member for its runtime now and record whether it answered."""
        result: dict[str, Any]
        try:
            rt = self.admin.broker_runtime(addr)
        except AccessDeniedError as e:  # it answered: up, but this account may not read it
            result = {"up": True, "error": f"{e} -- the dashboard needs an admin account (splitmq --access-key/"
                      "--secret-key, or SPLITMQ_ACCESS_KEY/SPLITMQ_SECRET_KEY)", "checkedMs": self._clock_ms()}
        except ClientError as e:
            result = {"up": False, "error": str(e), "checkedMs": self._clock_ms()}
        else:
            result = {"up": True, "runtime": rt, "checkedMs": self._clock_ms()}
        with self._lock:
            self._live[addr] = result

    def snapshot(self, range_s: float | None = None) -> dict[str, Any]:
        """The newest snapshot, with each member's up/down from its newest probe (which may be fresher than
        the sweep); with ``range_s``, the totals' histories cover that many seconds back (downsampled, at most
        :data:`MAX_DRAWN` points each) instead of the last :data:`HISTORY_SAMPLES` samples."""
        with self._lock:
            snap = dict(self._snapshot)
            live = dict(self._live)
        with _HISTORY_LOCK:
            series = dict(self._series)
        if range_s is not None:
            since = self._clock_ms() - int(range_s * 1000)
            for key in ("topics", "consumers", "replication"):
                snap[key] = [dict(row, history=series[row["historyKey"]].render(since))
                             if row.get("historyKey") in series else row for row in snap.get(key, [])]
        groups = []
        for g in snap.get("groups", []):
            members = []
            for m in g["members"]:
                probe = live.get(m["addr"])
                if probe is not None and probe["checkedMs"] > m.get("checkedMs", 0) and probe["up"] != m["up"]:
                    m = dict(m, up=probe["up"], error=probe.get("error"), checkedMs=probe["checkedMs"])
                members.append(m)
            groups.append(dict(g, members=members))
        snap["groups"] = groups
        return snap

    def known_addrs(self) -> set[str]:
        """Every member address the sweep has seen (the page may only ask these for metrics)."""
        with self._lock:
            return {a for members in self._known.values() for a in members}

    def _set_error(self, message: str) -> None:
        with self._lock:
            self._snapshot = dict(self._snapshot, ok=False, error=message, updatedMs=self._clock_ms())

    def _series_of(self, key: str, long: bool = False) -> _Series:
        self._touched.add(key)
        s = self._series.get(key)
        if s is None:
            s = _Series(long)
            with _HISTORY_LOCK:  # the page's requests copy the table
                self._series[key] = s
        return s

    # --- one sweep ---

    def sweep(self) -> None:
        """Ask the nameserver and every member once; replace the snapshot."""
        started = time.monotonic()
        now = self._clock_ms()
        with self.admin_lock:
            try:
                info = self.admin.cluster_info()
            except ClientError as e:
                self._set_error(f"nameserver {self.namesrv_addr} unreachable: {e}")
                return
            with self._lock:  # the prober reads the known members
                for name, bd in info.broker_addr_table.items():
                    self._cluster_of[name] = bd.cluster
                    self._known.setdefault(name, {}).update({a: bid for bid, a in bd.broker_addrs.items()})
                known = {name: dict(members) for name, members in self._known.items()}
            groups = [self._group(name, known[name], info.broker_addr_table.get(name), now)
                      for name in sorted(known)]
            replication = [row for g in groups for row in self._replication(g, now)]
            topics, system_topics, dead_letters, topic_error = self._topics(now)
            consumers, system_groups, consumer_error = self._consumers(now)
            # Series of topics, groups or slaves that are gone go with them: the history stays bounded.
            with _HISTORY_LOCK:
                for key in set(self._series) - self._touched:
                    del self._series[key]
            for key in [k for k in self._served_by if f"lag/{k}" not in self._series]:
                del self._served_by[key]
            self._touched.clear()
        with self._lock:
            self._snapshot = {
                "namesrv": self.namesrv_addr, "ok": True, "error": None, "updatedMs": now,
                "sweepMs": round((time.monotonic() - started) * 1000, 1),
                "groups": groups, "replication": replication, "topics": topics, "consumers": consumers,
                "systemTopics": system_topics, "systemGroups": system_groups, "deadLetters": dead_letters,
                "warnings": [w for w in (topic_error, consumer_error) if w],
            }

    def _group(self, name: str, known: dict[str, int], bd: Any, now: int) -> dict[str, Any]:
        in_route = dict(bd.broker_addrs) if bd is not None else {}
        members = []
        dledger = False
        for addr, bid in sorted(known.items(), key=lambda item: (item[1], item[0])):
            m: dict[str, Any] = {"id": bid, "addr": addr, "inRoute": in_route.get(bid) == addr, "up": False}
            with self._lock:
                probe = self._live.get(addr)
            if probe is None or self._prober is None:  # new (or no prober running): probe it now
                self.probe(addr)
                with self._lock:
                    probe = self._live[addr]
            m["checkedMs"] = probe["checkedMs"]
            if "runtime" not in probe:  # down, or up but refusing this account
                m.update(up=probe["up"], error=probe["error"])
            else:
                rt = probe["runtime"]
                m.update(up=True, role=rt.get("role"), commitLogMaxOffset=rt.get("commitLogMaxOffset"),
                         commitLogMinOffset=rt.get("commitLogMinOffset"), putTps=rt.get("putTps"),
                         slaveReadEnable=rt.get("slaveReadEnable"), masterLinkUp=rt.get("masterLinkUp"),
                         diskUsedRatio=(rt.get("diskUsedRatio") or {}).get("commitLog"),
                         storeWriteable=rt.get("storeWriteable"))
                dledger = dledger or bool(rt.get("dledger"))
            members.append(m)
        master = next((m for m in members if m["id"] == 0 and m["up"]), None)
        if master is not None and isinstance(master.get("commitLogMaxOffset"), int):
            self._master_max.setdefault(name, _Series()).add(now, master["commitLogMaxOffset"])
        group: dict[str, Any] = {"name": name, "cluster": self._cluster_of.get(name, ""), "members": members,
                                 "dledger": dledger, "peers": []}
        if dledger:
            group["peers"] = self._peers(name)
        return group

    def _peers(self, name: str) -> list[dict[str, Any]]:
        """DLedger peers with their roles; a peer no member answers for is listed as down."""
        try:
            status = self.admin.dledger_status(name)
        except (ClientError, InvalidParameterError) as e:
            return [{"peerId": "?", "error": str(e), "up": False}]
        answers = [a for a in status.values() if "selfId" in a]
        peers: dict[str, str] = {}
        for answer in answers:
            peers.update(answer.get("peers") or {})
        leader = next((x for x in answers if x.get("role") == "LEADER"), None)
        progress = dict((leader or {}).get("peerProgress") or {})
        out = []
        for pid, paddr in sorted(peers.items()):
            a = next((x for x in answers if x.get("selfId") == pid), None)
            row: dict[str, Any] = {"peerId": pid, "peerAddr": paddr, "up": a is not None}
            if a is not None:
                row.update(role=a.get("role"), term=a.get("term"), addr=a.get("addr"),
                           brokerId=a.get("brokerId"), committedIndex=a.get("committedIndex"),
                           ledgerEndIndex=a.get("ledgerEndIndex"))
            if pid in progress:  # entries behind the leader's end, as the leader sees it (down peers too)
                row["lag"] = dict(progress[pid]).get("lag")
            out.append(row)
        return out

    def _replication(self, group: dict[str, Any], now: int) -> list[dict[str, Any]]:
        """One row per slave: offset diff, lag in bytes and in time, in-sync flag, and the diff's history.

        The master's ``GET /ha`` lists its HA connections by socket address, which does not name the slave; a
        connection is matched to the slave whose own max offset is nearest its ack offset (exact with one
        slave, the usual layout)."""
        name = group["name"]
        if group["dledger"]:
            return []
        slaves = [m for m in group["members"] if m["id"] != 0]
        if not slaves:
            return []
        masters = [m for m in group["members"] if m["id"] == 0]
        master = next((m for m in masters if m["up"]), masters[0] if masters else None)
        conns: list[dict[str, Any]] = []
        master_max: int | None = None
        if master is not None and master["up"]:
            try:
                ha = self.admin.ha_status(name).get(0, {})
            except ClientError:
                ha = {}
            conns = list(ha.get("slaves") or [])
            master_max = ha.get("masterMaxOffset", master.get("commitLogMaxOffset"))
        rows = []
        free = list(conns)
        for s in slaves:
            own = s.get("commitLogMaxOffset")
            conn = None
            if free:
                conn = min(free, key=lambda c: abs(int(c.get("ackOffset", 0)) - (own if isinstance(own, int) else 0)))
                free.remove(conn)
            ack = int(conn["ackOffset"]) if conn else own
            diff = (master_max - ack) if isinstance(master_max, int) and isinstance(ack, int) else None
            row: dict[str, Any] = {
                "group": name, "slaveId": s["id"], "addr": s["addr"], "up": s["up"], "masterUp": master_max is not None,
                "masterMaxOffset": master_max, "ackOffset": ack, "diffBytes": diff,
                "inSync": bool(conn.get("inSync")) if conn else False, "connected": conn is not None,
                "lagS": self._lag_s(name, ack, now) if diff else 0.0,
            }
            series = self._series_of(f"repl/{name}/{s['id']}", long=True)
            if diff is not None:
                series.add(now, max(0, diff))
            row["history"] = series.to_json()
            row["historyKey"] = f"repl/{name}/{s['id']}"
            rows.append(row)
        return rows

    def _lag_s(self, name: str, ack: int | None, now: int) -> float | None:
        """How long ago the master was where the slave is now: ``now`` minus the first sample in which the
        master's max offset passed ``ack`` (the oldest sample when it passed before the history begins)."""
        series = self._master_max.get(name)
        if series is None or ack is None:
            return None
        for t, value in series.points:
            if value > ack:
                return round((now - t) / 1000.0, 1)
        return 0.0

    def _topics(self, now: int) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]], str | None]:
        """The applications' topics (swept), the system topics (named only), and the dead-letter topics."""
        try:
            every = self.admin.topic_list()
        except ClientError as e:
            return [], [], [], f"topic list: {e}"
        # RocketMQ also registers a topic named after each cluster and broker group: not the applications' either.
        own = set(self._cluster_of.values()) | set(self._cluster_of)
        names = [t for t in every if not system_topic(t) and t not in own]
        system = sorted(t for t in every if (system_topic(t) or t in own) and not t.startswith("%DLQ%"))
        out = []
        for topic in names[:MAX_TOPICS]:
            try:
                offsets = self.admin.topic_offsets(topic)
            except ClientError as e:
                out.append({"name": topic, "error": str(e), "queues": [], "rate": 0.0})
                continue
            queues: list[dict[str, Any]] = []
            for mq, lo, hi in offsets:
                series = self._series_of(f"topic/{topic}/{mq.broker_name}/{mq.queue_id}")
                series.add(now, hi)
                queues.append({"broker": mq.broker_name, "queueId": mq.queue_id, "min": lo, "max": hi,
                               "rate": round(series.rate(now), 1)})
            total = self._series_of(f"topic/{topic}", long=True)
            total.add(now, sum(q["max"] for q in queues))
            out.append({"name": topic, "queues": queues, "rate": round(total.rate(now), 1),
                        "history": total.to_json(), "historyKey": f"topic/{topic}"})
        dead = self._dead_letters(sorted(t for t in every if t.startswith("%DLQ%")))
        more = len(names) - MAX_TOPICS
        return out, system, dead, (f"{more} more topics not shown (MAX_TOPICS={MAX_TOPICS})" if more > 0 else None)

    def _dead_letters(self, topics: list[str]) -> list[dict[str, Any]]:
        """Per ``%DLQ%<group>`` topic: the messages it holds (max minus min offset over its queues)."""
        out = []
        for topic in topics[:MAX_TOPICS]:
            row: dict[str, Any] = {"topic": topic, "group": topic.removeprefix("%DLQ%"), "queues": [], "count": 0}
            try:
                offsets = self.admin.topic_offsets(topic)
            except ClientError as e:
                row["error"] = str(e)
            else:
                row["queues"] = [{"broker": mq.broker_name, "queueId": mq.queue_id, "min": lo, "max": hi}
                                 for mq, lo, hi in offsets]
                row["count"] = sum(max(0, hi - lo) for _, lo, hi in offsets)
            out.append(row)
        return out

    def _consumers(self, now: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
        """The applications' group/topic pairs (swept), and the system groups (named with their topics only)."""
        try:
            groups = self.admin.consumer_groups()
        except ClientError as e:
            return [], [], f"consumer groups: {e}"
        out = []
        pairs = [(g, t) for g, topics in groups.items() if not system_group(g)
                 for t in topics if not system_topic(t)]
        system = [{"group": g, "topics": list(ts)} for g, ts in groups.items()
                  if system_group(g) or all(system_topic(t) for t in ts)]
        for group, topic in pairs[:MAX_GROUPS]:
            try:
                progress = self.admin.consumer_progress(group, topic)
            except ClientError as e:
                out.append({"group": group, "topic": topic, "error": str(e), "queues": [], "lag": 0})
                continue
            out.append(self._consumer_row(group, topic, progress, now))
        more = len(pairs) - MAX_GROUPS
        return out, system, (f"{more} more group/topic pairs not shown (MAX_GROUPS={MAX_GROUPS})"
                             if more > 0 else None)

    def _consumer_row(self, group: str, topic: str, progress: list[QueueProgress], now: int) -> dict[str, Any]:
        queues: list[dict[str, Any]] = []
        for qp in progress:
            key = f"{group}/{topic}/{qp.message_queue.broker_name}/{qp.message_queue.queue_id}"
            series = self._series_of(f"lag/{key}")
            series.add(now, qp.lag)
            changes = self._served_by.setdefault(key, deque(maxlen=SERVED_BY_CHANGES))
            if qp.last_pull_broker_id is not None and (not changes or changes[-1][1] != qp.last_pull_broker_id):
                changes.append([now, qp.last_pull_broker_id])
            queues.append({"broker": qp.message_queue.broker_name, "queueId": qp.message_queue.queue_id,
                           "brokerOffset": qp.broker_offset, "consumerOffset": qp.consumer_offset, "lag": qp.lag,
                           "servedBy": qp.last_pull_broker_id, "servedByChanges": list(changes),
                           "history": series.to_json()})
        total = self._series_of(f"lag/{group}/{topic}", long=True)
        lag = sum(q["lag"] for q in queues)
        total.add(now, lag)
        return {"group": group, "topic": topic, "lag": lag, "queues": queues, "history": total.to_json(),
                "historyKey": f"lag/{group}/{topic}"}
