"""Waiting in tests without sleeping to synchronise: poll a condition until a deadline, in a thread or in a loop.

A test waits for something it can observe (an offset reached, a counter moved, a server state); the deadline only
bounds a failure, and the failure names what did not happen and the last value seen. Where the code under test
can tell us directly (an event, a callback, a future), wait on that instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["poll_until", "wait_until"]


def poll_until(fn: Callable[[], T | None], timeout_s: float, what: str, *, interval_s: float = 0.02,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``fn`` until it returns a truthy value, and return that value.

    Args:
        fn: the condition; any truthy value ends the wait.
        timeout_s: bound on the wait.
        what: what is awaited, for the failure message.
        interval_s: pause between two calls (the polling period, not a synchronisation).
        ignore: exceptions of ``fn`` that mean "not yet" (a server still starting).

    Raises:
        AssertionError: ``timeout_s`` passed; names ``what`` and the last value or error.
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except ignore as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
        time.sleep(interval_s)


async def wait_until(fn: Callable[[], T | None], timeout_s: float, what: str, *, interval_s: float = 0.005) -> T:
    """:func:`poll_until` inside an event loop: the loop keeps running the code under test between calls.

    Raises:
        AssertionError: ``timeout_s`` passed; names ``what`` and the last value.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last: {value!r})")
        await asyncio.sleep(interval_s)
