"""The DLedger peer port under ``tlsEnable`` (issue 14 item 5): three members in one loop elect and replicate over
TLS, with and without the cluster secret inside it; a member that does not trust the others' certificate cannot
ask them anything and says why; a plain socket gets no byte of the peer protocol; and a real DLedger
``LocalCluster(tls=True)`` elects, answers SEND_OK (a quorum over TLS) and catches its followers up."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from broker.dledger.protocol import MsgType
from broker.dledger.transport import PeerClient, PeerError
from client import Admin, ClientConfig, Message, Producer, SendStatus
from client.cluster import LocalCluster
from client.tls import LocalTlsFiles, generate_local_tls_files
from common.tls import client_context, server_context
from tests.broker.dledger.test_auth import SECRET
from tests.broker.dledger.test_server import Group, entries
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    return generate_local_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    return generate_local_tls_files(tmp_path_factory.mktemp("other-ca"))


def tls_group(root: Path, files: LocalTlsFiles, secret: bytes = b"") -> Group:
    return Group(root, tls_server=server_context(files.cert_file, files.key_file),
                 tls_client=client_context(files.ca_file, ca_option="tlsCaFile"), auth_secret=secret)


@pytest.mark.parametrize("secret", [b"", SECRET], ids=["tls", "tls+secret"])
def test_members_elect_and_replicate_over_tls(tmp_path: Path, tls_files: LocalTlsFiles, secret: bytes) -> None:
    async def main() -> None:
        g = tls_group(tmp_path, tls_files, secret)
        try:
            await g.start_all()
            lead = await g.wait_leader()
            results = await asyncio.gather(*(lead.append(b"m%d" % i) for i in range(30)))
            last = results[-1][0]
            for n in g.nodes.values():
                await wait_until(lambda n=n: n.store.committed_index >= last, 5, f"{n.state.self_id} commits {last}")
                assert entries(n, last) == entries(lead, last)
        finally:
            await g.stop_all()
            for s in g.socks:
                s.close()

    asyncio.run(main())


def test_a_member_that_distrusts_the_certificate_asks_nothing_and_says_why(
        tmp_path: Path, tls_files: LocalTlsFiles, other_ca: LocalTlsFiles) -> None:
    async def main() -> None:
        g = tls_group(tmp_path, tls_files)
        try:
            await g.start_all()
            lead = await g.wait_leader()
            distrusting = PeerClient("g", "n9", lead.state.self_id, g.peers[lead.state.self_id],
                                     tls=client_context(other_ca.ca_file, ca_option="tlsCaFile"))
            with pytest.raises(PeerError, match="TLS verification") as info:
                await distrusting.request(MsgType.HEARTBEAT, b"", 2.0)
            assert "tlsCaFile" in str(info.value)
            await distrusting.close()
            # A plain socket: the member closes it in the TLS handshake; no byte of the peer protocol comes back.
            host, _, port = g.peers[lead.state.self_id].rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(bytes(8) + b"GET / HTTP/1.1\r\n\r\n")
            got = bytearray()
            async with asyncio.timeout(5.0):
                with contextlib.suppress(ConnectionError):
                    while chunk := await reader.read(65536):
                        got += chunk
            writer.close()
            assert len(got) < 64 and b"DLEDGER" not in got, got  # at most a TLS alert
            # the group is fine: it has a leader that appends (on a loaded machine the leadership may have moved)
            await (await g.wait_leader()).append(b"the group is fine")
        finally:
            await g.stop_all()
            for s in g.socks:
                s.close()

    asyncio.run(main())


@pytest.mark.integration
def test_a_dledger_cluster_over_tls_elects_and_replicates(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, mode="dledger", peers_per_group=3, tls=True) as cluster:
        assert cluster.tls_ca_file is not None
        cluster.leader("broker-a")
        with Admin(cluster.namesrv_addr, client_config=ClientConfig(tls_ca_file=cluster.tls_ca_file)) as admin:
            admin.create_topic("TlsDLedger", queue_nums=4)
        with Producer("tls_dl_pg", cluster.namesrv_addr,
                      client_config=ClientConfig(tls_ca_file=cluster.tls_ca_file)) as p:
            for i in range(10):  # SEND_OK in DLedger mode: a quorum has the entry, over the TLS peer port
                assert p.send(Message("TlsDLedger", b"entry %d" % i)).send_status is SendStatus.SEND_OK
        cluster.wait_slave_caught_up("broker-a", timeout_s=15)
