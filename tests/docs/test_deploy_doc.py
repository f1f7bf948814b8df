"""docs/DEPLOY.md's files are real: every properties block loads as a broker configuration, the systemd units
start the installed entry points, and the commands it tells an operator to run exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from broker.config import KEYS, BrokerConfig
from broker.properties_file import parse_properties
from client.cli._parser import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "DEPLOY.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_every_properties_block_is_a_valid_broker_configuration() -> None:
    found = blocks("properties")
    assert len(found) >= 3
    for text in found:
        props = parse_properties(text)
        assert not set(props) - set(KEYS), f"keys the broker does not know: {sorted(set(props) - set(KEYS))}"
        config = BrokerConfig.from_properties(props)
        assert config.broker_cluster_name == "prod"


def test_the_master_and_slave_files_pair_up() -> None:
    master, slave = (BrokerConfig.from_properties(parse_properties(t)) for t in blocks("properties")[:2])
    assert (master.broker_name, master.broker_id, slave.broker_name, slave.broker_id) == ("broker-a", 0, "broker-a", 1)
    assert master.slave_read_enable and master.namesrv_addr == slave.namesrv_addr


def test_the_units_run_the_installed_entry_points() -> None:
    units = blocks("ini")
    assert any("splitmq-nameserver --listen" in u for u in units)
    assert any("splitmq-broker -c" in u for u in units)
    import tomllib

    scripts = tomllib.loads((DOC.parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"splitmq-nameserver", "splitmq-broker", "splitmq"} <= set(scripts)


@pytest.mark.parametrize("line", [ln for b in blocks("sh") for ln in b.splitlines()
                                  if ln.startswith("splitmq ")])
def test_the_operator_commands_parse(line: str) -> None:
    argv = shlex.split(line.split("#", 1)[0])[1:]
    build_parser().parse_args(argv)  # SystemExit(2) on an unknown command or option


def test_the_recipe_is_the_secure_one(tmp_path: Path) -> None:
    """Each broker file of the recipe, with the generated ``broker-secure.properties`` appended as the recipe
    says, starts on its host's address (protected mode finds every credential) with TLS on; the nameserver unit
    passes the flags of ``nameserver.args``; the generator's files holding secrets are mode 0600."""
    from client.secure import generate_secure_files

    files = generate_secure_files(tmp_path / "secure", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    fragment = files.broker_properties.read_text()
    for text in blocks("properties"):
        props = parse_properties(text + "\n" + fragment)
        config = BrokerConfig.from_properties(props)
        assert config.bind_host.startswith("10.0.0.") and config.protected_mode_refusal() is None
        assert config.tls_enable and config.acl_enable and config.ha_auth_secret
    assert "cat /etc/splitmq/secure/broker-secure.properties >>" in DOC.read_text()
    flags = files.nameserver_args.read_text().replace(str(files.directory), "/etc/splitmq/secure").split()
    unit = next(u for u in blocks("ini") if "splitmq-nameserver" in u)
    assert all(flag in unit for flag in flags), flags
    for path in (files.broker_properties, files.nameserver_args, files.directory / "cluster.secret",
                 files.directory / "acl" / "plain_acl.toml", files.directory / "admin.credentials",
                 files.directory / "tls" / "server.key"):
        assert path.stat().st_mode & 0o777 == 0o600, path
