"""Issue 39, hole 2: ``haAuthSecret`` without ``aclEnable`` must not leave broker registration open.

Before the fix an anonymous ``POST /broker/register`` for an existing ``brokerName`` moved the group's slaves to
an impostor (the route's master, and so the HA address a slave follows, changed). The nameserver now takes the
cluster's secret (``SPLITMQ_HA_AUTH_SECRET``, or ``--ha-auth-secret-file``) and every broker with
``haAuthSecret`` signs its registrations with a key derived from it: a registration, unregistration or
write-permission change that does not carry it is refused, while route queries stay open. Failed before the fix:
the anonymous registration answered 200 and the route named the impostor."""

from __future__ import annotations

import httpx
import pytest

from tests.broker.procs import Servers
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

SECRET = "a cluster secret of some length"


def test_an_anonymous_registration_cannot_move_a_group_when_the_cluster_has_a_secret(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITMQ_HA_AUTH_SECRET", SECRET)
    ns = servers.nameserver()
    master = servers.broker({"namesrvAddr": ns.addr, "brokerName": "broker-a", "brokerIP1": "127.0.0.1",
                             "haAuthSecret": SECRET, "registerNameServerPeriodMinMs": "1000",
                             "registerNameServerPeriod": "1000"}, name="master")

    def masters() -> dict[str, str]:
        table = httpx.get(f"{ns.url}/cluster", timeout=5).json()["brokerAddrTable"]
        return {name: entry["brokerAddrs"].get("0", "") for name, entry in table.items()}

    poll_until(lambda: masters().get("broker-a") == master.addr, 20, "the real master's registration")
    fake = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:6666", "brokerName": "broker-a",
            "brokerId": 0, "haServerAddr": "127.0.0.1:6667", "topicConfigTable": {}}
    for path in ("/broker/register", "/broker/unregister", "/broker/wipe-write-perm"):
        r = httpx.post(f"{ns.url}{path}", json=fake, timeout=5)
        assert r.status_code == 403, (path, r.status_code, r.text)
    assert masters()["broker-a"] == master.addr
    # route queries stay open: clients need no account in this configuration
    assert httpx.get(f"{ns.url}/cluster", timeout=5).status_code == 200
