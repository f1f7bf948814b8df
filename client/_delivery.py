"""Delivery reports of ``send_async``: the callback shape and how an outcome reaches it.

``Producer.send_async`` returns a :class:`concurrent.futures.Future`, ``AsyncProducer.send_async`` an
:class:`asyncio.Task`; either way the optional ``on_delivery(error, result)`` callback (confluent-kafka's
argument order: the error first, None on success) is called once with the send's outcome -- also when the send
failed, was cancelled or the producer closed before it ran. A callback that raises is logged, never lost in a
thread. Without a callback a failed send is logged at WARNING, so that a future nobody looks at does not drop a
failure silently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from client._requests import SendResult
from common.errors import ClientClosedError, InvalidParameterError

__all__ = ["AsyncSendFuture", "DeliveryCallback", "SendFuture", "check_callback", "outcome_of", "report"]

log = logging.getLogger(__name__)

#: ``on_delivery(error, result)``: ``(None, SendResult)`` when the message was stored, ``(exception, None)`` when
#: not (the same exception the future holds; ``ClientClosedError`` for a send the producer's close cancelled).
DeliveryCallback = Callable[[BaseException | None, SendResult | None], Any]

#: What ``Producer.send_async`` returns.
SendFuture = concurrent.futures.Future[SendResult]
#: What ``AsyncProducer.send_async`` returns (await it for the SendResult).
AsyncSendFuture = asyncio.Task[SendResult]


def check_callback(on_delivery: object) -> DeliveryCallback | None:
    """``on_delivery`` itself, when None or callable.

    Raises:
        InvalidParameterError: it is something else.
    """
    if on_delivery is not None and not callable(on_delivery):
        raise InvalidParameterError(f"on_delivery must be a callable (error, result) -> None, got "
                                    f"{type(on_delivery).__name__}")
    return on_delivery


def outcome_of(fut: concurrent.futures.Future[SendResult] | asyncio.Future[SendResult], group: str
               ) -> tuple[BaseException | None, SendResult | None]:
    """``(error, result)`` of a finished future (a cancelled one: the producer closed before the send ran)."""
    if fut.cancelled():
        return ClientClosedError(f"producer {group} closed before the send_async ran; send it again"), None
    err = fut.exception()
    if err is not None:
        return err, None
    return None, fut.result()


def report(on_delivery: DeliveryCallback | None, topic: str, error: BaseException | None,
           result: SendResult | None) -> None:
    """Hand an outcome to ``on_delivery``; a callback that raises is logged (the send's outcome stays on the
    future). Without a callback, a failure is logged."""
    if on_delivery is None:
        if error is not None:
            log.warning("send_async to %s failed and no on_delivery callback was given: %s", topic, error)
        return
    try:
        on_delivery(error, result)
    except Exception:
        log.exception("the on_delivery callback of a send to %s raised", topic)
