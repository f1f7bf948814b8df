"""The wake-up flag the DLedger loops wait on (the state loop, each follower's push loop, the broker's role
handler): set by whoever has news, waited on with a bound so a loop still looks now and then without news."""

from __future__ import annotations

import asyncio

__all__ = ["Wakeup"]


class Wakeup:
    """A wake-up flag a loop waits on with a timeout: a plain future and a timer, so a cancellation always
    reaches the waiter (``asyncio.wait_for`` on Python 3.11 can lose one that races with the inner wait)."""

    def __init__(self) -> None:
        self._set = False
        self._fut: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Return when set (since the last wait) or after ``timeout_s`` seconds; clears the flag."""
        if not self._set:
            loop = asyncio.get_running_loop()
            fut = self._fut = loop.create_future()
            timer = loop.call_later(timeout_s, _resolve, fut)
            try:
                await fut
            finally:
                timer.cancel()
                self._fut = None
        self._set = False


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
