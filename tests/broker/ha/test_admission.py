"""HA connection admission (broker/ha/admission.py): connections that have not reported have their own cap and
deadline, so idle sockets cannot lock a real slave out (issue 11 item 3: 64 idle connections used to)."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


def _fd_count() -> int:
    """Open socket descriptors of this process (master, slave and the flood's client ends): stores open files."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            count += os.readlink(f"/proc/self/fd/{name}").startswith("socket:")
    return count


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the master has closed this flood socket (EOF or reset), without blocking."""
    try:
        return s.recv(64) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_a_flood_of_idle_connections_does_not_lock_the_real_slave_out(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    # The housekeeping interval is the broker's default (20 s): before the pending rule, idle sockets held every
    # slot that long, so the catch-up below (bounded well under it) failed.
    config = attrs.evolve(fast_config, ha_housekeeping_interval_ms=20_000, ha_max_connections=4,
                          ha_max_pending_connections=8, ha_pending_timeout_ms=500)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 10, 1000)

    async def scenario() -> None:
        async with master_service(master, config) as service:
            loop = asyncio.get_running_loop()
            fds_before = _fd_count()
            flood: list[socket.socket] = []
            try:
                for i in range(200):
                    s = socket.socket()
                    flood.append(s)
                    s.setblocking(False)
                    await loop.sock_connect(s, ("127.0.0.1", service.port))
                    if i % 10 == 0:
                        await loop.sock_sendall(s, b"\x00\x00\x00")  # three bytes of a report, then nothing
                await wait_until(lambda: service.connection_count <= 8, "the flood cut to the pending cap", 5.0)
                # The master holds at most the pending cap of the flood (the rest are ours, the client ends).
                assert _fd_count() <= fds_before + len(flood) + 8
                async with slave_client(slave, config, service.port):
                    await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset,
                                     "the real slave's catch-up ack", 8.0)
                    end = kind.write(master, 3, 1000)
                    # A SYNC_MASTER send's wait, bounded by syncFlushTimeout's default.
                    assert await service.wait_for_ack(end, 2.0) is True
                    # Every flood socket is closed by the master soon after the pending deadline; the slave stays.
                    await wait_until(lambda: all(_closed_by_peer(s) for s in flood), "the flood closed by the master",
                                     5.0)
                    await wait_until(lambda: service.connection_count == 1, "only the real slave left", 5.0)
                    assert service.wait_for_ack(master.max_physical_offset, 0.01).result() is True
            finally:
                for s in flood:
                    s.close()
            # Once the slave is gone too, no socket is left of the flood or the link (the master closes its end).
            await wait_until(lambda: _fd_count() <= fds_before, "the sockets closed", 5.0)

    run(scenario())


def test_the_admission_keys_come_from_the_broker_properties() -> None:
    from broker.config import BrokerConfig, ConfigError

    ha = BrokerConfig.from_properties({"haMaxConnections": "3", "haMaxPendingConnections": "5",
                                       "haPendingTimeoutMs": "700"}).to_ha_config()
    assert (ha.ha_max_connections, ha.ha_max_pending_connections, ha.ha_pending_timeout_ms) == (3, 5, 700)
    defaults = BrokerConfig.from_properties({}).to_ha_config()
    assert (defaults.ha_max_connections, defaults.ha_max_pending_connections, defaults.ha_pending_timeout_ms) == (
        HAConfig().ha_max_connections, HAConfig().ha_max_pending_connections, HAConfig().ha_pending_timeout_ms)
    with pytest.raises(ConfigError, match="haMaxPendingConnections"):
        BrokerConfig.from_properties({"haMaxPendingConnections": "0"})


def test_pending_connections_are_shared_out_by_source() -> None:
    """Issue 39: a flood from one address evicts only its own pending connections once it holds its share (a
    quarter of the cap), never a real slave's handshake from another address; with the cap full, the source
    holding most gives up its oldest."""
    from broker.ha.admission import pending_to_evict_by_source, source_share

    assert source_share(16) == 4 and source_share(2) == 1
    flood = {i: (i, "10.0.0.66") for i in range(1, 5)}
    slave = {99: (0, "10.0.0.2")}  # the oldest of all
    assert pending_to_evict_by_source({**flood, **slave}, "10.0.0.66", 16) == [1]  # its own oldest
    full = {**{i: (i, f"10.0.0.{100 + i}") for i in range(1, 16)}, **slave}
    assert len(full) == 16
    assert pending_to_evict_by_source(full, "10.0.0.200", 16) == [99]  # all hold one: the oldest goes
    crowded = {**{i: (100 + i, "10.0.0.66") for i in range(1, 5)},
               **{i: (i, f"10.0.0.{100 + i}") for i in range(5, 16)}, **slave}
    assert pending_to_evict_by_source(crowded, "10.0.0.201", 16) == [1]  # the crowded source pays, not the slave
    for _ in range(100):  # a hundred more from the flood: the slave's handshake stays
        crowded.pop(pending_to_evict_by_source(crowded, "10.0.0.66", 16)[0])
        crowded[max(crowded) + 1] = (1000 + len(crowded), "10.0.0.66")
        assert 99 in crowded
