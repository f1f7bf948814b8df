"""Protected mode (issue 39 item 1): a server without credentials serves loopback peers only, and asked to bind
a non-loopback address it refuses to start, naming the keys to set and ``protectedMode=false``; with that it
starts and says loudly what is open. The broker judges each port by its own credential (``aclEnable`` for HTTP,
``haAuthSecret`` for the HA / DLedger peer port); the nameserver by ``--acl-enable`` or the cluster secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from nameserver.server import NamesrvConfig
from remoting.http import HttpLimits, HttpService
from remoting.router import Router
from tests.broker.procs import ProcessExited, Servers

ACCOUNTS = '[[accounts]]\naccessKey = "admin"\nsecretKey = "admin-secret"\nadmin = true\n'
SECRET = "a cluster secret of some length"


@pytest.mark.parametrize(("props", "missing"), [
    ({}, ["aclEnable=true with aclFile (for the HTTP port)", "haAuthSecret (for the HA port)"]),
    ({"aclEnable": "true", "aclFile": "/x"}, ["haAuthSecret (for the HA port)"]),
    ({"haAuthSecret": SECRET}, ["aclEnable=true with aclFile (for the HTTP port)"]),
    ({"haAuthSecret": SECRET, "aclEnable": "true", "aclFile": "/x"}, []),
])
def test_a_non_loopback_bind_needs_the_credential_of_every_port(props: dict[str, str], missing: list[str]) -> None:
    config = BrokerConfig.from_properties({"brokerIP1": "10.0.0.1", "bindAddress": "0.0.0.0", **props})
    refusal = config.protected_mode_refusal()
    if not missing:
        assert refusal is None and config.http_open and config.peer_port_open
        return
    assert refusal is not None and "protectedMode=false" in refusal
    for key in missing:
        assert key in refusal
    assert BrokerConfig.from_properties({**props}).protected_mode_refusal() is None  # loopback: always starts
    opened = BrokerConfig.from_properties({"bindAddress": "0.0.0.0", "protectedMode": "false", **props})
    assert opened.protected_mode_refusal() is None and opened.http_open and opened.peer_port_open
    assert len(opened.protected_mode_warnings()) == len(missing)
    assert all(w.startswith("SECURITY: protectedMode=false") for w in opened.protected_mode_warnings())


def test_each_port_without_its_credential_serves_loopback_peers_only() -> None:
    bare = BrokerConfig.from_properties({})
    assert not bare.http_open and bare.to_ha_config().loopback_only
    acl_only = BrokerConfig.from_properties({"aclEnable": "true", "aclFile": "/x"})
    assert acl_only.http_open and acl_only.to_ha_config().loopback_only
    secret_only = BrokerConfig.from_properties({"haAuthSecret": SECRET})
    assert not secret_only.http_open and not secret_only.to_ha_config().loopback_only


def test_an_http_server_in_protected_mode_closes_a_non_loopback_peer() -> None:
    """A server bound to loopback cannot get a non-loopback peer; should one arrive (a packet routed to it), the
    HTTP layer closes it before reading a byte. Its admission rule, driven directly."""
    service = HttpService(Router({}, max_body_bytes=1), HttpLimits(loopback_only=True))
    refused = service.admit("10.1.2.3")
    assert refused is not None and "protected mode" in refused and "protectedMode=false" in refused
    assert service.admit("127.0.0.1") is None and service.admit("::1") is None
    assert HttpService(Router({}, max_body_bytes=1), HttpLimits()).admit("10.1.2.3") is None


def test_one_client_cannot_take_every_http_connection() -> None:
    service = HttpService(Router({}, max_body_bytes=1), HttpLimits(max_connections=10, max_connections_per_client=3))
    assert [service.admit("127.0.0.2") for _ in range(3)] == [None] * 3
    refused = service.admit("127.0.0.2")
    assert refused is not None and "httpMaxConnectionsPerClient" in refused
    assert service.admit("127.0.0.3") is None  # another client still gets in


@pytest.mark.integration
def test_a_broker_bound_to_every_address_without_credentials_refuses_to_start_and_names_the_keys(
        servers: Servers) -> None:
    with pytest.raises(ProcessExited) as e:
        servers.broker({"brokerIP1": "127.0.0.1", "bindAddress": "0.0.0.0"})
    assert e.value.rc == 2
    for key in ("aclEnable=true with aclFile", "haAuthSecret", "protectedMode=false"):
        assert key in e.value.stderr
    opened = servers.broker({"brokerIP1": "127.0.0.1", "bindAddress": "0.0.0.0", "protectedMode": "false"},
                            name="opened")
    log = opened.log()
    assert "SECURITY: protectedMode=false and aclEnable=false: the HTTP port on 0.0.0.0 serves ANYONE" in log
    assert "SECURITY: protectedMode=false and no haAuthSecret: the HA port on 0.0.0.0 serves ANYONE" in log


@pytest.mark.integration
def test_a_secured_broker_on_every_address_starts(servers: Servers, tmp_path: Path) -> None:
    (tmp_path / "acl.toml").write_text(ACCOUNTS)
    broker = servers.broker({"brokerIP1": "127.0.0.1", "bindAddress": "0.0.0.0", "aclEnable": "true",
                             "aclFile": str(tmp_path / "acl.toml"), "haAuthSecret": SECRET})
    assert "SECURITY" not in broker.log()


def test_the_nameserver_rule() -> None:
    refusal = NamesrvConfig().protected_mode_refusal("0.0.0.0")
    assert refusal is not None
    for flag in ("--acl-enable", "SPLITMQ_HA_AUTH_SECRET", "--protected-mode false"):
        assert flag in refusal
    assert NamesrvConfig().protected_mode_refusal("127.0.0.1") is None
    assert NamesrvConfig(ha_auth_secret=b"s").protected_mode_refusal("0.0.0.0") is None
    assert NamesrvConfig(protected_mode=False).protected_mode_refusal("0.0.0.0") is None


@pytest.mark.integration
def test_a_nameserver_on_every_address_without_credentials_refuses_to_start(servers: Servers) -> None:
    rc, _, err = servers.run_to_exit(["-m", "nameserver", "--listen", "0.0.0.0:0"])
    assert rc == 2 and "protected mode" in err and "--acl-enable" in err and "--protected-mode false" in err
    opened = servers.nameserver(("--listen", "0.0.0.0:0", "--protected-mode", "false"))
    assert "SECURITY: --protected-mode false and no credentials: the nameserver on 0.0.0.0" in opened.log()
    quiet = servers.nameserver()
    assert "SECURITY" not in quiet.log()
