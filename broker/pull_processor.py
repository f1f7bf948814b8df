"""``GET /pull``: RocketMQ's ``PullMessageProcessor`` (SEMANTICS.md 3.2) with SplitMQ's decision 6.

Arguments are read by :meth:`client.protocol.requests.PullRequestHeader.from_query` (INVALID_PARAMETER naming
the bad one). Pre-checks in order: broker readable (NO_PERMISSION), subscription group (auto-created, else
SUBSCRIPTION_GROUP_NOT_EXIST; ``consumeEnable=false`` -> NO_PERMISSION), topic exists (TOPIC_NOT_EXIST),
topic readable (NO_PERMISSION), ``queueId`` in ``[0, readQueueNums)`` (INVALID_PARAMETER), subscription
expression (SUBSCRIPTION_PARSE_FAILED). Then :func:`broker.read_split.decide_pull_route` says whether this broker
serves; the store is read; the status becomes a code; a PULL_NOT_FOUND with the suspend flag is parked in
:class:`broker.long_polling.PullHoldService` and re-run once when woken or at its deadline.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.read_split import code_for_status, decide_pull_route, rewrite_offset_moved
from broker.store.api import GetMessageResult, GetMessageStatus, TagFilter
from broker.tag_filter import build_tag_filter
from client.errors import (
    InvalidParameterError,
    NoPermissionError,
    SubscriptionGroupNotExistError,
    TopicNotExistError,
)
from client.protocol.asgi import Request, Response
from client.protocol.codes import Perm, PullSysFlag, ResponseCode
from client.protocol.requests import INT64_MAX, PullRequestHeader, checked_name
from client.protocol.wire import encode_pull_header

if TYPE_CHECKING:
    from broker.controller import BrokerController
    from broker.metadata.subscription_groups import SubscriptionGroupConfig

__all__ = ["INT64_MAX", "PullProcessor", "checked_name"]

log = logging.getLogger(__name__)

#: Store answers that may only mean "the dispatcher has not reached it yet".
_AT_QUEUE_END = frozenset({
    GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MATCHED_MESSAGE,
})


class PullProcessor:
    """Serves ``GET /pull`` for one broker."""

    def __init__(self, ctrl: BrokerController) -> None:
        self._ctrl = ctrl

    async def handle(self, request: Request) -> Response:
        req = PullRequestHeader.from_query(request.query)
        group = self._check(req)
        tag_filter = build_tag_filter(req.sub_expression)
        body = await self._process(req, group, tag_filter)
        return Response(body)

    def _check(self, req: PullRequestHeader) -> SubscriptionGroupConfig:
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

    async def _process(self, req: PullRequestHeader, group: SubscriptionGroupConfig, tag_filter: TagFilter | None
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

    def _hold_timeout_s(self, req: PullRequestHeader) -> float:
        cfg = self._ctrl.config
        if not cfg.long_polling_enable:
            return cfg.short_polling_time_ms / 1000.0
        return min(req.suspend_timeout_ms, cfg.max_suspend_timeout_ms) / 1000.0

    def _run_once(self, req: PullRequestHeader, group: SubscriptionGroupConfig, tag_filter: TagFilter | None,
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
            ctrl.dispatch.catch_up()  # a stored message not yet in its queue must not read as "no message"
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
