"""Auto-creation is not a resource hole (issue 11 item 8): consume-queue files are sparse and get disk blocks as
they fill; auto-created topics and groups are capped with a clear error naming the key; auto-created groups are
written to disk at most once a second, not once per new group."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from broker.metadata import SubscriptionGroupManager, TopicConfigManager
from broker.store.config import StoreConfig
from broker.store.file_store import FileMessageStore
from common.codec import encode_batch
from common.message import Message
from tests.broker.fakes import run_with_broker
from tests.broker.store.conftest import BORN_HOST, batch


def _disk_bytes(root: Path) -> int:
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, files in os.walk(root) for f in files)


def test_a_queue_with_a_few_units_costs_kilobytes_not_its_file(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path_root_dir=str(tmp_path / "store"), mapped_file_size_commitlog=1 << 20,
                      message_index_enable=False, total_physical_memory_bytes=1 << 34)
    assert cfg.mapped_file_size_consume_queue == 6_000_000  # the default, 300,000 units
    store = FileMessageStore(cfg)
    store.load()
    store.start()
    try:
        for i in range(200):
            assert store.append_batch(f"T{i}", 0, batch(f"T{i}", 1), born_host=BORN_HOST).status.value == "PUT_OK"
        store.dispatch_available()
        assert store.get_max_offset_in_queue("T199", 0) == 1
        cq_bytes = _disk_bytes(tmp_path / "store" / "consumequeue")
        # 200 files of 6 MB each preallocated 1.2 GB; sparse, each holds one 64 KiB reservation.
        assert cq_bytes <= 200 * 64 * 1024 + (1 << 20), cq_bytes
        assert len(list((tmp_path / "store" / "consumequeue").iterdir())) == 200
    finally:
        store.shutdown()
    again = FileMessageStore(cfg)  # reopened sparse files recover their units
    again.load()
    again.start()
    try:
        assert again.get_max_offset_in_queue("T5", 0) == 1
        assert again.append_batch("T5", 0, batch("T5", 1), born_host=BORN_HOST).queue_offset == 1
    finally:
        again.shutdown()


def test_auto_created_topics_and_groups_are_capped_with_a_clear_error(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: httpx.AsyncClient) -> None:
        limit = 8
        system = len(ctrl.topics)  # the broker's own topics count toward the limit (TBW102, SCHEDULE, timer...)
        assert 0 < system < limit
        statuses = []
        for i in range(limit + 3):
            body = encode_batch([Message(f"New{i}", b"x")], born_timestamp_ms=1)
            r = await client.post("/send", params={"topic": f"New{i}", "queueId": 0}, content=body)
            statuses.append(r.status_code)
        assert len(ctrl.topics) == limit and statuses.count(200) == limit - system, statuses
        err = r.json()
        assert err["code"] == 17 and "maxAutoCreateTopics=8" in err["remark"], err
        r = await client.post("/topic", json={"topicName": "Explicit", "readQueueNums": 1, "writeQueueNums": 1})
        assert r.status_code == 200  # explicit creation is not capped
        codes = []
        for i in range(6):
            r = await client.get("/pull", params={"group": f"G{i}", "topic": "Explicit", "queueId": 0,
                                                  "offset": 0, "maxNums": 1})
            codes.append(r.status_code if r.status_code != 200 else 0)
        err = r.json()
        assert err["code"] == 26 and "maxAutoCreateSubscriptionGroups=4" in err["remark"], err

    run_with_broker(tmp_path, scenario, auto_create_topic_enable=True, max_auto_create_topics=8,
                    max_auto_create_subscription_groups=4)


def test_auto_created_groups_are_written_at_most_once_per_flush(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(tmp_path, clock_ms=lambda: 1)
    saves = []
    real_save = groups._file.save
    groups._file.save = lambda obj: (saves.append(len(obj)), real_save(obj))[1]  # type: ignore[method-assign]
    for i in range(500):
        assert groups.find_or_create(f"group-{i}") is not None
    assert saves == [] and groups.dirty
    groups.persist_if_dirty()
    groups.persist_if_dirty()
    assert len(saves) == 1 and not groups.dirty
    again = SubscriptionGroupManager(tmp_path, clock_ms=lambda: 2)
    again.load()
    assert len(again) == 500 and again.data_version == groups.data_version
    # Topics auto-created by sends are still written at once (they are capped, and their loss would hide data).
    topics = TopicConfigManager(tmp_path, clock_ms=lambda: 1)
    assert topics.create_in_send("T", 4, 4) is not None
    reread = TopicConfigManager(tmp_path, clock_ms=lambda: 1)
    reread.load()
    assert "T" in reread


def test_auto_created_groups_survive_a_clean_stop(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: httpx.AsyncClient) -> None:
        r = await client.post("/topic", json={"topicName": "T", "readQueueNums": 1, "writeQueueNums": 1})
        assert r.status_code == 200
        for i in range(20):
            await client.get("/pull", params={"group": f"G{i}", "topic": "T", "queueId": 0, "offset": 0,
                                              "maxNums": 1})

    run_with_broker(tmp_path, scenario)
    again = SubscriptionGroupManager(tmp_path / "config", clock_ms=lambda: 1)
    again.load()
    assert {f"G{i}" for i in range(20)} <= {g.group_name for g in again}
