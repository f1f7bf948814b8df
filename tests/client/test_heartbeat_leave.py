"""A consumer group closed while a heartbeat is under way stays gone: the heartbeat, whose answers may reach the
brokers after the close's unregister (it listed the group again there until the heartbeat timeout, and the other
members kept waiting for its queues), leaves the group again once its own answers are in.

The operations are driven by hand here, in the one order that used to go wrong: heartbeat sent, unregister sent
and answered, heartbeat answered."""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import httpx

from client._instance import ClientConfig, _InstanceCore
from client._requests import Exchange

BROKERS = ["127.0.0.1:10911", "127.0.0.1:10921"]
OK = httpx.Response(200, content=b"{}")


def _core() -> _InstanceCore:
    core = _InstanceCore("127.0.0.1:9876", ClientConfig())
    core.heartbeat_targets = lambda: list(BROKERS)  # type: ignore[method-assign]  # no route cache needed
    core.register_consumer("g_left")
    core.register_consumer("g_stays")
    return core


def _finish(op: Generator[Exchange, Any, Any], sent: list[Exchange]) -> Any:
    """Answer each request of ``op`` with OK until it ends, adding each to ``sent``; returns what it returned."""
    try:
        while True:
            sent.append(op.send(OK))
    except StopIteration as stop:
        return stop.value


def _groups(req: Exchange) -> set[str]:
    return {g["group"] for g in json.loads(req.body)["consumerGroups"]}


def test_a_heartbeat_answered_after_the_groups_unregister_leaves_it_again() -> None:
    core = _core()
    heartbeat = core.heartbeat_op()
    first = next(heartbeat)
    assert first.target == "/heartbeat" and _groups(first) == {"g_left", "g_stays"}

    leave = core.unregister_consumer_group_op("g_left")  # the close, on another thread, overtakes it
    unregistered = [leave.send(None)]
    _finish(leave, unregistered)
    assert [r.target for r in unregistered] == ["/client/unregister"] * 2

    after = [heartbeat.send(OK)]  # the first broker's heartbeat answer, then the second's
    assert _finish(heartbeat, after) == 2
    assert [(r.target, r.addr) for r in after] == [("/heartbeat", BROKERS[1]),
                                                   ("/client/unregister", BROKERS[0]),
                                                   ("/client/unregister", BROKERS[1])]
    assert all(b"g_left" in r.body and b"g_stays" not in r.body for r in after[1:])


def test_a_heartbeat_with_no_group_gone_sends_nothing_more() -> None:
    core = _core()
    heartbeat = core.heartbeat_op()
    sent = [next(heartbeat)]
    _finish(heartbeat, sent)
    assert [r.target for r in sent] == ["/heartbeat"] * 2
