"""The in-sync rule of a SYNC_MASTER, through the real HA service and loopback sockets (docs/HA.md "which slaves
count"): raw slave connections report offsets by hand, so each test decides exactly what the master has heard."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from broker.ha import HAConfig, HAService
from broker.ha.protocol import FRAME_HEADER, encode_report
from tests.broker.ha.conftest import FILE_SIZE

pytestmark = pytest.mark.ha

Run = Callable[[Coroutine[Any, Any, Any]], Any]
DEADLINE_S = 20.0


async def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.002)


class RawSlave:
    """One HA connection whose offset reports the test writes; it never reads the master's frames."""

    def __init__(self, service: HAService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.reader = reader
        """The master's frames (left unread unless a test reads them)."""
        self.writer = writer
        host, port = writer.get_extra_info("sockname")[:2]
        self.addr = f"{host}:{port}"
        self._reported = False

    @classmethod
    async def connect(cls, service: HAService, report: int | None = None) -> RawSlave:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        slave = cls(service, reader, writer)
        await wait_until(lambda: slave._entry() is not None, f"the master to accept {slave.addr}")
        if report is not None:
            await slave.report(report)
        return slave

    def _entry(self) -> dict[str, Any] | None:
        return next((s for s in self.service.status()["slaves"] if s["addr"] == self.addr), None)

    async def report(self, offset: int) -> None:
        """Send a report and wait until the master has taken it in.

        After the first report, an honest slave can only report bytes the master sent on this connection (it
        refuses anything past that), so the report waits until the master has sent up to ``offset``.
        """
        if self._reported:
            await wait_until(lambda: (self._entry() or {}).get("sentOffset", -1) >= offset,
                             f"the master to send {self.addr} up to {offset}")
        self._reported = True
        self.writer.write(encode_report(offset))
        await self.writer.drain()
        await wait_until(lambda: (self._entry() or {}).get("ackOffset") == offset, f"{self.addr}'s report {offset}")

    async def close(self) -> None:
        """Close the connection and wait until the master has forgotten it."""
        self.writer.close()
        await wait_until(lambda: self._entry() is None, f"the master to drop {self.addr}")


@contextlib.asynccontextmanager
async def master_service(store: Any, **config: Any) -> AsyncIterator[HAService]:
    service = HAService(store, HAConfig(ha_max_gap_not_in_sync=4096, **config))
    await service.start("127.0.0.1", 0)
    try:
        yield service
    finally:
        await service.stop()


def test_only_connected_slaves_own_acks_make_a_send_wait(run: Run, kind: Any, stores: Callable[[str], Any]) -> None:
    master = stores("master")
    end = kind.write(master, 20, 1000)  # ~20 KB: an empty slave is more than the 4 KiB gap behind

    async def scenario() -> None:
        async with master_service(master) as service:
            assert service.wait_for_replicas(end, 5.0) is None  # no slave
            in_sync = await RawSlave.connect(service, report=end)
            lagging = await RawSlave.connect(service, report=0)
            silent = await RawSlave.connect(service)  # never reports: acked -1
            fut = service.wait_for_replicas(end, 5.0)
            assert fut is not None and fut.done() and fut.result() is True  # the in-sync slave holds it already
            await in_sync.close()
            assert service.push2slave_max_offset == end  # 4.9.3 would still call the slave OK
            assert service.connection_count == 2 and service.in_sync_slave_count(end) == 0
            assert service.wait_for_replicas(end, 5.0) is None  # SLAVE_NOT_AVAILABLE at once
            await lagging.report(end - 4095)  # within the gap (strict <): in sync again, a send waits
            fut = service.wait_for_replicas(end, 5.0)
            assert fut is not None and not fut.done()
            await lagging.report(end)
            assert await asyncio.wait_for(fut, DEADLINE_S) is True
            await silent.close()
            await lagging.close()

    run(scenario())


def test_a_waiting_send_survives_its_slave_leaving_until_its_deadline(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """The slave a send waits for disconnects: the send does not fail early and its ack does not count; a slave
    connecting later and reporting past the offset completes it, else it ends False at its deadline."""
    master = stores("master")
    end = kind.write(master, 5, 1000)

    async def scenario() -> None:
        async with master_service(master) as service:
            loop = asyncio.get_running_loop()
            first = await RawSlave.connect(service, report=end - 100)
            rescued = service.wait_for_replicas(end, DEADLINE_S)
            assert rescued is not None
            await first.close()
            assert not rescued.done()
            newcomer = await RawSlave.connect(service, report=end)  # its first report is an ack
            assert rescued.done() and rescued.result() is True
            t0 = loop.time()
            expiring = service.wait_for_replicas(end + 1, 0.3)
            assert expiring is not None
            await newcomer.close()
            assert await expiring is False
            assert loop.time() - t0 >= 0.29  # at its deadline, not when the slave left
            assert service.status()["ackWaiters"] == 0

    run(scenario())


def test_an_empty_slave_gets_the_file_of_a_send_that_waited_for_it(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """A send waits while a slave is connected but silent (it counts, as in RocketMQ); the master moves on to its
    next file before the slave's first report, 0. An empty slave is streamed from the master's last file -- which
    would leave out the waiting send, whose SEND_OK then came from acks past it (what the chaos run saw as a
    replica missing acknowledged messages). It is streamed from the waiting send's file instead, so its ack is
    true."""
    master = stores("master")
    end = kind.write(master, 2, 1000)  # within the 4 KiB gap of a slave that has not reported

    async def scenario() -> None:
        async with master_service(master) as service:
            silent = await RawSlave.connect(service)
            early = service.wait_for_replicas(end, DEADLINE_S)
            assert early is not None and not early.done()
            kind.write(master, FILE_SIZE // 1000 + 8, 1000)  # into the next file
            assert master.max_physical_offset >= FILE_SIZE
            await silent.report(0)
            first_frame = FRAME_HEADER.unpack(await asyncio.wait_for(silent.reader.readexactly(12), DEADLINE_S))
            assert first_frame[0] == 0  # streamed from the first file, not from the last one (FILE_SIZE)
            await silent.report(end - 1)
            assert not early.done()
            await silent.report(end)
            assert await asyncio.wait_for(early, DEADLINE_S) is True
            await silent.close()

    run(scenario())


def test_three_replicas_need_two_connected_slaves(run: Run, kind: Any, stores: Callable[[str], Any]) -> None:
    master = stores("master")
    end = kind.write(master, 5, 1000)

    async def scenario() -> None:
        async with master_service(master, in_sync_replicas=3) as service:
            a = await RawSlave.connect(service, report=end - 10)
            assert service.wait_for_replicas(end, 5.0) is None  # one slave in sync, two needed
            b = await RawSlave.connect(service, report=end - 10)
            fut = service.wait_for_replicas(end, DEADLINE_S)
            assert fut is not None
            await a.report(end)
            assert not fut.done()  # one of two acks
            await a.close()
            await b.report(end)
            assert not fut.done()  # b's ack alone: a's left with it
            assert service.wait_for_replicas(end, 5.0) is None  # and new sends answer at once
            c = await RawSlave.connect(service, report=end)
            assert await asyncio.wait_for(fut, DEADLINE_S) is True
            await b.close()
            await c.close()

    run(scenario())


@pytest.mark.parametrize(
    ("config", "in_sync_slaves", "outcome"),
    [
        ({"in_sync_replicas": 1}, 0, "at once"),  # the master's copy is enough
        ({"in_sync_replicas": 3, "min_in_sync_replicas": 2, "enable_auto_in_sync_replicas": True}, 1, "waits"),
        ({"in_sync_replicas": 3, "min_in_sync_replicas": 2, "enable_auto_in_sync_replicas": True}, 0, "refused"),
        ({"in_sync_replicas": 3, "enable_auto_in_sync_replicas": True}, 0, "at once"),
    ],
)
def test_replica_settings(run: Run, stores: Callable[[str], Any], kind: Any, config: dict[str, Any],
                          in_sync_slaves: int, outcome: str) -> None:
    master = stores("master")
    end = kind.write(master, 5, 1000)

    async def scenario() -> None:
        async with master_service(master, **config) as service:
            slaves = [await RawSlave.connect(service, report=end - 10) for _ in range(in_sync_slaves)]
            fut = service.wait_for_replicas(end, DEADLINE_S)
            if outcome == "refused":
                assert fut is None
            elif outcome == "at once":
                assert fut is not None and fut.done() and fut.result() is True
            else:
                assert fut is not None and not fut.done()
                await slaves[0].report(end)
                assert await asyncio.wait_for(fut, DEADLINE_S) is True
            for slave in slaves:
                await slave.close()

    run(scenario())


async def _closed_by_master(reader: asyncio.StreamReader) -> None:
    """Read (and drop) the master's frames until it closes the connection."""
    while await reader.read(65536):
        pass


@pytest.mark.parametrize("first_report", [False, True], ids=["after-streaming", "first-report"])
def test_a_report_past_what_the_master_sent_is_a_protocol_error_never_an_ack(
    run: Run, kind: Any, stores: Callable[[str], Any], first_report: bool
) -> None:
    """Ack poisoning: a connection that reports 2^62 is closed and its report never completes a send, so later
    sends are not SEND_OK with no replica holding them (with the old rule every send after it was)."""
    master = stores("master")
    end = kind.write(master, 5, 1000)

    async def scenario() -> None:
        async with master_service(master) as service:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            if not first_report:
                writer.write(encode_report(0))  # a plausible first report: streaming starts
                await wait_until(lambda: any(s["sentOffset"] >= end for s in service.status()["slaves"]),
                                 "the master to stream the log to the fake slave")
            writer.write(encode_report(1 << 62))
            await writer.drain()
            await asyncio.wait_for(_closed_by_master(reader), DEADLINE_S)
            await wait_until(lambda: service.connection_count == 0, "the master to forget the connection")
            assert service.push2slave_max_offset < 1 << 62
            assert service.wait_for_replicas(end, 5.0) is None  # no slave: SLAVE_NOT_AVAILABLE at once
            writer.close()

    run(scenario())
