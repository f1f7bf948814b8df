"""Timed delivery against a real master killed half-way (issue 17 acceptance, short profile of
``python -m benchmarks timer``): 200 messages with random delays up to 6 s, SIGKILL and restart at 3 s. Every
message arrives exactly once, none before its time, and those not due during the downtime within 1 s of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.timer_bench import run_timer_profile
from client import Admin, Message, Producer
from client.cluster import LocalCluster
from client.errors import ClientError, MessageIllegalError

pytestmark = pytest.mark.integration

MESSAGES = 200
HORIZON_S = 6.0


def test_timed_messages_survive_a_master_sigkill_exactly_once(tmp_path: Path) -> None:
    r = run_timer_profile(tmp_path, messages=MESSAGES, horizon_s=HORIZON_S)
    worst = sorted(r.lateness_ms)[-5:]
    print(f"sent {r.sent}, lateness p50 {r.percentile(0.5)} ms p99 {r.percentile(0.99)} ms worst {worst}, "
          f"{r.pending_at_kill} pending at the kill, {r.during_downtime} due during the {r.downtime_ms} ms downtime, early {r.early}, lost {r.lost}, "
          f"duplicated {r.duplicated}")
    assert r.sent == MESSAGES
    assert r.lost == 0, f"{r.lost} timed messages lost across the SIGKILL"
    assert r.duplicated == 0, f"{r.duplicated} timed messages delivered twice"
    assert r.early == 0, f"{r.early} timed messages delivered before their time"
    assert len(r.lateness_ms) + r.during_downtime == MESSAGES
    assert r.pending_at_kill >= MESSAGES // 4, "too few messages were pending in the timer at the kill"
    assert max(r.lateness_ms) <= 1000, f"lateness ms {worst}"


def test_the_master_refuses_timers_beyond_its_bound_and_sends_to_the_timer_topic(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0, broker_config={"timerMaxDelaySec": "10"})
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic("TimerBound", queue_nums=1)
    with Producer("p_timer_bound", cluster.namesrv_addr) as p:
        with pytest.raises(MessageIllegalError, match=r"beyond timerMaxDelaySec \(10 s\)"):
            p.send(Message("TimerBound", b"x", delay_s=11))
        with pytest.raises(ClientError, match="rmq_sys_wheel_timer"):
            p.send(Message("rmq_sys_wheel_timer", b"x"))
        assert p.send(Message("TimerBound", b"x", delay_s=10)).queue_offset == 0  # the timer queue's first unit
