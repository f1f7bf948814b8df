"""Timed delivery across a master crash (issue 17, item 4): ``python -m benchmarks timer``.

A one-master cluster; ``messages`` messages are sent at once with random ``delay_s`` in ``(0, horizon_s]``;
half-way through the horizon the master is killed (SIGKILL) and started again on the same store. Then every
message is read back from offset 0 of every queue, and each delivered copy is judged by the broker's own clock:
its store time (when it became visible) against its ``TIMER_DELIVER_MS`` (when it was due, set by the broker at
the send).

Rows: messages, lateness p50 / p99 / max of the messages not due during the downtime (target: within 1 s),
those due during it (late by the downtime, not counted in the lateness), early (delivered before their time),
lost and duplicated (targets: 0). The full profile is 1,000 messages over 60 s; ``--quick`` is 200 over 6 s,
the profile ``tests/broker/test_timer_restart.py`` runs and checks.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import attrs

from benchmarks import Row
from client import Admin, Message, MessageExt, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import ClientError

__all__ = ["TimerResult", "run", "run_timer_profile"]

TOPIC = "TimerBench"
QUEUES = 4
#: Slack around the downtime: a message due this close to it may have been delayed by it.
DOWNTIME_SLACK_MS = 200
#: Past the horizon, how long the read-back waits for the last deliveries.
DRAIN_S = 20.0


@attrs.frozen
class TimerResult:
    """What one run measured (ms on the broker's clock)."""

    sent: int
    lateness_ms: tuple[int, ...]
    """Store time of the delivered copy minus its deliver time, for messages not due during the downtime."""
    during_downtime: int
    """Messages due while the master was down (late by up to the downtime)."""
    pending_at_kill: int
    """Messages due after the kill: pending in the timer when the master was killed."""
    early: int
    lost: int
    duplicated: int
    downtime_ms: int

    def percentile(self, p: float) -> int:
        values = sorted(self.lateness_ms)
        return values[min(len(values) - 1, int(p * len(values)))] if values else 0


def run_timer_profile(root: Path, *, messages: int, horizon_s: float, restart: bool = True,
                      seed: int = 17) -> TimerResult:
    """Send ``messages`` timed messages with delays up to ``horizon_s``, crash and restart the master half-way
    (when ``restart``), read everything back. Raises ClusterError / ClientError when the cluster fails."""
    rng = random.Random(seed)
    with LocalCluster(root, broker_groups=1, slaves_per_group=0) as cluster:
        with Admin(cluster.namesrv_addr) as admin:
            admin.create_topic(TOPIC, queue_nums=QUEUES)
        started = time.monotonic()
        ids: list[str] = []
        with Producer("timer-bench", cluster.namesrv_addr) as producer:
            for i in range(messages):
                delay = round(rng.uniform(0.2, horizon_s), 3)
                ids.append(producer.send(Message(TOPIC, f"{i}".encode(), delay_s=delay)).msg_id)
        down_from = down_until = 0
        if restart:
            master = cluster.broker("broker-a", 0)
            # Half-way through the horizon (or at once when sending took longer).
            _sleep_until(started + horizon_s / 2)
            down_from = time.time_ns() // 1_000_000
            master.kill()
            master.start()
            down_until = time.time_ns() // 1_000_000
        got = _read_back(cluster.namesrv_addr, len(ids), deadline=started + horizon_s + DRAIN_S)
    counts = Counter(m.msg_id for m in got)
    lateness: list[int] = []
    during = early = pending = 0
    for m in {m.msg_id: m for m in got}.values():
        due = int(m.properties.get("TIMER_DELIVER_MS", "0"))
        late = m.store_timestamp - due
        if late < 0:
            early += 1
        if restart and due > down_from:
            pending += 1
        if restart and down_from - DOWNTIME_SLACK_MS <= due <= down_until + DOWNTIME_SLACK_MS:
            during += 1
        else:
            lateness.append(late)
    return TimerResult(sent=len(ids), lateness_ms=tuple(lateness), during_downtime=during, pending_at_kill=pending,
                       early=early,
                       lost=len(set(ids) - set(counts)), duplicated=sum(n - 1 for n in counts.values()),
                       downtime_ms=down_until - down_from)


def _sleep_until(t: float) -> None:
    """Wait for a moment of the profile (the kill half-way through): pacing, not synchronisation."""
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _read_back(namesrv: str, n: int, *, deadline: float) -> list[MessageExt]:
    """Everything in the topic, read from offset 0 with long polling until ``n`` distinct messages are there
    (or the deadline), then one more pass so a late duplicate would show."""
    got: list[MessageExt] = []
    seen: set[str] = set()
    with PullConsumer("timer-bench-reader", namesrv) as pc:
        queues = pc.fetch_subscribe_message_queues(TOPIC)
        offsets = dict.fromkeys(queues, 0)
        extra_pass = True
        while (len(seen) < n or extra_pass) and time.monotonic() < deadline:
            if len(seen) >= n:
                extra_pass = False
            for mq in queues:
                try:
                    r = pc.pull(mq, offsets[mq], 32, suspend_timeout_s=0.2 if len(seen) < n else 0.0)
                except ClientError:  # the master is coming back up: the SDK's own backoff paces the retry
                    continue
                if r.pull_status is PullStatus.FOUND:
                    got.extend(r.msg_found_list)
                    seen.update(m.msg_id for m in r.msg_found_list)
                offsets[mq] = r.next_begin_offset
    return got


def run(quick: bool) -> list[Row]:
    """The ``timer`` entry: 1,000 messages over 60 s (``--quick``: 200 over 6 s), a SIGKILL half-way."""
    messages, horizon_s = (200, 6.0) if quick else (1000, 60.0)
    with tempfile.TemporaryDirectory(prefix="splitmq-timer-bench-") as root:
        r = run_timer_profile(Path(root), messages=messages, horizon_s=horizon_s)
    return [
        Row("timed messages sent", r.sent, "msgs", target=f"delays up to {horizon_s:.0f} s"),
        Row("late p50", r.percentile(0.5), "ms", target="<= 1000"),
        Row("late p99", r.percentile(0.99), "ms", target="<= 1000"),
        Row("late max", max(r.lateness_ms, default=0), "ms", target="<= 1000"),
        Row("due during the downtime", r.during_downtime, "msgs", target=f"downtime {r.downtime_ms} ms"),
        Row("pending at the kill", r.pending_at_kill, "msgs", target="> 0"),
        Row("early", r.early, "msgs", target="0"),
        Row("lost", r.lost, "msgs", target="0"),
        Row("duplicated", r.duplicated, "msgs", target="0"),
    ]
