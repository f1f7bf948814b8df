"""Put path: validations (nothing written on failure), queue offsets, delay rewrite, transactions."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.store.api import PutMessageStatus
from common.codec import BatchItem, batch_item, decode_records
from common.codes import BrokerRole, SysFlag
from common.properties import REAL_QID, REAL_TOPIC

from .conftest import BORN_HOST, StoreFactory, batch


def _raw_item(body: bytes, props: bytes, sys_flag: int = 0) -> BatchItem:
    return batch_item(body, props, sys_flag=sys_flag, born_timestamp=1)


def test_queue_offsets_are_assigned_per_queue(make_store: StoreFactory) -> None:
    store = make_store()
    r1 = store.append_batch("T", 0, batch("T", 3), born_host=BORN_HOST)
    r2 = store.append_batch("T", 1, batch("T", 2), born_host=BORN_HOST)
    r3 = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert (r1.queue_offset, r2.queue_offset, r3.queue_offset) == (0, 0, 3)
    assert r1.msg_count == 3 and len(r1.physical_offsets) == 3 and r1.end_offset == r2.wrote_offset
    store.dispatch_available()
    msgs = decode_records(b"".join(store.get_message("g", "T", 0, 0, 32, 1 << 20).records))
    assert [m.queue_offset for m in msgs] == [0, 1, 2, 3]
    assert [m.commit_log_offset for m in msgs[:3]] == list(r1.physical_offsets)


@pytest.mark.parametrize(
    ("topic", "needle"),
    [
        ("x" * 128, "longer than 127"),
        ("../x", "outside"),
        ("a b", "outside"),
        ("", "empty"),
        ("topic/evil", "outside"),
    ],
)
def test_bad_topic_names_are_refused(make_store: StoreFactory, topic: str, needle: str) -> None:
    store = make_store()
    r = store.append_batch(topic, 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert needle in r.remark
    assert store.max_physical_offset == 0


def test_oversize_message_names_the_limit_and_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store(max_message_size=2000)
    items = batch("T", 2, body=b"ok") + batch("T", 1, body=b"b" * 2000)
    r = store.append_batch("T", 0, items, born_host=BORN_HOST)
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert "maxMessageSize 2000" in r.remark and "message 2" in r.remark
    assert store.max_physical_offset == 0
    assert store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST).queue_offset == 0


def test_properties_over_32767_bytes_are_refused(make_store: StoreFactory) -> None:
    store = make_store(max_message_size=1 << 20)
    props = b"K\x01" + b"v" * 32766 + b"\x02"
    r = store.append_batch("T", 0, [_raw_item(b"b", props)], born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert "32767" in r.remark
    r = store.put_message("T", 0, b"b", {"K": "v" * 40000}, born_host=BORN_HOST, born_timestamp=1)
    assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.max_physical_offset == 0


def test_slave_refuses_writes_naming_its_role(make_store: StoreFactory) -> None:
    store = make_store(broker_role=BrokerRole.SLAVE)
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SLAVE" in r.remark
    assert store.max_physical_offset == 0


def test_shut_down_store_refuses_writes(make_store: StoreFactory) -> None:
    store = make_store()
    store.shutdown()
    r = store.append_batch("T", 0, batch("T", 1), born_host=BORN_HOST)
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "SHUT_DOWN" in r.remark


def test_delay_rewrite_to_schedule_topic(make_store: StoreFactory) -> None:
    store = make_store()
    items = batch("T", 1, start=0) + batch("T", 1, delay_level=3, start=1) + batch("T", 1, delay_level=40, start=2)
    items += batch("T", 1, start=3)
    r = store.append_batch("T", 5, items, born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK and r.msg_count == 4 and r.queue_offset == 0
    store.dispatch_available()
    assert store.get_max_offset_in_queue("T", 5) == 2
    assert store.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 2) == 1
    assert store.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 17) == 1  # level 40 clamped to 18
    got = store.get_message("g", "SCHEDULE_TOPIC_XXXX", 2, 0, 32, 1 << 20)
    (msg,) = decode_records(b"".join(got.records))
    assert msg.topic == "SCHEDULE_TOPIC_XXXX" and msg.queue_id == 2
    assert msg.properties[REAL_TOPIC] == "T" and msg.properties[REAL_QID] == "5"
    # The consume-queue tag code of a delayed message is its deliver time: store time + 10 s for level 3.
    unit = store.cqs.get("SCHEDULE_TOPIC_XXXX", 2).unit(0)
    assert unit is not None and unit[2] == msg.store_timestamp + 10_000
    plain = decode_records(b"".join(store.get_message("g", "T", 5, 0, 32, 1 << 20).records))
    assert [m.queue_offset for m in plain] == [0, 1]


def test_delay_rewrite_appends_the_real_topic_and_queue(make_store: StoreFactory) -> None:
    """The reroute reads the item's delay level and appends REAL_TOPIC / REAL_QID to the raw properties; a
    message delayed again (older REAL_* pairs) or without a trailing separator reads back with the new values."""
    store = make_store()
    items = [_raw_item(b"again", b"REAL_TOPIC\x01Old\x02REAL_QID\x019\x02u\x01v\x02DELAY\x011"),
             _raw_item(b"odd", b"DELAY\x01x\x02"), _raw_item(b"zero", b"DELAY\x010\x02")]
    assert [it.delay_level for it in items] == [1, 0, 0]
    r = store.append_batch("T", 5, items, born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK
    store.dispatch_available()
    (msg,) = decode_records(b"".join(store.get_message("g", "SCHEDULE_TOPIC_XXXX", 0, 0, 32, 1 << 20).records))
    assert msg.body == b"again"
    assert msg.properties == {REAL_TOPIC: "T", REAL_QID: "5", "u": "v", "DELAY": "1"}
    plain = decode_records(b"".join(store.get_message("g", "T", 5, 0, 32, 1 << 20).records))
    assert [m.body for m in plain] == [b"odd", b"zero"]  # not a level: stored where they were sent


def test_prepared_transaction_gets_offset_zero_and_no_queue_unit(make_store: StoreFactory) -> None:
    store = make_store()
    items = [*batch("T", 1), _raw_item(b"half", b"", int(SysFlag.TRANSACTION_PREPARED)), *batch("T", 1, start=1)]
    r = store.append_batch("T", 0, items, born_host=BORN_HOST)
    assert r.status is PutMessageStatus.PUT_OK
    store.dispatch_available()
    assert store.get_max_offset_in_queue("T", 0) == 2
    half = decode_records(store.look_message_by_offset(r.physical_offsets[1]) or b"")
    assert half[0].queue_offset == 0


def test_put_message_builds_one_record(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.put_message("T", 1, b"body", {"TAGS": "x", "KEYS": "a b"}, born_host=BORN_HOST,
                          born_timestamp=123, flag=7, reconsume_times=2)
    assert r.status is PutMessageStatus.PUT_OK
    (m,) = decode_records(store.look_message_by_offset(r.wrote_offset) or b"", verify_crc=True)
    assert (m.body, m.tags, m.keys, m.flag, m.reconsume_times, m.born_timestamp) == (
        b"body", "x", ("a", "b"), 7, 2, 123)


def test_append_event_once_per_append_with_the_new_end(make_store: StoreFactory) -> None:
    store = make_store()
    seen: list[int] = []
    store.add_append_listener(seen.append)
    r = store.append_batch("T", 0, batch("T", 2), born_host=BORN_HOST)
    assert seen == [r.end_offset]
    p = store.put_message("T", 1, b"x", {}, born_host=BORN_HOST, born_timestamp=1)
    assert seen == [r.end_offset, p.end_offset]


def test_append_event_for_replicated_bytes(make_store: StoreFactory, tmp_path: Path) -> None:
    master = make_store(root=tmp_path / "m")
    end = master.append_batch("T", 0, batch("T", 3), born_host=BORN_HOST).end_offset
    slave = make_store(root=tmp_path / "s", broker_role=BrokerRole.SLAVE)
    seen: list[int] = []
    slave.add_append_listener(seen.append)
    data = master.get_commitlog_data(0, end)
    assert data is not None
    slave.append_to_commitlog(0, data[:100])
    slave.append_to_commitlog(100, data[100:])
    assert seen == [100, end]
