"""One asyncio task that runs a service's passes and sleeps between them until its next due time or a wake-up.

The delay-level scheduler (:mod:`broker.schedule`) and the timer (:mod:`broker.timer.service`) both deliver
parked messages this way: a pass puts back what is due, the service says how long it may sleep (its earliest
due time, bounded), and the store's dispatch listener wakes it early when new units arrive -- possibly from the
dispatch thread, hence :meth:`PassLoop.wake` is thread-safe. No polling tick: a message goes out within
milliseconds of its time. A pass that raises is logged and the service's ``on_error`` sets its back-off; the
task never dies of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

__all__ = ["PassLoop"]

log = logging.getLogger(__name__)


class PassLoop:
    """The task of one service (see the module docstring).

    Args:
        name: the task's name (and the log's word for the service).
        run_pass: one pass (runs on the event loop, without awaiting; what it returns is ignored).
        wait_ms: after a pass, how long the task may sleep; ``<= 0`` runs the next pass at once (after letting
            other work in).
        on_error: called after a pass raised (the service's back-off), after the exception was logged.
        on_timeout: called when a sleep ended by its time rather than a wake-up (a safety net for a lost wake-up).
    """

    def __init__(self, name: str, run_pass: Callable[[], object], wait_ms: Callable[[], int], *,
                 on_error: Callable[[], None], on_timeout: Callable[[], None] | None = None) -> None:
        self._name = name
        self._run_pass = run_pass
        self._wait_ms = wait_ms
        self._on_error = on_error
        self._on_timeout = on_timeout
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task on the running loop (the first pass runs at once)."""
        if self.running:
            raise RuntimeError(f"{self._name} already running")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name=self._name)

    async def stop(self) -> bool:
        """Cancel the task and wait for it; True when there was one. Idempotent; safe when never started."""
        task, self._task = self._task, None
        if task is None:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    def wake(self) -> None:
        """Run a pass soon (thread-safe; a no-op before :meth:`start`)."""
        wake, loop = self._wake, self._loop
        if wake is None or loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            wake.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            wake.clear()
            try:
                self._run_pass()
            except Exception:  # one bad pass (disk error...) must not end the service
                log.exception("%s: a pass failed; backing off", self._name)
                self._on_error()
            wait_ms = self._wait_ms()
            if wait_ms <= 0:
                await asyncio.sleep(0)  # more is due: let requests in between passes
                continue
            try:
                await asyncio.wait_for(wake.wait(), wait_ms / 1000.0)
            except TimeoutError:
                if self._on_timeout is not None:
                    self._on_timeout()
