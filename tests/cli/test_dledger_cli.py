"""``splitmq dledger status|transfer`` and ``splitmq cluster up --mode dledger``, as a user runs them.

The table logic is tested without servers (:func:`status_rows` on answers as ``Admin.dledger_status`` gives
them); the commands run as ``python -m client.cli`` subprocesses against one real 3-peer DLedger group.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.cli import main
from client.cli._dledger_cmds import status_rows
from client.cluster import LocalCluster
from tests.cli.test_cli_integration import without_wait_notice
from tests.waiting import poll_until

REPO = Path(__file__).resolve().parents[2]
GROUP = "broker-a"
PEERS = {"n0": "h:1", "n1": "h:2", "n2": "h:3"}


# --- without servers -----------------------------------------------------------------------------------------


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0)


@pytest.mark.parametrize("leaf", ["status", "transfer"])
def test_dledger_commands_have_help(leaf: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["dledger", leaf, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: splitmq dledger {leaf} ")
    assert "-b BROKER_NAME" in out and "-n ADDR, --namesrv ADDR" in out
    assert _exit_code(["dledger", "--help"]) == 0
    assert f"    {leaf} " in capsys.readouterr().out


def test_cluster_up_help_offers_dledger(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["cluster", "up", "--help"]) == 0
    out = capsys.readouterr().out
    assert "{async,sync,dledger}" in out and "--peers P" in out


@pytest.mark.parametrize("argv", [
    ["dledger", "transfer", "-n", "h:1", "-b", GROUP], ["dledger", "status", "-n", "h:1"],
    ["cluster", "up", "--root", "x", "--mode", "dledger", "--peers", "0"], ["dledger", "status", "-b", GROUP],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                             ) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err, err


def answer(peer: str, role: str, *, term: int = 4, leader: str | None = "n0", end: int = 10, committed: int = 10,
           progress: dict[str, int] | None = None) -> dict[str, Any]:
    """One member's ``GET /dledger`` answer (progress: peer -> lag, on a leader)."""
    return {"selfId": peer, "peers": PEERS, "role": role, "term": term, "leaderId": leader, "ledgerEndIndex": end,
            "committedIndex": committed, "addr": f"a{peer}",
            "peerProgress": {p: {"ackedIndex": end - lag, "lag": lag} for p, lag in (progress or {}).items()}}


def rows_of(status: dict[int, dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["peer"], r["brokerId"], r["role"], r["lag"]) for r in status_rows(status)]


#: name -> (what Admin.dledger_status gave, rows as (peer, broker id, role, lag)).
ROWS: dict[str, tuple[dict[int, dict[str, Any]], list[tuple[Any, ...]]]] = {
    "all up, lag from the leader": (
        {0: answer("n0", "LEADER", progress={"n0": 0, "n1": 0, "n2": 3}), 2: answer("n1", "FOLLOWER"),
         3: answer("n2", "FOLLOWER", end=7)},
        [("n0", 0, "LEADER", 0), ("n1", 2, "FOLLOWER", 0), ("n2", 3, "FOLLOWER", 3)]),
    "a stopped follower is only in the peer lists": (
        {0: answer("n0", "LEADER", progress={"n1": 0, "n2": 40}), 2: answer("n1", "FOLLOWER")},
        [("n0", 0, "LEADER", 0), ("n1", 2, "FOLLOWER", 0), ("n2", None, "down", 40)]),
    "a crashed follower is named by its id": (
        {0: answer("n1", "LEADER", leader="n1", progress={"n0": 0, "n2": 9}), 1: answer("n0", "FOLLOWER"),
         3: {"error": "connect refused", "addr": "an2"}},
        [("n0", 1, "FOLLOWER", 0), ("n1", 0, "LEADER", 0), ("n2", 3, "unreachable", 9)]),
    "a crashed leader is the one peer left over; no lag without a leader": (
        {0: {"error": "connect refused", "addr": "an0"}, 2: answer("n1", "CANDIDATE", leader=None),
         3: answer("n2", "CANDIDATE", leader=None)},
        [("n0", 0, "unreachable", None), ("n1", 2, "CANDIDATE", None), ("n2", 3, "CANDIDATE", None)]),
    "two crashed members: the follower by its id, the leader as the one left over": (
        {0: {"error": "x", "addr": "an0"}, 3: {"error": "y", "addr": "an2"}, 2: answer("n1", "CANDIDATE")},
        [("n0", 0, "unreachable", None), ("n1", 2, "CANDIDATE", None), ("n2", 3, "unreachable", None)]),
    "a stale id that names no peer stays unnamed": (
        {0: answer("n0", "LEADER", progress={"n1": 0, "n2": 0}), 2: answer("n1", "FOLLOWER"),
         7: {"error": "z", "addr": "old"}, 3: answer("n2", "FOLLOWER")},
        [(None, 7, "unreachable", None), ("n0", 0, "LEADER", 0), ("n1", 2, "FOLLOWER", 0),
         ("n2", 3, "FOLLOWER", 0)]),
    "an old leader cut off: the higher term speaks for the group": (
        {0: answer("n1", "LEADER", term=5, leader="n1", progress={"n0": 2, "n2": 0}),
         1: answer("n0", "LEADER", term=4, progress={"n1": 0, "n2": 0}), 3: answer("n2", "FOLLOWER", term=5)},
        [("n0", 1, "LEADER", 2), ("n1", 0, "LEADER", 0), ("n2", 3, "FOLLOWER", 0)]),
}


@pytest.mark.parametrize("case", sorted(ROWS))
def test_status_rows(case: str) -> None:
    status, want = ROWS[case]
    got = rows_of(status)
    assert sorted(got, key=repr) == sorted(want, key=repr), case


# --- against a DLedger group ---------------------------------------------------------------------------------


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "client.cli", *args], capture_output=True, text=True,
                         timeout=timeout_s, cwd=REPO)
    res.stderr = without_wait_notice(res.stderr)  # a loaded machine's notice, not the command's answer
    return res


def ok(*args: str) -> str:
    res = run_cli(*args)
    assert res.returncode == 0, f"splitmq {' '.join(args)} exited {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    return res.stdout


def table(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the text table whose header starts with ``first``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    headers = lines[start].split()
    return [dict(zip(headers, line.split(), strict=True)) for line in lines[start + 1:]
            if len(line.split()) == len(headers)]


@pytest.fixture(scope="module")
def raft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cli-raft"), mode="dledger", peers_per_group=3,
                     broker_config={"heartBeatTimeIntervalMs": "500"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def settled_rows(ns: str) -> list[dict[str, str]] | None:
    """``dledger status`` rows once one peer leads at id 0 and the others follow it at id N + 1."""
    res = run_cli("dledger", "status", "-n", ns, "-b", GROUP)
    if res.returncode != 0:
        return None
    rows = table(res.stdout, "PEER")
    leaders = [r for r in rows if r["ROLE"] == "LEADER"]
    if len(rows) != 3 or len(leaders) != 1 or leaders[0]["BROKER_ID"] != "0":
        return None
    lead = leaders[0]["PEER"]
    if any(r["ROLE"] != "FOLLOWER" or r["LEADER"] != lead or r["BROKER_ID"] != str(int(r["PEER"][1:]) + 1)
           for r in rows if r is not leaders[0]):
        return None
    return rows


@pytest.mark.integration
def test_status_table_and_json(raft: LocalCluster) -> None:
    ns = raft.namesrv_addr
    rows = poll_until(lambda: settled_rows(ns), 30, "one leader at id 0")
    assert [r["PEER"] for r in rows] == ["n0", "n1", "n2"]
    assert {r["TERM"] for r in rows} == {rows[0]["TERM"]}
    assert all(int(r["END_INDEX"]) >= int(r["COMMITTED_INDEX"]) >= -1 and r["LAG"].isdigit() for r in rows)
    assert [r["ADDR"] for r in rows] == [raft.broker(GROUP, i).addr for i in range(3)]

    doc = json.loads(ok("dledger", "status", "-n", ns, "-b", GROUP, "--json"))
    assert doc["brokerName"] == GROUP and doc["leader"] in ("n0", "n1", "n2")
    assert doc["members"]["0"]["selfId"] == doc["leader"] and len(doc["peers"]) == 3


@pytest.mark.integration
def test_transfer_to_a_named_peer(raft: LocalCluster) -> None:
    ns = raft.namesrv_addr
    rows = poll_until(lambda: settled_rows(ns), 30, "one leader at id 0")
    old = next(r for r in rows if r["ROLE"] == "LEADER")
    target = next(r["PEER"] for r in rows if r["ROLE"] != "LEADER")
    out = ok("dledger", "transfer", "-n", ns, "-b", GROUP, "--to", target)
    m = re.fullmatch(rf"leadership of {GROUP} moved from {old['PEER']} to {target}: term (\d+), master (\S+)\n", out)
    assert m, out
    assert int(m.group(1)) > int(old["TERM"]) and m.group(2) == raft.broker(GROUP, int(target[1:])).addr
    after = poll_until(lambda: settled_rows(ns), 30, f"{target} leading at id 0")
    assert next(r["PEER"] for r in after if r["ROLE"] == "LEADER") == target

    again = ok("dledger", "transfer", "-n", ns, "-b", GROUP, "--to", target)
    assert again == f"{target} already leads {GROUP} (term {m.group(1)}); nothing to do\n"
    res = run_cli("dledger", "transfer", "-n", ns, "-b", GROUP, "--to", "n9")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"splitmq: error: [code=29] 'n9' is not a member of DLedger group {GROUP} " \
                         f"(peers: n0, n1, n2)\n"


@pytest.mark.integration
def test_status_names_a_member_that_is_down(raft: LocalCluster) -> None:
    ns = raft.namesrv_addr
    rows = poll_until(lambda: settled_rows(ns), 30, "one leader at id 0")
    follower = next(r["PEER"] for r in rows if r["ROLE"] == "FOLLOWER")
    handle = raft.broker(GROUP, int(follower[1:]))
    handle.stop()  # unregisters: only the other members' peer lists still name it
    try:
        def down() -> subprocess.CompletedProcess[str] | None:
            res = run_cli("dledger", "status", "-n", ns, "-b", GROUP)
            row = next((r for r in table(res.stdout, "PEER") if r["PEER"] == follower), None)
            return res if res.returncode == 0 and row is not None and row["ROLE"] == "down" else None

        res = poll_until(down, 15, f"{follower} shown down")
        assert f"splitmq: warning: peer {follower} of {GROUP} is not registered with the nameserver" in res.stderr
    finally:
        handle.start()
    poll_until(lambda: settled_rows(ns), 30, f"{follower} back as a follower")


@pytest.mark.integration
def test_status_of_an_unknown_group_is_one_line() -> None:
    res = run_cli("dledger", "status", "-n", "127.0.0.1:1", "-b", GROUP, "--timeout", "1")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and "127.0.0.1:1" in res.stderr


# --- cluster up --mode dledger -------------------------------------------------------------------------------


def _reader(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put("")


def _next_line(lines: queue.Queue[str], deadline: float) -> str:
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise AssertionError("cluster up printed nothing more before the deadline") from None


@pytest.mark.integration
def test_cluster_up_dledger_prints_each_peer_and_its_elected_role(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-m", "client.cli", "cluster", "up", "--root", str(tmp_path / "c"),
                           "--mode", "dledger", "--peers", "3", "--set", "heartBeatTimeIntervalMs=500"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) as proc:
        try:
            lines: queue.Queue[str] = queue.Queue()
            assert proc.stdout is not None and proc.stderr is not None
            threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
            deadline = time.monotonic() + 40
            m = re.fullmatch(r"namesrv=(127\.0\.0\.1:\d+)\n", _next_line(lines, deadline))
            assert m
            header = _next_line(lines, deadline).split()
            assert header == ["NAME", "PEER", "ID", "ROLE", "ADDR", "PEER_ADDR", "PID"]
            rows = [dict(zip(header, _next_line(lines, deadline).split(), strict=True)) for _ in range(3)]
            assert [r["PEER"] for r in rows] == ["n0", "n1", "n2"]
            roles = sorted((r["ID"], r["ROLE"]) for r in rows)
            assert roles[0] == ("0", "SYNC_MASTER") and [role for _, role in roles[1:]] == ["SLAVE", "SLAVE"]
            assert all(r["ID"] == str(int(r["PEER"][1:]) + 1) for r in rows if r["ROLE"] == "SLAVE")

            status = json.loads(ok("dledger", "status", "-n", m.group(1), "-b", GROUP, "--json"))
            leader = next(r for r in rows if r["ID"] == "0")
            assert status["leader"] == leader["PEER"]

            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
            rest = "".join(iter(lambda: _next_line(lines, time.monotonic() + 5), ""))
            err = proc.stderr.read()
            assert "cluster stopped" in rest and "Traceback" not in err
            assert "starting 1 broker group(s) x 3 DLedger peer(s), mode dledger" in err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
