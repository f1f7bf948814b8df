"""``POST /consumer/sendback``: a consumer hands back a message it failed to consume (RocketMQ's
``consumerSendMsgBack``, docs/BEHAVIOUR.md 8.3, broker side).

The broker looks the original up by its commit-log offset and stores a copy in ``%RETRY%<group>`` with a delay
level, or in ``%DLQ%<group>`` past the retry limit, as the rules of :mod:`broker.retry` say.

Checks, in order: the broker is not a SLAVE (SERVICE_NOT_AVAILABLE naming the role), the subscription group
exists (auto-created when ``autoCreateSubscriptionGroup``, else SUBSCRIPTION_GROUP_NOT_EXIST), the broker is
writeable (NO_PERMISSION naming the permission), the target topic is writeable (NO_PERMISSION), the original
exists (SYSTEM_ERROR ``look message by offset failed, <offset>``). A store failure, or a flush / slave wait
that does not succeed under SYNC_FLUSH / SYNC_MASTER, is SYSTEM_ERROR naming the status, as in RocketMQ (the
consumer then produces the retry message itself).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from broker.config import BrokerConfig
from broker.durability import Durability
from broker.metadata import SubscriptionGroupManager, TopicConfigManager
from broker.metrics import BrokerMetrics
from broker.processor.args import INT32_MAX, INT64_MAX, ArgumentError, json_field
from broker.retry import (
    DLQ_QUEUE_NUMS,
    SendBackTarget,
    build_send_back_properties,
    decide_send_back,
    dlq_topic,
    retry_topic,
)
from broker.role import RoleState
from broker.store.api import MessageStore, PutMessageStatus
from common.codec import decode_records, packed_born_host
from common.codes import Perm, ResponseCode, SysFlag
from common.errors import (
    BrokerSystemError,
    InvalidParameterError,
    MessageIllegalError,
    NoPermissionError,
    ProtocolViolationError,
    ServiceNotAvailableError,
    SubscriptionGroupNotExistError,
)
from common.message import MessageExt
from common.properties import WAIT, validate_group
from common.route import TopicConfig
from remoting.router import Request, Response, json_response

__all__ = ["SendBackProcessor"]

log = logging.getLogger(__name__)

_NOT_WRITEABLE = frozenset({PutMessageStatus.SERVICE_NOT_AVAILABLE, PutMessageStatus.CREATE_MAPPED_FILE_FAILED})


def _parse_request(obj: Mapping[str, Any]) -> tuple[str, int, int, str, str, int]:
    """``(group, offset, delayLevel, originMsgId, originTopic, maxReconsumeTimes)``; ArgumentError naming a bad
    field."""
    group = json_field(obj, "group", str)
    try:
        validate_group(group)
    except MessageIllegalError as e:
        raise ArgumentError(f"JSON field 'group': {e.message}") from None
    offset = json_field(obj, "offset", int, lo=0, hi=INT64_MAX)
    delay_level = json_field(obj, "delayLevel", int, default=0, lo=-INT32_MAX - 1, hi=INT32_MAX)
    origin_msg_id = json_field(obj, "originMsgId", str, default="")
    origin_topic = json_field(obj, "originTopic", str, default="")
    max_times = json_field(obj, "maxReconsumeTimes", int, default=-1, lo=-1, hi=INT32_MAX)
    return group, offset, delay_level, origin_msg_id, origin_topic, max_times


class SendBackProcessor:
    """Serves ``POST /consumer/sendback`` for one broker.

    Args:
        config: the broker's configuration (role, permission; its name in messages).
        addr: the broker's client address (in messages).
        store: where the original is read and the copy appended.
        topics / groups: the retry and DLQ topics (created when missing) and the group's retry settings.
        metrics: stored messages.
        durability: the flush / replica wait after the append.
        request_registration: asks for a registration soon (after a topic was created).
        rand: random source for the retry queue choice (injected in tests).
    """

    def __init__(self, config: BrokerConfig, *, addr: str, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, metrics: BrokerMetrics, durability: Durability,
                 request_registration: Callable[[], None], rand: Callable[[int, int], int] | None = None,
                 role: RoleState | None = None) -> None:
        self._config = config
        self._role = role or RoleState(config.broker_role, config.broker_id)
        self._addr = addr
        self._store = store
        self._topics = topics
        self._groups = groups
        self._metrics = metrics
        self._durability = durability
        self._request_registration = request_registration
        self._randint = rand or random.randint

    def _message_at(self, offset: int) -> tuple[bytes, MessageExt]:
        """The message whose record starts at ``offset``; a 4xx when no record starts there (the client's offset
        came from a pull, so anything else is a bad request, not a broker fault), with its record."""
        record = None
        if self._store.min_physical_offset <= offset < self._store.max_physical_offset:
            try:
                record = self._store.look_message_by_offset(offset)
            except (ValueError, IndexError, OSError):  # a size read mid-record can point anywhere
                record = None
        msg = None
        if record is not None:
            try:
                msg = decode_records(record)[0]
            except (ProtocolViolationError, IndexError, ValueError):
                msg = None
        # A record's PHYSICALOFFSET is its own position: bytes inside a body that merely look like a record fail it.
        if record is None or msg is None or msg.commit_log_offset != offset:
            raise InvalidParameterError(
                f"look message by offset failed: offset {offset} is not the start of a message in the commit log "
                f"of {self._config.broker_name} (use the commitLogOffset a pull returned)")
        return record, msg

    def routes(self) -> dict[tuple[str, str], Any]:
        return {("POST", "/consumer/sendback"): self.handle}

    async def handle(self, request: Request) -> Response:
        cfg = self._config
        group, offset, delay_level, origin_msg_id, origin_topic, max_arg = _parse_request(request.json())
        where = f"broker {cfg.broker_name} (id {self._role.broker_id}, {self._addr}, {self._role.name})"
        if self._role.is_slave:
            raise ServiceNotAvailableError(f"{where} is a SLAVE and does not accept send-back; send it to the "
                                           f"master of {cfg.broker_name}")
        sg = self._groups.find_or_create(group)
        if sg is None:
            raise SubscriptionGroupNotExistError(f"subscription group not exist, {group} on {where} "
                                                 "(autoCreateSubscriptionGroup=false)")
        if not Perm.writeable(cfg.broker_permission):
            raise NoPermissionError(f"the broker[{cfg.broker_name} {self._addr}] sending message is forbidden "
                                    f"(brokerPermission={cfg.broker_permission})")
        if sg.retry_queue_nums <= 0:
            log.info("send-back of offset %d for group %s dropped: retryQueueNums=0", offset, group)
            return json_response({})
        retry = self._topic(retry_topic(group), sg.retry_queue_nums)
        record, msg = self._message_at(offset)
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
        result = self._store.put_message(
            tc.topic_name, queue_id, msg.body, props, born_host=packed_born_host(record, msg.sys_flag),
            born_timestamp=msg.born_timestamp, flag=msg.flag,
            sys_flag=msg.sys_flag & ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6 | SysFlag.IDEMPOTENT),
            reconsume_times=msg.reconsume_times + 1,
        )
        if result.status is not PutMessageStatus.PUT_OK:
            # A store that cannot write (disk full, an I/O error) is SERVICE_NOT_AVAILABLE, as for a send.
            cls = ServiceNotAvailableError if result.status in _NOT_WRITEABLE else BrokerSystemError
            raise cls(f"{result.status.value}: {result.remark or 'store refused the message'} "
                      f"[send-back to {tc.topic_name} on {where}]")
        self._metrics.stored(tc.topic_name, 1, result.wrote_bytes)
        if props.get(WAIT) != "false":
            code = await self._durability.wait(result)
            if code is not ResponseCode.SUCCESS:
                raise BrokerSystemError(f"{code.name}: send-back stored in {tc.topic_name} at offset "
                                        f"{result.wrote_offset}, but not acknowledged in time [{where}]")
        return json_response({})

    def _topic(self, topic: str, queue_nums: int) -> TopicConfig:
        """The retry or DLQ topic, created (RW, ``queue_nums`` queues) when missing; NO_PERMISSION when an
        operator made it unwriteable."""
        tc = self._topics.get(topic)
        if tc is None:
            tc = self._topics.create_retry_topic(topic, queue_nums)
            log.info("created topic %s with %d queues for send-back", topic, queue_nums)
            self._request_registration()
        if not Perm.writeable(tc.perm) or tc.write_queue_nums <= 0:
            raise NoPermissionError(f"the topic[{topic}] sending message is forbidden on broker "
                                    f"{self._config.broker_name} (perm={tc.perm}, writeQueueNums="
                                    f"{tc.write_queue_nums})")
        return tc
