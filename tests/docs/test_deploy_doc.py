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
