"""Delayed messages against a real broker, across a master restart (graceful stop and SIGKILL).

Messages of three delay levels are sent; the master is stopped while the longer ones are still pending and
restarted on the same store. Then every message must arrive exactly once (counted by unique key), none before
``original store time + level delay`` (both store times read back from the broker), and those whose deliver time
was not inside the downtime within a second after it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from client import Admin, Message, MessageExt, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import RouteNotFoundError
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

LEVELS_S = [1, 2, 5, 8]
SENT_LEVELS = (1, 2, 3, 4)  # 1 s: due before the stop; 2 s: about during it; 5 s, 8 s: after it
PER_LEVEL = 15
TOPIC = "DelayRestart"


@pytest.mark.parametrize("how", ["graceful", "sigkill"])
def test_delayed_messages_survive_a_master_restart_exactly_once(cluster_factory: Callable[..., LocalCluster],
                                                                how: str) -> None:
    cluster = cluster_factory(broker_groups=1, slaves_per_group=0,
                              broker_config={"messageDelayLevel": " ".join(f"{s}s" for s in LEVELS_S)})
    with Admin(cluster.namesrv_addr) as admin:
        admin.create_topic(TOPIC, queue_nums=2)
        with Producer("p_delay", cluster.namesrv_addr) as p:
            sent = {}
            for i in range(PER_LEVEL * len(SENT_LEVELS)):
                level = SENT_LEVELS[i % len(SENT_LEVELS)]
                r = p.send(Message(TOPIC, f"{level}:{i}".encode(), delay_level=level))
                sent[r.msg_id] = (level, r.offset_msg_id)
        # The scheduled copies' store times: the clock the delay counts from.
        scheduled_at = {uniq: admin.query_message(off).store_timestamp for uniq, (_, off) in sent.items()}
    delivered = _wait_delivered(cluster, {u for u, (level, _) in sent.items() if level == 1})
    pending = {u for u, (level, _) in sent.items() if level >= 3}
    assert not delivered & pending, "a 5 s or 8 s message was delivered before the stop: nothing pending to restart"
    master = cluster.broker("broker-a", 0)
    down_from = int(time.time() * 1000)
    if how == "graceful":
        master.stop()
    else:
        master.kill()
    master.start()
    down_until = int(time.time() * 1000)
    got = _consume(cluster, len(sent), timeout_s=max(LEVELS_S) + 8)

    counts = Counter(m.msg_id for m in got)
    dups = {k: n for k, n in counts.items() if n > 1}
    missing = set(sent) - set(counts)
    lateness, early, interrupted = [], [], []
    for m in {m.msg_id: m for m in got}.values():
        level, _ = sent[m.msg_id]
        due = scheduled_at[m.msg_id] + LEVELS_S[level - 1] * 1000
        if m.store_timestamp < due:
            early.append((m.msg_id, level, due - m.store_timestamp))
        if m.msg_id not in delivered and down_from - 200 <= due <= down_until + 200:
            interrupted.append(m.store_timestamp - due)
        else:
            lateness.append(m.store_timestamp - due)
    print(f"{how}: {len(sent)} sent, {len(counts)} received once, duplicates {len(dups)}, missing {len(missing)}, "
          f"downtime {down_until - down_from} ms, {len(interrupted)} due during it (max lateness "
          f"{max(interrupted, default=0)} ms), max lateness of the others {max(lateness, default=0)} ms")
    assert not missing, f"lost {len(missing)}: {sorted(sent[u][0] for u in missing)}"
    assert not dups, f"delivered twice: {dups}"
    assert not early, f"delivered before their delay (id, level, ms early): {early[:5]}"
    assert lateness and max(lateness) <= 1000, f"lateness ms {sorted(lateness)[-5:]}"


def _wait_delivered(cluster: LocalCluster, ids: set[str], timeout_s: float = 10.0) -> set[str]:
    """Wait until every message of ``ids`` is in the topic; return what the topic holds then (the state under
    test: the 1 s level is delivered, the longer levels are pending)."""
    with PullConsumer("g_delay_probe", cluster.namesrv_addr) as pc:
        queues = pc.fetch_subscribe_message_queues(TOPIC)

        def all_there() -> set[str] | None:
            there = {m.msg_id for mq in queues for m in _read_queue(pc, mq)}
            return there if ids <= there else None

        return poll_until(all_there, timeout_s, f"{len(ids)} messages of the 1 s level delivered")


def _read_queue(pc: PullConsumer, mq: MessageQueue) -> list[MessageExt]:
    """What ``mq`` holds now, from offset 0 (no long polling)."""
    got: list[MessageExt] = []
    offset = 0
    while True:
        r = pc.pull(mq, offset, 32)
        if r.pull_status is not PullStatus.FOUND:
            return got
        got.extend(r.msg_found_list)
        offset = r.next_begin_offset


def _consume(cluster: LocalCluster, n: int, timeout_s: float) -> list[MessageExt]:
    """Everything in the topic (pulled from offset 0 of each queue) until ``n`` distinct messages, then one
    more pass so a duplicate would show."""
    got: list[MessageExt] = []
    deadline = time.monotonic() + timeout_s
    with PullConsumer("g_delay_reader", cluster.namesrv_addr) as pc:
        # A gracefully stopped master unregistered its topics: wait for its new registration.
        queues = poll_until(lambda: pc.fetch_subscribe_message_queues(TOPIC), timeout_s,
                            f"the route of {TOPIC} after the restart", ignore=(RouteNotFoundError,))
        offsets = dict.fromkeys(queues, 0)
        extra_pass = True
        while len({m.msg_id for m in got}) < n or extra_pass:
            if len({m.msg_id for m in got}) >= n:
                extra_pass = False
            if time.monotonic() > deadline:
                break
            for mq in queues:
                try:
                    r = pc.pull(mq, offsets[mq], 32, suspend_timeout_s=0.2)
                except Exception:  # the master is still coming up
                    continue
                if r.pull_status is PullStatus.FOUND:
                    got.extend(r.msg_found_list)
                offsets[mq] = r.next_begin_offset
    return got
