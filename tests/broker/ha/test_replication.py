"""Master and slave in one event loop over loopback TCP, with real stores in temp dirs (the fake commit log,
and the file store once it exists): catch-up, resume, offset mismatch, acks, isSlaveOK, housekeeping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from broker.ha import HAClient, HAConfig, HAService
from broker.ha.protocol import REPORT, FrameDecoder, encode_frame_header, encode_report
from tests import waiting
from tests.broker.ha.memlog import MemoryCommitLog

pytestmark = pytest.mark.ha

Run = Callable[[Coroutine[Any, Any, Any]], Any]
DEADLINE_S = 20.0


async def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    """The suite's :func:`tests.waiting.wait_until` with this file's deadline."""
    await waiting.wait_until(pred, timeout_s, what)


@contextlib.asynccontextmanager
async def master_service(store: Any, config: HAConfig) -> AsyncIterator[HAService]:
    """An HA service on ``store``, subscribed to its append event as the broker's controller does."""
    service = HAService(store, config)
    store.add_append_listener(lambda _end: service.notify_new_data())
    await service.start("127.0.0.1", 0)
    try:
        yield service
    finally:
        await service.stop()


@contextlib.asynccontextmanager
async def slave_client(store: Any, config: HAConfig, port: int) -> AsyncIterator[HAClient]:
    client = HAClient(store, config, f"127.0.0.1:{port}", rand=lambda: 0.5)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


def last_file_start(store: Any) -> int:
    m = int(store.max_physical_offset)
    return m - m % int(store.mapped_file_size_commitlog)


def assert_identical(kind: Any, master: Any, slave: Any, begin: int) -> None:
    end = int(master.max_physical_offset)
    assert int(slave.max_physical_offset) == end, (begin, end, slave.max_physical_offset)
    got, want = kind.read_range(slave, begin, end), kind.read_range(master, begin, end)
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise AssertionError(f"slave differs from master at offset {begin + first} (range {begin}..{end})")


def test_empty_slave_catches_up_from_the_masters_last_file(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    master, slave = stores("master"), stores("slave")
    kind.write(master, 300, 1000)  # ~300 KB: several 64 KiB files
    start = last_file_start(master)
    assert start >= 4 * 64 * 1024, start

    async def scenario() -> None:
        async with master_service(master, fast_config) as service, slave_client(slave, fast_config, service.port):
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "initial catch-up")
            assert_identical(kind, master, slave, start)
            assert slave.min_physical_offset == start  # nothing before the master's last file
            # Live data (crossing into further files) flows without any explicit notify from the test.
            kind.write(master, 200, 1000)
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "live catch-up")
            assert_identical(kind, master, slave, start)
            await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset, "the ack")
            (entry,) = service.status()["slaves"]
            assert entry["ackOffset"] == master.max_physical_offset and entry["inSync"] and entry["diff"] == 0

    run(scenario())


def test_slave_restarted_mid_stream_resumes_from_its_own_offset(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    master, slave = stores("master"), stores("slave")
    kind.write(master, 50, 1000)
    start = last_file_start(master)

    async def scenario() -> None:
        async with master_service(master, fast_config) as service:
            async with slave_client(slave, fast_config, service.port):
                await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "first sync")
            await wait_until(lambda: service.connection_count == 0, "master noticing the slave left")
            resume_at = int(slave.max_physical_offset)
            kind.write(master, 150, 1000)
            async with slave_client(slave, fast_config, service.port) as client:
                await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "resume")
                (entry,) = service.status()["slaves"]
                # The new connection streamed exactly the missing bytes: it started at the slave's offset.
                assert entry["transferredBytes"] == master.max_physical_offset - resume_at
                assert client.connect_count == 1
            assert_identical(kind, master, slave, start)

    run(scenario())


async def _scripted_master(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]
                           ) -> asyncio.Server:
    return await asyncio.start_server(handler, "127.0.0.1", 0)


def test_frame_at_the_wrong_offset_disconnects_and_the_slave_recovers(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A scripted master: connection 1 sends data then a heartbeat past the slave's end, connection 2 a data
    frame past it (both mismatches: the slave drops the link), connection 3 resumes from the slave's report."""
    source = stores("source")
    kind.write(source, 20, 500)
    slave = stores("slave")
    reports: list[int] = []
    cut = _record_end_at_or_after(kind.read_range(source, 0, 8192), 4096)  # the slave appends whole records
    first = kind.read_range(source, 0, cut)
    rest_end = int(source.max_physical_offset)
    rest = kind.read_range(source, cut, rest_end)
    caplog.set_level(logging.INFO, logger="broker.ha.client")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (offset,) = REPORT.unpack(await reader.readexactly(8))
        reports.append(offset)
        if len(reports) == 1:  # empty slave: accepts any start
            writer.write(encode_frame_header(0, len(first)) + first)
            writer.write(encode_frame_header(cut + 100, 0))  # heartbeat with a gap of 100 bytes
        elif len(reports) == 2:
            writer.write(encode_frame_header(offset + 8, 10) + b"x" * 10)
        else:
            writer.write(encode_frame_header(offset, len(rest)) + rest)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):
                pass
        writer.close()

    async def scenario() -> None:
        server = await _scripted_master(handler)
        port = server.sockets[0].getsockname()[1]
        try:
            async with slave_client(slave, fast_config, port) as client:
                await wait_until(lambda: slave.max_physical_offset == rest_end, "recovery after the mismatches")
                assert reports == [0, cut, cut]
                assert client.connect_count == 3
                assert kind.read_range(slave, 0, rest_end) == kind.read_range(source, 0, rest_end)
        finally:
            server.close()
            await server.wait_closed()

    run(scenario())
    prefix = "HA client disconnected from "
    errors = [m.split(": ", 1)[1] for r in caplog.records if (m := r.getMessage()).startswith(prefix)]
    assert errors[:2] == [
        f"master sent phyOffset {cut + 100} but the slave's max offset is {cut}",
        f"master sent phyOffset {cut + 8} but the slave's max offset is {cut}",
    ]


def _record_end_at_or_after(data: bytes, at: int) -> int:
    """The first record boundary at or after ``at`` in ``data`` (records from offset 0)."""
    pos = 0
    while pos < at:
        pos += int.from_bytes(data[pos : pos + 4], "big")
    return pos


async def _paused_slave(port: int, report: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A slave that reports once and then neither reads nor reports."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_report(report))
    await writer.drain()
    return reader, writer


def test_wait_for_ack_true_when_a_slave_acks_and_waiters_share_acks(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    master, slave = stores("master"), stores("slave")
    kind.write(master, 10, 1000)

    async def scenario() -> None:
        async with master_service(master, fast_config) as service, slave_client(slave, fast_config, service.port):
            await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset, "catch-up ack")
            assert service.wait_for_ack(master.max_physical_offset, 0.01).result() is True  # already acked
            futures = []
            for _ in range(5):
                end = kind.write(master, 3, 1000)
                futures.append(service.wait_for_ack(end, 10.0))
            assert await asyncio.gather(*futures) == [True] * 5
            assert service.push2slave_max_offset == master.max_physical_offset

    run(scenario())


def test_wait_for_ack_false_after_the_timeout_when_the_slave_is_paused(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig
) -> None:
    master = stores("master")
    end = kind.write(master, 10, 1000)

    async def scenario() -> None:
        async with master_service(master, fast_config) as service:
            _, writer = await _paused_slave(service.port, 0)
            await wait_until(lambda: service.connection_count == 1, "paused slave connected")
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert await service.wait_for_ack(end, 0.3) is False
            assert loop.time() - t0 >= 0.29
            # stop() completes pending waiters with False.
            pending = service.wait_for_ack(end, 60.0)
            writer.close()
        assert pending.done() and pending.result() is False

    run(scenario())


def test_is_slave_ok(run: Run, kind: Any, stores: Callable[[str], Any]) -> None:
    config = HAConfig(ha_max_gap_not_in_sync=10_000, ha_send_heartbeat_interval_ms=200,
                      ha_housekeeping_interval_ms=2000)
    master, slave = stores("master"), stores("slave")
    where = kind.write(master, 30, 1000)  # ~30 KB in one 64 KiB file

    async def scenario() -> None:
        async with master_service(master, config) as service:
            assert service.is_slave_ok(where) is False  # no slave
            _, writer = await _paused_slave(service.port, 0)  # acked 0: more than the gap behind
            await wait_until(lambda: service.connection_count == 1, "paused slave connected")
            assert service.is_slave_ok(where) is False
            assert service.in_sync_slave_count(where) == 0
            writer.close()
            await wait_until(lambda: service.connection_count == 0, "paused slave gone")
            async with slave_client(slave, config, service.port):
                await wait_until(lambda: service.push2slave_max_offset == where, "real slave caught up")
                assert service.is_slave_ok(where) is True
                assert service.in_sync_slave_count(where) == 1
                assert service.is_slave_ok(where + 10_000) is False  # exactly the gap: strict <
            await wait_until(lambda: service.connection_count == 0, "real slave gone")
            assert service.is_slave_ok(where) is False  # push2 is kept, but nobody is connected

    run(scenario())


def test_master_housekeeping_drops_a_silent_slave(run: Run, stores: Callable[[str], Any]) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=300)
    master = stores("master")

    async def scenario() -> None:
        async with master_service(master, config) as service:
            reader, writer = await _paused_slave(service.port, 0)
            await wait_until(lambda: service.connection_count == 1, "slave connected")
            await wait_until(lambda: service.connection_count == 0, "silent slave dropped", timeout_s=5)
            # The master closed its end: the peer sees EOF after any heartbeats already sent.
            while await asyncio.wait_for(reader.read(4096), 5):
                pass
            writer.close()

    run(scenario())


def test_slave_housekeeping_drops_a_silent_master_and_reconnects(run: Run, stores: Callable[[str], Any]) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=300,
                      reconnect_backoff_min_ms=10, reconnect_backoff_max_ms=50)
    slave = stores("slave")
    connections: list[int] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):  # swallow reports, never answer
                pass
        writer.close()

    async def scenario() -> None:
        server = await _scripted_master(silent)
        try:
            async with slave_client(slave, config, server.sockets[0].getsockname()[1]) as client:
                await wait_until(lambda: client.connect_count >= 2, "reconnect after housekeeping", 5)
                assert "no bytes from the master" in client.last_error
        finally:
            server.close()
            await server.wait_closed()

    run(scenario())


def test_heartbeats_keep_an_idle_link_alive(run: Run, kind: Any, stores: Callable[[str], Any]) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=50, ha_housekeeping_interval_ms=500)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 5, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, slave_client(slave, config, service.port) as client:
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up")
            # Idle for 3 housekeeping intervals: only heartbeats cross the link, and they must keep both ends up
            # (a silent end is dropped after one interval, and the slave's reconnect would count).
            idle_until = client.last_read_ms + 3 * config.ha_housekeeping_interval_ms
            await wait_until(lambda: client.last_read_ms >= idle_until, "bytes from the master after 3 intervals",
                             timeout_s=5)
            assert client.connect_count == 1 and client.is_connected
            assert service.connection_count == 1
            status = client.status()
            assert status["connected"] and status["maxOffset"] == master.max_physical_offset

    run(scenario())


def test_two_slaves_both_catch_up(run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig) -> None:
    master, s1, s2 = stores("master"), stores("s1"), stores("s2")
    kind.write(master, 100, 1000)
    start = last_file_start(master)

    async def scenario() -> None:
        async with (
            master_service(master, fast_config) as service,
            slave_client(s1, fast_config, service.port),
            slave_client(s2, fast_config, service.port),
        ):
            done = lambda: s1.max_physical_offset == s2.max_physical_offset == master.max_physical_offset  # noqa: E731
            await wait_until(done, "both slaves caught up")
            kind.write(master, 100, 1000)
            await wait_until(done, "both slaves caught up with live data")
            await wait_until(lambda: service.in_sync_slave_count(master.max_physical_offset) == 2, "both acked")
            assert len(service.status()["slaves"]) == 2
        assert_identical(kind, master, s1, start)
        assert_identical(kind, master, s2, start)

    run(scenario())


def test_master_frames_respect_batch_size_and_file_boundaries(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """A raw slave reading the stream: bodies <= haTransferBatchSize, never crossing a file, contiguous."""
    config = HAConfig(ha_transfer_batch_size=5000, ha_send_heartbeat_interval_ms=100,
                      ha_housekeeping_interval_ms=2000)
    master = stores("master")
    end = kind.write(master, 150, 1000)
    file_size = int(master.mapped_file_size_commitlog)
    begin = 100  # a non-empty slave's report: streamed from there, across every file

    async def scenario() -> list[tuple[int, bytes]]:
        async with master_service(master, config) as service:
            reader, writer = await _paused_slave(service.port, begin)
            decoder = FrameDecoder(1 << 20)
            frames: list[tuple[int, bytes]] = []
            pos = begin
            while pos < end:
                for frame in decoder.feed(await asyncio.wait_for(reader.read(65536), DEADLINE_S)):
                    frames.append((frame.phy_offset, bytes(frame.body)))
                    pos = frame.phy_offset + len(frame.body)
            writer.close()
            return frames

    frames = run(scenario())
    data = [f for f in frames if f[1]]
    assert data[0][0] == begin
    for (off, body), (next_off, _) in zip(data, [*data[1:], (end, b"")], strict=True):
        assert len(body) <= 5000, off
        assert off % file_size + len(body) <= file_size, f"frame at {off} crosses a file"
        assert off + len(body) == next_off, f"gap after the frame at {off}"
    assert b"".join(body for _, body in data) == kind.read_range(master, begin, end)


def test_client_address_rules() -> None:
    client = HAClient(object(), HAConfig(), None)  # type: ignore[arg-type]
    client.update_master_address(None)
    assert client.master_ha_addr is None
    client.update_master_address("10.0.0.1:10912")
    client.update_master_address(None)  # docs/BEHAVIOUR.md 2.2: a null result keeps the known address
    assert client.master_ha_addr == "10.0.0.1:10912"
    with pytest.raises(ValueError, match="not host:port"):
        client.update_master_address("10.0.0.1")
    with pytest.raises(ValueError, match="not host:port"):
        HAClient(object(), HAConfig(), "host:99999")  # type: ignore[arg-type]


def test_stop_is_idempotent_and_start_twice_is_refused(run: Run, stores: Callable[[str], Any]) -> None:
    master = stores("master")

    async def scenario() -> None:
        service = HAService(master, HAConfig())
        port = await service.start("127.0.0.1", 0)
        assert port > 0
        with pytest.raises(RuntimeError, match="started"):
            await service.start("127.0.0.1", 0)
        await service.stop()
        await service.stop()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        client = HAClient(master, HAConfig(), f"127.0.0.1:{port}")
        await client.start()
        with pytest.raises(RuntimeError, match="started"):
            await client.start()
        await client.stop()
        await client.stop()
        assert not client.is_connected

    run(scenario())



def test_wait_for_ack_bound_and_cancellation(run: Run, stores: Callable[[str], Any]) -> None:
    master = stores("master")

    async def scenario() -> None:
        async with master_service(master, HAConfig(ha_max_ack_waiters=2)) as service:
            first = service.wait_for_ack(100, 60.0)
            second = service.wait_for_ack(200, 60.0)
            refused = service.wait_for_ack(300, 60.0)
            assert refused.done() and refused.result() is False  # ha_max_ack_waiters reached
            first.cancel()  # the caller gave up: the slot is free again
            await asyncio.sleep(0)
            third = service.wait_for_ack(300, 60.0)
            assert not third.done() and not second.done()
        assert second.result() is False and third.result() is False  # stop() completes pending waits

    run(scenario())


def test_replication_on_uvloop(kind: Any, stores: Callable[[str], Any], fast_config: HAConfig) -> None:
    """The broker may run on uvloop: the raw-socket channel must work there too."""
    master, slave = stores("master"), stores("slave")
    kind.write(master, 100, 1000)
    start = last_file_start(master)

    async def scenario() -> None:
        async with master_service(master, fast_config) as service, slave_client(slave, fast_config, service.port):
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up")
            end = kind.write(master, 100, 1000)
            assert await service.wait_for_ack(end, DEADLINE_S) is True

    uvloop.run(scenario())
    assert_identical(kind, master, slave, start)


def test_new_data_reaches_the_slave_without_waiting_for_a_heartbeat(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """With a 60 s heartbeat, only the append notification can move live data within the deadline."""
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 5, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, slave_client(slave, config, service.port):
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up")
            for _ in range(3):
                end = kind.write(master, 2, 500)
                assert await service.wait_for_ack(end, 3.0) is True

    run(scenario())


def test_notify_new_data_from_another_thread(run: Run) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000)
    master, slave = MemoryCommitLog(), MemoryCommitLog()
    master.append_record(b"a" * 100)

    async def scenario() -> None:
        async with master_service(master, config) as service, slave_client(slave, config, service.port):
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up")
            master._listeners.clear()  # only the explicit, cross-thread notification may wake the writer
            end = master.append_record(b"b" * 100)
            await asyncio.to_thread(service.notify_new_data)
            assert await service.wait_for_ack(end, 3.0) is True
            service.notify_new_data()  # no connections waiting: harmless
        service.notify_new_data()  # after stop: a no-op

    run(scenario())


def _writers_idle(service: HAService) -> bool:
    return bool(service._conns) and all(c._idle for c in service._conns.values())


def _data_frames(sock: socket.socket, begin: int, end: int) -> list[tuple[int, bytes]]:
    """Blocking reads of the data frames from ``begin`` until ``end``, as ``(phyOffset, body)``; fails on a gap
    or the socket timeout."""
    decoder = FrameDecoder(1 << 22)
    frames: list[tuple[int, bytes]] = []
    pos = begin
    while pos < end:
        for frame in decoder.feed(memoryview(sock.recv(1 << 20))):
            if frame.body:
                assert frame.phy_offset == pos, f"frame at {frame.phy_offset}, expected {pos}"
                frames.append((pos, bytes(frame.body)))
                pos += len(frame.body)
    return frames


def _read_frames(sock: socket.socket, begin: int, end: int) -> bytes:
    """The bytes of the data frames from ``begin`` until ``end`` (:func:`_data_frames`)."""
    return b"".join(body for _, body in _data_frames(sock, begin, end))


@contextlib.asynccontextmanager
async def idle_raw_slave(service: HAService, begin: int) -> AsyncIterator[socket.socket]:
    """A plain socket that reported ``begin`` to ``service``, once the master's writer is caught up and idle."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=DEADLINE_S) as sock:
        sock.sendall(encode_report(begin))
        await wait_until(lambda: _writers_idle(service), "writer caught up and idle")
        yield sock


def test_an_append_is_sent_to_an_idle_slave_before_the_loop_turns(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """The SYNC_MASTER round trip starts inside the append: the bytes are on the wire while this coroutine still
    holds the loop, so the writer task cannot have sent them."""
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000)
    master = stores("master")
    begin = kind.write(master, 5, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, idle_raw_slave(service, begin) as sock:
            end = kind.write(master, 3, 1000)
            sock.settimeout(2.0)  # blocking the loop: only a send made inside the append can arrive
            assert _read_frames(sock, begin, end) == kind.read_range(master, begin, end)

    run(scenario())


def test_a_push_the_socket_cannot_take_whole_is_finished_by_the_writer_in_order(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """Tiny socket buffers and a slave that does not read: pushes are cut short; the stream stays contiguous."""
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000)
    master = stores("master")
    begin = kind.write(master, 2, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", service.port))
            with sock:
                sock.sendall(encode_report(begin))
                await wait_until(lambda: _writers_idle(service), "writer caught up and idle")
                conn = next(iter(service._conns.values()))
                conn.channel._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                cut_short = []
                send_some = conn.channel.send_some

                def recording(bufs: Any) -> Any:
                    rest = send_some(bufs)
                    cut_short.append(bool(rest))
                    return rest

                conn.channel.send_some = recording  # type: ignore[method-assign]
                for _ in range(20):
                    kind.write(master, 4, 1000)
                    await asyncio.sleep(0)
                end = master.max_physical_offset
                assert any(cut_short), "no push was cut short: the test did not exercise the carry"
                sock.setblocking(False)
                loop = asyncio.get_running_loop()
                got = bytearray()
                decoder = FrameDecoder(1 << 22)
                pos = begin
                while pos < end:
                    data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), DEADLINE_S)
                    assert data, "master closed the connection"
                    for frame in decoder.feed(memoryview(data)):
                        if frame.body:
                            assert frame.phy_offset == pos, f"frame at {frame.phy_offset}, expected {pos}"
                            got += frame.body
                            pos += len(frame.body)
                assert bytes(got) == kind.read_range(master, begin, end)

    run(scenario())


def test_small_appends_wait_for_the_transfer_delay_and_go_together(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """An ASYNC_MASTER's small appends are not sent from the append: the writer sends them together once
    ``ha_transfer_delay_ms`` has passed, in one frame."""
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000,
                      ha_transfer_delay_ms=50)
    master = stores("master")
    begin = kind.write(master, 2, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, idle_raw_slave(service, begin) as sock:
            conn = next(iter(service._conns.values()))
            assert conn.sent_to == begin
            kind.write(master, 1, 300)
            end = kind.write(master, 1, 300)
            assert conn.sent_to == begin, "a small append was sent at once"
            await wait_until(lambda: conn.sent_to == end, "the delayed transfer")
            frames = _data_frames(sock, begin, end)
            assert [(at, len(body)) for at, body in frames] == [(begin, end - begin)]
            assert frames[0][1] == kind.read_range(master, begin, end)

    run(scenario())


def test_a_transfer_batch_of_waiting_bytes_goes_at_once_despite_the_delay(
    run: Run, kind: Any, stores: Callable[[str], Any]
) -> None:
    """Once ``ha_transfer_batch_size`` bytes wait, the append sends them itself (a minute's delay notwithstanding)."""
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000,
                      ha_transfer_batch_size=4096, ha_transfer_delay_ms=60_000)
    master = stores("master")
    begin = kind.write(master, 2, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, idle_raw_slave(service, begin) as sock:
            end = kind.write(master, 2, 2200)  # > 4096 bytes waiting once both are in (one append or two)
            sock.settimeout(2.0)  # blocking the loop: only a send made inside an append can arrive
            assert _read_frames(sock, begin, end) == kind.read_range(master, begin, end)

    run(scenario())


def test_stop_cancels_a_pending_delayed_transfer(run: Run, kind: Any, stores: Callable[[str], Any]) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=60_000, ha_housekeeping_interval_ms=120_000,
                      ha_transfer_delay_ms=60_000)
    master = stores("master")
    begin = kind.write(master, 2, 500)

    async def scenario() -> None:
        async with master_service(master, config) as service, idle_raw_slave(service, begin):
            kind.write(master, 1, 100)
            timer = service._transfer_timer
            assert timer is not None
        assert timer.cancelled() and service._transfer_timer is None
        kind.write(master, 1, 100)  # an append after stop schedules nothing
        assert service._transfer_timer is None

    run(scenario())
