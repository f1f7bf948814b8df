"""broker.pass_loop.PassLoop: passes run at start, on a wake-up (also from another thread) and when the sleep
runs out; a failing pass backs off and the task goes on; stop reports whether there was a task."""

from __future__ import annotations

import asyncio
import threading

from broker.pass_loop import PassLoop
from tests.waiting import wait_until


def test_wake_ups_errors_timeouts_and_stop() -> None:
    async def main() -> None:
        passes: list[str] = []
        errors: list[int] = []
        timeouts: list[int] = []
        fail_next = [False]

        def run_pass() -> None:
            passes.append(threading.current_thread().name)
            if fail_next[0]:
                fail_next[0] = False
                raise OSError("disk error")

        sleep_ms = [60_000]
        loop = PassLoop("test-passes", run_pass, lambda: sleep_ms[0], on_error=lambda: errors.append(1),
                        on_timeout=lambda: timeouts.append(1))
        assert await loop.stop() is False and not loop.running
        loop.wake()  # before start: a no-op
        loop.start()
        await wait_until(lambda: len(passes) == 1, 5, "the first pass at start")
        loop.wake()
        await wait_until(lambda: len(passes) == 2, 5, "a pass on a wake-up on the loop's thread")
        fail_next[0] = True
        t = threading.Thread(target=loop.wake)
        t.start()
        t.join()
        await wait_until(lambda: len(passes) == 3 and errors == [1], 5, "a failing pass woken from a thread")
        assert loop.running  # the task survived the failure
        sleep_ms[0] = 20
        loop.wake()
        await wait_until(lambda: timeouts, 5, "a sleep that ran out")
        assert await loop.stop() is True and not loop.running
        assert await loop.stop() is False  # idempotent

    asyncio.run(main())
