"""Issue 39, hole 3: a slave must never discard its replicated log on one frame's say-so.

The attack as found: a frame at a commit-log file start past the slave's end made the slave drop its whole log
("retention deleted the bytes between") -- from anyone the slave was pointed at, and with ``haAuthSecret`` from an
impostor that relayed the handshake to the real master. Each test plays the attacker against a slave holding a
log and checks the log is still all there afterwards. Both failed before the fix (the slave's log went from its
records to none)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import attrs
import pytest

from broker.ha import HAClient, HAConfig
from broker.ha.protocol import REPORT, encode_frame_header
from broker.peer_auth import CHALLENGE_SIZE, PROOF_SIZE, RESPONSE_SIZE
from common.codes import BrokerRole
from tests.broker.ha.conftest import FILE_SIZE, FileKind
from tests.broker.ha.test_replication import Run, master_service, wait_until

pytestmark = pytest.mark.ha

SECRET = b"a cluster secret of some length"


def slave_store(tmp_path: Any, name: str) -> tuple[Any, bytes]:
    """A file store holding ~3 files of records, turned slave; and its bytes."""
    kind = FileKind()
    store = kind.make(str(tmp_path / name))
    kind.write(store, 150, 1000)
    store.set_broker_role(BrokerRole.SLAVE)
    return store, kind.read_range(store, 0, int(store.max_physical_offset))


def far_file_start(store: Any) -> int:
    """A commit-log file start two files past the store's end: what the attacker's frame names."""
    return (int(store.max_physical_offset) // FILE_SIZE + 2) * FILE_SIZE


def assert_log_intact(store: Any, before: bytes) -> None:
    assert int(store.min_physical_offset) == 0 and int(store.max_physical_offset) == len(before), (
        store.min_physical_offset, store.max_physical_offset, len(before))
    assert FileKind().read_range(store, 0, len(before)) == before


def test_one_frame_past_the_end_from_an_unauthenticated_master_drops_nothing(
    run: Run, tmp_path: Any, fast_config: HAConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The default configuration (no haAuthSecret): whoever the slave is pointed at sends one 12-byte frame at a
    file start past the slave's end. The slave refuses it, keeps its log and says why."""
    slave, before = slave_store(tmp_path, "slave")
    far = far_file_start(slave)
    sent = asyncio.Event()
    caplog.set_level(logging.INFO, logger="broker.ha.client")

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(REPORT.size)
        writer.write(encode_frame_header(far, 0))  # one frame: "my log starts at far"
        await writer.drain()
        sent.set()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):
                pass
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HAClient(slave, fast_config, f"127.0.0.1:{port}", rand=lambda: 0.5)
        await client.start()
        try:
            await wait_until(lambda: int(slave.max_physical_offset) != len(before)
                             or (sent.is_set() and not client.is_connected), "the slave's answer to the frame")
        finally:
            await client.stop()
            server.close()
            await server.wait_closed()

    try:
        run(scenario())
        assert_log_intact(slave, before)
    finally:
        slave.shutdown()
    assert any("refusing to drop" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_an_impostor_relaying_the_handshake_to_the_real_master_neither_reads_the_log_nor_drops_the_slaves(
    run: Run, tmp_path: Any, fast_config: HAConfig
) -> None:
    """With haAuthSecret: the slave is pointed at an impostor (an open registration did that), which relays the
    handshake between the slave and the real master and then sends the slave one frame past its end. The
    handshake is bound to the address each side dialled or was dialled on, so the master refuses the relayed
    proof: the impostor reads no byte of the log, and the slave keeps its own."""
    config = attrs.evolve(fast_config, ha_auth_secret=SECRET, ha_auth_timeout_ms=2000)
    kind = FileKind()
    master = kind.make(str(tmp_path / "master"))
    kind.write(master, 50, 1000)
    slave, before = slave_store(tmp_path, "slave")
    far = far_file_start(slave)
    done = asyncio.Event()
    leaked = bytearray()

    async def scenario() -> None:
        async with master_service(master, config) as service:
            async def relay(s_reader: asyncio.StreamReader, s_writer: asyncio.StreamWriter) -> None:
                m_reader, m_writer = await asyncio.open_connection("127.0.0.1", service.port)
                try:
                    s_writer.write(await m_reader.readexactly(CHALLENGE_SIZE))
                    m_writer.write(await s_reader.readexactly(RESPONSE_SIZE))
                    proof = await m_reader.read(PROOF_SIZE)
                    if len(proof) < PROOF_SIZE:
                        return  # the master refused the relayed proof
                    s_writer.write(proof)
                    report = await s_reader.readexactly(REPORT.size)
                    m_writer.write(REPORT.pack(0))  # read the master's log from its start
                    s_writer.write(encode_frame_header(far, 0))
                    del report
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            while chunk := await m_reader.read(65536):
                                leaked.extend(chunk)
                except (ConnectionError, asyncio.IncompleteReadError):
                    pass
                finally:
                    done.set()
                    m_writer.close()
                    s_writer.close()

            server = await asyncio.start_server(relay, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            client = HAClient(slave, config, f"127.0.0.1:{port}", rand=lambda: 0.5)
            await client.start()
            try:
                await wait_until(done.is_set, "the relay's end")
            finally:
                await client.stop()
                server.close()
                await server.wait_closed()

    try:
        run(scenario())
        assert not leaked, f"the impostor read {len(leaked)} bytes of the master's log"
        assert_log_intact(slave, before)
    finally:
        slave.shutdown()
        master.shutdown()
