"""``splitmq`` as a user runs it: ``python -m client.cli ...`` subprocesses against one real local cluster.

One cluster (one group, one slave, slave reads on, fast metadata sync) serves the whole module; each test uses
its own topic and group names so the order of the tests does not matter.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.cluster import LocalCluster
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: A command or request failing while the cluster settles means "not yet" to a poll.
NOT_YET = (Exception,)


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout_s: float = 60.0, notice: bool = False) -> subprocess.CompletedProcess[str]:
    """``splitmq ARGS`` as a subprocess; output captured as text, without (unless ``notice``) the notice a command prints when the
    nameserver has not answered within a second (a loaded machine's, not the command's; tests/cli/
    test_cli_surprises.py checks the notice itself)."""
    res = subprocess.run([sys.executable, "-m", "client.cli", *args], input=stdin, capture_output=True, text=True,
                         timeout=timeout_s, cwd=REPO, env=env)
    if not notice:
        res.stderr = without_wait_notice(res.stderr)
    return res


def without_wait_notice(stderr: str) -> str:
    """``stderr`` without the line ``waiting for nameserver ... to answer (up to N s)``."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not (line.startswith("waiting for nameserver ") and " to answer (up to " in line))


def ok(*args: str, stdin: str | None = None) -> str:
    """Run and insist on exit code 0; returns stdout."""
    res = run_cli(*args, stdin=stdin)
    assert res.returncode == 0, f"splitmq {' '.join(args)} exited {res.returncode}\nstdout:\n{res.stdout}\n" \
                                f"stderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    return res.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def table(text: str, header_first: str, *, has: str | None = None) -> list[dict[str, str]]:
    """Rows of the text table whose header starts with ``header_first`` (and names column ``has``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.split()[:1] == [header_first] and (has is None or has in line.split()))
    headers = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        cells = line.split()
        if len(cells) != len(headers):
            break
        rows.append(dict(zip(headers, cells, strict=True)))
    return rows


def http_json(addr: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cli-cluster"), broker_groups=1, slaves_per_group=1,
                     # diskMaxUsedSpaceRatio 95: test_broker_clean checks the reason of an operator's pass, which
                     # a real disk more than 75 % full would turn into "disk usage is above ..."
                     broker_config={"slaveReadEnable": "true", "slaveMetadataSyncInterval": "300",
                                    "diskMaxUsedSpaceRatio": "95", "diskSpaceCleanForciblyRatio": "97"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ns(cluster: LocalCluster) -> str:
    return cluster.namesrv_addr


def create_topic(ns: str, topic: str, queues: int = 2) -> None:
    out = ok("topic", "create", "-n", ns, "-t", topic, "-r", str(queues), "-w", str(queues))
    assert f"topic {topic} created on broker-a" in out


def wait_topic_on_slave(cluster: LocalCluster, topic: str) -> None:
    slave = cluster.broker("broker-a", 1)
    poll_until(lambda: topic in http_json(slave.addr, "/topics")["topicConfigTable"], 10, f"{topic} on the slave",
               ignore=NOT_YET)


# --- topics, groups, cluster ---------------------------------------------------------------------------------


def test_topic_create_route_status_list(ns: str) -> None:
    create_topic(ns, "CliTopicA", queues=2)
    route = ok_json("topic", "route", "-n", ns, "-t", "CliTopicA")
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"]) for q in route["queueDatas"]] == \
        [("broker-a", 2, 2)]
    text = ok("topic", "route", "-n", ns, "-t", "CliTopicA")
    assert {r["ID"] for r in table(text, "BROKER", has="ADDR")} == {"0", "1"}

    ok("produce", "-n", ns, "-t", "CliTopicA", "one", "two", "three")
    status = ok_json("topic", "status", "-n", ns, "-t", "CliTopicA")
    queues = status["queues"]
    assert [q["queueId"] for q in queues] == [0, 1]
    assert sum(q["maxOffset"] for q in queues) == 3
    assert all(q["minOffset"] == 0 for q in queues)
    assert all((q["lastUpdateTimestamp"] or 0) > 0 for q in queues if q["maxOffset"] > 0), queues
    rows = table(ok("topic", "status", "-n", ns, "-t", "CliTopicA"), "BROKER")
    assert [r["QUEUE"] for r in rows] == ["0", "1"]
    assert sum(int(r["MAX_OFFSET"]) for r in rows) == 3

    assert "CliTopicA" in ok("topic", "list", "-n", ns).split()
    assert "CliTopicA" in ok_json("topic", "list", "-n", ns)["topics"]

    out = ok("topic", "update", "-n", ns, "-t", "CliTopicA", "-r", "3", "-w", "3", "-b", "broker-a")
    assert "updated on broker-a" in out
    route = ok_json("topic", "route", "-n", ns, "-t", "CliTopicA")
    assert route["queueDatas"][0]["writeQueueNums"] == 3


def test_group_update(cluster: LocalCluster, ns: str) -> None:
    out = ok("group", "update", "-n", ns, "-g", "CliGroupU", "--broker-id", "1", "--slow-broker-id", "1",
             "--retry-max-times", "3")
    assert "group CliGroupU created or updated on broker-a" in out
    groups = http_json(cluster.broker("broker-a", 0).addr, "/subscription-groups")["subscriptionGroupTable"]
    cfg = groups["CliGroupU"]
    assert (cfg["brokerId"], cfg["whichBrokerWhenConsumeSlowly"], cfg["retryMaxTimes"]) == (1, 1, 3)


def test_cluster_list(cluster: LocalCluster, ns: str) -> None:
    brokers = ok_json("cluster", "list", "-n", ns)["brokers"]
    got = {(b["brokerName"], b["brokerId"]): (b["addr"], b["role"]) for b in brokers}
    assert got == {("broker-a", 0): (cluster.broker("broker-a", 0).addr, "ASYNC_MASTER"),
                   ("broker-a", 1): (cluster.broker("broker-a", 1).addr, "SLAVE")}
    rows = table(ok("cluster", "list", "-n", ns), "CLUSTER")
    assert {(r["BROKER"], r["ID"], r["ROLE"]) for r in rows} == {("broker-a", "0", "ASYNC_MASTER"),
                                                                  ("broker-a", "1", "SLAVE")}


def test_ha_status_shows_slave_in_sync(cluster: LocalCluster, ns: str) -> None:
    create_topic(ns, "CliTopicHa")
    ok("produce", "-n", ns, "-t", "CliTopicHa", "--count", "20", "--size", "64")
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    status = ok_json("ha", "status", "-n", ns, "-b", "broker-a")
    master = status["members"]["0"]
    want = int(cluster.broker("broker-a", 0).runtime()["commitLogMaxOffset"])
    assert master["masterMaxOffset"] >= want > 0
    assert len(master["slaves"]) == 1
    # The slave has the data (waited above); its ack reaches the master on its next report.
    def in_sync() -> str | None:
        text = ok("ha", "status", "-n", ns, "-b", "broker-a")
        return text if table(text, "SLAVE_ADDR")[0]["IN_SYNC"] == "yes" else None

    text = poll_until(in_sync, 10, "ha status IN_SYNC yes", ignore=NOT_YET)
    row = table(text, "SLAVE_ADDR")[0]
    assert int(row["ACK_OFFSET"]) >= want
    assert re.search(r"^masterMaxOffset:\s+\d+$", text, re.M)
    assert table(text, "ID")[0]["CONNECTED"] == "yes"


def test_ha_status_shows_a_lagging_slave_behind_then_in_sync(cluster: LocalCluster, ns: str) -> None:
    create_topic(ns, "CliTopicLag")
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    slave = cluster.broker("broker-a", 1)
    slave.pause()  # the slave stops reading: everything produced now is replication lag
    try:
        ok("produce", "-n", ns, "-t", "CliTopicLag", "--count", "2000", "--size", "1024")
        behind = table(ok("ha", "status", "-n", ns, "-b", "broker-a"), "SLAVE_ADDR")[0]
        assert int(behind["DIFF_BYTES"]) >= 2000 * 1024, behind
    finally:
        slave.resume()

    def caught_up() -> dict[str, str] | None:
        row = table(ok("ha", "status", "-n", ns, "-b", "broker-a"), "SLAVE_ADDR")[0]
        return row if row["DIFF_BYTES"] == "0" and row["IN_SYNC"] == "yes" else None

    poll_until(caught_up, 15, "ha status DIFF 0 after the slave resumed", ignore=NOT_YET)


def test_broker_status(cluster: LocalCluster, ns: str) -> None:
    rt = ok_json("broker", "status", "-n", ns, "-b", "broker-a")
    assert (rt["brokerName"], rt["brokerId"], rt["role"]) == ("broker-a", 0, "ASYNC_MASTER")
    slave = cluster.broker("broker-a", 1)
    text = ok("broker", "status", "-n", ns, "--addr", slave.addr)
    assert re.search(r"^role:\s+SLAVE$", text, re.M)
    assert re.search(rf"^addr:\s+{re.escape(slave.addr)}$", text, re.M)
    assert re.search(r"^storeWriteable:\s+yes$", text, re.M), text  # the retention figures are shown too
    assert re.search(r"^diskUsedRatio.commitLog:\s+\d+\.\d%$", text, re.M), text
    assert re.search(r"^retentionFilesDeleted:\s+0$", text, re.M), text


def test_broker_clean(ns: str) -> None:
    reports = ok_json("broker", "clean", "-n", ns, "-b", "broker-a")
    assert set(reports) == {"0", "1"}  # master and slave alike
    for r in reports.values():
        # nothing has expired in this cluster (72 h): a pass that deletes nothing says why
        assert (r["deletedFiles"], r["minOffset"]) == (0, -1)
        assert r["reason"] == "an operator asked for a pass now (splitmq broker clean, Admin.clean_expired_files)"
    text = ok("broker", "clean", "-n", ns, "-b", "broker-a")
    rows = table(text, "BROKER_ID")
    assert [(row["BROKER_ID"], row["ROLE"], row["DELETED_FILES"]) for row in rows] == [("0", "master", "0"),
                                                                                         ("1", "slave", "0")]
    # the reason reads as a sentence, not as one underscored table cell (issue 40 point 5)
    assert ("broker-a[0] master: nothing had expired (fileReservedTime), nothing deleted; why: an operator asked "
            "for a pass now (splitmq broker clean, Admin.clean_expired_files)") in text.splitlines()
    assert "an_operator" not in text
    res = run_cli("broker", "clean", "-n", ns, "-b", "nope")
    assert res.returncode != 0 and "nope" in res.stderr and "Traceback" not in res.stderr


# --- messages ------------------------------------------------------------------------------------------------

_LINE = re.compile(r"^queue=(\S+)/(\d+) offset=(\d+) served-by=(\d+) tags=(\S+) keys=(\S+) body=(.*)$")


def test_produce_then_consume(ns: str) -> None:
    create_topic(ns, "CliTopicPc", queues=2)
    out = ok("produce", "-n", ns, "-t", "CliTopicPc", "--tags", "TagA", "--keys", "k1,k2", "hello world", "second")
    sent = re.findall(r"^sent status=SEND_OK queue=broker-a/(\d+) offset=(\d+) msgId=(\w+) offsetMsgId=(\w+)$",
                      out, re.M)
    assert len(sent) == 2
    ok("produce", "-n", ns, "-t", "CliTopicPc", "-", stdin="from-stdin-1\n\nfrom-stdin-2\n")
    res = run_cli("produce", "-n", ns, "-t", "CliTopicPc", "--count", "30", "--size", "50")
    assert res.returncode == 0, res.stderr
    assert re.search(r"^sent 30 msgs in [\d.]+ s \([\d.]+ msgs/s\)$", res.stdout, re.M), res.stdout
    assert res.stderr == "", res.stderr  # not a terminal: no progress lines, the final count once on stdout
    assert res.stdout.count("sent 30 msgs") == 1, res.stdout

    text = ok("consume", "-n", ns, "-t", "CliTopicPc", "-g", "CliGroupPc", "--from-beginning", "--count", "34",
              "--timeout", "5")
    lines = [m for m in (_LINE.match(line) for line in text.splitlines()) if m]
    assert len(lines) == 34, text
    bodies = {m.group(7) for m in lines}
    assert {"hello world", "second", "from-stdin-1", "from-stdin-2"} <= bodies
    tagged = next(m for m in lines if m.group(7) == "hello world")
    assert (tagged.group(5), tagged.group(6), tagged.group(4)) == ("TagA", "k1,k2", "0")
    assert sum(1 for b in bodies if re.fullmatch(r"\d{12}:x{37}", b)) == 30

    # Offsets were committed: the same group has nothing left, and says why it stopped.
    res = run_cli("consume", "-n", ns, "-t", "CliTopicPc", "-g", "CliGroupPc", "--timeout", "0.5")
    assert res.returncode == 0 and res.stdout == "", res
    assert "consumed 0 msgs (no new message for 0.5 s)" in res.stderr


def test_consume_from_slave_is_served_by_slave(cluster: LocalCluster, ns: str) -> None:
    create_topic(ns, "CliTopicSl", queues=2)
    ok("produce", "-n", ns, "-t", "CliTopicSl", "a", "b", "c", "d")
    cluster.wait_slave_caught_up("broker-a", timeout_s=10)
    wait_topic_on_slave(cluster, "CliTopicSl")
    out = ok("consume", "-n", ns, "-t", "CliTopicSl", "-g", "CliGroupSl", "--from-slave", "--from-beginning",
             "--count", "4", "--json", "--timeout", "5")
    msgs = json_lines(out)
    assert sorted(m["body"] for m in msgs) == ["a", "b", "c", "d"]
    assert {m["servedBy"] for m in msgs} == {1}
    prog = ok_json("consumer", "progress", "-n", ns, "-g", "CliGroupSl", "-t", "CliTopicSl")
    assert {q["lastPullBrokerId"] for q in prog["queues"] if q["brokerOffset"]} == {1}  # read off the slave


def test_consumer_progress_after_commit(ns: str) -> None:
    create_topic(ns, "CliTopicCp", queues=2)
    ok("produce", "-n", ns, "-t", "CliTopicCp", *[f"m{i}" for i in range(6)])
    ok("consume", "-n", ns, "-t", "CliTopicCp", "-g", "CliGroupCp", "--from-beginning", "--count", "4",
       "--timeout", "5")
    prog = ok_json("consumer", "progress", "-n", ns, "-g", "CliGroupCp", "-t", "CliTopicCp")
    queues = prog["queues"]
    assert sum(q["brokerOffset"] for q in queues) == 6
    assert sum(max(q["consumerOffset"], 0) for q in queues) == 4
    assert prog["totalLag"] == 2
    assert all(q["lag"] == q["brokerOffset"] - max(q["consumerOffset"], 0) for q in queues)
    assert {q["lastPullBrokerId"] for q in queues} == {0}  # the consumer pulled from the master
    # Without -t the topics come from the group's committed offsets.
    text = ok("consumer", "progress", "-n", ns, "-g", "CliGroupCp")
    rows = table(text, "TOPIC")
    assert {r["TOPIC"] for r in rows} == {"CliTopicCp"}
    assert {r["LAST_PULL_NODE"] for r in rows} == {"0:master"}
    assert "total lag: 2" in text


def test_msg_query_by_id_and_key(ns: str) -> None:
    create_topic(ns, "CliTopicQ", queues=1)
    out = ok("produce", "-n", ns, "-t", "CliTopicQ", "--keys", "order-42", "payload-1", "payload-2")
    sent = re.findall(r"msgId=(\w+) offsetMsgId=(\w+)$", out, re.M)
    assert len(sent) == 2
    uniq, offset_id = sent[0]

    text = ok("msg", "query", "-n", ns, "--id", offset_id)
    assert re.search(r"^body:\s+payload-1$", text, re.M)
    assert re.search(rf"^msgId:\s+{uniq}$", text, re.M)
    by_uniq = ok_json("msg", "query", "-n", ns, "--id", uniq, "-t", "CliTopicQ")["messages"]
    assert [m["body"] for m in by_uniq] == ["payload-1"]
    by_key = ok_json("msg", "query", "-n", ns, "--key", "order-42", "-t", "CliTopicQ")["messages"]
    assert sorted(m["body"] for m in by_key) == ["payload-1", "payload-2"]
    assert all(m["keys"] == ["order-42"] for m in by_key)


# --- bad input -----------------------------------------------------------------------------------------------


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "code", "needle"), [
    (("topic", "route", "-t", "CliNoSuchTopic"), 1, "CliNoSuchTopic"),
    (("topic", "status", "-t", "CliNoSuchTopic"), 1, "CliNoSuchTopic"),
    (("consume", "-t", "CliNoSuchTopic", "--timeout", "1"), 1, "CliNoSuchTopic"),
    (("ha", "status", "-b", "broker-zz"), 1, "broker-zz"),
    (("broker", "status", "-b", "broker-a", "-i", "7"), 1, "id 7"),
    (("msg", "query", "--key", "k", "-t", "CliNoSuchTopic"), 1, "CliNoSuchTopic"),
    (("topic", "create", "-t", "bad topic!"), 1, "bad topic!"),
    (("topic", "create", "-t", "X", "-r", "0"), 2, "-r/--read-queues"),
    (("topic", "create", "-t", "X", "-c", "C", "-b", "B"), 2, "not allowed with"),
    (("topic", "list", "--timeout", "-1"), 2, "--timeout"),
    (("produce", "-t", "X", "--count", "many"), 2, "--count"),
    (("produce", "-t", "X"), 2, "nothing to send"),
    (("msg", "query", "--key", "k"), 2, "--key needs -t"),
    (("topic", "frobnicate"), 2, "invalid choice"),
])
def test_bad_input_is_one_clear_line(ns: str, args: tuple[str, ...], code: int, needle: str) -> None:
    res = run_cli(*args, "-n", ns) if args[:2] != ("topic", "frobnicate") else run_cli(*args)
    assert res.returncode == code, res
    assert needle in _one_line_error(res)


def test_unreachable_nameserver(ns: str) -> None:
    for args in (("topic", "list"), ("topic", "route", "-t", "X"), ("produce", "-t", "X", "m"),
                 ("cluster", "list")):
        res = run_cli(*args, "-n", "127.0.0.1:1", "--timeout", "2")
        assert res.returncode == 1, res
        assert "127.0.0.1:1" in _one_line_error(res)


def test_missing_nameserver_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    res = run_cli("topic", "list", env=env)
    assert res.returncode == 2
    assert "NAMESRV_ADDR" in _one_line_error(res)
    res = run_cli("topic", "list", env={**env, "NAMESRV_ADDR": "127.0.0.1:1"})
    assert res.returncode == 1 and "127.0.0.1:1" in res.stderr


# --- cluster up ----------------------------------------------------------------------------------------------


def _reader(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put("")


def _next_line(lines: queue.Queue[str], deadline: float) -> str:
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise AssertionError("cluster up printed nothing more before the deadline") from None


def test_cluster_up_runs_until_sigint(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-m", "client.cli", "cluster", "up", "--root", str(tmp_path / "c"),
                           "--slaves", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO) as proc:
        try:
            _check_cluster_up(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _check_cluster_up(proc: subprocess.Popen[str]) -> None:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None and proc.stderr is not None
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 30
    first = _next_line(lines, deadline)
    m = re.fullmatch(r"namesrv=(127\.0\.0\.1:\d+)\n", first)
    assert m, first
    header = _next_line(lines, deadline).split()
    row = dict(zip(header, _next_line(lines, deadline).split(), strict=True))
    assert (row["NAME"], row["ID"], row["ROLE"]) == ("broker-a", "0", "ASYNC_MASTER")
    broker_pid = int(row["PID"])

    brokers = ok_json("cluster", "list", "-n", m.group(1))["brokers"]
    assert [(b["brokerName"], b["brokerId"], b["addr"]) for b in brokers] == [("broker-a", 0, row["ADDR"])]

    proc.send_signal(signal.SIGINT)
    rc = proc.wait(30)
    rest = "".join(iter(lambda: _next_line(lines, time.monotonic() + 5), ""))
    err = proc.stderr.read()
    assert rc == 0, err
    assert "cluster stopped" in rest
    assert "received SIGINT; stopping the cluster" in err
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(broker_pid, 0)
