"""``splitmq`` without surprises (issue 16): version, shell completion, a nameserver that never answers, progress
only on a terminal, no topic created by a send, ``--from-slave`` against slaves that do not serve reads."""

from __future__ import annotations

import argparse
import io
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin
from client.cli import _run, build_parser, main
from client.cli._completion import command_words, completion_script
from client.cli._output import Output
from client.cluster import LocalCluster
from client.errors import BrokerConnectError, BrokerNotFoundError, ClientError, RouteNotFoundError
from tests.cli.test_cli_integration import http_json, run_cli

REPO = Path(__file__).resolve().parents[2]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert re.fullmatch(r"splitmq \S+\n", capsys.readouterr().out)


def test_completion_lists_every_command_from_the_parser() -> None:
    words = command_words(build_parser())
    assert {"cluster", "topic", "produce", "consume", "completion", "--version"} <= set(words[""][0])
    assert "create" in words["topic"][0] and "--create" in words["produce"][0]
    assert words["cluster up"][1]["--mode"] == ["async", "sync", "dledger"]
    assert words["completion"][0][:2] == ["bash", "zsh"]
    assert completion_script(build_parser(), "zsh").startswith("#compdef splitmq\nautoload -U +X bashcompinit")
    with pytest.raises(ValueError, match="fish"):
        completion_script(build_parser(), "fish")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize(("line", "expected"), [
    ("splitmq to", "topic"), ("splitmq topic cr", "create"), ("splitmq cluster up --mode d", "dledger"),
    ("splitmq produce -t Orders --cr", "--create"), ("splitmq completion z", "zsh"),
])
def test_bash_completion_completes(line: str, expected: str) -> None:
    script = subprocess.run([sys.executable, "-m", "client.cli", "completion", "bash"], capture_output=True,
                            text=True, timeout=30, cwd=REPO, check=True).stdout
    words = line.split(" ")
    drive = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
             f"_splitmq; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    res = subprocess.run(["bash", "-c", drive], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [expected], res


@pytest.fixture
def silent_nameserver() -> Iterator[str]:
    """A socket that accepts connections and never answers (a wrong port, a hung process)."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def test_a_silent_nameserver_is_named_after_a_bounded_wait(silent_nameserver: str) -> None:
    started = time.monotonic()
    res = run_cli("produce", "-n", silent_nameserver, "-t", "Orders", "hello", "--timeout", "2", timeout_s=30,
                  notice=True)
    elapsed = time.monotonic() - started
    assert res.returncode == 1, res
    lines = res.stderr.splitlines()
    assert lines == [f"waiting for nameserver {silent_nameserver} to answer (up to 2 s)",
                     f"splitmq: error: nameserver {silent_nameserver} did not answer within 2 s: is "
                     f"{silent_nameserver} a SplitMQ nameserver? (check -n/--namesrv or NAMESRV_ADDR, or raise "
                     f"--timeout)"], res.stderr
    assert "TBW102" not in res.stderr and res.stdout == ""
    assert elapsed < 2 + 10, f"took {elapsed:.1f} s for a 2 s bound (interpreter start included)"


def test_progress_is_drawn_on_a_terminal(silent_nameserver: str) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "client.cli", "topic", "list", "-n", silent_nameserver,
                                 "--timeout", "2"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                                cwd=REPO)
        os.close(slave)
        slave = -1
        chunks = []
        while True:  # ends at EOF: the child exited and closed its end of the terminal
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO once the last writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=30) == 1
        assert proc.stdout is not None
        proc.stdout.close()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    text = b"".join(chunks).decode()
    assert f"\rwaiting for nameserver {silent_nameserver} to answer: 1 s of 2 s" in text, text
    assert text.rstrip().endswith("did not answer within 2 s: is " + silent_nameserver +
                                  " a SplitMQ nameserver? (check -n/--namesrv or NAMESRV_ADDR, or raise --timeout)")


# --- against a cluster whose slaves do not serve reads (RocketMQ's broker default) ----------------------------


@pytest.fixture(scope="module")
def reads_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("reads-off"), broker_groups=1, slaves_per_group=1,
                     broker_config={"slaveReadEnable": "false", "messageIndexEnable": "false"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.integration
def test_consume_from_slave_with_slave_reads_off_fails_naming_the_key(reads_off: LocalCluster) -> None:
    ns = reads_off.namesrv_addr
    assert run_cli("topic", "create", "-n", ns, "-t", "OffTopic", "-r", "2", "-w", "2").returncode == 0
    assert run_cli("produce", "-n", ns, "-t", "OffTopic", "a", "b").returncode == 0
    res = run_cli("consume", "-n", ns, "-t", "OffTopic", "--from-slave", "--from-beginning", "--timeout", "3")
    assert res.returncode == 1 and res.stdout == "", res
    line = _one_line(res)
    assert "slaveReadEnable=true" in line and "broker-a[1]" in line, line
    # Without --from-slave the same cluster serves the messages from the master.
    res = run_cli("consume", "-n", ns, "-t", "OffTopic", "--from-beginning", "--count", "2", "--timeout", "5")
    assert res.returncode == 0 and res.stdout.count("served-by=0") == 2, res


@pytest.mark.integration
def test_a_send_never_creates_a_topic_without_create(reads_off: LocalCluster) -> None:
    ns = reads_off.namesrv_addr
    for args in (("hello",), ("--count", "10")):
        res = run_cli("produce", "-n", ns, "-t", "OrdrsTypo", *args, "--timeout", "5")
        assert res.returncode == 1, res
        line = _one_line(res)
        assert "OrdrsTypo" in line and "--create" in line and "does not exist" in line, line
    with Admin(ns) as admin, pytest.raises(RouteNotFoundError):
        admin.topic_route("OrdrsTypo")
    master = reads_off.broker("broker-a", 0)
    assert "OrdrsTypo" not in http_json(master.addr, "/topics")["topicConfigTable"]

    res = run_cli("produce", "-n", ns, "-t", "OrdrsNew", "--create", "--count", "500", "--size", "100")
    assert res.returncode == 0, res
    assert re.fullmatch(r"sent 500 msgs in [\d.]+ s \([\d.]+ msgs/s\)\n", res.stdout), res.stdout
    assert res.stderr == "created topic OrdrsNew (8 queues per broker group, --create)\n", res.stderr
    with Admin(ns) as admin:
        assert admin.topic_route("OrdrsNew").queue_datas[0].write_queue_nums == 8


def test_sdk_errors_get_a_hint_saying_what_to_do() -> None:
    def failing(exc: Exception) -> str:
        err = io.StringIO()

        def func(args: argparse.Namespace, out: Output) -> int:
            raise exc

        assert _run(argparse.Namespace(func=func, debug=False), Output(io.StringIO(), err)) == 1
        return err.getvalue()

    assert failing(RouteNotFoundError("No route info of this topic: Nope")) == (
        "splitmq: error: No route info of this topic: Nope: check the topic name ('splitmq topic list'), or create "
        "it ('splitmq topic create -t TOPIC')\n")
    assert "'splitmq cluster list' shows them" in failing(BrokerNotFoundError("The broker[x] not exist"))
    assert "is that server running" in failing(BrokerConnectError("connect to h:1 failed"))
    assert failing(ClientError("nameserver h:1 did not answer within 2 s: ...")) == \
        "splitmq: error: nameserver h:1 did not answer within 2 s: ...\n"
