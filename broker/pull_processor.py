"""``GET /pull``: RocketMQ's ``PullMessageProcessor`` (SEMANTICS.md 3.2) with SplitMQ's decision 6.

Pre-checks in order: broker readable (NO_PERMISSION), subscription group (auto-created, else
SUBSCRIPTION_GROUP_NOT_EXIST; ``consumeEnable=false`` -> NO_PERMISSION), topic exists (TOPIC_NOT_EXIST),
topic readable (NO_PERMISSION), ``queueId`` in ``[0, readQueueNums)`` (INVALID_PARAMETER), subscription
expression (SUBSCRIPTION_PARSE_FAILED). Then :func:`broker.read_split.decide_pull_route` says whether this broker
serves; the store is read; the status becomes a code; a PULL_NOT_FOUND with the suspend flag is parked in
:class:`broker.long_polling.PullHoldService` and re-run once when woken or at its deadline.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from broker.read_split import code_for_status, decide_pull_route, rewrite_offset_moved
from broker.store.api import GetMessageResult, GetMessageStatus, TagFilter
from broker.tag_filter import build_tag_filter
from client.errors import (
    InvalidParameterError,
    MessageIllegalError,
    NoPermissionError,
    SubscriptionGroupNotExistError,
    TopicNotExistError,
)
from client.protocol.asgi import ArgumentError, Request, Response
from client.protocol.codes import Perm, PullSysFlag, ResponseCode
from client.protocol.properties import validate_group, validate_topic
from client.protocol.wire import encode_pull_header

if TYPE_CHECKING:
    from broker.controller import BrokerController
    from broker.metadata.subscription_groups import SubscriptionGroupConfig

__all__ = ["PullProcessor", "PullRequest", "checked_name"]

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1
DEFAULT_SUSPEND_TIMEOUT_MS = 15_000
#: Default of ``maxBytes``: RocketMQ 5's ``maxTotalMsgSize`` (the store's own batch limits apply first).
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
#: Store answers that may only mean "the dispatcher has not reached it yet".
_AT_QUEUE_END = frozenset({
    GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MATCHED_MESSAGE,
})


def checked_name(kind: str, value: str) -> str:
    """A topic or group query argument, validated; a bad one is INVALID_PARAMETER naming the argument."""
    try:
        return validate_topic(value) if kind == "topic" else validate_group(value)
    except MessageIllegalError as e:
        raise ArgumentError(f"query argument {kind!r}: {e.message}") from None


@attrs.frozen
class PullRequest:
    """The parsed query of one pull."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    max_bytes: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_ms: int
    sub_expression: str

    @classmethod
    def from_request(cls, request: Request) -> PullRequest:
        """Raises ArgumentError naming a missing or malformed argument."""
        return cls(
            group=checked_name("group", request.arg("group")),
            topic=checked_name("topic", request.arg("topic")),
            queue_id=request.int_arg("queueId", lo=-(2**31), hi=2**31 - 1),
            offset=request.int_arg("offset", lo=0, hi=INT64_MAX),
            max_nums=request.int_arg("maxNums", 32, lo=1, hi=65_536),
            max_bytes=request.int_arg("maxBytes", DEFAULT_MAX_BYTES, lo=1, hi=1 << 31),
            sys_flag=request.int_arg("sysFlag", 0, lo=0, hi=2**31 - 1),
            commit_offset=request.int_arg("commitOffset", -1, lo=-1, hi=INT64_MAX),
            suspend_timeout_ms=request.int_arg("suspendTimeoutMs", DEFAULT_SUSPEND_TIMEOUT_MS, lo=0, hi=2**31 - 1),
            sub_expression=request.query.get("subExpression", "*"),
        )


class PullProcessor:
    """Serves ``GET /pull`` for one broker."""

    def __init__(self, ctrl: BrokerController) -> None:
        self._ctrl = ctrl

    async def handle(self, request: Request) -> Response:
        req = PullRequest.from_request(request)
        group = self._check(req)
        tag_filter = build_tag_filter(req.sub_expression)
        body = await self._process(req, group, tag_filter)
        return Response(body)

    def _check(self, req: PullRequest) -> SubscriptionGroupConfig:
        ctrl = self._ctrl
        cfg = ctrl.config
        where = f"broker {cfg.broker_name} ({ctrl.addr}, {ctrl.role_name})"
        if not Perm.readable(cfg.broker_permission):
            raise NoPermissionError(f"the broker[{cfg.broker_name} {ctrl.addr}] pulling message is forbidden "
                                    f"(brokerPermission={cfg.broker_permission})")
        group = ctrl.groups.find_or_create(req.group)
        if group is None:
            raise SubscriptionGroupNotExistError(
                f"subscription group [{req.group}] does not exist on {where} (autoCreateSubscriptionGroup=false)"
            )
        if not group.consume_enable:
            raise NoPermissionError(f"subscription group [{req.group}] has consumeEnable=false on {where}")
        tc = ctrl.topics.get(req.topic)
        if tc is None and cfg.is_slave and ctrl.store.get_max_offset_in_queue(req.topic, req.queue_id) > 0:
            # The replicated commit log already holds this queue but the 10 s metadata sync has not brought the
            # topic's config yet (a topic created just before its master died): serve what was replicated
            # rather than refuse it (RocketMQ answers TOPIC_NOT_EXIST until the sync).
            return group
        if tc is None:
            raise TopicNotExistError(f"topic[{req.topic}] not exist on {where}, apply first please!")
        if not Perm.readable(tc.perm):
            raise NoPermissionError(f"the topic[{req.topic}] pulling message is forbidden on {where} (perm={tc.perm})")
        if not 0 <= req.queue_id < tc.read_queue_nums:
            raise InvalidParameterError(
                f"queueId {req.queue_id} of topic {req.topic} is outside [0, {tc.read_queue_nums}) readQueueNums on "
                f"{where}"
            )
        return group

    async def _process(self, req: PullRequest, group: SubscriptionGroupConfig, tag_filter: TagFilter | None
                       ) -> bytes:
        ctrl = self._ctrl
        cfg = ctrl.config
        if (req.sys_flag & PullSysFlag.COMMIT_OFFSET and req.commit_offset >= 0 and not cfg.is_slave):
            ctrl.offsets.commit(req.group, req.topic, req.queue_id, req.commit_offset)
        allow_suspend = bool(req.sys_flag & PullSysFlag.SUSPEND)
        body = self._run_once(req, group, tag_filter, allow_suspend)
        if body is not None:
            return body
        woken = await ctrl.hold.wait(req.topic, req.queue_id, req.offset, self._hold_timeout_s(req))
        log.debug("parked pull %s/%d@%d %s", req.topic, req.queue_id, req.offset, "woken" if woken else "expired")
        body = self._run_once(req, group, tag_filter, allow_suspend=False)
        assert body is not None
        return body

    def _hold_timeout_s(self, req: PullRequest) -> float:
        cfg = self._ctrl.config
        if not cfg.long_polling_enable:
            return cfg.short_polling_time_ms / 1000.0
        return min(req.suspend_timeout_ms, cfg.max_suspend_timeout_ms) / 1000.0

    def _run_once(self, req: PullRequest, group: SubscriptionGroupConfig, tag_filter: TagFilter | None,
                  allow_suspend: bool) -> bytes | None:
        """One pass over the store; None when the pull should be parked."""
        ctrl = self._ctrl
        cfg = ctrl.config
        store = ctrl.store
        own_id = cfg.broker_id
        route = decide_pull_route(
            is_slave=cfg.is_slave, slave_read_enable=cfg.slave_read_enable, master_link_up=ctrl.master_link_up(),
            suggest_pulling_from_slave=False, group_broker_id=group.broker_id,
            which_broker_when_consume_slowly=group.which_broker_when_consume_slowly,
        )
        if not route.serve:
            ctrl.metrics.count_request(ResponseCode.PULL_RETRY_IMMEDIATELY, pull=True)
            return encode_pull_header(
                int(ResponseCode.PULL_RETRY_IMMEDIATELY), req.offset,
                store.get_min_offset_in_queue(req.topic, req.queue_id),
                store.get_max_offset_in_queue(req.topic, req.queue_id), route.suggest_which_broker_id, own_id, 0,
            )
        result: GetMessageResult = store.get_message(req.group, req.topic, req.queue_id, req.offset, req.max_nums,
                                                     req.max_bytes, tag_filter)
        if result.status in _AT_QUEUE_END and store.dispatch_behind_bytes > 0:
            ctrl.catch_up_dispatch()  # a stored message not yet in its queue must not read as "no message"
            result = store.get_message(req.group, req.topic, req.queue_id, req.offset, req.max_nums, req.max_bytes,
                                       tag_filter)
        ctrl.last_pulls.record(req.group, req.topic, req.queue_id, ctrl.now_ms())
        suggest = decide_pull_route(
            is_slave=cfg.is_slave, slave_read_enable=cfg.slave_read_enable, master_link_up=ctrl.master_link_up(),
            suggest_pulling_from_slave=result.suggest_pulling_from_slave, group_broker_id=group.broker_id,
            which_broker_when_consume_slowly=group.which_broker_when_consume_slowly,
        ).suggest_which_broker_id
        code = code_for_status(result.status, req.offset)
        code, suggest = rewrite_offset_moved(code, suggest, is_slave=cfg.is_slave,
                                             offset_check_in_slave=cfg.offset_check_in_slave,
                                             group_broker_id=group.broker_id)
        if code is ResponseCode.PULL_NOT_FOUND and allow_suspend and ctrl.hold.can_park():
            return None
        ctrl.metrics.count_request(code, pull=True)
        records = result.records if code is ResponseCode.SUCCESS else []
        if records:
            ctrl.metrics.served(req.topic, len(records), result.total_size)
        head = encode_pull_header(int(code), result.next_begin_offset, result.min_offset, result.max_offset,
                                  suggest, own_id, len(records))
        return b"".join((head, *records)) if records else head
