"""The SDK and the CLI against a real ``LocalCluster(acl=True)`` (issue 14, items 6 and 7).

One cluster serves the module: the admin account of ``cluster.admin_credentials`` produces, consumes and
administers; a client without credentials, or with a wrong secret, is refused at once with AccessDeniedError
(NO_PERMISSION, not retried: no hang, no SendFailedError after a round of attempts); a second account added to
the watched accounts file gets exactly the permissions it was given, and the refusal names the missing one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import (
    Admin,
    AsyncProducer,
    Credentials,
    GroupConsumer,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    SendStatus,
)
from client.cluster import LocalCluster
from client.errors import AccessDeniedError
from common.message import MessageQueue
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: A refused call returns well inside this (it is never retried nor waits for a timeout).
REFUSED_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("acl"), broker_groups=1, slaves_per_group=0, acl=True) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Credentials:
    assert cluster.admin_credentials is not None
    return cluster.admin_credentials


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster, admin: Credentials) -> str:
    name = f"AclT_{uuid.uuid4().hex[:6]}"
    with Admin(cluster.namesrv_addr, credentials=admin) as adm:
        adm.create_topic(name, queue_nums=1)
    return name


def test_the_cluster_files_hold_the_admin_account_owner_only(cluster: LocalCluster, admin: Credentials) -> None:
    assert cluster.acl_file is not None and cluster.ha_auth_secret
    text = cluster.acl_file.read_text()
    assert admin.access_key in text and admin.secret_key in text and "admin = true" in text
    assert cluster.acl_file.stat().st_mode & 0o777 == 0o600
    props = cluster.broker("broker-a", 0).config_path
    assert props.stat().st_mode & 0o777 == 0o600 and "aclEnable=true" in props.read_text()
    assert admin.secret_key not in repr(admin) and admin.secret_key not in repr(cluster.broker("broker-a", 0))


def test_admin_account_produces_and_consumes(cluster: LocalCluster, admin: Credentials, topic: str) -> None:
    with Producer("acl_pg", cluster.namesrv_addr, credentials=admin) as p:
        sent = p.send(Message(topic, b"signed hello"))
        assert sent.send_status is SendStatus.SEND_OK
    with PullConsumer("acl_cg", cluster.namesrv_addr, credentials=admin) as c:
        mq = MessageQueue(topic, "broker-a", 0)
        r = c.pull(mq, 0, max_nums=32)
        assert r.pull_status is PullStatus.FOUND
        assert b"signed hello" in [m.body for m in r.msg_found_list]


def test_group_consumer_and_async_producer_sign_their_background_work(cluster: LocalCluster, admin: Credentials,
                                                                      topic: str) -> None:
    """Heartbeats, the rebalance's consumer-id and offset queries, pulls and commits all pass the ACL."""
    import asyncio

    body = f"async {uuid.uuid4().hex}".encode()

    async def produce() -> None:
        async with AsyncProducer("acl_apg", cluster.namesrv_addr, credentials=admin) as p:
            assert (await p.send(Message(topic, body))).send_status is SendStatus.SEND_OK

    asyncio.run(produce())
    with GroupConsumer("acl_gc", cluster.namesrv_addr, credentials=admin, consume_from_where="FIRST_OFFSET") as c:
        c.subscribe(topic)
        seen: list[bytes] = []
        poll_until(lambda: body in (seen.extend(m.body for m in c.poll(timeout_s=0.5)) or seen), 20.0,
                   "the group consumer to deliver the message")
        c.commit()


def _refused(call: object) -> AccessDeniedError:
    assert callable(call)
    t0 = time.monotonic()
    with pytest.raises(AccessDeniedError) as info:
        call()
    elapsed = time.monotonic() - t0
    assert elapsed < REFUSED_WITHIN_S, f"refusal took {elapsed:.2f} s: retried or waited"
    assert info.value.code == 16 and not info.value.retriable
    return info.value


@pytest.mark.parametrize("credentials", [None, Credentials("intruder", "guess")], ids=["unsigned", "unknown"])
def test_clients_without_a_valid_account_are_refused_at_once(cluster: LocalCluster, admin: Credentials, topic: str,
                                                            credentials: Credentials | None) -> None:
    ns = cluster.namesrv_addr
    with Producer("acl_pg_x", ns, credentials=credentials, send_timeout_s=10.0) as p:
        err = _refused(lambda: p.send(Message(topic, b"nope")))
    assert "not signed" in str(err) or "refused" in str(err)
    with PullConsumer("acl_cg_x", ns, credentials=credentials) as c:
        _refused(lambda: c.pull(MessageQueue(topic, "broker-a", 0), 0))
    with Admin(ns, credentials=credentials) as adm:
        _refused(lambda: adm.create_topic(f"AclNo_{uuid.uuid4().hex[:6]}", queue_nums=1))
    wrong = Credentials(admin.access_key, admin.secret_key + "x")
    with Producer("acl_pg_w", ns, credentials=wrong) as p:
        err = _refused(lambda: p.send(Message(topic, b"nope")))
    assert admin.secret_key not in str(err)


def test_a_pub_only_account_is_told_which_permission_it_lacks(cluster: LocalCluster, admin: Credentials,
                                                              topic: str) -> None:
    writer = Credentials(f"writer-{uuid.uuid4().hex[:4]}", "writer-secret")
    assert cluster.acl_file is not None
    with cluster.acl_file.open("a") as f:  # the servers watch the file and reload it
        f.write(f'\n[[accounts]]\naccessKey = "{writer.access_key}"\nsecretKey = "{writer.secret_key}"\n'
                f'defaultTopicPerm = "DENY"\ndefaultGroupPerm = "SUB"\ntopicPerms = ["{topic}=PUB"]\n')
    with Producer("acl_pg_pub", cluster.namesrv_addr, credentials=writer) as p:
        sent = poll_until(lambda: p.send(Message(topic, b"from writer")), 15.0,
                          "the brokers to load the new account", ignore=(AccessDeniedError,))
        assert sent.send_status is SendStatus.SEND_OK
    with PullConsumer("acl_cg_pub", cluster.namesrv_addr, credentials=writer) as c:
        err = _refused(lambda: c.pull(MessageQueue(topic, "broker-a", 0), 0))
    assert "SUB" in str(err) and topic in str(err), str(err)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "client.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env)


def test_cli_signs_with_its_account_options(cluster: LocalCluster, admin: Credentials, topic: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPLITMQ_")}
    new_topic = f"AclCli_{uuid.uuid4().hex[:6]}"
    signed = _cli("--access-key", admin.access_key, "topic", "create", "-n", cluster.namesrv_addr, "-t", new_topic,
                  "-r", "1", "-w", "1", env={**base, "SPLITMQ_SECRET_KEY": admin.secret_key})
    assert signed.returncode == 0, signed.stderr
    via_env = _cli("topic", "status", "-n", cluster.namesrv_addr, "-t", new_topic,
                   env={**base, "SPLITMQ_ACCESS_KEY": admin.access_key, "SPLITMQ_SECRET_KEY": admin.secret_key})
    assert via_env.returncode == 0, via_env.stderr
    unsigned = _cli("topic", "create", "-n", cluster.namesrv_addr, "-t", f"AclCliNo_{uuid.uuid4().hex[:6]}",
                    env=base)
    assert unsigned.returncode == 1 and "code=16" in unsigned.stderr, unsigned.stderr
    for res in (signed, via_env, unsigned):
        assert admin.secret_key not in res.stdout + res.stderr


def test_spark_connector_signs_on_driver_and_executors(cluster: LocalCluster, admin: Credentials) -> None:
    """The connector's driver work (planning) and executor work (the write and read tasks) run here without
    Spark: with ``accessKey``/``secretKey`` they read and write; without, planning fails with the ACL's error."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from spark_connector.errors import ConnectorError
    from spark_connector.options import parse_sink_options, parse_source_options
    from spark_connector.sink import RocketMQBatchWriter
    from spark_connector.source import RocketMQBatchReader

    name = f"AclSpark_{uuid.uuid4().hex[:6]}"
    with Admin(cluster.namesrv_addr, credentials=admin) as adm:
        adm.create_topic(name, queue_nums=2)
    account = {"nameserver": cluster.namesrv_addr, "topic": name, "accessKey": admin.access_key,
               "secretKey": admin.secret_key}
    batch = pa.record_batch({"body": pa.array([f"row {i}".encode() for i in range(10)], pa.binary())})
    commit = RocketMQBatchWriter(parse_sink_options(account)).write(iter([batch]))
    assert commit.rows == 10
    reader = RocketMQBatchReader(parse_source_options(account, streaming=False))
    bodies = [b for part in reader.partitions() for got in reader.read(part)
              for b in got.column(got.schema.get_field_index("body")).to_pylist()]
    assert sorted(bodies) == sorted(f"row {i}".encode() for i in range(10))
    anonymous = RocketMQBatchReader(parse_source_options({"nameserver": cluster.namesrv_addr, "topic": name},
                                                         streaming=False))
    with pytest.raises(ConnectorError, match=r"refused this job's account.*code=16.*accessKey/secretKey") as info:
        anonymous.partitions()
    assert admin.secret_key not in str(info.value)


def test_cli_cluster_up_acl_prints_the_admin_key_but_not_its_secret(tmp_path: Path) -> None:
    import signal
    import tomllib

    base = {k: v for k, v in os.environ.items() if not k.startswith("SPLITMQ_")}
    with subprocess.Popen([sys.executable, "-m", "client.cli", "cluster", "up", "--root", str(tmp_path / "c"),
                           "--slaves", "0", "--acl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, env=base) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            namesrv = proc.stdout.readline().strip().removeprefix("namesrv=")
            acl_line = proc.stdout.readline()
            assert acl_line.startswith("acl: admin access key "), acl_line
            access_key = acl_line.split()[4].rstrip(";")
            accounts = tomllib.loads((tmp_path / "c" / "acl" / "plain_acl.toml").read_text())["accounts"]
            secret = next(a["secretKey"] for a in accounts if a["accessKey"] == access_key)
            signed = _cli("--access-key", access_key, "topic", "create", "-n", namesrv, "-t", "AclUp", "-r", "1",
                          "-w", "1", env={**base, "SPLITMQ_SECRET_KEY": secret})
            assert signed.returncode == 0, signed.stderr
            unsigned = _cli("topic", "create", "-n", namesrv, "-t", "AclUpNo", env=base)
            assert unsigned.returncode == 1 and "code=16" in unsigned.stderr, unsigned.stderr
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert secret not in acl_line + out + err


def test_acl_properties_carry_the_account_and_the_cluster_secret(tmp_path: Path) -> None:
    plain = LocalCluster(tmp_path / "plain")
    assert plain.acl_properties() == {} and plain.admin_credentials is None and plain.ha_auth_secret is None
    acl = LocalCluster(tmp_path / "acl", acl=True)
    assert acl.admin_credentials is not None and acl.ha_auth_secret
    assert acl.acl_properties() == {"aclEnable": "true", "aclFile": str(acl.acl_file),
                                    "accessKey": acl.admin_credentials.access_key,
                                    "secretKey": acl.admin_credentials.secret_key, "haAuthSecret": acl.ha_auth_secret}
    other = LocalCluster(tmp_path / "other", acl=True)  # every cluster its own random account and secret
    assert other.admin_credentials != acl.admin_credentials and other.ha_auth_secret != acl.ha_auth_secret


def test_a_transaction_producer_signs_its_half_message_and_its_commit(cluster: LocalCluster, admin: Credentials,
                                                                    topic: str) -> None:
    from client import LocalTransactionState, TransactionProducer

    class Commit:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    body = f"txn {uuid.uuid4()}".encode()
    with TransactionProducer("acl_txn", cluster.namesrv_addr, Commit(), topics=[topic], credentials=admin) as p:
        p.send_message_in_transaction(Message(topic, body), None)
    with PullConsumer("acl_txn_cg", cluster.namesrv_addr, credentials=admin) as c:
        def committed() -> bool:
            for q in c.fetch_subscribe_message_queues(topic):
                r = c.pull(q, 0, max_nums=64)
                if r.pull_status is PullStatus.FOUND and body in [m.body for m in r.msg_found_list]:
                    return True
            return False

        poll_until(committed, 20, "the committed transactional message in its topic")
    with pytest.raises(AccessDeniedError), TransactionProducer("acl_txn", cluster.namesrv_addr, Commit(),
                                                               topics=[topic]) as anonymous:
        anonymous.send_message_in_transaction(Message(topic, b"unsigned"), None)
