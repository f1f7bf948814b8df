"""The producer rides through a change of its broker group's master (issue 12 item 4).

When an attempt finds no master at the address it tried (a follower's SERVICE_NOT_AVAILABLE as SLAVE, a refused
or reset connection, no master in the route) and no other group can take the message, the send reads the route
until a new master registers and sends there, within ``send_timeout_s``; at the deadline it fails naming the
group. The decision is table-tested on :class:`SendAttempts` with an injected clock; the producers are tested
against real processes: a nameserver and a master that is SIGKILLed while sends are under way, and a new master
of the same group started on another port (with its own store) as a leader elected elsewhere would be.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from client import AsyncProducer, Message, Producer, PullConsumer, PullStatus, SendResult, SendStatus
from client._producer_core import MASTER_POLL_S, SAME_MASTER_RETRY_S, MasterVerdict, lost_master
from client.cluster import BrokerHandle, LocalCluster
from client.errors import (
    BrokerConnectError,
    BrokerNotFoundError,
    ClientError,
    MessageIllegalError,
    RequestTimeoutError,
    SendFailedError,
    ServiceNotAvailableError,
    SystemBusyError,
)
from client.lowlevel import LatencyFaultTolerance, QueueSelector, SendAttempts, TopicPublishInfo
from common.codec import decode_offset_msg_id
from common.message import MessageQueue
from common.route import TopicRouteData
from tests.ha.support import create_topic, ha_cluster
from tests.waiting import poll_until, wait_until

RETRY, POLL, GIVE_UP = MasterVerdict.RETRY, MasterVerdict.POLL, MasterVerdict.GIVE_UP


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _info(*groups: str) -> TopicPublishInfo:
    return TopicPublishInfo("T", tuple(MessageQueue("T", g, q) for g in groups for q in range(2)),
                            TopicRouteData((), ()))


def _run(*groups: str, clock: Clock, timeout_s: float = 10.0, retries: int = 2, await_master: bool = True,
         fixed: MessageQueue | None = None) -> SendAttempts:
    return SendAttempts(_info(*groups), fixed, clock.now + timeout_s, group="pg", retries=retries,
                        selector=QueueSelector(start_index=0), fault=LatencyFaultTolerance(), clock=clock,
                        await_master=await_master, rand=lambda: 0.5)


def _gone(addr: str) -> BrokerConnectError:
    return BrokerConnectError("send at master: ConnectError: refused", broker_addr=addr)


def _as(role: str | None, addr: str = "a0:1") -> ServiceNotAvailableError:
    return ServiceNotAvailableError("not writeable", broker_addr=addr, broker_role=role)


@pytest.mark.parametrize(("err", "lost"), [
    (_gone("a0:1"), True),                                  # refused, reset: the master's process is gone
    (BrokerNotFoundError("The broker[a] not exist"), True),  # no master address in the route at all
    (_as("SLAVE"), True),                                   # a follower, or a leader that stepped down
    (_as("SYNC_MASTER"), False),                            # a master whose store is not writeable
    (_as(None), False),                                     # disk full, role unknown
    (RequestTimeoutError("slow", broker_addr="a0:1"), False),  # reached, maybe only slow; deadline used
    (SystemBusyError("busy"), False),
    (MessageIllegalError("bad"), False),
])
def test_which_failures_mean_the_master_is_lost(err: ClientError, lost: bool) -> None:
    assert lost_master(err) is lost


@pytest.mark.parametrize(("groups", "fails", "await_master", "fixed", "retry_next", "awaiting"), [
    # a lone group whose master is gone: stop the attempts and wait for a new master
    (("a",), [("a", _gone("a0:1"))], True, False, False, "a"),
    (("a",), [("a", _as("SLAVE"))], True, False, False, "a"),
    (("a",), [("a", BrokerNotFoundError("The broker[a] not exist"))], True, False, False, "a"),
    # not a lost master: as before (the broker's own error at once; a timeout retried on the same group)
    (("a",), [("a", _as("SYNC_MASTER"))], True, False, False, None),
    (("a",), [("a", RequestTimeoutError("slow"))], True, False, True, None),
    (("a",), [("a", MessageIllegalError("bad"))], True, False, False, None),
    # another group can take it: move there, as before
    (("a", "b"), [("a", _gone("a0:1"))], True, False, True, None),
    (("a", "b"), [("a", _as("SLAVE"))], True, False, True, None),
    # ... unless every other group lost its master too, or is not writeable
    (("a", "b"), [("a", _gone("a0:1")), ("b", _gone("b0:1"))], True, False, False, "b"),
    (("a", "b"), [("b", _as(None, "b0:1")), ("a", _gone("a0:1"))], True, False, False, "a"),
    (("a", "b"), [("a", _gone("a0:1")), ("b", SystemBusyError("busy"))], True, False, True, None),
    # the low-level client does not wait: a refused connection is one more retriable failure
    (("a",), [("a", _gone("a0:1"))], False, False, True, None),
    # an explicit queue never waits (one attempt: the next one is refused by next())
    (("a",), [("a", _gone("a0:1"))], True, True, True, None),
])
def test_which_failures_make_the_send_wait_for_a_new_master(
        groups: tuple[str, ...], fails: list[tuple[str, ClientError]], await_master: bool, fixed: bool,
        retry_next: bool, awaiting: str | None) -> None:
    clock = Clock()
    run = _run(*groups, clock=clock, await_master=await_master,
               fixed=MessageQueue("T", groups[0], 0) if fixed else None)
    verdict = None
    for name, err in fails:
        step = run.next()
        assert step is not None
        verdict = run.failed(MessageQueue("T", name, 0), err)
    assert (verdict, run.awaiting) == (retry_next, awaiting)


def _fail(run: SendAttempts, err: ClientError) -> bool:
    """One attempt failing with ``err``; what :meth:`SendAttempts.failed` says."""
    step = run.next()
    assert step is not None
    return run.failed(step[0], err)


def _wait(run: SendAttempts, err: ClientError, group: str = "a") -> None:
    """One attempt to ``group`` failing with ``err``, which must make the send wait."""
    step = run.next()
    assert step is not None and step[0].broker_name == group
    assert run.failed(step[0], err) is False and run.awaiting == group


@pytest.mark.parametrize(("master", "after_s", "verdict"), [
    ("a1:1", 0.0, RETRY),                          # a new master registered: at once
    (None, 0.0, POLL),                             # the route lists no master (expired, an election on)
    ("a0:1", 0.0, POLL),                           # still the address that failed
    ("a0:1", SAME_MASTER_RETRY_S, POLL),           # ... not yet: the 2 attempts left spread over the 10 s left
    ("a0:1", 10.0 / 3, RETRY),                     # ... tried again after a while (restarted / re-elected)
    ("a1:1", 10.0, RETRY),                         # a change seen at the deadline is still tried
    (None, 10.0, GIVE_UP),                         # the deadline passed with no new master
    ("a0:1", 10.0 - 1e-3, RETRY),
])
def test_what_a_route_read_decides(master: str | None, after_s: float, verdict: MasterVerdict) -> None:
    clock = Clock()
    run = _run("a", clock=clock)
    _wait(run, _gone("a0:1"))
    clock.now += after_s
    assert run.route_read({"a": master}.get, None) is verdict


def test_the_retry_on_a_new_master_does_not_use_the_retry_budget() -> None:
    clock = Clock()
    run = _run("a", clock=clock, retries=0)
    _wait(run, _gone("a0:1"))
    assert run.route_read({"a": "a1:1"}.get, None) is RETRY and run.resuming == ("a", "a1:1")
    step = run.next()  # no retry left, yet the new master is tried
    assert step is not None and step[0].broker_name == "a" and step[1] == pytest.approx(10.0)
    run.succeeded(step[0])
    assert run.next() is None  # and the budget is still spent: nothing else is


def _drive(run: SendAttempts, clock: Clock, master_of: Callable[[str], str | None],
           fail: Callable[[MessageQueue], ClientError]) -> list[tuple[float, str]]:
    """A producer's loop over ``run`` with every attempt failing as ``fail`` says: ``(time, broker)`` of each
    attempt, until the send gives up."""
    made: list[tuple[float, str]] = []
    while True:
        step = run.next()
        if step is None:
            if run.awaiting is None:
                return made
        else:
            made.append((clock.now - 100.0, step[0].broker_name))
            if run.failed(step[0], fail(step[0])) or run.awaiting is None:
                continue
        while (verdict := run.route_read(master_of, None)) is POLL:
            clock.now += run.poll_pause_s()
        if verdict is GIVE_UP:
            return made


@pytest.mark.parametrize(("groups", "retries"), [(("a",), 2), (("a", "b"), 2), (("a", "b"), 0), (("a",), 5)])
def test_with_every_master_refusing_a_send_makes_one_plus_retries_attempts(groups: tuple[str, ...],
                                                                          retries: int) -> None:
    """Issue 40: 12 attempts in 10 s with retry_times_when_send_failed=2. The route never changes, so the budget
    holds: 1 + retries attempts, the retries of a same address spread over the send's 10 s, then the wait for a
    new master until the deadline, and an error that counts them first."""
    clock = Clock()
    run = _run(*groups, clock=clock, retries=retries)
    made = _drive(run, clock, lambda g: f"{g}0:1", lambda mq: _gone(f"{mq.broker_name}0:1"))
    assert len(made) == 1 + retries, made
    assert len(run.attempts) == 1 + retries
    times = [t for t, _ in made]
    later = times[len(groups) - 1:]  # from the attempt that made the send wait
    assert all(b - a >= SAME_MASTER_RETRY_S for a, b in itertools.pairwise(later)), made
    assert times[-1] < 10.0 - SAME_MASTER_RETRY_S, made  # the last one leaves time to answer
    first_line = str(run.exhausted()).splitlines()[0]
    assert first_line.startswith(f"send to topic T failed after {1 + retries} attempt"), first_line


def test_each_new_master_gets_an_attempt_beyond_the_budget() -> None:
    """An election: the route names a new address after each failure; each is tried (one attempt each, beyond
    1 + retries), the old ones are not tried again once the budget is spent."""
    clock = Clock()
    run = _run("a", clock=clock, retries=0)
    masters = iter(["a1:1", "a2:1", "a3:1"])
    current = ["a0:1"]

    def fail(mq: MessageQueue) -> ClientError:
        addr = current[0]
        current[0] = next(masters, addr)  # the next leader registers once this one failed
        return _gone(addr)

    made = _drive(run, clock, lambda g: current[0], fail)
    assert len(made) == 4, made  # a0 within the budget, then a1, a2, a3 as they registered
    assert "failed after 4 attempts" in str(run.exhausted()).splitlines()[0]


def test_a_group_is_tried_again_only_when_its_master_is_another_address() -> None:
    """The new master fails too: its address now counts as tried, so no second attempt at once (no busy loop);
    a third master is tried at once again."""
    clock = Clock()
    run = _run("a", clock=clock)
    _wait(run, _gone("a0:1"))
    assert run.route_read({"a": "a1:1"}.get, None) is RETRY
    _wait(run, _as("SLAVE", "a1:1"))
    assert run.route_read({"a": "a1:1"}.get, None) is POLL
    assert run.route_read({"a": "a0:1"}.get, None) is POLL
    assert run.route_read({"a": "a2:1"}.get, None) is RETRY


def test_a_broker_naming_itself_otherwise_than_the_route_is_not_retried_in_a_loop() -> None:
    clock = Clock()
    run = _run("a", clock=clock)
    _wait(run, _as("SLAVE", "10.0.0.5:1"))  # the route says a1:1; the broker's own idea of its address differs
    assert run.route_read({"a": "a1:1"}.get, None) is RETRY
    _wait(run, _as("SLAVE", "10.0.0.5:1"))
    assert run.route_read({"a": "a1:1"}.get, None) is POLL  # the route's address counts as tried now


def test_a_new_master_without_a_writable_queue_in_the_route_is_not_tried() -> None:
    clock = Clock()
    run = _run("a", clock=clock)
    _wait(run, _gone("a0:1"))
    assert run.route_read({"a": "a1:1"}.get, _info()) is POLL  # no queue of a (say, write permission wiped)
    assert run.route_read({"a": "a1:1"}.get, _info("a")) is RETRY


def test_with_two_groups_lost_the_first_to_get_a_master_is_tried() -> None:
    clock = Clock()
    run = _run("a", "b", clock=clock)
    assert _fail(run, _gone("a0:1")) is True
    _wait(run, _gone("b0:1"), "b")
    assert run.route_read({"a": "a0:1", "b": "b1:1"}.get, None) is RETRY and run.resuming == ("b", "b1:1")
    step = run.next()
    assert step is not None and step[0].broker_name == "b"


def test_a_new_master_of_a_group_found_unwritable_makes_it_writable_again() -> None:
    """Two groups, a's old master answers as a SLAVE (unwritable for this send), b's is gone: a's new master
    is tried."""
    clock = Clock()
    run = _run("a", "b", clock=clock)
    assert _fail(run, _as("SLAVE", "a0:1")) is True
    _wait(run, _gone("b0:1"), "b")
    assert run.route_read({"a": "a1:1", "b": "b0:1"}.get, None) is RETRY
    step = run.next()
    assert step is not None and step[0].broker_name == "a"


def test_route_reads_are_bounded_by_the_deadline_and_the_error_names_the_group() -> None:
    clock = Clock()
    run = _run("a", clock=clock, timeout_s=3.0)
    _wait(run, _gone("a0:1"))
    reads = 0
    while (verdict := run.route_read({"a": None}.get, None)) is POLL:
        reads += 1
        pause = run.poll_pause_s()
        assert 0 <= pause <= MASTER_POLL_S[1]
        clock.now += pause
    assert verdict is GIVE_UP
    assert reads <= 3.0 / MASTER_POLL_S[0] + 1
    err = run.exhausted()
    assert isinstance(err, SendFailedError) and err.attempts == run.attempts
    text = str(err)
    for part in ("broker group a", "a0:1", "no new master registered", "send_timeout_s", "splitmq topic route -t T",
                 f"{reads + 1} route read(s)"):
        assert part in text, text


def test_the_pause_never_passes_the_deadline() -> None:
    clock = Clock()
    run = _run("a", clock=clock, timeout_s=1.0)
    assert run.poll_pause_s() == pytest.approx(0.15)  # the middle of MASTER_POLL_S with rand 0.5
    clock.now += 0.95
    assert run.poll_pause_s() == pytest.approx(0.05)
    clock.now += 1.0
    assert run.poll_pause_s() == 0.0


# --- against real processes --------------------------------------------------------------------------------

TOPIC = "Ride"


@pytest.fixture
def lone_master(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """A nameserver and one group, ``broker-a``, with a master and no slave; topic ``Ride`` on it."""
    cluster = ha_cluster(cluster_factory, slaves_per_group=0)
    create_topic(cluster, TOPIC, queue_nums=2)
    return cluster


@pytest.fixture
def new_master(cluster_factory: Callable[..., LocalCluster]) -> Iterator[Callable[[LocalCluster], BrokerHandle]]:
    """Starts another master of ``broker-a``: its own store, a new port, registered as brokerId 0 (the old
    master's entry is replaced, as when a new leader registers). Stopped at teardown, before the cluster."""
    started: list[BrokerHandle] = []

    def start(cluster: LocalCluster) -> BrokerHandle:
        m = BrokerHandle(cluster, "broker-a", 9, "ASYNC_MASTER")  # 9 names its directory: broker-a-9
        m.broker_id = 0  # what it registers as
        m.write_config(None)
        # It knows the old master's topics, as a new leader does (brokers do not create topics on a send).
        topics = cluster.broker("broker-a", 0).store_dir / "config" / "topics.json"
        (m.store_dir / "config").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(topics, m.store_dir / "config" / "topics.json")
        started.append(m)
        m.start()
        return m

    yield start
    for m in started:
        m.stop()


def _waiting(caplog: pytest.LogCaptureFixture) -> int:
    """Sends that logged that they wait for a new master."""
    return sum(1 for r in caplog.records if r.name == "client._producer" and "is gone" in r.getMessage())


def _check_on(master: BrokerHandle, namesrv: str, sent: dict[bytes, SendResult]) -> None:
    """Each message was stored by ``master`` and a consumer reads it back from there."""
    with PullConsumer("cg", namesrv) as c:
        for body, r in sent.items():
            assert r.send_status is SendStatus.SEND_OK, r
            assert decode_offset_msg_id(r.offset_msg_id)[0] == master.addr, (r, master)
            got = c.pull(r.message_queue, r.queue_offset, max_nums=1)
            assert got.pull_status is PullStatus.FOUND, (r, got)
            m = got.msg_found_list[0]
            assert (m.body, m.msg_id) == (body, r.msg_id)


@pytest.mark.integration
def test_sends_under_way_when_the_master_dies_are_stored_by_the_new_master(
        lone_master: LocalCluster, new_master: Callable[[LocalCluster], BrokerHandle],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="client._producer")
    one = [Message(TOPIC, b"one")]
    batch = [Message(TOPIC, b"batch-%d" % i) for i in range(3)]
    outcomes: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], list[SendResult]]) -> None:
        try:
            outcomes[name] = fn()
        except Exception as e:  # shown by the asserts below
            outcomes[name] = e

    with Producer("pg", lone_master.namesrv_addr, send_timeout_s=10.0) as p:
        assert p.send(Message(TOPIC, b"before")).send_status is SendStatus.SEND_OK
        lone_master.kill_master("broker-a")
        threads = [threading.Thread(target=run, args=("send", lambda: [p.send(one[0])]), daemon=True),
                   threading.Thread(target=run, args=("send_batch", lambda: p.send_batch(batch)), daemon=True)]
        for t in threads:
            t.start()
        poll_until(lambda: _waiting(caplog) >= 2 or outcomes, 10, "both sends waiting for a new master")
        assert not outcomes, outcomes  # they must not have ended: there is no master yet
        m2 = new_master(lone_master)
        for t in threads:
            t.join(15)
    assert all(isinstance(v, list) for v in outcomes.values()) and len(outcomes) == 2, outcomes
    sent = dict(zip([m.body for m in one + batch], outcomes["send"] + outcomes["send_batch"], strict=True))
    _check_on(m2, lone_master.namesrv_addr, sent)


@pytest.mark.integration
def test_async_sends_under_way_when_the_master_dies_are_stored_by_the_new_master(
        lone_master: LocalCluster, new_master: Callable[[LocalCluster], BrokerHandle],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="client._producer")
    one = Message(TOPIC, b"async-one")
    batch = [Message(TOPIC, b"async-batch-%d" % i) for i in range(3)]

    async def main() -> tuple[BrokerHandle, list[SendResult], list[SendResult]]:
        async with AsyncProducer("pg", lone_master.namesrv_addr, send_timeout_s=10.0) as p:
            assert (await p.send(Message(TOPIC, b"before"))).send_status is SendStatus.SEND_OK
            await asyncio.to_thread(lone_master.kill_master, "broker-a")
            single = asyncio.create_task(p.send(one))
            batched = asyncio.create_task(p.send_batch(batch))
            await wait_until(lambda: _waiting(caplog) >= 2 or single.done() or batched.done(), 10,
                             "both sends waiting for a new master")
            for task in (single, batched):
                assert not task.done(), task.exception()  # they must not have ended: there is no master yet
            m2 = await asyncio.to_thread(new_master, lone_master)
            return m2, [await single], await batched

    m2, r_one, r_batch = asyncio.run(main())
    _check_on(m2, lone_master.namesrv_addr, dict(zip([one.body] + [m.body for m in batch], r_one + r_batch,
                                                     strict=True)))


@pytest.mark.integration
def test_a_master_restarted_at_its_address_is_tried_again(lone_master: LocalCluster,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The route never changes when the master comes back at its own address (or a leader is elected again):
    the send tries that address again every SAME_MASTER_RETRY_S instead of waiting for a change."""
    caplog.set_level(logging.INFO, logger="client._producer")
    outcome: list[Any] = []
    with Producer("pg", lone_master.namesrv_addr, send_timeout_s=10.0) as p:
        assert p.send(Message(TOPIC, b"before")).send_status is SendStatus.SEND_OK
        m1 = lone_master.kill_master("broker-a")
        sender = threading.Thread(target=lambda: outcome.append(p.send(Message(TOPIC, b"again"))), daemon=True)
        sender.start()
        poll_until(lambda: _waiting(caplog) or not sender.is_alive(), 10, "the send waiting for a new master")
        assert sender.is_alive(), outcome
        m1.start()  # same store, same port
        sender.join(15)
    assert outcome, "the send raised (see the thread's exception above)"
    _check_on(m1, lone_master.namesrv_addr, {b"again": outcome[0]})


@pytest.mark.integration
def test_without_a_new_master_the_send_fails_at_its_deadline_naming_the_group(lone_master: LocalCluster) -> None:
    timeout_s = 3.0
    with Producer("pg", lone_master.namesrv_addr, send_timeout_s=timeout_s) as p:
        assert p.send(Message(TOPIC, b"before")).send_status is SendStatus.SEND_OK
        lone_master.kill_master("broker-a")
        t0 = time.monotonic()
        with pytest.raises(SendFailedError) as ei:
            p.send(Message(TOPIC, b"nobody"))
        took = time.monotonic() - t0
    text = str(ei.value)
    print(f"\nno new master: SendFailedError after {took:.2f} s (send_timeout_s {timeout_s}): {text}")
    assert "broker group broker-a" in text and "no new master registered" in text, text
    assert took < timeout_s + 1.0, took


class _CountingMaster:
    """Listens at a dead master's address: counts the sends that reach it and closes each connection without an
    answer, as a master dying with the request in hand (the producer's attempt fails and the route still names
    this address)."""

    def __init__(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self._sock = socket.create_server((host, int(port)), reuse_port=False)
        self._sock.settimeout(0.2)
        self.sends = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    head = conn.recv(65536)
                except OSError:
                    continue
                if head.startswith(b"POST /send"):
                    self.sends += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _refused_or_counted(lone_master: LocalCluster, how: str) -> _CountingMaster | None:
    """Kill the lone master; with ``how == "closing"`` a counting listener takes its address."""
    dead = lone_master.kill_master("broker-a")
    return _CountingMaster(dead.addr) if how == "closing" else None


@pytest.mark.integration
@pytest.mark.parametrize("how", ["refusing", "closing"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_send_to_a_dead_master_makes_one_plus_retries_attempts(lone_master: LocalCluster, how: str,
                                                                 kind: str) -> None:
    """Issue 40 point 3: with retry_times_when_send_failed=2 a send to a group whose master refuses (or drops
    every request) makes 3 attempts, counted by the listener at the master's address when there is one, waits
    for a new master until send_timeout_s, and says how many attempts it made on its first line."""
    timeout_s = 4.0
    msg = Message(TOPIC, b"nobody home")
    listener: _CountingMaster | None = None
    t0 = 0.0
    try:
        if kind == "sync":
            with Producer("pg", lone_master.namesrv_addr, send_timeout_s=timeout_s) as p:
                assert p.send(Message(TOPIC, b"before")).send_status is SendStatus.SEND_OK
                listener = _refused_or_counted(lone_master, how)
                t0 = time.monotonic()
                with pytest.raises(SendFailedError) as ei:
                    p.send(msg)
        else:
            async def main() -> _CountingMaster | None:
                nonlocal t0
                async with AsyncProducer("pg", lone_master.namesrv_addr, send_timeout_s=timeout_s) as p:
                    assert (await p.send(Message(TOPIC, b"before"))).send_status is SendStatus.SEND_OK
                    counted = await asyncio.to_thread(_refused_or_counted, lone_master, how)
                    t0 = time.monotonic()
                    with pytest.raises(SendFailedError) as ei_:
                        await p.send(msg)
                    holder.append(ei_)
                    return counted

            holder: list[pytest.ExceptionInfo[SendFailedError]] = []
            listener = asyncio.run(main())
            ei = holder[0]
        took = time.monotonic() - t0
    finally:
        if listener is not None:
            listener.close()
    err = ei.value
    first = str(err).splitlines()[0]
    print(f"\n{kind} {how}: {len(err.attempts)} attempts "
          f"({'listener counted ' + str(listener.sends) if listener else 'refused'}) in {took:.2f} s: {first}")
    assert len(err.attempts) == 3, err.attempts
    if listener is not None:
        assert listener.sends == 3
    assert first.startswith(f"send to topic {TOPIC} failed after 3 attempts"), first
    assert timeout_s - 0.5 < took < timeout_s + 1.0, took  # it waited for a new master until its deadline
