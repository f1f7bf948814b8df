"""Metadata managers: JSON shapes, DataVersion bumps, atomic writes with ``.bak``, fallback to ``.bak``."""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

import pytest

from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    JsonFile,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.metadata.topics import AUTO_CREATE_TOPIC, SCHEDULE_TOPIC
from common.route import DataVersion, TopicConfig

clock = count(1000).__next__


def test_json_file_keeps_bak_and_falls_back(tmp_path: Path) -> None:
    f = JsonFile(tmp_path / "config" / "x.json")
    assert f.load() is None
    f.save({"v": 1})
    assert not f.bak_path.exists()
    f.save({"v": 2})
    assert json.loads(f.bak_path.read_text()) == {"v": 1}
    assert f.load() == {"v": 2}
    f.path.write_text("{truncated")
    assert f.load() == {"v": 1}
    f.path.unlink()
    assert f.load() == {"v": 1}
    assert not (tmp_path / "config" / "x.json.tmp").exists()


def test_json_file_rejects_non_object(tmp_path: Path) -> None:
    f = JsonFile(tmp_path / "x.json")
    f.path.write_text("[1, 2]")
    assert f.load() is None


def test_topics_builtin_and_auto_create(tmp_path: Path) -> None:
    m = TopicConfigManager(tmp_path, auto_create_topic_enable=True, default_topic_queue_nums=8, clock_ms=clock)
    tbw = m.get(AUTO_CREATE_TOPIC)
    assert tbw is not None and (tbw.perm, tbw.write_queue_nums) == (7, 8)
    assert m.get(SCHEDULE_TOPIC) is not None and m.get(SCHEDULE_TOPIC).read_queue_nums == 18  # type: ignore[union-attr]
    tc = m.create_in_send("NewTopic", 4, 8)
    assert tc == TopicConfig("NewTopic", 4, 4, 6)
    assert m.create_in_send("Other", 16, 8) == TopicConfig("Other", 8, 8, 6)
    assert m.data_version.counter == 2
    off = TopicConfigManager(tmp_path / "b", auto_create_topic_enable=False, clock_ms=clock)
    assert off.get(AUTO_CREATE_TOPIC) is None
    assert off.create_in_send("NewTopic", 4, 8) is None


def test_topics_persist_reload(tmp_path: Path) -> None:
    m = TopicConfigManager(tmp_path, clock_ms=clock)
    assert m.update(TopicConfig("T", 2, 3, 6))
    assert not m.update(TopicConfig("T", 2, 3, 6))
    obj = json.loads(m.path.read_text())
    assert obj["topicConfigTable"]["T"] == {"topicName": "T", "readQueueNums": 2, "writeQueueNums": 3, "perm": 6,
                                            "topicSysFlag": 0, "order": False}
    assert obj["dataVersion"] == m.data_version.to_json()
    m2 = TopicConfigManager(tmp_path, clock_ms=clock)
    m2.load()
    assert m2.get("T") == TopicConfig("T", 2, 3, 6)
    assert m2.data_version == m.data_version


def test_topics_load_falls_back_to_bak(tmp_path: Path) -> None:
    m = TopicConfigManager(tmp_path, clock_ms=clock)
    m.update(TopicConfig("A", 1, 1))
    m.update(TopicConfig("B", 1, 1))
    m.path.write_text("garbage")
    m2 = TopicConfigManager(tmp_path, clock_ms=clock)
    m2.load()
    assert m2.get("A") is not None and m2.get("B") is None


def test_consumer_offsets_shape_and_persist(tmp_path: Path) -> None:
    m = ConsumerOffsetManager(tmp_path, clock_ms=clock)
    assert m.query("g", "T", 0) is None
    m.commit("g", "T", 0, 5)
    m.commit("g", "T", 1, 7)
    assert m.dirty and m.persist_if_dirty() and not m.persist_if_dirty()
    obj = json.loads(m.path.read_text())
    assert obj["offsetTable"] == {"T@g": {"0": 5, "1": 7}}
    m2 = ConsumerOffsetManager(tmp_path, clock_ms=clock)
    m2.load()
    assert (m2.query("g", "T", 0), m2.query("g", "T", 1), m2.query("g", "T", 2)) == (5, 7, None)


def test_consumer_offsets_put_all(tmp_path: Path) -> None:
    m = ConsumerOffsetManager(tmp_path, clock_ms=clock)
    m.commit("g", "T", 0, 50)
    m.commit("g", "T", 1, 60)
    m.commit("slave-only", "T", 0, 9)
    m.put_all({"T@g": {0: 10}})
    assert m.table() == {"T@g": {0: 10}, "T@slave-only": {0: 9}}


def test_groups_defaults_auto_create(tmp_path: Path) -> None:
    m = SubscriptionGroupManager(tmp_path, auto_create=True, clock_ms=clock)
    g = m.find_or_create("cg")
    assert g == SubscriptionGroupConfig(group_name="cg")
    assert (g.broker_id, g.which_broker_when_consume_slowly, g.retry_max_times, g.retry_queue_nums,
            g.consume_enable) == (0, 1, 16, 1, True)
    assert m.dirty and not m.path.exists()  # written by the broker's once-a-second flush, not per new group
    m.persist_if_dirty()
    obj = json.loads(m.path.read_text())
    assert obj["subscriptionGroupTable"]["cg"]["whichBrokerWhenConsumeSlowly"] == 1
    assert SubscriptionGroupManager(tmp_path / "x", auto_create=False, clock_ms=clock).find_or_create("cg") is None
    m2 = SubscriptionGroupManager(tmp_path, clock_ms=clock)
    m2.load()
    assert m2.get("cg") == g and m2.data_version == m.data_version


@pytest.mark.parametrize(("body", "match"), [
    ({"brokerId": 0}, "groupName is missing"),
    ({"groupName": "g", "brokerId": "1"}, "brokerId"),
    ({"groupName": "g", "consumeEnable": 1}, "consumeEnable"),
    ({"groupName": "g", "retryMaxTimes": True}, "retryMaxTimes"),
])
def test_group_from_json_rejects(body: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SubscriptionGroupConfig.from_json(body)


def test_delay_offsets(tmp_path: Path) -> None:
    m = DelayOffsetManager(tmp_path)
    m.update(3, 17)
    m.persist()
    assert json.loads(m.path.read_text()) == {"offsetTable": {"3": 17}}
    m2 = DelayOffsetManager(tmp_path)
    m2.load()
    assert m2.get(3) == 17 and m2.get(1) == 0
    m2.replace_from_master({"offsetTable": {"1": 4}})
    assert m2.table() == {1: 4}
    with pytest.raises(ValueError):
        m2.replace_from_master({"offsetTable": {"x": "y"}})
    assert m2.table() == {1: 4}


def test_data_version_equality() -> None:
    assert DataVersion(1, 2) == DataVersion(1, 2) != DataVersion(1, 3)
