"""Operations written once, run by both drivers: ``ClientInstance.drive`` and ``AsyncClientInstance.drive`` behave
alike (answers sent in, a failed request thrown in at its ``yield``, an interruption reaching the operation's
``finally``), and an operation behaves alike under both (``send_oneway``'s error rule)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from client import AsyncClientInstance, AsyncProducer, ClientInstance, Message, MessageQueue, Producer
from client._requests import Exchange, Op
from client.errors import ClientClosedError, MessageIllegalError
from tests.client.conftest import FakeCluster, async_instance

A, B = "a0:1", "b0:1"


class _Interrupt(BaseException):
    """Stands for KeyboardInterrupt or a task's cancellation."""


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.host == "down":
        raise httpx.ConnectError("refused", request=request)
    if request.url.host == "stop":
        raise _Interrupt
    return httpx.Response(200, content=request.url.path.encode())


def _drive(kind: str, op: Op[Any]) -> Any:
    """Run ``op`` with the sync or the async driver over :func:`_handler`."""
    if kind == "sync":
        inst = ClientInstance("ns:1", transport=httpx.MockTransport(_handler))
        try:
            return inst.drive(op)
        finally:
            inst.close()

    async def handler(request: httpx.Request) -> httpx.Response:
        return _handler(request)

    async def main() -> Any:
        inst = AsyncClientInstance("ns:1", transport=httpx.MockTransport(handler))
        try:
            return await inst.drive(op)
        finally:
            await inst.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_driver_sends_answers_in_and_throws_failures_in(kind: str) -> None:
    seen: list[str] = []

    def op() -> Op[list[str]]:
        for addr in ("down:1", "up:1"):
            try:
                resp = yield Exchange("GET", addr, f"/from-{addr[:-2]}", timeout=1.0)
            except httpx.ConnectError:
                seen.append(f"{addr} failed")
                continue
            seen.append(resp.content.decode())
        return seen

    assert _drive(kind, op()) == ["down:1 failed", "/from-up"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_driver_returns_without_a_request_and_raises_what_the_op_raises(kind: str) -> None:
    def quiet() -> Op[int]:
        return 7
        yield  # a generator that makes no request

    def failing() -> Op[None]:
        yield Exchange("GET", "down:1", "/x")

    assert _drive(kind, quiet()) == 7
    with pytest.raises(httpx.ConnectError):
        _drive(kind, failing())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_interruption_reaches_the_operation_and_propagates(kind: str) -> None:
    cleaned: list[bool] = []

    def op() -> Op[None]:
        try:
            yield Exchange("GET", "stop:1", "/x", timeout=1.0)
        finally:
            cleaned.append(True)

    with pytest.raises(_Interrupt):
        _drive(kind, op())
    assert cleaned == [True]


# --- one rule for both producers: send_oneway -------------------------------------------------------------


def _oneway(kind: str, fake: FakeCluster, msg: Message, queue: MessageQueue | None = None, *,
            closed: bool = False) -> None:
    if kind == "sync":
        fake.instance()  # type: ignore[attr-defined]
        p = Producer("pg", fake.namesrv, start_index=0)
        if closed:
            p.close()
        try:
            p.send_oneway(msg, queue)
        finally:
            p.close()
        return

    async def main() -> None:
        inst = async_instance(fake)
        p = AsyncProducer("pg", fake.namesrv, start_index=0)
        if closed:
            await p.close()
        try:
            await p.send_oneway(msg, queue)
        finally:
            await p.close()
            await inst.release()

    asyncio.run(main())


FAILURES: dict[str, Callable[[FakeCluster], None]] = {
    "broker error": lambda f: f.script.update({A: [26]}),
    "transport error": lambda f: f.script.update({A: ["connect"]}),
    "no route": lambda f: f.routes.clear(),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_oneway_reports_no_send_failure(fake, kind: str, failure: str) -> None:
    fake.add_topic("T", {"broker-a": {0: A}})
    FAILURES[failure](fake)
    _oneway(kind, fake, Message("T", b"x"))  # no exception
    assert len(fake.sends()) == (0 if failure == "no route" else 1)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_oneway_raises_for_an_invalid_message_and_a_closed_producer(fake, kind: str) -> None:
    fake.add_topic("T", {"broker-a": {0: A}})
    with pytest.raises(MessageIllegalError):
        _oneway(kind, fake, Message("T", b""))
    with pytest.raises(MessageIllegalError):
        _oneway(kind, fake, Message("T", b"x"), MessageQueue("Other", "broker-a", 0))
    with pytest.raises(ClientClosedError):
        _oneway(kind, fake, Message("T", b"x"), closed=True)
    assert fake.sends() == []
