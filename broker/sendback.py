"""``POST /consumer/sendback``: a consumer hands back a message it failed to consume (RocketMQ's
``consumerSendMsgBack``, SEMANTICS.md 8.3, broker side), and the retry/DLQ rule of the send path.

The broker looks the original up by its commit-log offset and stores a copy in ``%RETRY%<group>`` with a
delay level (default ``3 + reconsumeTimes``: 10 s, 30 s, 1 min, ... 2 h), so it comes back to the group after
the delay; once ``reconsumeTimes`` reaches the group's ``retryMaxTimes`` (16) -- or the consumer asks with
``delayLevel < 0`` -- the copy goes to ``%DLQ%<group>`` instead, with no delay, where nobody consumes it
until an operator looks.

Checks, in order: the broker is not a SLAVE (SERVICE_NOT_AVAILABLE naming the role), the subscription group
exists (auto-created when ``autoCreateSubscriptionGroup``, else SUBSCRIPTION_GROUP_NOT_EXIST), the broker is
writeable (NO_PERMISSION naming the permission), the target topic is writeable (NO_PERMISSION), the original
exists (SYSTEM_ERROR ``look message by offset failed, <offset>``). A store failure, or a flush / slave wait
that does not succeed under SYNC_FLUSH / SYNC_MASTER, is SYSTEM_ERROR naming the status, as in RocketMQ (the
consumer then produces the retry message itself).
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from broker.store.api import PutMessageStatus
from client.errors import (
    BrokerSystemError,
    MessageIllegalError,
    NoPermissionError,
    ProtocolViolationError,
    ServiceNotAvailableError,
    SubscriptionGroupNotExistError,
)
from client.protocol.asgi import ArgumentError, Request, Response, json_response
from client.protocol.codec import BatchItem, decode_records
from client.protocol.codes import BrokerRole, Perm, ResponseCode, SysFlag
from client.protocol.properties import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_TOPIC,
    WAIT,
    decode_properties,
    encode_properties,
    validate_group,
)
from client.protocol.route import TopicConfig

if TYPE_CHECKING:
    from broker.controller import BrokerController

__all__ = [
    "DLQ_GROUP_TOPIC_PREFIX",
    "DLQ_QUEUE_NUMS",
    "RETRY_GROUP_TOPIC_PREFIX",
    "SendBackProcessor",
    "SendBackTarget",
    "build_send_back_properties",
    "decide_send_back",
    "dlq_topic",
    "ensure_retry_topics",
    "reroute_retry_batch",
    "retry_send_dlq_topic",
    "retry_topic",
]

log = logging.getLogger(__name__)

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
#: Queues of a ``%DLQ%`` topic (RocketMQ's ``DLQ_NUMS_PER_GROUP``).
DLQ_QUEUE_NUMS = 1
#: Delay level of the first retry minus one: reconsumeTimes 0 -> level 3 (10 s with the default levels).
RETRY_BASE_DELAY_LEVEL = 3
_DELAY_KEY = f"{DELAY}\x01".encode()


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


class SendBackTarget(enum.Enum):
    RETRY = "RETRY"
    DLQ = "DLQ"


def decide_send_back(reconsume_times: int, max_reconsume_times: int, delay_level: int) -> tuple[SendBackTarget, int]:
    """Where a sent-back message goes, and with which delay level.

    Args:
        reconsume_times: the original's reconsume count (0 the first time it failed).
        max_reconsume_times: the group's ``retryMaxTimes`` or the consumer's override.
        delay_level: the consumer's wish: 0 = let the broker decide, < 0 = straight to the DLQ.

    Returns:
        ``(DLQ, 0)`` once ``reconsume_times >= max_reconsume_times`` or for ``delay_level < 0``; else
        ``(RETRY, delay_level or 3 + reconsume_times)`` (the store caps it at the highest level).
    """
    if delay_level < 0 or reconsume_times >= max_reconsume_times:
        return SendBackTarget.DLQ, 0
    return SendBackTarget.RETRY, delay_level if delay_level > 0 else RETRY_BASE_DELAY_LEVEL + reconsume_times


def retry_send_dlq_topic(topic: str, reconsume_times: int, properties: Mapping[str, str],
                         group_retry_max_times: int) -> str | None:
    """The send path's rule for a message a producer sends straight to ``%RETRY%<group>`` (the consumer's
    fallback when send-back failed): the ``%DLQ%<group>`` topic it must go to instead, or None.

    It goes to the DLQ when ``reconsume_times`` (the send request's ``reconsumeTimes``, i.e. the message's
    ``RECONSUME_TIME`` property as the SDK sends it) exceeds its ``MAX_RECONSUME_TIMES`` property (the group's
    ``retryMaxTimes`` when absent or malformed). SEMANTICS.md 8.3 says "exceeds"; RocketMQ's
    ``handleRetryAndDLQ`` uses ``>=``, which gives the fallback path one retry fewer than send-back.
    The caller then stores it in queue 0 of that topic (created with 1 queue, perm RW) without a delay.
    """
    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return None
    raw = properties.get(MAX_RECONSUME_TIMES, "")
    max_times = int(raw) if raw.lstrip("-").isdigit() else group_retry_max_times
    if reconsume_times > max_times:
        return dlq_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
    return None


def reroute_retry_batch(topic: str, reconsume_times: int, items: Sequence[BatchItem], group_retry_max_times: int
                        ) -> tuple[str, int, list[BatchItem]] | None:
    """The send path's hook: for a batch sent to ``%RETRY%<group>`` whose first message is over its retry
    limit (:func:`retry_send_dlq_topic`), ``(dlq_topic, 0, items without DELAY)`` to store instead; else None.

    The caller creates the DLQ topic when missing (``DLQ_QUEUE_NUMS`` queue, perm RW) and appends the returned
    items to queue 0 of it (RocketMQ also drops the delay level there).
    """
    if not items or not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return None
    dlq = retry_send_dlq_topic(topic, reconsume_times, decode_properties(items[0].properties),
                               group_retry_max_times)
    if dlq is None:
        return None
    return dlq, 0, [_without_delay(item) for item in items]


def _without_delay(item: BatchItem) -> BatchItem:
    if _DELAY_KEY not in bytes(item.properties):
        return item
    props = decode_properties(item.properties)
    if props.pop(DELAY, None) is None:
        return item
    return item._replace(properties=encode_properties(props), delay_level=0)


def build_send_back_properties(original: Mapping[str, str], *, original_topic: str, original_msg_id: str,
                               reconsume_times: int, max_reconsume_times: int, delay_level: int) -> dict[str, str]:
    """Properties of the copy: the original's, plus ``RETRY_TOPIC`` (first topic, kept across retries),
    ``ORIGIN_MESSAGE_ID`` (first id, kept), ``RECONSUME_TIME`` / ``MAX_RECONSUME_TIMES`` and ``DELAY``
    (removed for level 0, so the store's delay rewrite does not apply)."""
    props = dict(original)
    props.setdefault(RETRY_TOPIC, original_topic)
    if not props.get(ORIGIN_MESSAGE_ID):
        props[ORIGIN_MESSAGE_ID] = original_msg_id
    props[RECONSUME_TIME] = str(reconsume_times + 1)
    props[MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if delay_level > 0:
        props[DELAY] = str(delay_level)
    else:
        props.pop(DELAY, None)
    return props


def _field(obj: Mapping[str, Any], key: str, typ: type, *, default: Any = None, lo: int = -(2**63),
           hi: int = 2**63 - 1) -> Any:
    """One JSON field, type-checked; ArgumentError naming it."""
    v = obj.get(key, default)
    if v is None:
        raise ArgumentError(f"JSON field {key!r} is missing")
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not an integer")
        if not lo <= v <= hi:
            raise ArgumentError(f"JSON field {key!r}={v} is outside [{lo}, {hi}]")
    elif not isinstance(v, typ):
        raise ArgumentError(f"JSON field {key!r}={v!r:.40} is not a {typ.__name__}")
    return v


def _parse_request(obj: Mapping[str, Any]) -> tuple[str, int, int, str, str, int]:
    """``(group, offset, delayLevel, originMsgId, originTopic, maxReconsumeTimes)``; ArgumentError naming a bad
    field."""
    group = _field(obj, "group", str)
    try:
        validate_group(group)
    except MessageIllegalError as e:
        raise ArgumentError(f"JSON field 'group': {e.message}") from None
    offset = _field(obj, "offset", int, lo=0, hi=2**63 - 1)
    delay_level = _field(obj, "delayLevel", int, default=0, lo=-(2**31), hi=2**31 - 1)
    origin_msg_id = _field(obj, "originMsgId", str, default="")
    origin_topic = _field(obj, "originTopic", str, default="")
    max_times = _field(obj, "maxReconsumeTimes", int, default=-1, lo=-1, hi=2**31 - 1)
    return group, offset, delay_level, origin_msg_id, origin_topic, max_times


class SendBackProcessor:
    """Serves ``POST /consumer/sendback`` for one broker.

    Args:
        ctrl: the broker (config, store, topics, groups, HA service, metrics).
        rand: random source for the retry queue choice (injected in tests).
    """

    def __init__(self, ctrl: BrokerController, *, rand: Callable[[int, int], int] | None = None) -> None:
        self._ctrl = ctrl
        self._randint = rand or random.randint

    def routes(self) -> dict[tuple[str, str], Any]:
        return {("POST", "/consumer/sendback"): self.handle}

    async def handle(self, request: Request) -> Response:
        ctrl = self._ctrl
        cfg = ctrl.config
        group, offset, delay_level, origin_msg_id, origin_topic, max_arg = _parse_request(request.json())
        where = f"broker {cfg.broker_name} (id {cfg.broker_id}, {ctrl.addr}, {ctrl.role_name})"
        if cfg.broker_role is BrokerRole.SLAVE:
            raise ServiceNotAvailableError(f"{where} is a SLAVE and does not accept send-back; send it to the "
                                           f"master of {cfg.broker_name}")
        sg = ctrl.groups.find_or_create(group)
        if sg is None:
            raise SubscriptionGroupNotExistError(f"subscription group not exist, {group} on {where} "
                                                 "(autoCreateSubscriptionGroup=false)")
        if not Perm.writeable(cfg.broker_permission):
            raise NoPermissionError(f"the broker[{cfg.broker_name} {ctrl.addr}] sending message is forbidden "
                                    f"(brokerPermission={cfg.broker_permission})")
        if sg.retry_queue_nums <= 0:
            log.info("send-back of offset %d for group %s dropped: retryQueueNums=0", offset, group)
            return json_response({})
        retry = self._topic(retry_topic(group), sg.retry_queue_nums)
        record = ctrl.store.look_message_by_offset(offset)
        if record is None:
            raise BrokerSystemError(f"look message by offset failed, {offset}")
        try:
            msg = decode_records(record)[0]
        except (ProtocolViolationError, IndexError):
            raise BrokerSystemError(f"look message by offset failed, {offset} (no valid record there)") from None
        max_times = max_arg if max_arg >= 0 else sg.retry_max_times
        target, level = decide_send_back(msg.reconsume_times, max_times, delay_level)
        if target is SendBackTarget.DLQ:
            tc = self._topic(dlq_topic(group), DLQ_QUEUE_NUMS)
            queue_id = 0
            log.info("message %s (offset %d, %s) of group %s to %s after %d reconsumes (max %d, delayLevel %d)",
                     origin_msg_id or msg.msg_id, offset, origin_topic or msg.topic, group, tc.topic_name,
                     msg.reconsume_times, max_times, delay_level)
        else:
            tc = retry
            queue_id = self._randint(0, tc.write_queue_nums - 1)
        props = build_send_back_properties(
            msg.properties, original_topic=msg.topic, original_msg_id=msg.msg_id,
            reconsume_times=msg.reconsume_times, max_reconsume_times=max_times, delay_level=level,
        )
        result = ctrl.store.put_message(
            tc.topic_name, queue_id, msg.body, props, born_host=_born_host(record, msg.sys_flag),
            born_timestamp=msg.born_timestamp, flag=msg.flag,
            sys_flag=msg.sys_flag & ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6),
            reconsume_times=msg.reconsume_times + 1,
        )
        if result.status is not PutMessageStatus.PUT_OK:
            raise BrokerSystemError(f"{result.status.value}: {result.remark or 'store refused the message'} "
                                    f"[send-back to {tc.topic_name} on {where}]")
        ctrl.metrics.stored(tc.topic_name, 1, result.wrote_bytes)
        if props.get(WAIT) != "false":
            code = await ctrl.durability.wait(result)
            if code is not ResponseCode.SUCCESS:
                raise BrokerSystemError(f"{code.name}: send-back stored in {tc.topic_name} at offset "
                                        f"{result.wrote_offset}, but not acknowledged in time [{where}]")
        return json_response({})

    def _topic(self, topic: str, queue_nums: int) -> TopicConfig:
        """The retry or DLQ topic, created (RW, ``queue_nums`` queues) when missing; NO_PERMISSION when an
        operator made it unwriteable."""
        ctrl = self._ctrl
        tc = ctrl.topics.get(topic)
        if tc is None:
            tc = ctrl.topics.create_retry_topic(topic, queue_nums)
            log.info("created topic %s with %d queues for send-back", topic, queue_nums)
            ctrl.request_registration()
        if not Perm.writeable(tc.perm) or tc.write_queue_nums <= 0:
            raise NoPermissionError(f"the topic[{topic}] sending message is forbidden on broker "
                                    f"{ctrl.config.broker_name} (perm={tc.perm}, writeQueueNums="
                                    f"{tc.write_queue_nums})")
        return tc


def ensure_retry_topics(ctrl: BrokerController, consumer_groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create ``%RETRY%<group>`` for each heartbeating group that subscribes it (a push consumer), as
    RocketMQ's heartbeat does: the group holds the retry queues from its first rebalance, so the first
    send-back's retry is pulled after its delay instead of after the next rebalance period.

    Nothing on a slave (it copies the master's topics), on an unwriteable broker, for a group that cannot be
    found or auto-created, or with ``retryQueueNums = 0``. Returns the topics created (registration follows).
    """
    cfg = ctrl.config
    if cfg.broker_role is BrokerRole.SLAVE or not Perm.writeable(cfg.broker_permission):
        return []
    created = []
    for c in consumer_groups:
        group = c.get("group")
        if not isinstance(group, str):
            continue
        topic = retry_topic(group)
        if ctrl.topics.get(topic) is not None:
            continue
        if not any(s.get("topic") == topic for s in c.get("subscriptions") or () if isinstance(s, Mapping)):
            continue
        sg = ctrl.groups.find_or_create(group)
        if sg is None or sg.retry_queue_nums <= 0:
            continue
        ctrl.topics.create_retry_topic(topic, sg.retry_queue_nums)
        log.info("created topic %s with %d queues for the heartbeat of group %s", topic, sg.retry_queue_nums,
                 group)
        created.append(topic)
    if created:
        ctrl.request_registration()
    return created


def _born_host(record: bytes, sys_flag: int) -> bytes:
    return record[48 : 48 + (20 if sys_flag & SysFlag.BORNHOST_V6 else 8)]
