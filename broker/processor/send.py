"""``POST /send``: validate, append the batch to the store, then wait as the flush / replication mode requires.

Arguments are read by :meth:`common.requests.SendRequestHeader.from_query`, once per distinct query: the
processor keeps the headers whose arguments and topic name passed. Checks, in order: the broker is not a SLAVE
(SERVICE_NOT_AVAILABLE), the broker is writeable (NO_PERMISSION), the topic name is legal (not checked again for a
kept header) and not a system topic producers may not send to, the body decodes (MESSAGE_ILLEGAL), the topic exists
(auto-created from ``TBW102`` when enabled, else TOPIC_NOT_EXIST), it is writeable (NO_PERMISSION), and ``queueId``
is in ``[0, writeQueueNums)`` (INVALID_PARAMETER); then, as in RocketMQ, the store refuses a batch with a message
past ``maxMessageSize`` (MESSAGE_ILLEGAL, naming the message; checked once, when the store plans the put). A message
with a timer property due later is parked in ``rmq_sys_wheel_timer`` (:mod:`broker.timer.rules`). After a successful
append, unless every message says ``WAIT=false``, the send waits as :mod:`broker.durability` describes (docs/BEHAVIOUR.md
2.9, decision 5): SYNC_FLUSH for the flush (``FLUSH_DISK_TIMEOUT``), SYNC_MASTER for the acks of
``inSyncReplicas - 1`` connected slaves, one by default (``FLUSH_SLAVE_TIMEOUT`` after ``syncFlushTimeout``;
``SLAVE_NOT_AVAILABLE`` at once when fewer connected slaves are in sync, i.e. have their own last ack within
``haMaxGapNotInSync`` of the put); the replica status wins when both fail.

Idempotent sends (issue 38, docs/GUIDE.md "Idempotent sends"): a batch whose messages carry
``SysFlag.IDEMPOTENT`` is looked up, key by key, in the broker's duplicate window (:mod:`broker.dedup`) before
anything is stored. A message whose ``UNIQ_KEY`` the window holds is not stored again: it is answered with its
first copy's queue, queue offset and commit-log offset, once that copy is as durable as a new send would be (the
same wait, on the first copy's end; in DLedger mode, its entry's commit). The others are stored as one append, and
their keys enter the window at once, before the durability wait, so a concurrent retry of them waits for the same
copy. When the messages of an answer are not all at consecutive offsets of one queue, the reply carries each
message's place (docs/PROTOCOL.md). With ``duplicateWindowMs=0`` the bit is ignored.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from operator import and_, attrgetter, or_

from broker.config import BrokerConfig
from broker.dedup import Duplicates, DuplicateWindow, FirstWrite
from broker.durability import Durability
from broker.metadata import SubscriptionGroupManager, TopicConfigManager
from broker.metadata.topics import NOT_ALLOWED_SEND_TOPICS
from broker.metrics import BrokerMetrics
from broker.processor.args import broker_where
from broker.retry import DLQ_QUEUE_NUMS, RETRY_GROUP_TOPIC_PREFIX, reroute_retry_batch
from broker.role import RoleState
from broker.store.api import AppendResult, MessageStore, PutMessageStatus
from broker.timer.rules import has_timer, route_timer_send
from common.codec import BatchItem, decode_batch, pack_host
from common.codes import Perm, ResponseCode, SysFlag
from common.errors import (
    BrokerError,
    BrokerSystemError,
    InvalidParameterError,
    MessageIllegalError,
    NoPermissionError,
    ServiceNotAvailableError,
    SystemBusyError,
    TopicNotExistError,
)
from common.properties import validate_topic
from common.requests import SendRequestHeader
from common.route import TopicConfig
from common.wire import encode_send_reply
from remoting.router import Request, Response

__all__ = ["SendProcessor"]

log = logging.getLogger(__name__)

_LOOPBACK_HOST = pack_host("127.0.0.1", 0)
_PREPARED = int(SysFlag.TRANSACTION_PREPARED)
_IDEMPOTENT = int(SysFlag.IDEMPOTENT)
#: Read in C over a batch.
_SYS_FLAG = attrgetter("sys_flag")
_UNIQ_KEY = attrgetter("uniq_key")

_FAILURES: dict[PutMessageStatus, type[BrokerError]] = {
    PutMessageStatus.MESSAGE_ILLEGAL: MessageIllegalError,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: MessageIllegalError,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ServiceNotAvailableError,
    # The next commit-log file could not be created (disk full, an I/O error): the store is not writeable.
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ServiceNotAvailableError,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: SystemBusyError,
}


#: Send headers kept checked (:attr:`SendProcessor._checked`) at most.
_CHECKED_MAX = 4096


def _born_host(client: tuple[str, int] | None) -> bytes:
    if not client:
        return _LOOPBACK_HOST
    try:
        return _packed_peer(client[0], int(client[1]))
    except (ValueError, TypeError):
        return _LOOPBACK_HOST


@functools.lru_cache(maxsize=4096)
def _packed_peer(host: str, port: int) -> bytes:
    """``pack_host`` of a peer (parsing the address with ipaddress cost ~10 µs a send; peers repeat)."""
    return pack_host(host, port)


def _wait_store_msg_ok(items: Sequence[BatchItem]) -> bool:
    """False only when every message says ``WAIT=false`` (then the producer does not wait for durability)."""
    return any(item.wait for item in items)  # read by decode_batch: no second look at the properties


def _flags_of(items: Sequence[BatchItem]) -> tuple[int, int]:
    """``(OR, AND)`` of the batch's SYSFLAGs: what any message asks, and what every one does. One pass in C (a
    generator over the items cost a single send more than the test itself); a batch has one or two distinct
    flags."""
    if len(items) == 1:
        flag = items[0].sys_flag
        return flag, flag
    distinct = set(map(_SYS_FLAG, items))
    if len(distinct) == 1:
        flag = distinct.pop()
        return flag, flag
    return functools.reduce(or_, distinct), functools.reduce(and_, distinct)


def _keys_of(items: Sequence[BatchItem], every: int) -> tuple[bytes, ...]:
    """The unique key of each message of an idempotent batch (empty for a message without the bit: always new);
    ``every`` is the AND of their SYSFLAGs."""
    if every & _IDEMPOTENT:
        return tuple(map(_UNIQ_KEY, items))
    return tuple(item.uniq_key if item.sys_flag & _IDEMPOTENT else b"" for item in items)


def _reply(code: int, placements: Sequence[tuple[int, int, int]], store_host: bytes) -> bytes:
    """A send reply for messages at ``placements`` (queue id, queue offset, commit-log offset): the plain form
    when they are consecutive offsets of one queue, else with each message's place."""
    qid, first = placements[0][0], placements[0][1]
    offsets = [p[2] for p in placements]
    if all(p[0] == qid and p[1] == first + i for i, p in enumerate(placements)):
        return encode_send_reply(code, qid, first, store_host, offsets)
    return encode_send_reply(code, qid, first, store_host, offsets, [x for p in placements for x in p[:2]])


class SendProcessor:
    """Serves ``POST /send`` for one broker.

    Args:
        config: the broker's configuration (role, permission, ``maxMessageSize``, topic auto-creation).
        addr: the broker's client address (in error messages).
        store_host: the packed ``addr`` echoed in send replies.
        store: where the batch is appended.
        topics / groups: the topic table (auto-created and retry/DLQ topics) and the subscription groups (the
            retry limit of a ``%RETRY%`` topic's group).
        metrics: stored messages and answered codes.
        durability: the flush / replica wait after an append.
        request_registration: asks for a registration soon (after a topic was created).
        role: the broker's current role and id (DLedger mode changes them; default: the configuration's).
        clock_ms: wall clock in ms (timed messages' delays count from it).
        half_item: turns a prepared (transactional) send into the half message stored in ``half_topic``
            (:meth:`broker.transaction.TransactionalMessageService.half_item`); None refuses prepared sends.
        dedup: the duplicate window of idempotent sends (None: ``duplicateWindowMs=0``, the bit is ignored).
        entry_committed: DLedger: whether the entry ``(index, term)`` is committed in this member's log (a
            duplicate whose first copy's commit future failed is answered SEND_OK once it is).
    """

    def __init__(self, config: BrokerConfig, *, addr: str, store_host: bytes, store: MessageStore,
                 topics: TopicConfigManager, groups: SubscriptionGroupManager, metrics: BrokerMetrics,
                 durability: Durability, request_registration: Callable[[], None],
                 role: RoleState | None = None, clock_ms: Callable[[], int] | None = None,
                 half_item: Callable[[str, int, str, list[BatchItem]], BatchItem] | None = None,
                 half_topic: str = "", dedup: DuplicateWindow | None = None,
                 entry_committed: Callable[[tuple[int, int]], bool] | None = None) -> None:
        self._config = config
        self._dedup = dedup
        self._entry_committed = entry_committed
        self._half_item = half_item
        self._half_topic = half_topic
        self._role = role or RoleState(config.broker_role, config.broker_id)
        self._addr = addr
        self._store_host = store_host
        self._store = store
        self._topics = topics
        self._groups = groups
        self._metrics = metrics
        self._durability = durability
        self._request_registration = request_registration
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._checked: dict[bytes, SendRequestHeader] = {}
        """Headers whose arguments and topic name passed the checks, by their query (:attr:`Request.query_key`):
        a producer sends the same few queries again and again. Emptied at :data:`_CHECKED_MAX` entries."""

    async def handle(self, request: Request) -> Response:
        cfg = self._config
        key = request.query_key
        req = self._checked.get(key) if key else None
        checked = req is not None
        if req is None:
            req = SendRequestHeader.from_query(request.query)
        topic, queue_id, reconsume_times = req.topic, req.queue_id, req.reconsume_times
        client_queue_nums = req.create_queue_nums
        if self._role.is_slave:
            raise ServiceNotAvailableError(
                f"broker {cfg.broker_name} (id {self._role.broker_id}, {self._addr}) is a SLAVE and does not accept "
                f"messages; send to the master of {cfg.broker_name}"
            )
        if not Perm.writeable(cfg.broker_permission):
            raise NoPermissionError(f"the broker[{cfg.broker_name} {self._addr}] sending message is forbidden "
                                    f"(brokerPermission={cfg.broker_permission})")
        if not checked:
            validate_topic(topic)
            if key:
                if len(self._checked) >= _CHECKED_MAX:
                    self._checked.clear()
                self._checked[key] = req
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise NoPermissionError(f"sending message to topic[{topic}] is forbidden")
        items = decode_batch(request.body)
        tc = self._topic_for_send(topic, client_queue_nums)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic, tc, queue_id, items = self._maybe_dead_letter(topic, tc, queue_id, items, reconsume_times)
        if not Perm.writeable(tc.perm):
            raise NoPermissionError(f"the topic[{topic}] sending message is forbidden on broker "
                                    f"{cfg.broker_name} (perm={tc.perm})")
        if not 0 <= queue_id < tc.write_queue_nums:
            raise InvalidParameterError(
                f"queueId {queue_id} of topic {topic} is outside [0, {tc.write_queue_nums}) writeQueueNums on "
                f"broker {cfg.broker_name} ({self._addr})"
            )
        reply_queue_id = queue_id
        flags, every = _flags_of(items)  # once the topic and queue are valid
        dedup = self._dedup if flags & _IDEMPOTENT else None
        keys: tuple[bytes, ...] = ()
        dups: Duplicates | None = None
        wait: bool | None = None  # whether the batch waits for durability (None: read it from the items stored)
        if dedup is not None:
            keys = _keys_of(items, every)
            dups = dedup.lookup(topic, keys)
            if dups is not None:
                wait = _wait_store_msg_ok(items)
                if not dups.new:
                    return await self._answer_duplicates(dups, wait)
                items = [items[i] for i in dups.new]
                keys = tuple(keys[i] for i in dups.new)
        window_topic = topic
        if flags & _PREPARED:
            if self._half_item is None:
                raise MessageIllegalError(f"broker {cfg.broker_name} does not take transactional messages")
            items = [self._half_item(topic, queue_id, req.group, items)]
            topic, queue_id = self._half_topic, 0
        elif cfg.timer_wheel_enable and has_timer(items):  # a byte search; parsed only when a timer may be there
            timed = route_timer_send(topic, queue_id, items, self._clock_ms(), cfg.timer_max_delay_sec)
            if timed is not None:
                topic, queue_id, items = timed
        # The store's append event (HA push, dispatch, put rate) runs inside append_batch.
        result = self._store.append_batch(topic, queue_id, items, born_host=_born_host(request.client),
                                          reconsume_times=reconsume_times)
        if result.status is not PutMessageStatus.PUT_OK:
            self._raise_failure(topic, queue_id, result)
        self._metrics.stored(topic, result.msg_count, result.wrote_bytes)
        fresh = None
        if dedup is not None:
            # Before the wait: a retry that comes meanwhile finds this copy and waits for it too.
            fresh = FirstWrite(keys, reply_queue_id, result.queue_offset, result.physical_offsets, result.end_offset,
                               result.store_timestamp, self._store_host, window_topic, result.committed,
                               result.entry)
            dedup.add(fresh)
        if wait is None:
            wait = _wait_store_msg_ok(items)
        code = await self._durability.wait(result) if wait else ResponseCode.SUCCESS
        self._metrics.count_request(code, pull=False)
        if dups is not None:
            return Response(_reply(int(code), dups.placements(fresh), self._store_host))
        return Response(encode_send_reply(int(code), reply_queue_id, result.queue_offset, self._store_host,
                                          result.physical_offsets))

    async def _answer_duplicates(self, dups: Duplicates, wait: bool) -> Response:
        """Every message of the batch was stored before: answer with the first copies, once the latest of them
        is as durable as the mode asks (what its own send waited for)."""
        first = dups.latest()
        assert first is not None
        code = await self._wait_first(first) if wait else ResponseCode.SUCCESS
        self._metrics.count_request(code, pull=False)
        hosts = {v[0].store_host for v in dups.verdicts if type(v) is tuple}
        return Response(_reply(int(code), dups.placements(None), hosts.pop() if len(hosts) == 1 else self._store_host))

    async def _wait_first(self, first: FirstWrite) -> ResponseCode:
        """The durability wait of a first copy: its end (classic), or its entry's commit (DLedger). A commit future
        that failed (the quorum wait timed out) is checked against the log: the entry may have committed since."""
        fut = first.committed
        if (fut is not None and fut.done() and (fut.cancelled() or fut.exception() is not None)
                and first.entry is not None and self._entry_committed is not None
                and self._entry_committed(first.entry)):
            fut = None
        return await self._durability.wait(AppendResult(PutMessageStatus.PUT_OK, wrote_offset=first.end,
                                                        committed=fut))

    def _maybe_dead_letter(self, topic: str, tc: TopicConfig, queue_id: int, items: list[BatchItem],
                           reconsume_times: int) -> tuple[str, TopicConfig, int, list[BatchItem]]:
        """A batch sent straight to ``%RETRY%<group>`` past its retry limit goes to ``%DLQ%<group>`` (8.3)."""
        group = self._groups.find_or_create(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
        max_times = group.retry_max_times if group is not None else 16
        rerouted = reroute_retry_batch(topic, reconsume_times, items, max_times)
        if rerouted is None:
            return topic, tc, queue_id, items
        dlq, dlq_queue, dlq_items = rerouted
        dlq_tc = self._topics.get(dlq)
        if dlq_tc is None:
            dlq_tc = self._topics.create_retry_topic(dlq, DLQ_QUEUE_NUMS)
            self._request_registration()
        return dlq, dlq_tc, dlq_queue, dlq_items

    def _topic_for_send(self, topic: str, client_queue_nums: int) -> TopicConfig:
        cfg = self._config
        topics = self._topics
        tc = topics.get(topic)
        if tc is not None:
            return tc
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            group = self._groups.find_or_create(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
            if group is not None:
                tc = topics.create_retry_topic(topic, group.retry_queue_nums)
        elif cfg.auto_create_topic_enable:
            tc = topics.create_in_send(topic, client_queue_nums, cfg.default_topic_queue_nums)
        if tc is None:
            raise TopicNotExistError(
                f"topic[{topic}] not exist on broker {cfg.broker_name} ({self._addr}), apply first please! "
                f"(autoCreateTopicEnable={str(cfg.auto_create_topic_enable).lower()})"
            )
        self._request_registration()
        return tc

    def _raise_failure(self, topic: str, queue_id: int, result: AppendResult) -> None:
        where = f"topic {topic} queue {queue_id} on {broker_where(self._config, self._addr, self._role)}"
        remark = f"{result.status.value}: {result.remark or 'store refused the message'} [{where}]"
        cls = _FAILURES.get(result.status, BrokerSystemError)
        self._metrics.count_request(cls.code, pull=False)
        raise cls(remark)
