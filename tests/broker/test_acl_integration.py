"""ACL against real processes: a nameserver with --acl-enable, a master and a slave with aclEnable=true.

Each attack of issue 14 is refused with NO_PERMISSION and a clear message, and nothing is written; the right
account does the same thing; the broker's own account signs its registration and the slave's metadata sync; a
fake broker with another account changes no route; a broken accounts file on reload keeps the last good one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from common.codec import encode_batch
from common.message import Message
from common.signing import Credentials, SigningAuth, authorization_header, fresh_authorization
from tests.broker.procs import ServerProcess, Servers
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

ACCOUNTS = """
[[accounts]]
accessKey = "admin"
secretKey = "admin-secret"
admin = true

[[accounts]]
accessKey = "broker-a"
secretKey = "broker-a-secret"
admin = true

[[accounts]]
accessKey = "intruder"
secretKey = "intruder-secret"
admin = true

[[accounts]]
accessKey = "pub"
secretKey = "pub-secret"
topicPerms = ["T=PUB"]

[[accounts]]
accessKey = "sub"
secretKey = "sub-secret"
topicPerms = ["T=SUB"]
groupPerms = ["G=SUB"]
"""
CREDS = {a: Credentials(a, f"{a}-secret") for a in ("admin", "broker-a", "intruder", "pub", "sub")}
NOT_SIGNED = {"code": 16, "remark": "request not signed / signature refused"}


@attrs.frozen
class Cluster:
    acl_file: Path
    namesrv: ServerProcess
    master: ServerProcess
    slave: ServerProcess


def auth(name: str) -> SigningAuth:
    return SigningAuth(CREDS[name])


@pytest.fixture(scope="module")
def cluster(module_servers: Servers) -> Iterator[Cluster]:
    acl = module_servers.workdir / "acl.toml"
    acl.write_text(ACCOUNTS)
    ns = module_servers.nameserver(("--acl-enable", "--acl-file", str(acl)))
    common = {"aclEnable": "true", "aclFile": str(acl), "accessKey": "broker-a", "secretKey": "broker-a-secret",
              "namesrvAddr": ns.addr, "brokerName": "broker-a", "autoCreateTopicEnable": "false",
              "registerNameServerPeriod": "1000", "registerNameServerPeriodMinMs": "500",
              "slaveMetadataSyncInterval": "300"}
    master = module_servers.broker({**common, "brokerRole": "ASYNC_MASTER"}, name="master")
    slave = module_servers.broker({**common, "brokerRole": "SLAVE", "brokerId": "1", "haListenPort": "0"},
                                  name="slave")
    r = httpx.post(f"{master.url}/topic", json={"topicName": "T", "readQueueNums": 1, "writeQueueNums": 1},
                   auth=auth("admin"))
    assert r.status_code == 200, r.text
    # the master registered T with its signed registration (the nameserver refuses unsigned ones)
    poll_until(lambda: httpx.get(f"{ns.url}/route", params={"topic": "T"}).status_code == 200, 20,
               "route of T at the ACL nameserver")
    yield Cluster(acl, ns, master, slave)


def commitlog_end(c: Cluster) -> int:
    r = httpx.get(f"{c.master.url}/runtime", auth=auth("admin"))
    assert r.status_code == 200, r.text
    return int(r.json()["commitLogMaxOffset"])


BODY = encode_batch([Message("T", b"hello")], born_timestamp_ms=1, uniq_keys=["U1"])
SEND = "/send?topic=T&queueId=0"


def refused_json(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 403, (r.status_code, r.text)
    body = r.json()
    return {"code": body["code"], "remark": body["remark"]}


def test_unsigned_wrong_secret_stale_and_replayed_requests_write_nothing(cluster: Cluster) -> None:
    url = cluster.master.url + SEND
    before = commitlog_end(cluster)
    assert refused_json(httpx.post(url, content=BODY)) == NOT_SIGNED
    r = httpx.post(url, content=BODY, auth=SigningAuth(Credentials("pub", "not-the-secret")))
    assert refused_json(r) == NOT_SIGNED
    host = cluster.master.addr
    stale = authorization_header(CREDS["pub"], "POST", SEND, BODY, host=host,
                                 timestamp_ms=int(time.time() * 1000) - 120_000, nonce="01")
    assert refused_json(httpx.post(url, content=BODY, headers={"Authorization": stale})) == NOT_SIGNED
    assert commitlog_end(cluster) == before
    header = fresh_authorization(CREDS["pub"], "POST", SEND, BODY, host)
    assert httpx.post(url, content=BODY, headers={"Authorization": header}).status_code == 200
    after_one = commitlog_end(cluster)
    assert after_one > before
    assert refused_json(httpx.post(url, content=BODY, headers={"Authorization": header})) == NOT_SIGNED
    assert commitlog_end(cluster) == after_one
    log = cluster.master.log()
    assert "signature does not verify" in log or "ACL refused" in log  # the real reason stays server-side


def test_permissions_by_account(cluster: Cluster) -> None:
    url = cluster.master.url
    before = commitlog_end(cluster)
    r = httpx.post(url + SEND, content=BODY, auth=auth("sub"))
    assert refused_json(r) == {"code": 16, "remark": "account sub has no PUB permission on topic T"}
    assert commitlog_end(cluster) == before
    pull = {"topic": "T", "queueId": 0, "group": "G", "offset": 0, "maxNums": 32}
    r = httpx.get(url + "/pull", params=pull, auth=auth("pub"))
    assert refused_json(r) == {"code": 16, "remark": "account pub has no SUB permission on topic T"}
    r = httpx.post(url + "/topic", json={"topicName": "Stolen"}, auth=auth("pub"))
    assert refused_json(r) == {"code": 16, "remark": "account pub has no admin permission (POST /topic needs admin)"}
    assert "Stolen" not in httpx.get(url + "/topics", auth=auth("admin")).json()["topicConfigTable"]
    r = httpx.post(url + "/offset/consumer", json={"group": "G", "offsets": [{"topic": "T", "queueId": 0,
                                                                              "offset": 10**15}]}, auth=auth("pub"))
    assert refused_json(r)["code"] == 16
    # the right accounts do the same things
    assert httpx.post(url + SEND, content=BODY, auth=auth("pub")).status_code == 200
    r = httpx.get(url + "/pull", params=pull, auth=auth("sub"))
    assert r.status_code == 200 and b"hello" in r.content
    r = httpx.post(url + "/topic", json={"topicName": "Granted"}, auth=auth("admin"))
    assert r.status_code == 200
    assert "Granted" in httpx.get(url + "/topics", auth=auth("admin")).json()["topicConfigTable"]


def test_slave_syncs_metadata_with_its_signed_account(cluster: Cluster) -> None:
    def synced() -> bool:
        r = httpx.get(cluster.slave.url + "/topics", auth=auth("admin"))
        return r.status_code == 200 and "T" in r.json()["topicConfigTable"]

    poll_until(synced, 20, "the slave's signed metadata sync copying topic T")
    assert "slave sync of /topics from master" not in cluster.slave.log()  # never refused


def test_a_fake_broker_with_another_account_changes_no_route(cluster: Cluster) -> None:
    ns = cluster.namesrv.url
    before = httpx.get(f"{ns}/route", params={"topic": "T"}).json()
    fake = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:1", "brokerName": "broker-a",
            "haServerAddr": "127.0.0.1:2", "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 8,
                                                                      "writeQueueNums": 8, "perm": 6}}}
    for broker_id, who in ((0, "intruder"), (1, "intruder"), (0, None), (0, "pub")):
        r = httpx.post(f"{ns}/broker/register", json={**fake, "brokerId": broker_id},
                       auth=auth(who) if who else None)
        assert refused_json(r)["code"] == 16
    r = httpx.post(f"{ns}/broker/wipe-write-perm", json={"brokerName": "broker-a"}, auth=auth("pub"))
    assert refused_json(r)["code"] == 16
    assert httpx.get(f"{ns}/route", params={"topic": "T"}).json() == before


def test_broken_accounts_file_on_reload_keeps_the_last_good_one(cluster: Cluster) -> None:
    url = cluster.master.url + SEND
    try:
        cluster.acl_file.write_text("[[accounts]]\naccessKey = 'pub'\nsecretKey = 3\n")
        poll_until(lambda: "keeping the last good accounts" in cluster.master.log(), 15,
                   "the broker logging that the broken accounts file was not loaded")
        assert "accounts[0].secretKey must be a string" in cluster.master.log()
        assert httpx.post(url, content=BODY, auth=auth("pub")).status_code == 200
        # a good file is taken: pub loses PUB on T
        cluster.acl_file.write_text(ACCOUNTS.replace('topicPerms = ["T=PUB"]', 'topicPerms = ["T=SUB"]'))
        poll_until(lambda: httpx.post(url, content=BODY, auth=auth("pub")).status_code == 403, 15,
                   "the reloaded accounts file taking PUB on T from pub")
    finally:
        cluster.acl_file.write_text(ACCOUNTS)
        poll_until(lambda: httpx.post(url, content=BODY, auth=auth("pub")).status_code == 200, 15,
                   "the original accounts file reloaded")
