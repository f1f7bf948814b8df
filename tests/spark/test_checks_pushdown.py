"""Pure parts of issue 36: checkpoint checks (failOnDataLoss), the offsets' group identities, filter pushdown
and the Kafka-named streaming metrics (no Spark session, no cluster)."""

from __future__ import annotations

import datetime
import json
import logging

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from spark_connector.checks import check_checkpoint
from spark_connector.errors import DataLossError
from spark_connector.metrics import behind_latest, source_metrics
from spark_connector.offsets import GROUPS_KEY, QueueKey, groups_from_json, offsets_from_json, offsets_to_json
from spark_connector.pushdown import push_filters
from spark_connector.resolve import QueueState

A0, A1, B0 = QueueKey("T", "broker-a", 0), QueueKey("T", "broker-a", 1), QueueKey("T", "broker-b", 0)
IA, IB, IX = "a" * 32, "b" * 32, "f" * 32


def _state(*, identities: dict[str, str | None] | None = None, from_master: set[str] | None = None) -> QueueState:
    return QueueState(mins={A0: 10, A1: 0, B0: 0}, maxs={A0: 100, A1: 50, B0: 20},
                      from_master={"broker-a", "broker-b"} if from_master is None else from_master,
                      identities={"broker-a": IA, "broker-b": IB} if identities is None else identities)


def test_offsets_carry_group_identities_in_canonical_json() -> None:
    doc = offsets_to_json({B0: 3, A1: 2, A0: 1}, {"broker-b": IB, "broker-a": IA, "broker-c": None})
    assert list(doc) == [GROUPS_KEY, "T"] and doc[GROUPS_KEY] == {"broker-a": IA, "broker-b": IB}
    text = json.dumps(doc)
    assert text == json.dumps(doc, sort_keys=True)
    back = json.loads(text)
    assert offsets_from_json(back) == {A0: 1, A1: 2, B0: 3} and groups_from_json(back) == {"broker-a": IA,
                                                                                          "broker-b": IB}
    assert groups_from_json({"T": {}}) == {} and GROUPS_KEY not in offsets_to_json({A0: 1})


def test_a_checkpoint_that_fits_is_kept() -> None:
    start = {A0: 10, A1: 50, B0: 5}
    assert check_checkpoint(start, {"broker-a": IA}, _state(), fail=True, what="topic T") == start
    # a slave's max trails its master's: a checkpoint beyond it waits, it is not data loss
    ahead = {A0: 120}
    assert check_checkpoint(ahead, {}, _state(from_master={"broker-b"}), fail=True, what="topic T") == ahead
    # identities unknown on either side (an old checkpoint, a slave that has not copied it): offsets decide
    assert check_checkpoint(start, {}, _state(identities={"broker-a": None}), fail=True, what="t") == start


@pytest.mark.parametrize(("start", "groups", "first_line", "lenient"), [
    ({A0: 50, A1: 3}, {"broker-a": IX},
     r"^the checkpoint of this query does not fit topic T any more: broker group broker-a holds another store than "
     r"the checkpoint's \(group identity aaaaaaaa\.\.\. now, ffffffff\.\.\. in the checkpoint: another cluster, or "
     r"its store was wiped\), so its checkpointed offsets T@broker-a:0=50, T@broker-a:1=3 mean nothing there\. "
     r"Set failOnDataLoss=false to go on from the earliest offsets still there \(what is gone is skipped\), or "
     r"give the query a new checkpointLocation$",
     {A0: 10, A1: 0}),
    ({A0: 400}, {"broker-a": IA},
     r"^the checkpoint of this query does not fit topic T any more: T@broker-a:0 is checkpointed at offset 400, "
     r"beyond its max offset 100\. Set failOnDataLoss=false", {A0: 10}),
    ({A0: 5}, {}, r"T@broker-a:0 is checkpointed at offset 5, below its min offset 10 \(those messages expired "
                  r"unread\)\. Set failOnDataLoss=false", {A0: 10}),
    ({QueueKey("T", "broker-a", 7): 9, A1: 1}, {}, r"T@broker-a:7 \(checkpointed at 9\) is no longer in the route\.",
     {A1: 1}),
])
def test_a_checkpoint_that_does_not_fit_fails_or_goes_on_from_the_earliest(
        start: dict[QueueKey, int], groups: dict[str, str], first_line: str, lenient: dict[QueueKey, int],
        caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(DataLossError, match=first_line) as e:
        check_checkpoint(start, groups, _state(), fail=True, what="topic T")
    assert "\n" not in str(e.value)
    with caplog.at_level(logging.WARNING, logger="spark_connector.checks"):
        assert check_checkpoint(start, groups, _state(), fail=False, what="topic T") == lenient
    assert "failOnDataLoss=false" in caplog.text


def test_many_problems_are_counted_not_listed() -> None:
    start = {QueueKey("T", "broker-a", i): 1 for i in range(10, 16)}
    with pytest.raises(DataLossError, match="; and 3 more\\. Set failOnDataLoss=false"):
        check_checkpoint(start, {}, _state(), fail=True, what="topic T")


_TS = datetime.datetime(2024, 1, 2, 3, 4, 5, 678_901, tzinfo=datetime.UTC)
_MS = 1704164645678  # _TS in epoch milliseconds, microseconds cut


def test_tags_become_the_tag_subscription_and_are_taken_over() -> None:
    f_eq, f_in = EqualTo(("tags",), "A"), In(("tags",), ("A", "B"))
    pushed, rest = push_filters([f_eq, f_in])
    assert rest == [] and pushed.tags == frozenset({"A"})
    sub = pushed.subscription("*", "TAG")
    assert (sub.expression, sub.expression_type, sub.tags, sub.fallback) == ("A", "TAG", frozenset({"A"}), None)
    # with the user's own tag filter: the intersection
    assert pushed.subscription("A || C", "TAG").expression == "A"
    empty, _ = push_filters([EqualTo(("tags",), "A"), EqualTo(("tags",), "B")])
    assert empty.empty and not empty.keeps(QueueKey("T", "b", 0))


def test_keys_and_like_filters_become_sql92_and_spark_rechecks_them() -> None:
    keys, starts, not_a = In(("keys",), ("k1", "o'k")), StringStartsWith(("tags",), "Ord"), Not(EqualTo(("tags",), "x"))
    pushed, rest = push_filters([keys, starts, not_a, IsNotNull(("keys",)), EqualTo(("tags",), "Order")])
    assert rest == [keys, starts, not_a, IsNotNull(("keys",))]
    sub = pushed.subscription("*", "TAG")
    assert sub.expression_type == "SQL92"
    assert sub.expression == ("TAGS IN ('Order') AND KEYS IN ('k1', 'o''k') AND TAGS STARTSWITH 'Ord' AND "
                              "TAGS <> 'x' AND KEYS IS NOT NULL")
    assert sub.fallback is not None and (sub.fallback.expression, sub.fallback.expression_type) == ("Order", "TAG")
    from common.sql92 import compile_sql

    compile_sql(sub.expression)  # the brokers' grammar takes it
    user_sql = pushed.subscription("region = 'EU'", "SQL92")
    assert user_sql.expression.startswith("(region = 'EU') AND TAGS IN ('Order') AND KEYS IN")
    assert user_sql.fallback is not None and user_sql.fallback.expression == "region = 'EU'"


def test_store_times_offsets_and_queues() -> None:
    f = [GreaterThanOrEqual(("storeTimestamp",), _TS), LessThan(("storeTimestamp",), _TS + datetime.timedelta(hours=1)),
         GreaterThan(("queueOffset",), 4), LessThanOrEqual(("queueOffset",), 20), In(("queueId",), (0, 1)),
         EqualTo(("brokerName",), "broker-a"), EqualTo(("bornTimestamp",), _TS)]
    pushed, rest = push_filters(f)
    assert rest == [f[0], f[1], f[6]]  # store times are re-checked (a clock stepping back); born time is not pushed
    assert (pushed.store_from_ms, pushed.store_until_ms) == (_MS + 1, _MS + 1 + 3_600_000)
    assert (pushed.offset_from, pushed.offset_until) == (5, 21)
    assert pushed.keeps(A0) and pushed.keeps(A1) and not pushed.keeps(B0)
    assert not pushed.keeps(QueueKey("T", "broker-a", 2))
    starts, ends = pushed.cut({A0: 0, A1: 10, B0: 0}, {A0: 100, A1: 12, B0: 9})
    assert starts == {A0: 5, A1: 10, B0: 5} and ends == {A0: 21, A1: 12}
    exact, _ = push_filters([GreaterThan(("storeTimestamp",), datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))])
    assert exact.store_from_ms == 1704067200001
    naive, rest = push_filters([GreaterThan(("storeTimestamp",), datetime.datetime(2024, 1, 1))])
    assert naive.store_from_ms is None and len(rest) == 1


def test_behind_latest_in_kafkas_names() -> None:
    end = json.dumps(offsets_to_json({A0: 90, A1: 50, B0: 0}, {"broker-a": IA}))
    latest = json.dumps(offsets_to_json({A0: 100, A1: 50, B0: 30}))
    assert behind_latest(end, latest) == {"minOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "13.333333333333334",
                                          "maxOffsetsBehindLatest": "30"}
    progress = {"sources": [{"description": "other", "endOffset": "5", "latestOffset": None},
                            {"endOffset": end, "latestOffset": latest}],
                "observedMetrics": {"rocketmq": {"rows": 40, "rowsFromSlaves": 30}}}
    assert source_metrics(progress) == {"minOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "13.333333333333334",
                                        "maxOffsetsBehindLatest": "30", "rows": "40", "rowsFromSlaves": "30",
                                        "slaveRowShare": "0.75"}
    assert source_metrics(None) == {} and behind_latest(None, latest) == {}
