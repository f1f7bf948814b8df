"""The TLS keys of the broker and the nameserver's TLS flags: a usable set builds the contexts the ports and the
outbound calls use; a missing or broken file is a start error naming the key, never a traceback at first use."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from broker.config import BrokerConfig, ConfigError, config_from_properties
from client.tls import LocalTlsFiles, generate_local_tls_files
from nameserver.__main__ import main as nameserver_main


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> LocalTlsFiles:
    return generate_local_tls_files(tmp_path_factory.mktemp("tls"))


def load(props: dict[str, str]) -> BrokerConfig:
    return config_from_properties(props, env={}).config


def tls_props(files: LocalTlsFiles, **extra: str) -> dict[str, str]:
    return {"tlsEnable": "true", "tlsCertFile": files.cert_file, "tlsKeyFile": files.key_file,
            "tlsCaFile": files.ca_file, **extra}


def test_tls_is_off_by_default_and_builds_nothing() -> None:
    config = load({})
    assert config.tls_enable is False and config.tls_contexts() is None


def test_a_tls_broker_has_server_and_verifying_client_contexts(files: LocalTlsFiles) -> None:
    tls = load(tls_props(files)).tls_contexts()
    assert tls is not None
    assert tls.http_server.verify_mode == ssl.CERT_NONE and tls.peer_server is tls.http_server
    assert tls.client.verify_mode == ssl.CERT_REQUIRED and tls.client.check_hostname
    assert tls.http_server.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_peer_client_auth_makes_the_peer_ports_demand_a_certificate(files: LocalTlsFiles) -> None:
    tls = load(tls_props(files, tlsPeerClientAuth="true")).tls_contexts()
    assert tls is not None
    assert tls.peer_server.verify_mode == ssl.CERT_REQUIRED
    assert tls.http_server.verify_mode == ssl.CERT_NONE  # clients of the HTTP port are not asked for one


@pytest.mark.parametrize(("change", "names"), [
    ({"tlsCertFile": "/nonexistent/server.pem"}, "server certificate file"),
    ({"tlsCaFile": "/nonexistent/ca.pem"}, "tlsCaFile"),
    ({"tlsKeyFile": None}, "tlsCertFile and tlsKeyFile"),
])
def test_a_broken_tls_setting_is_a_config_error_naming_it(files: LocalTlsFiles, change: dict[str, str | None],
                                                          names: str) -> None:
    props = tls_props(files)
    for key, value in change.items():
        if value is None:
            del props[key]
        else:
            props[key] = value
    with pytest.raises(ConfigError, match="tlsEnable=true") as info:
        load(props)
    assert names in str(info.value)


def test_a_key_that_is_not_pem_is_refused(files: LocalTlsFiles, tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load(tls_props(files, tlsKeyFile=str(bad)))


def test_the_nameserver_refuses_half_or_broken_tls_flags(files: LocalTlsFiles,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        nameserver_main(["--listen", "127.0.0.1:0", "--tls-cert", files.cert_file])
    assert info.value.code == 2 and "--tls-cert and --tls-key go together" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        nameserver_main(["--listen", "127.0.0.1:0", "--tls-cert", files.cert_file, "--tls-key", "/nonexistent"])
    assert info.value.code == 2 and "/nonexistent" in capsys.readouterr().err
