"""The SDK, the CLI and the Spark connector against a real ``LocalCluster(tls=True, acl=True)`` in SYNC mode with a
slave (issue 14 item 5: "TLS on: SDK, CLI, Spark and replication work; a client with the wrong CA fails with a
clear error").

One cluster serves the module. Every port is TLS: HTTP of the nameserver and the brokers, the HA stream (with the
``haAuthSecret`` handshake inside it) and the broker's own calls (registration, the slave's metadata sync). A
SYNC_MASTER answers SEND_OK only once the slave acked over HA, so every SEND_OK here is replication over TLS.
A client with another CA, a plain client, and a TLS client of a plain cluster fail at once with an error naming
TLS and the CA option (not a retry loop, not a generic timeout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin, AsyncProducer, ClientConfig, Message, Producer, PullConsumer, PullStatus, SendStatus
from client.cluster import LocalCluster
from client.errors import ClientError, TlsError
from client.lowlevel import BrokerClient
from client.tls import LocalTlsFiles, generate_local_tls_files
from common.message import MessageQueue
from tests.serving import plain_http_refuser

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: A TLS misconfiguration fails well inside this: it is not retried and waits for no timeout.
FAILS_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tls"), slaves_per_group=1, mode="sync", tls=True, acl=True) as c:
        yield c


@pytest.fixture(scope="module")
def config(cluster: LocalCluster) -> ClientConfig:
    assert cluster.tls_ca_file is not None and cluster.admin_credentials is not None
    return ClientConfig(tls_ca_file=cluster.tls_ca_file, credentials=cluster.admin_credentials)


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster, config: ClientConfig) -> str:
    name = f"TlsT_{uuid.uuid4().hex[:6]}"
    with Admin(cluster.namesrv_addr, client_config=config) as adm:
        adm.create_topic(name, queue_nums=1)
    return name


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    return generate_local_tls_files(tmp_path_factory.mktemp("other-ca"))


def test_every_server_is_started_with_tls(cluster: LocalCluster) -> None:
    props = cluster.broker("broker-a", 1).config_path.read_text()
    for key in ("tlsEnable=true", "tlsCertFile=", "tlsKeyFile=", "tlsCaFile="):
        assert key in props
    assert "tls=on" in cluster.broker("broker-a", 0).log_path.read_text()
    with socket.create_connection(cluster.namesrv_addr.rsplit(":", 1)) as s:  # type: ignore[arg-type]
        s.settimeout(5.0)
        s.sendall(b"GET /cluster HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not s.recv(4096).startswith(b"HTTP/"), "the nameserver answered plain HTTP"


def test_produce_replicate_and_consume_from_master_and_slave(cluster: LocalCluster, config: ClientConfig,
                                                             topic: str) -> None:
    with Producer("tls_pg", cluster.namesrv_addr, client_config=config) as p:
        for i in range(20):  # SYNC_MASTER: SEND_OK means the slave acked over the TLS HA stream
            assert p.send(Message(topic, b"tls %d" % i)).send_status is SendStatus.SEND_OK
    mq = MessageQueue(topic, "broker-a", 0)
    with PullConsumer("tls_cg", cluster.namesrv_addr, client_config=config) as c:
        got = c.pull(mq, 0, max_nums=32)
        assert got.pull_status is PullStatus.FOUND and len(got.msg_found_list) == 20
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    slave = cluster.broker("broker-a", 1)
    with BrokerClient(cluster.namesrv_addr, config=config) as low:
        raw = low.pull_raw_from(slave.addr, mq, 0, group="tls_cg_slave", max_nums=32)
        assert raw.n_records == 20
    assert "https://" in slave.log_path.read_text()  # its registration and metadata sync went over TLS too


def test_async_producer_and_admin_over_tls(cluster: LocalCluster, config: ClientConfig, topic: str) -> None:
    async def send() -> SendStatus:
        async with AsyncProducer("tls_apg", cluster.namesrv_addr, client_config=config) as p:
            return (await p.send(Message(topic, b"async over tls"))).send_status

    assert asyncio.run(send()) is SendStatus.SEND_OK
    with Admin(cluster.namesrv_addr, client_config=config) as adm:
        assert "broker-a" in adm.cluster_info().broker_addr_table
        assert adm.topic_route(topic).broker_datas


def _fails_clearly(call: object, *words: str) -> ClientError:
    started = time.monotonic()
    with pytest.raises(ClientError) as info:
        call()  # type: ignore[operator]
    assert time.monotonic() - started < FAILS_WITHIN_S, "a TLS misconfiguration was retried or waited on"
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


def test_a_client_with_another_ca_fails_at_once_naming_tls_and_the_option(
    cluster: LocalCluster, config: ClientConfig, other_ca: LocalTlsFiles, topic: str
) -> None:
    wrong = ClientConfig(tls_ca_file=other_ca.ca_file, credentials=config.credentials)
    with Producer("tls_pg_wrong", cluster.namesrv_addr, client_config=wrong) as p:
        err = _fails_clearly(lambda: p.send(Message(topic, b"nope")), "TLS verification", "tls_ca_file")
    assert isinstance(err, TlsError) and not err.retriable
    with Admin(cluster.namesrv_addr, client_config=wrong) as adm:
        _fails_clearly(adm.cluster_info, "TLS verification")

    async def async_send() -> None:
        async with AsyncProducer("tls_apg_wrong", cluster.namesrv_addr, client_config=wrong) as p:
            await p.send(Message(topic, b"nope"))

    _fails_clearly(lambda: asyncio.run(async_send()), "TLS verification", "tls_ca_file")


def test_a_plain_client_of_a_tls_cluster_is_told_about_tls(cluster: LocalCluster, config: ClientConfig,
                                                           topic: str) -> None:
    # A TlsError (not retried), not a RouteNotFoundError to wait on: the client asks the port whether it speaks TLS
    # once a new plain connection was closed before any answer.
    plain = ClientConfig(credentials=config.credentials)
    with Producer("tls_pg_plain", cluster.namesrv_addr, client_config=plain) as p:
        err = _fails_clearly(lambda: p.send(Message(topic, b"nope")), "speaks TLS", "tls_ca_file")
    assert isinstance(err, TlsError) and not err.retriable
    with Admin(cluster.namesrv_addr, client_config=plain) as adm:
        assert isinstance(_fails_clearly(adm.cluster_info, "speaks TLS"), TlsError)

    async def async_send() -> None:
        async with AsyncProducer("tls_apg_plain", cluster.namesrv_addr, client_config=plain) as p:
            await p.send(Message(topic, b"nope"))

    assert isinstance(_fails_clearly(lambda: asyncio.run(async_send()), "speaks TLS", "tls_ca_file"), TlsError)


def test_a_tls_client_of_a_plain_server_is_told_it_does_not_speak_tls(cluster: LocalCluster) -> None:
    with plain_http_refuser() as (host, port):  # a plain HTTP port: answers 400 to a TLS handshake
        assert cluster.tls_ca_file is not None
        with Producer("tls_pg_x", f"{host}:{port}",
                      client_config=ClientConfig(tls_ca_file=cluster.tls_ca_file)) as p:
            _fails_clearly(lambda: p.send(Message("AnyTopic", b"nope")), "does not speak TLS", "tls_ca_file")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "client.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env)


def test_cli_over_tls(cluster: LocalCluster, config: ClientConfig, other_ca: LocalTlsFiles) -> None:
    assert config.credentials is not None and cluster.tls_ca_file is not None
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPLITMQ_")}
    base |= {"SPLITMQ_ACCESS_KEY": config.credentials.access_key, "SPLITMQ_SECRET_KEY": config.credentials.secret_key}
    new_topic = f"TlsCli_{uuid.uuid4().hex[:6]}"
    created = _cli("--tls-ca", cluster.tls_ca_file, "topic", "create", "-n", cluster.namesrv_addr, "-t", new_topic,
                   "-r", "1", "-w", "1", env=base)
    assert created.returncode == 0, created.stderr
    sent = _cli("produce", "-n", cluster.namesrv_addr, "-t", new_topic, "over tls",
                env={**base, "SPLITMQ_TLS_CA": cluster.tls_ca_file})
    assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stdout + sent.stderr
    plain = _cli("topic", "status", "-n", cluster.namesrv_addr, "-t", new_topic, "--timeout", "3", env=base)
    assert plain.returncode == 1 and "--tls-ca" in plain.stderr, plain.stderr
    wrong = _cli("--tls-ca", other_ca.ca_file, "topic", "status", "-n", cluster.namesrv_addr, "-t", new_topic,
                 "--timeout", "3", env=base)
    assert wrong.returncode == 1 and "TLS verification" in wrong.stderr and "--tls-ca" in wrong.stderr, wrong.stderr


def test_spark_connector_over_tls(cluster: LocalCluster, config: ClientConfig,
                                  caplog: pytest.LogCaptureFixture) -> None:
    """The connector's driver work (planning, the ``pullFrom=slave`` check) and executor work (write and read
    tasks) run here without Spark."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from spark_connector.options import OptionError, parse_sink_options, parse_source_options
    from spark_connector.sink import RocketMQBatchWriter
    from spark_connector.source import RocketMQBatchReader

    assert config.credentials is not None and cluster.tls_ca_file is not None
    name = f"TlsSpark_{uuid.uuid4().hex[:6]}"
    with Admin(cluster.namesrv_addr, client_config=config) as adm:
        adm.create_topic(name, queue_nums=2)
    opts = {"nameserver": cluster.namesrv_addr, "topic": name, "accessKey": config.credentials.access_key,
            "secretKey": config.credentials.secret_key, "tlsCaFile": cluster.tls_ca_file}
    batch = pa.record_batch({"body": pa.array([f"row {i}".encode() for i in range(10)], pa.binary())})
    assert RocketMQBatchWriter(parse_sink_options(opts)).write(iter([batch])).rows == 10
    reader = RocketMQBatchReader(parse_source_options(opts, streaming=False))
    bodies = [b for part in reader.partitions() for got in reader.read(part)
              for b in got.column(got.schema.get_field_index("body")).to_pylist()]
    assert sorted(bodies) == sorted(f"row {i}".encode() for i in range(10))
    with caplog.at_level(logging.WARNING, logger="spark_connector"):
        from_slave = RocketMQBatchReader(parse_source_options({**opts, "pullFrom": "slave"}, streaming=False))
        assert sum(got.num_rows for part in from_slave.partitions() for got in from_slave.read(part)) == 10
    assert not [r for r in caplog.records if "could not ask" in r.getMessage()], caplog.text
    with pytest.raises(OptionError, match="tlsCaFile"):
        parse_source_options({**opts, "tlsCaFile": "/nonexistent/ca.pem"}, streaming=False)


def test_tls_properties_name_the_cluster_files(tmp_path: Path) -> None:
    plain = LocalCluster(tmp_path / "plain")
    assert plain.tls_properties() == {} and plain.tls_ca_file is None
    tls = LocalCluster(tmp_path / "tls", tls=True)
    props = tls.tls_properties()
    assert props["tlsEnable"] == "true" and props["tlsCaFile"] == tls.tls_ca_file


def test_the_dashboard_sees_a_tls_cluster(cluster: LocalCluster, config: ClientConfig) -> None:
    from client.dashboard import DashboardServer
    from tests.waiting import poll_until

    server = DashboardServer(cluster.namesrv_addr, "127.0.0.1:0", request_timeout_s=2.0,
                             credentials=config.credentials, tls_ca_file=cluster.tls_ca_file)
    try:
        def members_up() -> bool:
            server.collector.sweep()
            snap = server.collector.snapshot()
            return bool(snap["ok"] and snap["groups"] and all(m["up"] for m in snap["groups"][0]["members"]))

        poll_until(members_up, 20, "the TLS cluster's members up in the dashboard's snapshot")
    finally:
        server.close()


def test_cli_cluster_up_tls_prints_the_ca_to_pass(tmp_path: Path) -> None:
    import signal

    base = {k: v for k, v in os.environ.items() if not k.startswith("SPLITMQ_")}
    with subprocess.Popen([sys.executable, "-m", "client.cli", "cluster", "up", "--root", str(tmp_path / "c"),
                           "--slaves", "0", "--tls"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, env=base) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            namesrv = proc.stdout.readline().strip().removeprefix("namesrv=")
            tls_line = proc.stdout.readline()
            assert tls_line.startswith("tls: CA file "), tls_line
            ca = tls_line.split()[3]
            assert Path(ca).is_file()
            created = _cli("--tls-ca", ca, "topic", "create", "-n", namesrv, "-t", "TlsUp", "-r", "1", "-w", "1",
                           env=base)
            assert created.returncode == 0, created.stderr
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
