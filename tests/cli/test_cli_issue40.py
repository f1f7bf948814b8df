"""``splitmq`` answers that say what happened (issue 40 points 2 and 5), against one real SYNC_MASTER without a
slave: a produce the master stored without its replica exits 3, not 0; ``topic create`` of an existing topic says
so; ``group create`` exists."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from client.cli import main
from client.cluster import LocalCluster
from tests.cli.test_cli_integration import http_json, ok, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A SYNC_MASTER with no slave: every send is stored on the master and answered SLAVE_NOT_AVAILABLE."""
    c = LocalCluster(tmp_path_factory.mktemp("cli40"), slaves_per_group=0, mode="sync")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_produce_stored_without_its_replica_exits_3(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    ok("topic", "create", "-n", ns, "-t", "NoReplica", "-r", "1", "-w", "1")
    res = run_cli("produce", "-n", ns, "-t", "NoReplica", "one", "two")
    assert res.returncode == 3, (res.returncode, res.stdout, res.stderr)
    assert res.stdout.count("sent status=SLAVE_NOT_AVAILABLE ") == 2
    assert ("2 of 2 msgs stored on the master without their replica or disk flush (SLAVE_NOT_AVAILABLE x2); "
            "exit code 3") in res.stderr
    res = run_cli("produce", "-n", ns, "-t", "NoReplica", "--count", "300", "--size", "16")
    assert res.returncode == 3, (res.returncode, res.stdout, res.stderr)
    assert "300 of 300 msgs stored on the master without their replica" in res.stderr


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_the_help_names_exit_code_3(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_text(capsys, "produce").split())
    assert "Exit code 3: every message was stored, but at least one answered SLAVE_NOT_AVAILABLE" in text
    assert "3 (produce) every message stored but at least one without its replica" in " ".join(
        help_text(capsys).split())


def test_topic_create_says_created_unchanged_or_updated(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    assert "topic Twice created on broker-a" in ok("topic", "create", "-n", ns, "-t", "Twice", "-r", "2", "-w", "2")
    assert "topic Twice exists, unchanged on broker-a" in ok("topic", "create", "-n", ns, "-t", "Twice", "-r", "2",
                                                            "-w", "2")
    assert "topic Twice updated on broker-a" in ok("topic", "create", "-n", ns, "-t", "Twice", "-r", "4", "-w", "4")
    assert json.loads(ok("topic", "update", "-n", ns, "-t", "Twice", "-r", "4", "-w", "4", "--json"))["result"] == \
        "exists, unchanged"


def test_group_create_on_every_master(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    out = ok("group", "create", "-n", ns, "-g", "CliGroupC", "--retry-max-times", "5")
    assert "group CliGroupC created or updated on broker-a" in out
    groups = http_json(cluster.broker("broker-a", 0).addr, "/subscription-groups")["subscriptionGroupTable"]
    assert groups["CliGroupC"]["retryMaxTimes"] == 5
