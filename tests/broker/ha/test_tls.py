"""The HA port under ``tlsEnable`` (issue 14 item 5), master and slave in one loop over loopback: the channel's TLS
path (one ``send`` per buffer, reads while OpenSSL holds decrypted bytes) moves megabytes byte-identical, with and
without the ``haAuthSecret`` handshake inside TLS; a slave that does not trust the master's certificate, a plain
slave, a plain master and a raw socket each replicate nothing and say why; mutual TLS refuses a slave without a
certificate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from broker.ha import HAConfig
from client.tls import LocalTlsFiles, generate_local_tls_files
from common.tls import client_context, server_context
from tests.broker.ha.test_auth import SECRET, SECRET_BODY, secret_log
from tests.broker.ha.test_replication import Run, assert_identical, master_service, slave_client, wait_until

pytestmark = pytest.mark.ha


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    return generate_local_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    """A second CA: its clients do not trust the first one's certificate."""
    return generate_local_tls_files(tmp_path_factory.mktemp("other-ca"))


def with_tls(config: HAConfig, files: LocalTlsFiles, *, ca: str | None = None) -> HAConfig:
    return attrs.evolve(config, tls_server=server_context(files.cert_file, files.key_file),
                        tls_client=client_context(ca or files.ca_file, ca_option="tlsCaFile"))


@pytest.mark.parametrize("secret", [b"", SECRET], ids=["tls", "tls+secret"])
def test_tls_replicates_byte_identical_and_acks(
    run: Run, kind: Any, stores: Callable[[str], Any], fast_config: HAConfig, tls_files: LocalTlsFiles,
    secret: bytes
) -> None:
    config = with_tls(attrs.evolve(fast_config, ha_auth_secret=secret), tls_files)
    master, slave = stores("master"), stores("slave")
    kind.write(master, 2, 1000)  # inside the first file: an empty slave starts from the master's last file

    async def scenario() -> None:
        async with master_service(master, config) as service, slave_client(slave, config, service.port) as client:
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "catch-up over TLS")
            kind.write(master, 1000, 3000)  # ~3 MB: many 16 KiB TLS records, partial sends, held decrypted bytes
            await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, "3 MB over TLS")
            for _ in range(5):
                end = kind.write(master, 10, 3000)
                assert await service.wait_for_ack(end, 5.0) is True  # a SYNC_MASTER send's wait
            assert client.connect_count == 1
            assert_identical(kind, master, slave, 0)

    run(scenario())


def test_a_slave_that_does_not_trust_the_master_replicates_nothing_and_says_why(
    run: Run, fast_config: HAConfig, tls_files: LocalTlsFiles, other_ca: LocalTlsFiles,
    caplog: pytest.LogCaptureFixture
) -> None:
    from tests.broker.ha.memlog import MemoryCommitLog

    master, slave = secret_log(), MemoryCommitLog()
    good = with_tls(fast_config, tls_files)
    distrusting = with_tls(fast_config, tls_files, ca=other_ca.ca_file)

    async def scenario() -> None:
        async with master_service(master, good) as service, slave_client(slave, distrusting, service.port) as bad:
            await wait_until(lambda: "TLS verification" in bad.last_error, "the slave to refuse the master")
            assert "tlsCaFile" in bad.last_error and bad.connect_count == 0
            assert slave.max_physical_offset == 0 and service.push2slave_max_offset == 0

    with caplog.at_level(logging.WARNING, logger="broker.ha"):
        run(scenario())
    assert any("TLS verification" in r.getMessage() for r in caplog.records)


def test_plain_and_tls_ends_do_not_replicate_and_say_why(
    run: Run, fast_config: HAConfig, tls_files: LocalTlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.broker.ha.memlog import MemoryCommitLog

    tls = with_tls(fast_config, tls_files)

    async def scenario() -> None:
        plain_slave = MemoryCommitLog()
        async with master_service(secret_log(), tls) as service, slave_client(plain_slave, fast_config,
                                                                              service.port) as client:
            await wait_until(lambda: client.connect_count >= 1 and not client.is_connected, "the link to drop")
            await wait_until(lambda: service.connection_count == 0, "the master to hold no connection")
            assert plain_slave.max_physical_offset == 0 and service.push2slave_max_offset == 0
        tls_slave = MemoryCommitLog()
        async with master_service(secret_log(), fast_config) as service, slave_client(tls_slave, tls,
                                                                                      service.port) as client:
            await wait_until(lambda: "does not speak TLS" in client.last_error or "TLS" in client.last_error,
                             "the TLS slave to name TLS")
            assert tls_slave.max_physical_offset == 0 and client.connect_count == 0

    with caplog.at_level(logging.INFO, logger="broker.ha"):
        run(scenario())
    assert any("TLS handshake" in r.getMessage() for r in caplog.records)


def test_a_raw_socket_sending_eight_zero_bytes_gets_no_byte_of_the_log(
    run: Run, fast_config: HAConfig, tls_files: LocalTlsFiles
) -> None:
    master = secret_log()
    config = attrs.evolve(with_tls(fast_config, tls_files), ha_auth_timeout_ms=500)

    async def scenario() -> None:
        async with master_service(master, config) as service:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            writer.write(bytes(8))  # the old attack: a report of offset 0
            got = bytearray()
            async with asyncio.timeout(5.0):
                with contextlib.suppress(ConnectionError):
                    while chunk := await reader.read(65536):
                        got += chunk
            writer.close()
            assert SECRET_BODY not in got and len(got) < 64, got  # at most a TLS alert
            assert service.push2slave_max_offset == 0 and service.status()["slaves"] == []

    run(scenario())


def test_mutual_tls_refuses_a_slave_without_a_certificate(
    run: Run, fast_config: HAConfig, tls_files: LocalTlsFiles, tmp_path: Path
) -> None:
    from tests.broker.ha.memlog import MemoryCommitLog

    master = secret_log()
    mutual = attrs.evolve(fast_config, tls_server=server_context(
        tls_files.cert_file, tls_files.key_file, ca_file=tls_files.ca_file, require_client_cert=True))
    anonymous = with_tls(fast_config, tls_files)
    certified = attrs.evolve(fast_config, tls_client=client_context(
        tls_files.ca_file, cert_file=tls_files.cert_file, key_file=tls_files.key_file))
    assert mutual.tls_server is not None and mutual.tls_server.verify_mode == ssl.CERT_REQUIRED

    async def scenario() -> None:
        async with master_service(master, mutual) as service:
            nobody = MemoryCommitLog()
            async with slave_client(nobody, anonymous, service.port) as client:
                await wait_until(lambda: client.connect_count >= 1 or bool(client.last_error), "an attempt")
                await wait_until(lambda: not client.is_connected, "the master to drop the slave")
            assert nobody.max_physical_offset == 0
            good = MemoryCommitLog()
            async with slave_client(good, certified, service.port):
                await wait_until(lambda: good.max_physical_offset == master.max_physical_offset, "mutual TLS")

    run(scenario())


def test_the_channel_moves_buffer_lists_through_small_socket_buffers_over_tls(tls_files: LocalTlsFiles) -> None:
    """Tiny kernel buffers force partial record writes and refused writes (retried with the same bytes first, as
    OpenSSL requires) on one side and reads that leave decrypted bytes inside OpenSSL on the other."""
    import os
    import socket

    from broker.ha import tls_io
    from broker.ha.channel import SocketChannel

    # The last one is a single TLS record bigger than the receive buffer: its tail waits inside OpenSSL with
    # nothing left on the socket to wake the reader.
    chunks = [os.urandom(n) for n in (1, 12, 70_000, 5, 16_384, 16_385, 250_000, 3)] * 12 + [os.urandom(10_000)]
    want = b"".join(chunks)

    async def scenario() -> bytes:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        server = tls_io.wrap(server_context(tls_files.cert_file, tls_files.key_file), a, server_side=True)
        client = tls_io.wrap(client_context(tls_files.ca_file), b, server_side=False, server_hostname="localhost")
        await asyncio.gather(tls_io.handshake(server, 5.0), tls_io.handshake(client, 5.0))
        got = bytearray()
        rbuf = memoryview(bytearray(7000))
        done = loop.create_future()

        def on_data(n: int) -> None:
            got.extend(rbuf[:n])
            if len(got) >= len(want) and not done.done():
                done.set_result(None)

        sender = SocketChannel(loop, server, get_buffer=lambda: memoryview(bytearray(1)), on_data=lambda n: None,
                               name="tls-sender")
        receiver = SocketChannel(loop, client, get_buffer=lambda: rbuf, on_data=on_data, name="tls-receiver")
        try:
            bufs = [memoryview(c) if i % 2 else c for i, c in enumerate(chunks)]
            rest = sender.send_some(bufs)
            await sender.send_all(rest)
            await asyncio.wait_for(done, 10.0)
        finally:
            sender.close("done")
            receiver.close("done")
        return bytes(got)

    assert asyncio.run(scenario()) == want
