"""``GET /pull``: RocketMQ's ``PullMessageProcessor`` (docs/BEHAVIOUR.md 3.2) with SplitMQ's decision 6.

Arguments are read by :meth:`common.requests.PullRequestHeader.from_query` (INVALID_PARAMETER naming
the bad one). Pre-checks in order: broker readable (NO_PERMISSION), subscription group (auto-created, else
SUBSCRIPTION_GROUP_NOT_EXIST; ``consumeEnable=false`` -> NO_PERMISSION), topic exists (TOPIC_NOT_EXIST),
topic readable (NO_PERMISSION), ``queueId`` in ``[0, readQueueNums)`` (INVALID_PARAMETER), subscription
expression (SUBSCRIPTION_PARSE_FAILED; an SQL92 one with ``enablePropertyFilter=false``: NO_PERMISSION). An SQL92
subscription filters the records the store would return by their properties (:mod:`broker.tag_filter`); a TAG
one costs what it always did. Then the store is read when this broker serves the pull
(:attr:`broker.read_split.PullContext.serves`), and :func:`broker.read_split.plan_pull_answer` plans the answer
(code, suggested broker, a slave's offset rewrite) in one call. Before a read answers "no message", what is pending is
dispatched (read-your-writes). A PULL_NOT_FOUND with the suspend flag is parked in
:class:`broker.long_polling.PullHoldService` and re-run once when woken or at its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.clients import LastPulls
from broker.config import BrokerConfig
from broker.long_polling import PullHoldService
from broker.metadata import (
    ConsumerOffsetManager,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.metrics import BrokerMetrics
from broker.processor.args import broker_where
from broker.read_split import PullContext, plan_pull_answer
from broker.role import RoleState
from broker.store.api import GetMessageResult, GetMessageStatus, MessageStore, RecordFilter, TagFilter
from broker.tag_filter import build_record_filter, build_tag_filter
from common.codes import PULL_COMMIT_OFFSET, PULL_SUSPEND, Perm, ResponseCode
from common.errors import (
    InvalidParameterError,
    NoPermissionError,
    SubscriptionGroupNotExistError,
    TopicNotExistError,
)
from common.requests import PullRequestHeader
from common.selector import SQL92
from common.wire import encode_pull_header
from remoting.router import Request, Response

__all__ = ["PullProcessor"]

log = logging.getLogger(__name__)

#: Store answers that may only mean "the dispatcher has not reached it yet".
_AT_QUEUE_END = frozenset({
    GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MATCHED_MESSAGE,
})


class PullProcessor:
    """Serves ``GET /pull`` for one broker.

    Args:
        config: the broker's configuration (role, permission, read split and long-polling settings).
        addr: the broker's client address (in error messages).
        store: what is read.
        topics / groups: the topic table and the subscription groups (auto-created on a pull).
        offsets: the consumer offsets a pull may commit (``COMMIT_OFFSET`` flag, masters only).
        hold: where a pull that found nothing waits (long polling).
        catch_up_dispatch: dispatches what is pending before a read answers "no message"
            (:meth:`broker.dispatch_driver.DispatchDriver.catch_up`).
        master_link_up: on a slave, whether its HA link to the master is connected.
        last_pulls: records which group pulled which queue when.
        metrics: answered codes and served messages.
        clock_ms: the wall clock of ``last_pulls``.
    """

    def __init__(self, config: BrokerConfig, *, addr: str, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, hold: PullHoldService,
                 catch_up_dispatch: Callable[[], bool], master_link_up: Callable[[], bool], last_pulls: LastPulls,
                 metrics: BrokerMetrics, clock_ms: Callable[[], int], role: RoleState | None = None) -> None:
        self._config = config
        self._role = role or RoleState(config.broker_role, config.broker_id)
        self._addr = addr
        self._store = store
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._hold = hold
        self._catch_up_dispatch = catch_up_dispatch
        self._master_link_up = master_link_up
        self._last_pulls = last_pulls
        self._metrics = metrics
        self._clock_ms = clock_ms

    async def handle(self, request: Request) -> Response:
        req = PullRequestHeader.from_query(request.query)
        group = self._check(req)
        tag_filter: TagFilter | None = None
        record_filter: RecordFilter | None = None
        if req.expression_type == SQL92:
            record_filter = build_record_filter(req.sub_expression, enabled=self._config.enable_property_filter,
                                                where=broker_where(self._config, self._addr, self._role))
        else:
            tag_filter = build_tag_filter(req.sub_expression)
        return await self._process(req, group, tag_filter, record_filter)

    def _check(self, req: PullRequestHeader) -> SubscriptionGroupConfig:
        cfg = self._config
        where = broker_where(cfg, self._addr, self._role)
        if not Perm.readable(cfg.broker_permission):
            raise NoPermissionError(f"the broker[{cfg.broker_name} {self._addr}] pulling message is forbidden "
                                    f"(brokerPermission={cfg.broker_permission})")
        group = self._groups.find_or_create(req.group)
        if group is None:
            raise SubscriptionGroupNotExistError(
                f"subscription group [{req.group}] does not exist on {where} (autoCreateSubscriptionGroup=false)"
            )
        if not group.consume_enable:
            raise NoPermissionError(f"subscription group [{req.group}] has consumeEnable=false on {where}")
        tc = self._topics.get(req.topic)
        if tc is None and self._role.is_slave and self._store.get_max_offset_in_queue(req.topic, req.queue_id) > 0:
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

    async def _process(self, req: PullRequestHeader, group: SubscriptionGroupConfig, tag_filter: TagFilter | None,
                       record_filter: RecordFilter | None) -> Response:
        if (req.sys_flag & PULL_COMMIT_OFFSET and req.commit_offset >= 0 and not self._role.is_slave):
            # The piggy-backed offset repeats the client's last commit. One below the stored offset is stale: a
            # pull of the queue's previous owner that was on its way while that owner committed and handed the
            # queue over; storing it would make the next owner consume again what was consumed.
            stored = self._offsets.query(req.group, req.topic, req.queue_id)
            if stored is None or req.commit_offset > stored:
                self._offsets.commit(req.group, req.topic, req.queue_id, req.commit_offset)
        allow_suspend = bool(req.sys_flag & PULL_SUSPEND)
        response = self._run_once(req, group, tag_filter, record_filter, allow_suspend)
        if response is not None:
            return response
        woken = await self._hold.wait(req.topic, req.queue_id, req.offset, self._hold_timeout_s(req))
        log.debug("parked pull %s/%d@%d %s", req.topic, req.queue_id, req.offset, "woken" if woken else "expired")
        response = self._run_once(req, group, tag_filter, record_filter, allow_suspend=False)
        assert response is not None
        return response

    def _hold_timeout_s(self, req: PullRequestHeader) -> float:
        cfg = self._config
        if not cfg.long_polling_enable:
            return cfg.short_polling_time_ms / 1000.0
        return min(req.suspend_timeout_ms, cfg.max_suspend_timeout_ms) / 1000.0

    def _run_once(self, req: PullRequestHeader, group: SubscriptionGroupConfig, tag_filter: TagFilter | None,
                  record_filter: RecordFilter | None, allow_suspend: bool) -> Response | None:
        """One pass over the store; None when the pull should be parked."""
        cfg = self._config
        store = self._store
        ctx = PullContext(
            is_slave=self._role.is_slave, slave_read_enable=cfg.slave_read_enable, master_link_up=self._master_link_up(),
            offset_check_in_slave=cfg.offset_check_in_slave, group_broker_id=group.broker_id,
            which_broker_when_consume_slowly=group.which_broker_when_consume_slowly,
        )
        if not ctx.serves:
            plan = plan_pull_answer(ctx, None, req.offset)
            self._metrics.count_request(plan.code, pull=True)
            return Response(encode_pull_header(
                int(plan.code), req.offset, store.get_min_offset_in_queue(req.topic, req.queue_id),
                store.get_max_offset_in_queue(req.topic, req.queue_id), plan.suggest_which_broker_id, self._role.broker_id, 0,
            ))
        result: GetMessageResult = store.get_message(req.group, req.topic, req.queue_id, req.offset, req.max_nums,
                                                     req.max_bytes, tag_filter, record_filter)
        if result.status in _AT_QUEUE_END and store.dispatch_behind_bytes > 0:
            self._catch_up_dispatch()  # a stored message not yet in its queue must not read as "no message"
            result = store.get_message(req.group, req.topic, req.queue_id, req.offset, req.max_nums, req.max_bytes,
                                       tag_filter, record_filter)
        self._last_pulls.record(req.group, req.topic, req.queue_id, self._clock_ms())
        plan = plan_pull_answer(ctx, result.status, req.offset,
                                suggest_pulling_from_slave=result.suggest_pulling_from_slave)
        code = plan.code
        if code is ResponseCode.PULL_NOT_FOUND and allow_suspend and self._hold.can_park():
            return None
        self._metrics.count_request(code, pull=True)
        count = result.msg_count if code is ResponseCode.SUCCESS else 0
        if count:
            self._metrics.served(req.topic, count, result.total_size)
        head = encode_pull_header(int(code), result.next_begin_offset, result.min_offset, result.max_offset,
                                  plan.suggest_which_broker_id, self._role.broker_id, count)
        return Response.of_pieces((head, result.data)) if count else Response(head)
