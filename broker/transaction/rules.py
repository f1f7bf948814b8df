"""The rules of transactional messages as pure functions (RocketMQ's ``TransactionalMessageServiceImpl`` and
``TransactionalMessageBridge``), table-tested in ``tests/broker/test_transaction_rules.py``; no I/O, no clock.

Topics. A prepared message is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with ``REAL_TOPIC`` / ``REAL_QID``
saying where it goes (:func:`half_properties`); ending it writes an *op record* to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0 (:func:`op_properties`) and, on commit, the message to its real topic
(:func:`committed_properties`). A half message checked ``transactionCheckMax`` times moves to
``TRANS_CHECK_MAX_TIME_TOPIC`` (RocketMQ 5).

Matching. RocketMQ's op body is the half message's queue offset; here the op record names the transaction id
(the half message's ``UNIQ_KEY``, the same in every re-put copy) so an op record settles every copy, and says
``TRAN_HALF_END`` = the end of the half queue when it was written: every copy of the transaction lies below it,
so once the check offset passes it the op record is no longer needed (:func:`op_offset_after`).

A check round (:func:`plan_round`) walks the half queue from the check offset: a settled transaction is skipped,
one checked ``transactionCheckMax`` times is discarded, the first one younger than ``transactionTimeOut`` ends
the round (those behind it are younger or re-put copies, looked at next round), every other is checked: re-put
with ``TRANSACTION_CHECK_TIMES + 1`` and asked of its producer group.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Mapping, Sequence

import attrs

from broker.metadata.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from common.properties import (
    DELAY,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    WAIT,
)

__all__ = [
    "CHECK_MAX_TOPIC",
    "HALF_TOPIC",
    "OP_TOPIC",
    "SYSTEM_GROUP",
    "TRANSACTION_TOPICS",
    "CheckRules",
    "HalfView",
    "OpView",
    "RoundPlan",
    "Verdict",
    "check_times_of",
    "committed_properties",
    "half_properties",
    "judge",
    "op_offset_after",
    "op_properties",
    "op_view",
    "plan_round",
    "recheck_properties",
]

HALF_TOPIC = TRANS_HALF_TOPIC
OP_TOPIC = TRANS_OP_HALF_TOPIC
CHECK_MAX_TOPIC = TRANS_CHECK_MAX_TIME_TOPIC
TRANSACTION_TOPICS = frozenset({HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC})
#: The consumer group whose offsets of the half and op queues record the check service's progress (they are
#: replicated to slaves with the other consumer offsets, so a promoted slave goes on from there).
SYSTEM_GROUP = "CID_SYS_RMQ_TRANS"
#: Tag of an op record (RocketMQ's ``TransactionalMessageUtil.REMOVE_TAG``).
OP_REMOVE_TAG = "d"
#: Op record property: the transaction id it settles.
OP_TRANSACTION_ID = "__transactionId__"
#: Op record property (SplitMQ): the half queue's max offset when the op was written.
OP_HALF_END = "TRAN_HALF_END"


class Verdict(enum.Enum):
    """What a check round does with one half message."""

    SETTLED = "SETTLED"
    """An op record exists: committed or rolled back; skip it."""
    DISCARD = "DISCARD"
    """Checked ``transactionCheckMax`` times already: move it to ``TRANS_CHECK_MAX_TIME_TOPIC``."""
    WAIT = "WAIT"
    """Younger than ``transactionTimeOut``: the round ends here."""
    CHECK = "CHECK"
    """Re-put it with one more check and ask its producer group."""


@attrs.frozen
class CheckRules:
    """The check service's limits (``BrokerConfig`` keys of the same RocketMQ names)."""

    timeout_ms: int = 6000
    """``transactionTimeOut``: a half message younger than this (by its born time) is not checked yet."""
    check_max: int = 15
    """``transactionCheckMax``: checks of one transaction before it is discarded."""


@attrs.frozen
class HalfView:
    """What the rules read of one half message."""

    queue_offset: int
    transaction_id: str
    born_ms: int
    check_times: int


@attrs.frozen
class OpView:
    """What the rules read of one op record."""

    queue_offset: int
    transaction_id: str
    half_end: int


def judge(half: HalfView, settled: Container[str], now_ms: int, rules: CheckRules) -> Verdict:
    """The verdict on one half message (RocketMQ's order: op record, then check count, then age)."""
    if half.transaction_id in settled:
        return Verdict.SETTLED
    if half.check_times >= rules.check_max:
        return Verdict.DISCARD
    if now_ms - half.born_ms < rules.timeout_ms:
        return Verdict.WAIT
    return Verdict.CHECK


@attrs.frozen
class RoundPlan:
    """The verdicts of one round, in queue order, and where the next round starts."""

    actions: tuple[tuple[HalfView, Verdict], ...]
    """Every half message the round acts on (never a WAIT)."""
    next_offset: int
    """The half queue offset after the last message acted on (the first WAIT's offset when the round stopped)."""


def plan_round(start: int, halves: Sequence[HalfView], settled: Container[str], now_ms: int,
               rules: CheckRules) -> RoundPlan:
    """Verdicts for ``halves`` (read from the half queue at ``start`` onwards, in order) until the first WAIT."""
    actions: list[tuple[HalfView, Verdict]] = []
    next_offset = start
    for half in halves:
        verdict = judge(half, settled, now_ms, rules)
        if verdict is Verdict.WAIT:
            return RoundPlan(tuple(actions), half.queue_offset)
        actions.append((half, verdict))
        next_offset = half.queue_offset + 1
    return RoundPlan(tuple(actions), next_offset)


def op_offset_after(start: int, ops: Sequence[OpView], half_offset: int) -> int:
    """Where the next round reads op records from: past the leading op records every copy of whose transaction
    lies below ``half_offset`` (the check offset), which no later round can meet again."""
    offset = start
    for op in ops:
        if op.half_end > half_offset:
            break
        offset = op.queue_offset + 1
    return offset


def check_times_of(properties: Mapping[str, str]) -> int:
    """``TRANSACTION_CHECK_TIMES`` (0 when absent or not a number)."""
    raw = properties.get(TRANSACTION_CHECK_TIMES, "")
    return int(raw) if raw.isdigit() and len(raw) < 10 else 0


def half_properties(properties: Mapping[str, str], topic: str, queue_id: int, group: str) -> dict[str, str]:
    """A prepared message's properties as stored in the half topic (``parseHalfMessageInner``)."""
    props = dict(properties)
    props[REAL_TOPIC] = topic
    props[REAL_QID] = str(queue_id)
    props[TRAN_MSG] = "true"
    props[PGROUP] = group
    return props


def recheck_properties(properties: Mapping[str, str], check_times: int) -> dict[str, str]:
    """A half message's properties when it is re-put for check number ``check_times``."""
    props = dict(properties)
    props[TRANSACTION_CHECK_TIMES] = str(check_times)
    props[WAIT] = "false"
    return props


def committed_properties(properties: Mapping[str, str]) -> tuple[str, int, dict[str, str]]:
    """The real topic, queue and properties of a committed half message (``endMessageTransaction``).

    ``REAL_TOPIC`` / ``REAL_QID`` / ``TRANSACTION_CHECK_TIMES`` / ``DELAY`` are removed; ``UNIQ_KEY``, ``TRAN_MSG``
    and ``PGROUP`` stay, as in RocketMQ.

    Raises:
        ValueError: ``REAL_TOPIC`` is missing or ``REAL_QID`` is not a queue id.
    """
    topic = properties.get(REAL_TOPIC, "")
    raw_qid = properties.get(REAL_QID, "")
    if not topic or not raw_qid.isdigit() or len(raw_qid) > 9:
        raise ValueError(f"half message has {REAL_TOPIC}={topic!r} {REAL_QID}={raw_qid!r}")
    props = {k: v for k, v in properties.items()
             if k not in (REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES, DELAY, WAIT)}
    return topic, int(raw_qid), props


def op_properties(transaction_id: str, half_end: int) -> dict[str, str]:
    """The properties of an op record (its body is the half queue offset it was written for, as RocketMQ's)."""
    return {TAGS: OP_REMOVE_TAG, OP_TRANSACTION_ID: transaction_id, OP_HALF_END: str(half_end), WAIT: "false"}


def op_view(queue_offset: int, properties: Mapping[str, str]) -> OpView | None:
    """An op record as the rules read it; None when it is not one of ours (no transaction id)."""
    txid = properties.get(OP_TRANSACTION_ID, "")
    raw_end = properties.get(OP_HALF_END, "")
    if not txid:
        return None
    return OpView(queue_offset, txid, int(raw_end) if raw_end.isdigit() and len(raw_end) < 19 else 0)
