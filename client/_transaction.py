"""``TransactionProducer`` and ``AsyncTransactionProducer``: RocketMQ's transactional (two-phase) messages.

``send_message_in_transaction(msg, arg)``:

1. sends ``msg`` as a *half* message (SYSFLAG ``TRANSACTION_PREPARED``, ``TRAN_MSG=true``, ``PGROUP``), which the
   broker keeps in ``RMQ_SYS_TRANS_HALF_TOPIC``, invisible to consumers;
2. runs the listener's ``execute_local_transaction(msg, arg)`` (an exception counts as ``UNKNOW``, as in
   RocketMQ);
3. on ``COMMIT_MESSAGE`` / ``ROLLBACK_MESSAGE`` sends ``POST /transaction/end`` to the master that stored the
   half message; on ``UNKNOW`` sends nothing and the broker checks back later. A failed end is logged, not
   raised: the broker's check resolves the transaction.

Check-backs. The broker cannot call a producer over HTTP, so each producer polls every master of the routes it
knows (its ``topics`` and the topics it sent to) with ``GET /transaction/checks`` (a long poll, held by the
broker until a check comes or ``check_poll_s`` passes), runs ``check_local_transaction(msg)`` for each check, and
answers a decided one with the same end request flagged ``fromTransactionCheck``. Any producer of the group may
answer: a producer that dies mid-transaction is covered by another of its group (give it the topics in
``topics`` so it polls those brokers from its start). The sync producer polls from one daemon thread per
master; the async one from one task per master; both stop at close.

The operations (prepare, end, poll, answer) and every decision -- what ends a transaction, what answers a check
(``UNKNOW``: nothing, so the broker checks again) -- are written once on :class:`_TransactionCore`, as
:data:`client._requests.Op` generators; the two classes run them, call the listener (awaiting a coroutine
listener on the async side) and keep their pollers alive, threads or tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from client import _requests as rq
from client._instance import ClientConfig
from client._producer_core import SendWhere, group_for_key, validate_message
from client._requests import Answer, Op, call_op
from client.lowlevel import AsyncBrokerClient, BrokerClient
from common import codec
from common.codes import SendStatus, SysFlag
from common.errors import ClientClosedError, ClientError, MessageIllegalError, ProtocolViolationError
from common.message import Message, MessageExt, MessageQueue, forget_resend, keep_for_resend, resend_state
from common.properties import PGROUP, TRAN_MSG, validate_group
from common.signing import Credentials
from common.transaction import (
    CHECKS_PATH,
    MAX_CHECKS_PER_POLL,
    EndTransactionRequest,
    TransactionCheck,
    TransactionResolution,
)

__all__ = [
    "AsyncTransactionProducer",
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

log = logging.getLogger(__name__)

#: Pause after a failed check poll before the next one to the same broker (no busy loop on a dead broker).
POLL_RETRY_S = 1.0
#: How often the set of masters to poll is read again from the route cache.
MASTERS_REFRESH_S = 2.0
#: How long ``TransactionProducer.close`` waits for its threads (a poll held by a broker is left to end itself).
CLOSE_WAIT_S = 0.5


class LocalTransactionState(enum.Enum):
    """The outcome of a local transaction (RocketMQ's names, ``UNKNOW`` included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_RESOLUTION = {LocalTransactionState.COMMIT_MESSAGE: TransactionResolution.COMMIT,
               LocalTransactionState.ROLLBACK_MESSAGE: TransactionResolution.ROLLBACK}


class TransactionListener(Protocol):
    """The two callbacks of a transaction producer (RocketMQ's ``TransactionListener``). With
    :class:`AsyncTransactionProducer` either may be a coroutine function."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction of ``msg`` (its half message is stored) and say how it ended."""
        ...

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """The broker asks again about a transaction left ``UNKNOW`` (or whose end was lost)."""
        ...


@attrs.frozen
class TransactionSendResult:
    """What ``send_message_in_transaction`` did (RocketMQ's ``TransactionSendResult``)."""

    send_status: SendStatus
    """How the half message was stored."""
    msg_id: str
    """The message's unique id (``UNIQ_KEY``), which the committed message keeps."""
    message_queue: MessageQueue
    """The queue the message goes to once committed."""
    queue_offset: int
    """The half message's offset in ``RMQ_SYS_TRANS_HALF_TOPIC``."""
    offset_msg_id: str
    """The half message's broker msgId (store host + commit-log offset)."""
    transaction_id: str
    """The transaction's id (the same as ``msg_id``)."""
    local_transaction_state: LocalTransactionState
    """What ``execute_local_transaction`` returned (``UNKNOW`` when it raised)."""


def _as_state(value: object, what: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    log.error("%s returned %r, not a LocalTransactionState; taken as UNKNOW", what, value)
    return LocalTransactionState.UNKNOW


def _parse_checks(resp: Answer, addr: str) -> list[TransactionCheck]:
    obj = rq.json_of(resp, addr)
    entries = obj.get("checks")
    if not isinstance(entries, list):
        raise ProtocolViolationError(f"{addr} answered a check poll without a checks list", broker_addr=addr)
    try:
        return [TransactionCheck.from_json(e) for e in entries[:MAX_CHECKS_PER_POLL]]
    except ValueError as e:
        raise ProtocolViolationError(f"{addr}: {e}", broker_addr=addr) from None


def check_message(check: TransactionCheck) -> MessageExt:
    """The message a check asks about, as the listener sees it: its real topic and queue.

    Raises:
        ProtocolViolationError: the record does not decode.
    """
    try:
        msg = codec.decode_records(check.record)[0]
    except IndexError:
        raise ProtocolViolationError(f"transaction check {check.transaction_id} carries no record") from None
    return attrs.evolve(msg, topic=check.topic, queue_id=check.queue_id)


class _TransactionCore:
    """State and operations shared by both producers (no I/O)."""

    def __init__(self, group: str, listener: TransactionListener, topics: Iterable[str], *, send_timeout_s: float,
                 retries: int, check_poll_s: float, max_message_size: int, idempotent: bool = True) -> None:
        validate_group(group)
        if check_poll_s <= 0 or send_timeout_s <= 0 or retries < 0:
            raise ValueError("check_poll_s and send_timeout_s must be > 0, retries >= 0")
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(listener, name, None)):
                raise TypeError(f"the transaction listener has no {name}() method")
        self._group = group
        self._listener = listener
        self._topics: set[str] = set(topics)
        self._send_timeout_s = send_timeout_s
        self._retries = retries
        self._check_poll_s = check_poll_s
        self._max_message_size = max_message_size
        self._idempotent = idempotent
        self._uniq = codec.UniqKeyGenerator()
        self.answered_checks = 0
        """Checks answered with COMMIT or ROLLBACK since start."""

    @property
    def group(self) -> str:
        return self._group

    def _half_body(self, msg: Message) -> tuple[bytes, str, str | None, Message]:
        """The half message's send body, its key (the transaction id) and the group its send is pinned to (an
        idempotent re-send of ``msg``: the key and group of its last send that did not end in SEND_OK)."""
        msg = validate_message(msg, self._max_message_size)
        if msg.delay_level:
            raise MessageIllegalError(f"a transactional message to topic {msg.topic} cannot have a delay level "
                                      f"({msg.delay_level})")
        state = resend_state(msg) if self._idempotent else None
        uniq, pin = state if state is not None else (msg.uniq_key or self._uniq.next(), None)
        half = attrs.evolve(msg, properties={**msg.properties, TRAN_MSG: "true", PGROUP: self._group})
        flag = int(SysFlag.TRANSACTION_PREPARED) | (int(SysFlag.IDEMPOTENT) if self._idempotent else 0)
        body = codec.encode_batch([half], born_timestamp_ms=int(time.time() * 1000), uniq_keys=[uniq],
                                  max_message_size=self._max_message_size, sys_flag=flag)
        return body, uniq, pin, msg

    def prepare_op(self, low: BrokerClient | AsyncBrokerClient, msg: Message
                   ) -> Op[tuple[TransactionSendResult, str]]:
        """Store the half message; returns the result (state UNKNOW until the local transaction ran) and the
        address of the master that stored it. Idempotent: a half message sent again (the same ``Message`` after a
        send that did not end in SEND_OK, or the same ``uniq_key``) is stored once; its result is the first's."""
        body, uniq, pin, msg = self._half_body(msg)
        self._topics.add(msg.topic)
        if self._idempotent and pin is None and msg.uniq_key is not None:
            pin = group_for_key((yield from low._publish_info_op(msg.topic, False)), msg.uniq_key)
        where = SendWhere()
        try:
            raw = yield from low._send_op(msg.topic, body, 1, self._group, None, self._send_timeout_s,
                                          self._retries, self._idempotent, pin, where)
        except Exception:
            if self._idempotent:
                keep_for_resend(msg, uniq, where.group or pin)
            raise
        reply = raw.reply
        if self._idempotent:
            if reply.code == 0:
                forget_resend(msg, uniq)
            else:
                keep_for_resend(msg, uniq, raw.message_queue.broker_name)
        addr = low.routes.find_broker_address_in_publish(raw.message_queue.broker_name) or ""
        offset_msg_id = codec.create_offset_msg_id(reply.store_host, reply.commit_log_offsets[0])
        result = TransactionSendResult(SendStatus.from_code(reply.code), uniq, raw.message_queue,
                                       reply.queue_offset, offset_msg_id, uniq, LocalTransactionState.UNKNOW)
        return result, addr

    def end_request(self, result: TransactionSendResult, state: LocalTransactionState
                    ) -> EndTransactionRequest | None:
        resolution = _RESOLUTION.get(state)
        if resolution is None:
            return None
        _, commit_log_offset = codec.decode_offset_msg_id(result.offset_msg_id)
        return EndTransactionRequest(self._group, result.message_queue.topic, result.transaction_id,
                                     commit_log_offset, resolution)

    @staticmethod
    def end_op(addr: str, req: EndTransactionRequest) -> Op[dict[str, Any]]:
        return (yield from call_op("POST", addr, req.target(), f"end of transaction {req.transaction_id} at {addr}",
                                   rq.json_of))

    def masters_op(self, low: BrokerClient | AsyncBrokerClient) -> Op[list[str]]:
        """The masters of the known routes (routes of ``topics`` are fetched first, when stale); a route that
        cannot be read leaves its masters out this time."""
        for topic in sorted(self._topics):
            try:
                yield from low._fetch_op(topic, False)
            except ClientError as e:
                log.debug("route of %s for transaction checks: %s", topic, e)
        return sorted({addr for _, broker_id, addr in low.routes.all_broker_addrs(include_slaves=False)
                       if broker_id == 0})

    def poll_op(self, addr: str, client_id: str) -> Op[list[TransactionCheck]]:
        hold_ms = int(self._check_poll_s * 1000)
        target = (f"{CHECKS_PATH}?group={rq.q(self._group)}&clientId={rq.q(client_id)}"
                  f"&maxNums={MAX_CHECKS_PER_POLL}&timeoutMs={hold_ms}")
        return (yield from call_op("GET", addr, target, f"transaction check poll of {self._group} at {addr}",
                                   _parse_checks, timeout=self._check_poll_s + 5.0))

    def settle_op(self, addr: str, result: TransactionSendResult, state: LocalTransactionState
                  ) -> Op[TransactionSendResult]:
        """End the transaction of ``result`` (stored by ``addr``) as its local transaction decided: COMMIT or
        ROLLBACK; ``UNKNOW`` sends nothing and the broker checks back. A failed end is logged, not raised: the
        broker's check resolves the transaction.

        Returns:
            ``result`` with its local transaction's state.
        """
        result = attrs.evolve(result, local_transaction_state=state)
        req = self.end_request(result, state)
        if req is not None:
            try:
                yield from self.end_op(addr, req)
            except ClientError as e:
                log.warning("end (%s) of transaction %s failed; the broker will check back: %s",
                            req.resolution.value, result.transaction_id, e)
        return result

    def answer(self, check: TransactionCheck, state: LocalTransactionState) -> EndTransactionRequest | None:
        """The end request answering ``check`` with ``state``; None for ``UNKNOW``: the transaction stays open and
        the broker checks it again later (a ROLLBACK here would lose a message the application may still
        commit)."""
        resolution = _RESOLUTION.get(state)
        if resolution is None:
            log.info("transaction %s of group %s still UNKNOW at check %d", check.transaction_id, self._group,
                     check.check_times)
            return None
        return EndTransactionRequest(self._group, check.topic, check.transaction_id, check.commit_log_offset,
                                     resolution, from_check=True)

    def answer_op(self, addr: str, check: TransactionCheck, state: LocalTransactionState) -> Op[None]:
        """Answer ``check`` (handed out by ``addr``) as the listener decided (see :meth:`answer`); a failed answer
        is logged: the broker checks again."""
        req = self.answer(check, state)
        if req is None:
            return
        try:
            yield from self.end_op(addr, req)
            self.answered_checks += 1
        except ClientError as e:
            log.warning("answer (%s) to the check of %s failed: %s", req.resolution.value, check.transaction_id, e)


class _ProducerShell:
    """What both transaction producers read from their core."""

    _core: _TransactionCore

    @property
    def group(self) -> str:
        """The producer group."""
        return self._core.group

    @property
    def answered_checks(self) -> int:
        """Checks this producer answered with COMMIT or ROLLBACK."""
        return self._core.answered_checks


class TransactionProducer(_ProducerShell):
    """Sends transactional messages; answers the brokers' check-backs from background threads.

    Args:
        group: the producer group (every producer of it may answer a check of the group's transactions).
        namesrv_addr: nameservers, ``;``-separated.
        listener: ``execute_local_transaction(msg, arg)`` and ``check_local_transaction(msg)``.
        topics: topics whose masters to poll for checks from the start (the topics sent to are added).
        send_timeout_s / retries: of the half message's send (as ``Producer.send``).
        check_poll_s: how long a broker holds a check poll with nothing to hand out.
        client_config: timeouts and connection bounds of the SDK's HTTP client.
        credentials: with the ACL on, the account that signs every request (PUB on the topics, and on the
            producer group for the check polls).
        idempotent: a half message sent again is stored once (as ``Producer(idempotent=True)``; its retries
            stay in the group that may hold it, without waiting for a new master there).
    """

    def __init__(self, group: str, namesrv_addr: str, listener: TransactionListener, *, topics: Iterable[str] = (),
                 send_timeout_s: float = 3.0, retries: int = 2, check_poll_s: float = 5.0,
                 max_message_size: int = codec.DEFAULT_MAX_MESSAGE_SIZE,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 idempotent: bool = True) -> None:
        self._core = _TransactionCore(group, listener, topics, send_timeout_s=send_timeout_s, retries=retries,
                                      check_poll_s=check_poll_s, max_message_size=max_message_size,
                                      idempotent=idempotent)
        self._listener = listener
        self._low = BrokerClient(namesrv_addr, config=client_config, credentials=credentials)
        self._client_id = f"{self._low._inst.client_id}@{group}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pollers: dict[str, threading.Thread] = {}
        self._started = False
        self._closed = False
        self._supervisor: threading.Thread | None = None

    def start(self) -> TransactionProducer:
        """Start polling for checks (``send_message_in_transaction`` starts it too). Idempotent until close.

        Raises:
            ClientClosedError: the producer is closed.
        """
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"transaction producer {self.group} is closed")
            if not self._started:
                self._started = True
                self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                                    name=f"splitmq-txn-{self.group}")
                self._supervisor.start()
        return self

    def __enter__(self) -> TransactionProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pollers and close the connections, within ``CLOSE_WAIT_S``. Idempotent.

        A poll held by a broker is not interrupted: its daemon thread ends when the poll returns (within
        ``check_poll_s``), answering nothing it got (the broker checks those again next round).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        threads = [t for t in (self._supervisor, *self._pollers.values()) if t is not None]
        deadline = time.monotonic() + CLOSE_WAIT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._low.close()

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Store ``msg`` as a half message, run the local transaction, end it (see the module docstring).

        Returns:
            The half message's result and the local transaction's state.

        Raises:
            MessageIllegalError: the message is not valid (a delay level included).
            SendFailedError / BrokerError: the half message could not be stored (the local transaction did not run).
            ClientClosedError: the producer is closed.
        """
        self.start()
        inst = self._low._inst
        result, addr = inst.drive(self._core.prepare_op(self._low, msg))
        state = self._local_state("execute_local_transaction", result.transaction_id,
                                  lambda: self._listener.execute_local_transaction(msg, arg))
        return inst.drive(self._core.settle_op(addr, result, state))

    def _call(self, call: Callable[[], object]) -> object:
        return call()

    def _local_state(self, what: str, transaction_id: str, call: Callable[[], object]) -> LocalTransactionState:
        """What the listener's ``what`` decided; UNKNOW when it raised (as RocketMQ) or answered no state."""
        try:
            return _as_state(self._call(call), what)
        except Exception:
            log.exception("%s of %s raised; its state is UNKNOW (the broker checks back)", what, transaction_id)
            return LocalTransactionState.UNKNOW

    # --- check-backs ---

    def _supervise(self) -> None:
        while not self._stop.is_set():
            self._start_pollers(self._low._inst.drive(self._core.masters_op(self._low)))
            self._pause(MASTERS_REFRESH_S)

    def _start_pollers(self, masters: list[str]) -> None:
        """A poller for each of ``masters`` that has none running."""
        with self._lock:
            if self._closed:
                return
            for addr in masters:
                t = self._pollers.get(addr)
                if t is None or not t.is_alive():
                    t = self._pollers[addr] = threading.Thread(target=self._poll, args=(addr,), daemon=True,
                                                                name=f"splitmq-txn-{self.group}-{addr}")
                    t.start()

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when the producer closes; True when it did."""
        return self._stop.wait(seconds)

    def _poll(self, addr: str) -> None:
        core, inst = self._core, self._low._inst
        while not self._stop.is_set():
            try:
                checks = inst.drive(core.poll_op(addr, self._client_id))
            except ClientClosedError:
                return
            except Exception as e:  # a broker down, or a bug: never end the poller silently or spin
                log.debug("transaction check poll at %s failed: %s", addr, e, exc_info=not isinstance(e, ClientError))
                if self._pause(POLL_RETRY_S):
                    return
                continue
            for check in checks:
                if self._stop.is_set():
                    return
                self._answer(addr, check)

    def _answer(self, addr: str, check: TransactionCheck) -> None:
        state = self._local_state("check_local_transaction", check.transaction_id,
                                  lambda: self._listener.check_local_transaction(check_message(check)))
        self._low._inst.drive(self._core.answer_op(addr, check, state))


class AsyncTransactionProducer(_ProducerShell):
    """The asyncio twin of :class:`TransactionProducer` (same arguments; the listener's methods may be
    coroutine functions; ``async with``; ``aclose``). Use it on one event loop."""

    def __init__(self, group: str, namesrv_addr: str, listener: TransactionListener, *, topics: Iterable[str] = (),
                 send_timeout_s: float = 3.0, retries: int = 2, check_poll_s: float = 5.0,
                 max_message_size: int = codec.DEFAULT_MAX_MESSAGE_SIZE,
                 client_config: ClientConfig | None = None, credentials: Credentials | None = None,
                 idempotent: bool = True) -> None:
        self._core = _TransactionCore(group, listener, topics, send_timeout_s=send_timeout_s, retries=retries,
                                      check_poll_s=check_poll_s, max_message_size=max_message_size,
                                      idempotent=idempotent)
        self._listener = listener
        self._low = AsyncBrokerClient(namesrv_addr, config=client_config, credentials=credentials)
        self._client_id = f"{self._low._inst.client_id}@{group}"
        self._stop = asyncio.Event()
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> AsyncTransactionProducer:
        """See :meth:`TransactionProducer.start`."""
        if self._closed:
            raise ClientClosedError(f"transaction producer {self.group} is closed")
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise(),
                                                                       name=f"splitmq-txn-{self.group}")
        return self

    async def __aenter__(self) -> AsyncTransactionProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel the pollers and close the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        tasks = [t for t in (self._supervisor, *self._pollers.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._low.aclose()

    async def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """See :meth:`TransactionProducer.send_message_in_transaction`."""
        await self.start()
        inst = self._low._inst
        result, addr = await inst.drive(self._core.prepare_op(self._low, msg))
        state = await self._local_state("execute_local_transaction", result.transaction_id,
                                        lambda: self._listener.execute_local_transaction(msg, arg))
        return await inst.drive(self._core.settle_op(addr, result, state))

    async def _call(self, call: Callable[[], object]) -> object:
        value = call()
        return await value if inspect.isawaitable(value) else value

    async def _local_state(self, what: str, transaction_id: str, call: Callable[[], object]
                           ) -> LocalTransactionState:
        """See :meth:`TransactionProducer._local_state`."""
        try:
            return _as_state(await self._call(call), what)
        except Exception:
            log.exception("%s of %s raised; its state is UNKNOW (the broker checks back)", what, transaction_id)
            return LocalTransactionState.UNKNOW

    # --- check-backs ---

    async def _supervise(self) -> None:
        while not self._stop.is_set():
            self._start_pollers(await self._low._inst.drive(self._core.masters_op(self._low)))
            await self._pause(MASTERS_REFRESH_S)

    def _start_pollers(self, masters: list[str]) -> None:
        """See :meth:`TransactionProducer._start_pollers`."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        for addr in masters:
            t = self._pollers.get(addr)
            if t is None or t.done():
                self._pollers[addr] = loop.create_task(self._poll(addr), name=f"splitmq-txn-{self.group}-{addr}")

    async def _pause(self, seconds: float) -> bool:
        """See :meth:`TransactionProducer._pause`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def _poll(self, addr: str) -> None:
        core, inst = self._core, self._low._inst
        while not self._stop.is_set():
            try:
                checks = await inst.drive(core.poll_op(addr, self._client_id))
            except ClientClosedError:
                return
            except Exception as e:  # a broker down, or a bug: never end the poller silently or spin
                log.debug("transaction check poll at %s failed: %s", addr, e, exc_info=not isinstance(e, ClientError))
                if await self._pause(POLL_RETRY_S):
                    return
                continue
            for check in checks:
                if self._stop.is_set():
                    return
                await self._answer(addr, check)

    async def _answer(self, addr: str, check: TransactionCheck) -> None:
        state = await self._local_state("check_local_transaction", check.transaction_id,
                                        lambda: self._listener.check_local_transaction(check_message(check)))
        await self._low._inst.drive(self._core.answer_op(addr, check, state))
