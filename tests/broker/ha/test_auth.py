"""The HA port with ``haAuthSecret`` (issue 14 item 4), master and slave in one loop over loopback TCP: the same
secret replicates as before; eight zero bytes (the attack that used to get the whole commit log), garbage, a
silent socket, a slave with a wrong secret, a slave without one, a fake master: each gets 0 bytes of the log and
is disconnected, while the real slave keeps replicating and acking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from broker.ha import HAConfig
from broker.ha.protocol import encode_frame_header
from broker.peer_auth import CHALLENGE_SIZE, MAGIC, VERSION, ChannelKind, ServerHandshake, addr_name
from tests.broker.ha.memlog import MemoryCommitLog
from tests.broker.ha.test_replication import Run, assert_identical, master_service, slave_client, wait_until

pytestmark = pytest.mark.ha

SECRET = b"a cluster secret of some length"
SECRET_BODY = b"TOP-SECRET-BODY-"


@pytest.fixture
def auth_config(fast_config: HAConfig) -> HAConfig:
    return attrs.evolve(fast_config, ha_auth_secret=SECRET, ha_auth_timeout_ms=500)


def secret_log(n: int = 40) -> MemoryCommitLog:
    """A master log whose every record carries ``SECRET_BODY``, so a leak of any record is visible."""
    log = MemoryCommitLog()
    for i in range(n):
        log.append_record(SECRET_BODY + b"%06d" % i + b"x" * 500)
    return log


async def raw_exchange(port: int, send: bytes, timeout_s: float = 5.0) -> bytes:
    """Connect, send ``send``, read until the master closes the connection (it must, within ``timeout_s``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if send:
            writer.write(send)
            await writer.drain()
        got = bytearray()
        async with asyncio.timeout(timeout_s):
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    got += chunk
        return bytes(got)
    finally:
        writer.close()


def test_the_same_secret_replicates_as_before(
    run: Run, kind: Any, stores: Callable[[str], Any], auth_config: HAConfig
) -> None:
    master, slave = stores("master"), stores("slave")
    kind.write(master, 50, 1000)

    async def scenario() -> None:
        async with master_service(master, auth_config) as service, slave_client(slave, auth_config, service.port):
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up")
            end = kind.write(master, 20, 1000)
            assert await service.wait_for_ack(end, 5.0) is True  # a SYNC_MASTER send's wait
            assert_identical(kind, master, slave, 0)

    run(scenario())


@pytest.mark.parametrize(("what", "send"), [
    ("eight zero bytes (a report of offset 0: the old attack)", bytes(8)),
    ("garbage", b"GET /ha HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4),
    ("the right magic and a made-up proof", MAGIC + bytes([VERSION, ChannelKind.HA]) + bytes(48)),
    ("a DLedger client's response", MAGIC + bytes([VERSION, ChannelKind.DLEDGER]) + bytes(48)),
    ("nothing (the handshake times out)", b""),
])
def test_a_connection_without_the_secret_gets_no_byte_of_the_log_and_is_closed(
    run: Run, auth_config: HAConfig, what: str, send: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    master = secret_log()

    async def scenario() -> None:
        async with master_service(master, auth_config) as service:
            got = await raw_exchange(service.port, send)
            # The challenge and nothing else: no frame header, no record.
            assert len(got) == CHALLENGE_SIZE and got.startswith(MAGIC + bytes([VERSION, ChannelKind.HA])), (what, got)
            assert SECRET_BODY not in got
            await wait_until(lambda: service.connection_count == 0, "closed")  # (wait_until returns None)
            assert service.push2slave_max_offset == 0 and service.status()["slaves"] == []

    with caplog.at_level(logging.WARNING, logger="broker.ha"):
        run(scenario())
    assert any("handshake" in r.getMessage() for r in caplog.records), what


def test_a_slave_with_a_wrong_secret_gets_nothing_while_the_real_one_replicates(
    run: Run, kind: Any, stores: Callable[[str], Any], auth_config: HAConfig, caplog: pytest.LogCaptureFixture
) -> None:
    master, slave, intruder = stores("master"), stores("slave"), stores("intruder")
    kind.write(master, 30, 1000)
    wrong = attrs.evolve(auth_config, ha_auth_secret=b"not the cluster secret")

    async def scenario() -> None:
        async with master_service(master, auth_config) as service, slave_client(slave, auth_config, service.port):
            await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset, "real slave acked")
            async with slave_client(intruder, wrong, service.port) as bad:
                await wait_until(lambda: "handshake" in bad.last_error, "the intruder refused")
                for _ in range(5):  # SYNC waits keep succeeding while the intruder keeps trying
                    end = kind.write(master, 4, 1000)
                    assert await service.wait_for_ack(end, 5.0) is True
                await wait_until(lambda: "handshake" in bad.last_error and bad.connect_count == 0,
                                 "the intruder still refused after retrying")
                assert intruder.max_physical_offset == 0
                # Polled: an intruder's attempt is a connection for the instant it takes to refuse it.
                await wait_until(lambda: [s["ackOffset"] for s in service.status()["slaves"]]
                                 == [master.max_physical_offset], "only the real slave counted")
            assert_identical(kind, master, slave, 0)

    with caplog.at_level(logging.WARNING, logger="broker.ha"):
        run(scenario())
    assert any("failed the handshake" in r.getMessage() and "client's proof is wrong" in r.getMessage()
               for r in caplog.records)


def test_a_slave_without_the_secret_and_a_master_without_it_do_not_replicate(
    run: Run, auth_config: HAConfig, fast_config: HAConfig
) -> None:
    """Mismatched configuration fails closed both ways, with an error that says why."""
    async def scenario() -> None:
        master = secret_log()
        old_slave = MemoryCommitLog()
        async with master_service(master, auth_config) as service, slave_client(old_slave, fast_config,
                                                                                service.port) as client:
            await wait_until(lambda: client.connect_count >= 2, "the old slave retried")
            assert old_slave.max_physical_offset == 0 and service.push2slave_max_offset == 0
        new_slave = MemoryCommitLog()
        async with master_service(master, fast_config) as service, slave_client(new_slave, auth_config,
                                                                               service.port) as client:
            await wait_until(lambda: "did not finish within 0.5 s" in client.last_error, "the slave gave up on it")
            assert new_slave.max_physical_offset == 0 and service.push2slave_max_offset == 0

    run(scenario())


def test_a_fake_master_without_the_secret_cannot_feed_the_slave(run: Run, auth_config: HAConfig) -> None:
    """The slave checks the master's proof before it reports or appends: an impostor's frames never land."""
    source = secret_log(5)
    data = source.read_range(0, source.max_physical_offset)
    slave = MemoryCommitLog()
    responses: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Plays the master's part with another secret: a valid-looking challenge, then a proof it cannot compute,
        # then frames as if the slave had reported 0.
        writer.write(ServerHandshake(b"the impostor's guess", ChannelKind.HA).start())
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            responses.append(await reader.readexactly(54))
            writer.write(bytes(32) + encode_frame_header(0, len(data)) + data)
            await writer.drain()
            await reader.read()
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with slave_client(slave, auth_config, port) as client:
                await wait_until(lambda: len(responses) >= 2, "the slave tried twice")
                assert "server's proof is wrong" in client.last_error
                assert slave.max_physical_offset == 0 and client.connect_count == 0
        finally:
            server.close()
            await server.wait_closed()

    run(scenario())


def test_handshaking_junk_cannot_lock_the_real_slave_out(
    run: Run, kind: Any, stores: Callable[[str], Any], auth_config: HAConfig
) -> None:
    """Issue 11 item 3 with the handshake: a connection still handshaking is pending, so a flood of them is cut to
    the pending cap (oldest first) and the real slave gets in, passes, and acks a SYNC wait."""
    config = attrs.evolve(auth_config, ha_max_pending_connections=8, ha_auth_timeout_ms=3000,
                          ha_pending_timeout_ms=3000, ha_housekeeping_interval_ms=20_000)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 10, 1000)

    async def scenario() -> None:
        async with master_service(master, config) as service:
            loop = asyncio.get_running_loop()
            flood: list[socket.socket] = []
            try:
                for i in range(100):
                    s = socket.socket()
                    flood.append(s)
                    s.setblocking(False)
                    await loop.sock_connect(s, ("127.0.0.1", service.port))
                    if i % 10 == 0:
                        await loop.sock_sendall(s, MAGIC[:2])  # a handshake begun, never finished
                await wait_until(lambda: service.connection_count <= 8, "the flood cut to the pending cap", 5.0)
                async with slave_client(slave, config, service.port):
                    await wait_until(lambda: service.push2slave_max_offset == master.max_physical_offset,
                                     "the real slave's catch-up ack", 5.0)
                    end = kind.write(master, 3, 1000)
                    assert await service.wait_for_ack(end, 2.0) is True
            finally:
                for s in flood:
                    s.close()

    run(scenario())


def test_the_secret_comes_from_the_broker_properties_and_is_never_shown() -> None:
    from broker.config import BrokerConfig

    cfg = BrokerConfig.from_properties({"haAuthSecret": "s3cret-value-0123456789"})
    assert cfg.to_ha_config().ha_auth_secret == b"s3cret-value-0123456789"
    assert "s3cret" not in repr(cfg) and "s3cret" not in repr(cfg.to_ha_config())
    assert BrokerConfig.from_properties({}).to_ha_config().ha_auth_secret == b""
    assert BrokerConfig.from_properties({"haAuthSecret": ""}).ha_auth_secret == ""


def test_a_master_address_change_during_the_handshake_goes_to_the_new_master(
    run: Run, auth_config: HAConfig
) -> None:
    """The nameserver names a new master while the slave is still handshaking with the old one: the slave does not
    start a session with the old one (no report reaches it), it goes to the new one."""
    master, slave = secret_log(10), MemoryCommitLog()
    after_proof: list[bytes] = []

    async def scenario() -> None:
        moved = asyncio.Event()
        answered = asyncio.Event()

        async def old_master(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hs = ServerHandshake(SECRET, ChannelKind.HA, names=(addr_name(writer.get_extra_info("sockname")),))
            writer.write(hs.start())
            proof = hs.feed(await reader.readexactly(54))
            answered.set()
            await moved.wait()  # the proof arrives only after the address changed
            writer.write(proof)
            with contextlib.suppress(ConnectionError):
                after_proof.append(await reader.read(8))  # b"" when the slave hangs up
            writer.close()

        old = await asyncio.start_server(old_master, "127.0.0.1", 0)
        try:
            async with master_service(master, auth_config) as service, slave_client(
                    slave, auth_config, old.sockets[0].getsockname()[1]) as client:
                await asyncio.wait_for(answered.wait(), 5)
                client.update_master_address(f"127.0.0.1:{service.port}")
                moved.set()
                await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "the new master")
                await wait_until(lambda: after_proof, "the old master's connection closed")
                assert after_proof == [b""]  # no offset report went to the old master
        finally:
            old.close()
            await old.wait_closed()

    run(scenario())
