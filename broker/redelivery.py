"""Putting a parked message back under its real topic, exactly once across crashes.

Shared by the two services that park messages in a system topic and put them back later: the delay-level
scheduler (:mod:`broker.schedule`, ``SCHEDULE_TOPIC_XXXX``) and the timer (:mod:`broker.timer.service`,
``rmq_sys_wheel_timer``). Both follow the same discipline:

1. before a batch of puts, journal (fsync'd) the commit-log offset the first put will land at and a
   :class:`Delivery` fingerprint of every message of the batch;
2. make the puts without yielding to the event loop, so that they are contiguous in the commit log;
3. on start, :func:`settled_prefix` walks the commit log from the journaled offset and counts how many of the
   journaled deliveries are already there: those are done, the rest are put again.

A copy lost together with the journal's fsync (an OS crash between the journal write and the page-cache flush
of the commit log) is delivered again -- never lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from broker.store.api import AppendResult, MessageStore
from common.codec import decode_records, packed_born_host
from common.codes import SysFlag
from common.errors import ProtocolViolationError
from common.message import MessageExt
from common.properties import UNIQ_KEY

__all__ = ["Delivery", "put_copy", "settled_prefix"]


@attrs.frozen
class Delivery:
    """One message about to be put back under its real topic; also its journal fingerprint."""

    queue_offset: int
    """Offset of the unit in the system topic's queue."""
    topic: str
    queue_id: int
    body_crc: int
    born_timestamp: int
    uniq_key: str
    """``UNIQ_KEY`` of the message ('' when absent)."""

    def to_json(self) -> list[Any]:
        return [self.queue_offset, self.topic, self.queue_id, self.body_crc, self.born_timestamp, self.uniq_key]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> Delivery:
        """Raises ValueError on a malformed row."""
        try:
            qo, topic, qid, crc, born, uniq = row
            return cls(int(qo), str(topic), int(qid), int(crc), int(born), str(uniq))
        except (TypeError, ValueError):
            raise ValueError(f"malformed delivery journal row {row!r:.80}") from None

    @classmethod
    def of(cls, queue_offset: int, topic: str, queue_id: int, msg: MessageExt, props: Mapping[str, str]
           ) -> Delivery:
        """The fingerprint of ``msg`` about to be put under ``topic`` / ``queue_id`` with ``props``."""
        return cls(queue_offset, topic, queue_id, msg.body_crc, msg.born_timestamp, props.get(UNIQ_KEY, ""))

    def matches(self, msg: MessageExt) -> bool:
        return (msg.topic == self.topic and msg.queue_id == self.queue_id and msg.body_crc == self.body_crc
                and msg.born_timestamp == self.born_timestamp
                and msg.properties.get(UNIQ_KEY, "") == self.uniq_key)


def put_copy(store: MessageStore, d: Delivery, msg: MessageExt, record: bytes, props: dict[str, str]
             ) -> AppendResult:
    """Put ``msg`` (read as ``record``) under ``d.topic`` / ``d.queue_id`` with ``props``, keeping its body,
    born host and time, flag and reconsume count (the store host is the master's own)."""
    return store.put_message(
        d.topic, d.queue_id, msg.body, props, born_host=packed_born_host(record, msg.sys_flag),
        born_timestamp=msg.born_timestamp, flag=msg.flag,
        sys_flag=msg.sys_flag & ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6 | SysFlag.IDEMPOTENT),
        reconsume_times=msg.reconsume_times,
    )


def settled_prefix(store: MessageStore, phy: int, deliveries: Sequence[Delivery]) -> int:
    """How many of ``deliveries`` (a journaled batch, in put order) have their copy in the commit log from
    physical offset ``phy`` onwards: the first that is missing or different ends the walk."""
    count = 0
    file_size = store.mapped_file_size_commitlog
    for d in deliveries:
        rec = store.look_message_by_offset(phy)
        if rec is None and phy % file_size:  # the put rolled to the next file (blank marker here)
            phy = (phy // file_size + 1) * file_size
            rec = store.look_message_by_offset(phy)
        if rec is None:
            break
        try:
            msg = decode_records(rec)[0]
        except (ProtocolViolationError, IndexError):
            break
        if not d.matches(msg):
            break
        count += 1
        phy += len(rec)
    return count
