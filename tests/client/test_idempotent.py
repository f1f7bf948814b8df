"""The idempotent producer's side (issue 38): which failures may have stored a message, how its retries stay in
the group that may hold it (:class:`SendAttempts`), which key a ``Message`` keeps across sends, where a caller's
key goes, and how a reply with each message's own place becomes results. Against the scripted fake cluster and
as tables; the brokers' side is ``tests/broker/test_send_idempotent.py``, whole clusters with kills are
``tests/ha/test_idempotent_failover.py``.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from client import AsyncProducer, Message, MessageQueue, Producer, SendStatus
from client._producer_core import (
    LatencyFaultTolerance,
    QueueSelector,
    SendAttempts,
    group_for_key,
    may_be_stored,
)
from client._requests import map_transport_error, send_results
from client._routing import TopicPublishInfo
from client._transaction import _TransactionCore
from client.errors import (
    BrokerNotFoundError,
    ClientError,
    MessageIllegalError,
    ProtocolViolationError,
    SendFailedError,
    ServiceNotAvailableError,
    SystemBusyError,
)
from common import codec, wire
from common.codes import SysFlag
from common.message import keep_for_resend, resend_state
from common.properties import UNIQ_KEY, decode_properties
from common.route import QueueData, TopicRouteData

A, B = "a0:1", "b0:1"
GROUPS = {"broker-a": {0: A}, "broker-b": {0: B}}
IDEM = int(SysFlag.IDEMPOTENT)


def refused() -> ClientError:
    return map_transport_error(httpx.ConnectError("refused"), A, "send")


def reset() -> ClientError:
    return map_transport_error(httpx.RemoteProtocolError("server disconnected"), A, "send")


@pytest.mark.parametrize(("err", "stored"), [
    (refused(), False),                                                   # no connection: nothing left
    (map_transport_error(httpx.ConnectTimeout("slow"), A, "send"), False),
    (map_transport_error(httpx.PoolTimeout("busy"), A, "send"), False),
    (reset(), True),                                                      # the request may have arrived
    (map_transport_error(httpx.ReadTimeout("no answer"), A, "send"), True),
    (ProtocolViolationError("garbled"), True),                            # an answer we cannot read
    (SystemBusyError("quorum wait timed out"), True),                     # answered after the append
    (ServiceNotAvailableError("stepped down", broker_role="SLAVE"), True),
    (ServiceNotAvailableError("disk full", broker_role="SYNC_MASTER"), False),   # refused before the store
    (MessageIllegalError("too big"), False),
    (BrokerNotFoundError("no address"), False),
])
def test_which_failures_may_have_stored_the_message(err: ClientError, stored: bool) -> None:
    assert may_be_stored(err) is stored


def info(*groups: str, masterless: tuple[str, ...] = ()) -> TopicPublishInfo:
    """Two queues per group; ``masterless`` groups are in the route without a writable queue for now."""
    qds = tuple(QueueData(g, 2, 2, 6) for g in sorted((*groups, *masterless)))
    return TopicPublishInfo("T", tuple(MessageQueue("T", g, q) for g in sorted(groups) for q in range(2)),
                            TopicRouteData(qds, ()))


def attempts(*groups: str, idempotent: bool = True, pinned: str | None = None, retries: int = 2,
             masterless: tuple[str, ...] = ()) -> SendAttempts:
    return SendAttempts(info(*groups, masterless=masterless), None, 1e9, group="pg", retries=retries,
                        selector=QueueSelector(start_index=0), fault=LatencyFaultTolerance(), await_master=True,
                        idempotent=idempotent, pinned=pinned, clock=lambda: 100.0)


def timeout() -> ClientError:
    return map_transport_error(httpx.ReadTimeout("no answer"), A, "send")


@pytest.mark.parametrize(("idempotent", "first_error", "next_group", "awaiting"), [
    (True, timeout(), "broker-a", None),                  # may be stored in a: the retry stays
    (True, SystemBusyError("busy"), "broker-a", None),
    (True, reset(), None, "broker-a"),                    # a's master may be gone: wait for a's next one
    (True, refused(), "broker-b", None),                  # never left: another group, as RocketMQ
    (False, timeout(), "broker-b", None),                 # not idempotent: another group, as RocketMQ
    (False, reset(), "broker-b", None),
    (False, SystemBusyError("busy"), "broker-b", None),
])
def test_a_retry_stays_in_the_group_that_may_hold_the_message(
        idempotent: bool, first_error: ClientError, next_group: str | None, awaiting: str | None) -> None:
    run = attempts("broker-a", "broker-b", idempotent=idempotent)
    step = run.next()
    assert step is not None and step[0].broker_name == "broker-a"
    assert run.failed(step[0], first_error) is (next_group is not None)
    assert run.awaiting == awaiting
    assert run.pinned == ("broker-a" if idempotent and may_be_stored(first_error) else None)
    if next_group is not None:
        step = run.next()
        assert step is not None and step[0].broker_name == next_group


def test_a_pinned_send_waits_for_its_groups_new_master_though_another_group_is_up() -> None:
    run = attempts("broker-a", "broker-b")
    step = run.next()
    assert step is not None and run.failed(step[0], timeout()) is True and run.pinned == "broker-a"
    step = run.next()
    assert step is not None and step[0].broker_name == "broker-a"
    assert run.failed(step[0], refused()) is False and run.awaiting == "broker-a"  # b is up; a is waited for
    assert run.route_read({"broker-a": "a1:1", "broker-b": B}.get, None).value == "retry"
    step = run.next()
    assert step is not None and step[0].broker_name == "broker-a"


def test_a_send_pinned_from_the_start_goes_to_its_group_or_waits_for_it() -> None:
    run = attempts("broker-a", "broker-b", pinned="broker-b")
    for _ in range(2):
        step = run.next()
        assert step is not None and step[0].broker_name == "broker-b"
        run.failed(step[0], SystemBusyError("busy"))
    run = attempts("broker-a", pinned="broker-b", masterless=("broker-b",))  # b has no master in the route now
    assert run.next() is None and run.awaiting == "broker-b"
    assert run.route_read({"broker-b": "b1:1"}.get, info("broker-a", "broker-b")).value == "retry"
    step = run.next()
    assert step is not None and step[0].broker_name == "broker-b"


def test_a_callers_key_has_one_group_whatever_the_masters() -> None:
    both, a_only = info("broker-a", "broker-b"), info("broker-a", masterless=("broker-b",))
    keys = [f"q1:batch7:part{p}:row{r}" for p in range(4) for r in range(50)]
    groups = [group_for_key(both, k) for k in keys]
    assert groups == [group_for_key(a_only, k) for k in keys]  # b's master down: its keys still go to b
    assert 60 < groups.count("broker-a") < 140  # spread over the groups
    assert group_for_key(info(), "k") is None


def test_a_reply_with_each_messages_place_gives_each_its_own_result() -> None:
    host = codec.pack_host("127.0.0.1", 10911)
    reply = wire.decode_send_reply(wire.encode_send_reply(0, 1, 40, host, [900, 100, 1000], [1, 40, 0, 7, 1, 41]))
    mq = MessageQueue("T", "broker-a", 1)
    rs = send_results(reply, mq, ["k1", "k2", "k3"])
    assert [(r.message_queue.queue_id, r.queue_offset, r.msg_id) for r in rs] == [(1, 40, "k1"), (0, 7, "k2"),
                                                                                  (1, 41, "k3")]
    assert rs[1].offset_msg_id == codec.create_offset_msg_id(host, 100)


# --- the producer over the scripted fake cluster --------------------------------------------------------------

def sent_keys(fake, addr: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for req in fake.sends(addr):
        items = codec.decode_batch(req.content)
        assert all(it.sys_flag & IDEM for it in items)
        out += [decode_properties(it.properties)[UNIQ_KEY] for it in items]
    return out


@pytest.fixture
def topic(fake):  # type: ignore[no-untyped-def]
    fake.add_topic("T", GROUPS)
    fake.instance()
    return fake


def test_a_message_keeps_its_key_and_group_until_a_send_of_it_ends_in_send_ok(topic) -> None:  # type: ignore[no-untyped-def]
    fake = topic
    msg = Message("T", b"x")
    with Producer("pg", fake.namesrv, start_index=0, send_timeout_s=2.0, retry_times_when_send_failed=1) as p:
        fake.script[A] = ["timeout", "timeout"]  # a's answers are lost: the message may be there
        with pytest.raises(SendFailedError):
            p.send(msg)
        assert len(fake.sends(A)) == 2 and fake.sends(B) == []  # the retry stayed in a
        key, group = resend_state(msg)  # type: ignore[misc]
        assert group == "broker-a" and sent_keys(fake) == [key, key]
        r = p.send(msg)  # the application sends it again: same key, same group
        assert (r.msg_id, r.message_queue.broker_name, r.send_status) == (key, "broker-a", SendStatus.SEND_OK)
        assert resend_state(msg) is None
        again = p.send(msg)  # acknowledged: the next send of the object is a new message
        assert again.msg_id != key
        batch = [Message("T", b"m%d" % i) for i in range(3)]
        fake.script[A] = ["timeout", "timeout"]
        fake.script[B] = ["timeout", "timeout"]
        with pytest.raises(SendFailedError):
            p.send_batch(batch)
        held = [resend_state(m) for m in batch]
        assert all(h is not None and h[1] == held[0][1] for h in held)  # type: ignore[index]
        rs = p.send_batch(batch)
        assert [r.msg_id for r in rs] == [h[0] for h in held]  # type: ignore[index]
        assert {r.message_queue.broker_name for r in rs} == {held[0][1]}  # type: ignore[index]


def test_a_message_sent_many_times_and_acknowledged_is_many_messages(topic) -> None:  # type: ignore[no-untyped-def]
    template = Message("T", b"same body")
    with Producer("pg", topic.namesrv) as p:
        assert len({p.send(template).msg_id for _ in range(5)}) == 5


def test_without_idempotence_a_resend_is_a_new_message(topic) -> None:  # type: ignore[no-untyped-def]
    fake = topic
    msg = Message("T", b"x")
    with Producer("pg", fake.namesrv, start_index=0, idempotent=False, retry_times_when_send_failed=0) as p:
        fake.script[A] = ["timeout"]
        with pytest.raises(SendFailedError):
            p.send(msg)
        r = p.send(msg)
    items = [codec.decode_batch(s.content)[0] for s in fake.sends()]
    assert not any(it.sys_flag & IDEM for it in items) and resend_state(msg) is None
    assert decode_properties(items[0].properties)[UNIQ_KEY] != r.msg_id


def test_a_callers_key_goes_to_its_group_from_any_producer(topic) -> None:  # type: ignore[no-untyped-def]
    fake = topic
    keys = [f"q:b:p:r{i}" for i in range(8)]
    routed = []
    for start in (0, 1):  # two producers with other round-robin positions
        with Producer("pg", fake.namesrv, start_index=start) as p:
            routed.append([p.send(Message("T", b"x", uniq_key=k)).message_queue.broker_name for k in keys])
    assert routed[0] == routed[1] and len(set(routed[0])) == 2
    assert sent_keys(fake) == keys + keys


def test_the_async_producer_keeps_the_key_too(fake, async_fake_instance) -> None:  # type: ignore[no-untyped-def]
    fake.add_topic("T", GROUPS)
    msg = Message("T", b"x")

    async def main() -> None:
        inst = async_fake_instance(fake)
        async with AsyncProducer("pg", fake.namesrv, start_index=0, send_timeout_s=2.0,
                                 retry_times_when_send_failed=0) as p:
            fake.script[A] = ["timeout"]
            with pytest.raises(SendFailedError):
                await p.send(msg)
            key = resend_state(msg)[0]  # type: ignore[index]
            assert (await p.send(msg)).msg_id == key and resend_state(msg) is None
        await inst.release()

    asyncio.run(main())


def test_a_half_message_is_sent_idempotent_under_its_kept_key() -> None:
    core = _TransactionCore("pg", _Listener(), (), send_timeout_s=1.0, retries=0, check_poll_s=1.0,
                            max_message_size=1 << 20)
    msg = Message("T", b"txn")
    body, key, pin, _ = core._half_body(msg)
    (item,) = codec.decode_batch(body)
    assert item.sys_flag & IDEM and item.sys_flag & int(SysFlag.TRANSACTION_PREPARED) and pin is None
    keep_for_resend(msg, key, "broker-b")
    assert core._half_body(msg)[1:3] == (key, "broker-b")
    plain = _TransactionCore("pg", _Listener(), (), send_timeout_s=1.0, retries=0, check_poll_s=1.0,
                             max_message_size=1 << 20, idempotent=False)
    assert not codec.decode_batch(plain._half_body(msg)[0])[0].sys_flag & IDEM
    assert plain._half_body(Message("T", b"y", uniq_key="tx-1"))[1] == "tx-1"


class _Listener:
    def execute_local_transaction(self, msg: object, arg: object) -> None: ...

    def check_local_transaction(self, msg: object) -> None: ...
