"""HA connection admission (broker/ha/admission.py): connections that have not reported have their own cap and
deadline, so idle sockets cannot lock a real slave out (issue 11 item 3: 64 idle connections used to)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from broker.ha import HAConfig
from broker.ha.admission import expired_pending, pending_to_evict, report_admitted
from tests.broker.ha.test_replication import Run, master_service, slave_client, wait_until

pytestmark = pytest.mark.ha


@pytest.mark.parametrize(("pending", "cap", "evict"), [
    ({}, 4, []),
    ({1: 10, 2: 20, 3: 30}, 4, []),
    ({1: 10, 2: 20, 3: 30, 4: 40}, 4, [1]),  # full: the oldest makes room
    ({7: 50, 3: 10, 5: 10, 9: 60}, 4, [3]),  # same age: the lower id
    ({1: 10, 2: 20, 3: 30, 4: 40, 5: 50}, 3, [1, 2, 3]),  # more than full (the cap was lowered)
    ({1: 10}, 1, [1]),
    ({1: 10}, 0, [1]),  # a cap below 1 counts as 1: a newcomer always gets in
])
def test_pending_to_evict(pending: dict[int, int], cap: int, evict: list[int]) -> None:
    assert pending_to_evict(pending, cap) == evict


@pytest.mark.parametrize(("pending", "now", "timeout", "expired"), [
    ({}, 100, 50, []),
    ({1: 10, 2: 60, 3: 90}, 100, 40, [1, 2]),  # 90 and 40 ms old
    ({1: 10, 2: 60}, 100, 41, [1]),
    ({1: 100}, 100, 1, []),
])
def test_expired_pending(pending: dict[int, int], now: int, timeout: int, expired: list[int]) -> None:
    assert expired_pending(pending, now, timeout) == expired


@pytest.mark.parametrize(("reporting", "cap", "ok"), [(0, 1, True), (63, 64, True), (64, 64, False), (65, 64, False)])
def test_report_admitted(reporting: int, cap: int, ok: bool) -> None:
    assert report_admitted(reporting, cap) is ok


def test_a_flood_of_idle_connections_does_not_lock_the_real_slave_out(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    config = attrs.evolve(fast_config, ha_max_connections=4, ha_max_pending_connections=8,
                          ha_pending_timeout_ms=500)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 10, 1000)

    async def scenario() -> None:
        async with master_service(master, config) as service:
            loop = asyncio.get_running_loop()
            flood: list[socket.socket] = []
            for i in range(200):
                s = socket.socket()
                s.setblocking(False)
                await loop.sock_connect(s, ("127.0.0.1", service.port))
                if i % 10 == 0:
                    await loop.sock_sendall(s, b"\x00\x00\x00")  # three bytes of a report, then nothing
                flood.append(s)
            await wait_until(lambda: service.connection_count <= 8, "the flood cut to the pending cap")
            async with slave_client(slave, config, service.port):
                await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset,
                                 "the real slave's catch-up ack")
                end = kind.write(master, 3, 1000)
                assert await service.wait_for_ack(end, 10.0) is True
                # The rest of the flood is closed by the deadline; the real slave stays.
                await wait_until(lambda: service.connection_count == 1, "the idle connections closed")
                assert service.wait_for_ack(master.max_physical_offset, 0.01).result() is True
            for s in flood:
                s.close()

    run(scenario())
