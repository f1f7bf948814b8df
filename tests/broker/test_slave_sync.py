"""Slave metadata sync: the pure apply rules (docs/BEHAVIOUR.md 5.2, 4.9.3) and one round against a fake master
where items fail independently."""

from __future__ import annotations

import asyncio
import json
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.slave_sync import SlaveSynchronizer, merge_offsets, plan_groups, plan_topics
from common.route import DataVersion, TopicConfig
from tests.waiting import wait_until

clock = count(1).__next__
TOPICS = {"dataVersion": {"timestamp": 5, "counter": 9},
          "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}}}
GROUPS = {"dataVersion": {"timestamp": 6, "counter": 3},
          "subscriptionGroupTable": {"g": {"groupName": "g", "brokerId": 1}}}


def test_plan_topics_replaces_only_when_version_differs() -> None:
    plan = plan_topics(DataVersion(1, 1), TOPICS)
    assert plan == ({"T": TopicConfig("T", 2, 2, 6)}, DataVersion(5, 9))
    assert plan_topics(DataVersion(5, 9), TOPICS) is None


def test_plan_groups() -> None:
    plan = plan_groups(DataVersion(), GROUPS)
    assert plan is not None and plan[0]["g"].broker_id == 1 and plan[1] == DataVersion(6, 3)
    assert plan_groups(DataVersion(6, 3), GROUPS) is None


def test_merge_offsets_put_all() -> None:
    local = {"T@g": {0: 50, 1: 60}, "T@slave-only": {0: 9}}
    merged = merge_offsets(local, {"offsetTable": {"T@g": {"0": 10}, "U@g": {"2": 3}}})
    # the master's key replaces the slave's whole queue map (older values win: duplicates, never loss)
    assert merged == {"T@g": {0: 10}, "T@slave-only": {0: 9}, "U@g": {2: 3}}
    assert local["T@g"] == {0: 50, 1: 60}


@pytest.mark.parametrize("bad", [{"offsetTable": []}, {"offsetTable": {"T@g": {"x": 1}}}, {"offsetTable": {"k": 5}}])
def test_merge_offsets_rejects_malformed(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        merge_offsets({}, bad)


def test_plan_topics_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="topicConfigTable"):
        plan_topics(DataVersion(), {"topicConfigTable": {"T": {"readQueueNums": 1}}})


def _managers(tmp_path: Path) -> dict[str, Any]:
    return {"topics": TopicConfigManager(tmp_path, clock_ms=clock),
            "offsets": ConsumerOffsetManager(tmp_path, clock_ms=clock),
            "groups": SubscriptionGroupManager(tmp_path, clock_ms=clock),
            "delay_offsets": DelayOffsetManager(tmp_path)}


def test_sync_round_applies_items_and_survives_failures(tmp_path: Path) -> None:
    answers: dict[str, Any] = {
        "/topics": TOPICS,
        "/offsets": {"offsetTable": {"T@g": {"0": 10}}},
        "/delay-offsets": httpx.Response(500, json={"code": 1, "remark": "boom"}),
        "/subscription-groups": GROUPS,
    }
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}{request.url.path}")
        a = answers[request.url.path]
        return a if isinstance(a, httpx.Response) else httpx.Response(200, json=a)

    m = _managers(tmp_path)
    m["offsets"].commit("slave-only", "T", 0, 9)
    master: list[str | None] = [None]

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = SlaveSynchronizer(master_addr=lambda: master[0], own_addr="127.0.0.1:2", client=client, **m)
            paused = await sync.sync_all()
            master[0] = "127.0.0.1:1"
            return paused, await sync.sync_all()

    paused, ok = asyncio.run(run())
    assert paused == 0
    assert ok == 3
    assert seen == ["127.0.0.1:1/topics", "127.0.0.1:1/offsets", "127.0.0.1:1/delay-offsets",
                    "127.0.0.1:1/subscription-groups"]
    assert m["topics"].table() == {"T": TopicConfig("T", 2, 2, 6)}
    assert m["topics"].data_version == DataVersion(5, 9)
    assert m["offsets"].table() == {"T@g": {0: 10}, "T@slave-only": {0: 9}}
    assert m["groups"].get("g").broker_id == 1
    # persisted to the same files
    assert json.loads((tmp_path / "topics.json").read_text())["dataVersion"] == {"timestamp": 5, "counter": 9}
    assert json.loads((tmp_path / "consumerOffset.json").read_text())["offsetTable"]["T@g"] == {"0": 10}
    assert not (tmp_path / "delayOffset.json").exists()


def test_sync_never_from_itself(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    async def run() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = SlaveSynchronizer(master_addr=lambda: "127.0.0.1:2", own_addr="127.0.0.1:2", client=client,
                                     **_managers(tmp_path))
            return await sync.sync_all()

    assert asyncio.run(run()) == 0


def test_sync_connect_failure_is_not_fatal(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = SlaveSynchronizer(master_addr=lambda: "127.0.0.1:1", own_addr="127.0.0.1:2", client=client,
                                     **_managers(tmp_path))
            return await sync.sync_all(), sync.failures

    assert asyncio.run(run()) == (0, 4)


def test_kick_runs_a_round_at_once_not_after_the_period(tmp_path: Path) -> None:
    """A new master (broker.master_seek) kicks the sync: the next round starts now, not a period later."""
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def run() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sync = SlaveSynchronizer(master_addr=lambda: "127.0.0.1:1", own_addr="127.0.0.1:2", client=client,
                                     **_managers(tmp_path))
            task = asyncio.get_running_loop().create_task(sync.run_periodic(3600.0))
            try:
                await wait_until(lambda: sync.rounds == 1, 5, "the first round, at once")
                sync.kick()
                await wait_until(lambda: sync.rounds == 2, 5, "a round right after the kick")
                return sync.rounds
            finally:
                task.cancel()

    assert asyncio.run(run()) == 2
