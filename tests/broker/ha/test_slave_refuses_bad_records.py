"""A slave never appends what it has not checked (issue 11, defect 2): a fake master sends a well-formed frame
header with bad bytes at the slave's own offset; the slave refuses the frame, keeps its log as it was, drops the
link and reconnects; then the real master serves it and its commit log is the master's, byte for byte, and it
restarts cleanly. In-process: real file stores, the real HA service and client, a scripted master on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.ha import HAClient, HAConfig, HAService
from broker.ha.protocol import REPORT, encode_frame_header
from tests import waiting
from tests.broker.ha.conftest import FileKind

pytestmark = pytest.mark.ha

DEADLINE_S = 20.0


def _garbage(_master: Any, _report: int, _first: int) -> bytes:
    return random.Random(11).randbytes(1000)


def _good_then_bad(master: Any, report: int, first: int) -> bytes:
    """The master's own bytes from the slave's offset, with the body of the third record from ``first`` (the
    first connection's report) changed: good records, then a bad one."""
    end = int(master.max_physical_offset)
    spoilt = first + _record_start(FileKind().read_range(master, first, end), 2)
    data = bytearray(FileKind().read_range(master, report, end))
    data[spoilt - report + 100] ^= 0xFF
    return bytes(data)


def _record_start(data: bytes | bytearray, index: int) -> int:
    pos = 0
    for _ in range(index):
        pos += int.from_bytes(data[pos : pos + 4], "big")
    return pos


@pytest.mark.parametrize(("payload", "kept"), [(_garbage, 0), (_good_then_bad, 2)], ids=["garbage", "good-then-bad"])
def test_a_slave_refuses_bad_bytes_reconnects_and_stays_a_copy_of_its_master(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, payload: Callable[[Any, int, int], bytes], kept: int
) -> None:
    config = HAConfig(ha_send_heartbeat_interval_ms=200, ha_housekeeping_interval_ms=2000,
                      reconnect_backoff_min_ms=20, reconnect_backoff_max_ms=200)
    kind = FileKind()
    master, slave = kind.make(str(tmp_path / "master")), kind.make(str(tmp_path / "slave"))
    kind.write(master, 40, 500)
    fake_reports: list[int] = []
    sent: list[bytes] = []
    caplog.set_level(logging.INFO, logger="broker.ha.client")

    async def fake_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (report,) = REPORT.unpack(await reader.readexactly(8))
        fake_reports.append(report)
        body = payload(master, report, fake_reports[0])
        sent.append(body)
        writer.write(encode_frame_header(report, len(body)) + body)  # a correct header at the slave's offset
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            while await reader.read(1024):
                pass
        writer.close()

    async def scenario() -> tuple[int, int]:
        fake = await asyncio.start_server(fake_master, "127.0.0.1", 0)
        fake_addr = f"127.0.0.1:{fake.sockets[0].getsockname()[1]}"
        service = HAService(master, config)
        master.add_append_listener(lambda _end: service.notify_new_data())
        real_addr = f"127.0.0.1:{await service.start('127.0.0.1', 0)}"
        client = HAClient(slave, config, real_addr, rand=lambda: 0.5)
        await client.start()
        try:
            await waiting.wait_until(lambda: slave.max_physical_offset == master.max_physical_offset,
                                     DEADLINE_S, "first catch-up from the real master")
            before = int(slave.max_physical_offset)
            if kept:
                kind.write(master, 3 * kept, 500)  # the next records, which the fake master sends spoiled
            client.update_master_address(fake_addr)
            await waiting.wait_until(lambda: len(fake_reports) >= 2 or slave.max_physical_offset > before + 8192,
                                     DEADLINE_S, "the slave refusing the fake master's frame and reconnecting")
            refused_at = before + _record_start(sent[0], kept)
            assert slave.max_physical_offset == refused_at, (
                f"the slave's log moved from {before} to {slave.max_physical_offset}; only {kept} good records "
                f"(to {refused_at}) may be appended"
            )
            # It reconnected and reported where its log really ends: nothing of the bad record was kept.
            assert fake_reports[:2] == [before, refused_at], fake_reports
            assert client.connect_count >= 3
            client.update_master_address(real_addr)
            kind.write(master, 20, 500)
            await waiting.wait_until(lambda: slave.max_physical_offset == master.max_physical_offset,
                                     DEADLINE_S, "catch-up from the real master after the refusal")
            while slave.dispatch_available():
                pass
            assert slave.dispatch_behind_bytes == 0  # dispatch went on: no bad record stopped it
            return refused_at, int(master.max_physical_offset)
        finally:
            await client.stop()
            await service.stop()
            fake.close()
            await fake.wait_closed()

    try:
        refused_at, end = asyncio.run(scenario())
    finally:
        kind.close(slave)
        kind.close(master)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == "broker.ha.client"]
    assert any(f"physical offset {refused_at}" in m for m in errors), errors

    # Byte-identical commit logs (same files, same bytes), and the slave restarts on its log.
    master_files = sorted((tmp_path / "master" / "commitlog").iterdir())
    slave_files = sorted((tmp_path / "slave" / "commitlog").iterdir())
    assert [f.name for f in slave_files] == [f.name for f in master_files]
    for m, s in zip(master_files, slave_files, strict=True):
        assert s.read_bytes() == m.read_bytes(), f"{s.name} differs from the master's"
    again = kind.make(str(tmp_path / "slave"))
    try:
        assert again.max_physical_offset == end
    finally:
        kind.close(again)
