"""The shell commands of README.md, docs/DEPLOY.md and docs/DASHBOARD.md run as written (issue 40, point 5).

The commands are read out of the documents' fenced ``sh`` blocks (and DEPLOY.md's ``properties`` and ``ini``
blocks, which name the files and the commands its servers run), so a document and this test cannot drift. Before
a command runs, only what :data:`DEPLOY_HOSTS` and the substitution tables below name is replaced, each for a
reason the document itself gives:

* DEPLOY.md's three hosts ``10.0.0.1..3`` become the loopback addresses ``127.0.0.1..3`` (Linux routes all of
  127/8 to loopback), its fixed ports (nameserver ``:9876``, ``listenPort=10911/10921``) become port 0, the
  real port read from each server's ready line (ports race-free); the DLedger variant's peer port ``:40911``
  becomes a port the test binds on each member's address and the member inherits (``--dledger-fd``, as
  LocalCluster's members do), since every member must know the others' before it starts. Its system paths
  (``/etc/splitmq``, ``/var/lib/splitmq``, ``/opt/splitmq/venv``) live under the test's temporary directory,
  the venv being the one the suite runs in. DASHBOARD.md's ``/tmp/mq`` and ``--listen 127.0.0.1:8080`` get the
  same treatment.
* The venv: a command that a fresh install provides (``splitmq``, ``splitmq-broker``, ``splitmq-nameserver``,
  ``.venv/bin/activate``) is the one of the venv the suite runs in (``make test`` made it with ``pip install -e``,
  as ``make demo`` does); ``pip install`` itself is not run (it needs the network), only checked to install
  from a path, since no package index serves SplitMQ.
* Not run, each named in :data:`NOT_RUN` with why: creating a system user (``useradd``, ``chown``: root and the
  host's user table), and DASHBOARD.md's command that runs the dashboard's own browser tests.

README.md's "Command line" section is run by ``tests/cli/test_readme.py``; its ``make`` lines start the whole
demo and suite and are not run here.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from client import Admin, ClientConfig, Credentials
from client.errors import ClientError
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
START_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 60.0

#: DEPLOY.md's hosts and the loopback address each runs on here.
DEPLOY_HOSTS = {"10.0.0.1": "127.0.0.1", "10.0.0.2": "127.0.0.2", "10.0.0.3": "127.0.0.3"}
#: Lines of the documents' ``sh`` blocks this test does not run, and why.
NOT_RUN = {
    "useradd --system --home /var/lib/splitmq splitmq": "creates a system user (root, the host's user table)",
    "chown splitmq /var/lib/splitmq": "needs that user (the mkdir before it runs)",
    "SPLITMQ_DASHBOARD_SCREENSHOTS=docs/dashboard pytest tests/dashboard": "the dashboard's own browser suite",
}


def doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def sub(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        text = text.replace(old, new)
    return text


class Server:
    """A long-running command of a document (``bash -c``, its own process group), its output read line by line."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        self.command = command
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     pass_fds=pass_fds)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first output line matching ``pattern`` (within START_TIMEOUT_S)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{self.command!r} printed no {pattern!r} within {START_TIMEOUT_S} s:\n"
                            f"{''.join(self.seen)}")
            if line is None:
                pytest.fail(f"{self.command!r} exited ({self.proc.wait()}) before {pattern!r}:\n{''.join(self.seen)}")
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in reversed(started):
        s.stop()


def shell_env(**extra: str) -> dict[str, str]:
    """The environment of a shell where the venv's commands are found and this checkout is what they import."""
    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **extra)
    for key in ("NAMESRV_ADDR", "SPLITMQ_TLS_CA", "SPLITMQ_ACCESS_KEY", "SPLITMQ_SECRET_KEY"):
        env.pop(key, None)
    return env


def run(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a block's lines as one ``bash -e`` script; insist on exit 0 and no traceback."""
    res = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT_S)
    assert res.returncode == 0, f"exit {res.returncode}:\n{script}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    return res


def runnable(block: str) -> str:
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    return "\n".join(ln for ln in lines if not any(ln.startswith(skip) for skip in NOT_RUN))


# --- README.md -----------------------------------------------------------------------------------------------


def test_readme_says_how_to_reach_the_splitmq_command(tmp_path: Path) -> None:
    """After ``make demo`` (``pip install -e`` into ``.venv``), both ways the README gives run ``splitmq``."""
    text = doc("README.md")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "`.venv/bin/splitmq`" in quick and "`. .venv/bin/activate`" in quick
    assert "pip install splitmq" not in text
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(VENV)  # the venv make demo made in the clone: the one this suite runs in
    env = shell_env()
    env["PATH"] = os.environ["PATH"]  # nothing of the venv on PATH until the README's activation
    out = run(".venv/bin/splitmq --version\n. .venv/bin/activate\nsplitmq --version", clone, env).stdout
    assert out.splitlines()[0].startswith("splitmq ") and out.splitlines()[1].startswith("splitmq ")


def test_readme_servers_alone_start_as_written(tmp_path: Path, servers: list[Server]) -> None:
    """"The servers alone": the nameserver line starts (port 9876 -> 0, ports race-free)."""
    m = re.search(r"`(python -m nameserver --listen [^`]+)`", doc("README.md"))
    assert m, "README.md no longer shows how to start a nameserver alone"
    env = shell_env()
    ns = Server(m.group(1).replace("python ", f"{sys.executable} ").replace(":9876", ":0"), tmp_path, env)
    servers.append(ns)
    ns.wait_for(r"nameserver ready listen=")


# --- docs/DASHBOARD.md ---------------------------------------------------------------------------------------


def test_dashboard_first_block_runs_as_written(tmp_path: Path, servers: list[Server]) -> None:
    """``cluster up`` in terminal 1, the dashboard in terminal 2 with the address ``cluster up`` wrote; the page
    the dashboard's first line names answers."""
    block = blocks(doc("docs/DASHBOARD.md"), "sh")[0]
    table = {"/tmp/mq": str(tmp_path / "mq"), "--listen 127.0.0.1:8080": "--listen 127.0.0.1:0"}
    up_line, dash_line = runnable(sub(block, table)).splitlines()
    env = shell_env()
    up = Server(up_line.split("#", 1)[0].strip(), tmp_path, env)
    servers.append(up)
    up.wait_for(r"^namesrv=")
    dash = Server(dash_line.split("  #", 1)[0].strip(), tmp_path, env)
    servers.append(dash)
    url = dash.wait_for(r"^dashboard=(http://\S+)").group(1)
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200 and b"<html" in resp.read().lower()

    def sees_both_groups() -> bool:  # the dashboard reached the nameserver cluster up started
        with urllib.request.urlopen(url.rstrip("/") + "/api/state", timeout=10) as resp:
            state = resp.read().decode()
        return "broker-a" in state and "broker-b" in state

    poll_until(sees_both_groups, 30, "the dashboard's state naming broker-a and broker-b", interval_s=0.2)


# --- docs/DEPLOY.md ------------------------------------------------------------------------------------------


def test_deploy_install_installs_from_a_path() -> None:
    """The install block: no index serves SplitMQ, so pip installs a copy of the repository; the venv it makes
    has the entry points the units run (checked on the suite's own venv, made the same way)."""
    install = blocks(doc("docs/DEPLOY.md"), "sh")[0]
    pip = next(ln for ln in install.splitlines() if " install " in ln)
    target = pip.split(" install ", 1)[1].split()[0]
    assert target.startswith("/"), f"{pip!r} installs from an index, not from a copy of the repository"
    for script in ("splitmq", "splitmq-broker", "splitmq-nameserver"):
        assert (VENV / "bin" / script).exists(), script


@dataclass
class Deployment:
    """DEPLOY.md up to its nameservers, on loopback: the secure files made, copied to /etc/splitmq, and the three
    nameservers running; what the later steps need."""

    text: str
    sh: list[str]
    etc: Path
    paths: dict[str, str]
    env: dict[str, str]
    work: Path
    ns_addr: dict[str, str]
    """Each nameserver of the document (``10.0.0.1:9876``) and the address it serves at here."""
    broker_start: str
    """The template unit's ExecStart (``%i`` left in)."""


def deploy_nameservers(tmp_path: Path, servers: list[Server]) -> Deployment:
    """DEPLOY.md's "Install" (directories), "Make the security files" and the nameservers' unit, as written but
    for the hosts, ports and paths mapped as the module docstring says."""
    text = doc("docs/DEPLOY.md")
    sh = blocks(text, "sh")
    etc, var = tmp_path / "etc" / "splitmq", tmp_path / "var" / "lib" / "splitmq"
    paths = {"/etc/splitmq": str(etc), "/var/lib/splitmq": str(var), "/opt/splitmq/venv": str(VENV)}
    env = shell_env()
    work = tmp_path / "operator"
    work.mkdir()
    # Install: the venv and pip lines stand for the suite's venv (test_deploy_install_installs_from_a_path);
    # the directories are made as written; the user and its ownership are NOT_RUN.
    install = sh[0].splitlines()
    assert install[0] == "python3 -m venv /opt/splitmq/venv" and "/bin/pip install /" in install[1]
    assert install[2] in NOT_RUN and install[3].endswith(" && chown splitmq /var/lib/splitmq")
    run(sub(install[3].split(" && chown")[0], paths), work, env)
    # Make the security files, on the operator's machine; then copy them to every host (the prose's scp).
    secure_init = next(b for b in sh if "secure init" in b)
    run(runnable(sub(sub(secure_init, DEPLOY_HOSTS), paths)), work, env)
    subprocess.run(["cp", "-rp", str(work / "splitmq-secure"), str(etc / "secure")], check=True)
    # The nameservers: the unit's ExecStart on each host.
    unit = next(b for b in blocks(text, "ini") if "splitmq-nameserver" in b)
    exec_start = sub(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1), paths)  # type: ignore[union-attr]
    ns_addr: dict[str, str] = {}
    for host, loop in DEPLOY_HOSTS.items():
        ns = Server(exec_start.replace("0.0.0.0:9876", f"{loop}:0"), tmp_path, env)
        servers.append(ns)
        ns_addr[f"{host}:9876"] = ns.wait_for(r"nameserver ready listen=(\S+)").group(1)
    unit = next(b for b in blocks(text, "ini") if "splitmq-broker" in b)
    broker_start = sub(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1), paths)  # type: ignore[union-attr]
    return Deployment(text, sh, etc, paths, env, work, ns_addr, broker_start)


def test_deploy_recipe_runs_on_loopback(tmp_path: Path, servers: list[Server]) -> None:
    """DEPLOY.md from "Make the security files" to "Checking it": the secure files made as written, the three
    nameservers started by the unit's ExecStart, broker-a's master and slave from the two properties files with
    the secure keys appended by the block that says so, then the operator's checks, all as written but for the
    hosts, ports and paths mapped as the module docstring says."""
    d = deploy_nameservers(tmp_path, servers)
    etc, paths, env, work, ns_addr = d.etc, d.paths, d.env, d.work, d.ns_addr
    hosts = {**ns_addr, **DEPLOY_HOSTS, "listenPort=10911": "listenPort=0", "listenPort=10921": "listenPort=0"}
    # The properties files the prose names, the secure keys appended by the block that does it.
    master_props, slave_props = blocks(d.text, "properties")[:2]
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "broker-a-master.properties").write_text(sub(sub(master_props, hosts), paths))
    (etc / "broker-a-slave.properties").write_text(sub(sub(slave_props, hosts), paths))
    append = sub(next(b for b in d.sh if "broker-secure.properties >>" in b), paths)
    run(append, work, env)
    run(append.replace("broker-a-master", "broker-a-slave"), work, env)  # "to each broker's file"
    # The brokers: the template unit's ExecStart with %i.
    for instance in ("broker-a-master", "broker-a-slave"):
        b = Server(d.broker_start.replace("%i", instance), tmp_path, env)
        servers.append(b)
        b.wait_for(r"broker ready name=broker-a")
    # Checking it: the operator's commands.
    checks = next(b for b in d.sh if "splitmq cluster list" in b)
    out = run(runnable(sub(sub(checks, ns_addr), paths)), work, env).stdout
    assert "topic Orders created on broker-a" in out
    assert "group billing created or updated on broker-a" in out


@pytest.mark.slow
def test_deploy_dledger_variant_fails_over_on_loopback(tmp_path: Path, servers: list[Server]) -> None:
    """"A DLedger variant": broker-a's members n0/n1/n2 from its properties file, n1/n2 made as the prose says,
    the secure keys appended as above, each started by the template unit; then what the prose promises: a
    leader is elected and registers as broker-a's master, a send to a topic the operator created is acknowledged,
    the leader dies (SIGKILL), another member is elected and takes the writes, and the messages acknowledged
    before are read back.

    The peer ports (``:40911``) are bound here, one on each member's loopback address (port 0: race-free), and
    each member inherits its own as LocalCluster's members do (``--dledger-fd``, added to the unit's command
    line); ``dLegerPeers`` names them.
    """
    d = deploy_nameservers(tmp_path, servers)
    section = d.text.split("## A DLedger variant", 1)[1].split("\n## ", 1)[0]
    n0_props = blocks(section, "properties")[0]
    socks: dict[str, socket.socket] = {}
    for host, loop in DEPLOY_HOSTS.items():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((loop, 0))
        sock.listen(128)
        sock.set_inheritable(True)
        socks[host] = sock
    peer_ports = {f"{host}:40911": "{}:{}".format(*sock.getsockname()) for host, sock in socks.items()}
    fixed = {**d.ns_addr, **peer_ports, "listenPort=10911": "listenPort=0"}
    append = sub(next(b for b in d.sh if "broker-secure.properties >>" in b), d.paths)
    members: dict[str, Server] = {}  # peer id -> its broker
    try:
        for i, host in enumerate(DEPLOY_HOSTS):
            member = f"n{i}"
            # "the same but for dLegerSelfId=n1 / n2, brokerIP1 (the host's address) and storePathRootDir"
            own = {"dLegerSelfId=n0": f"dLegerSelfId={member}", "brokerIP1=10.0.0.1": f"brokerIP1={host}",
                   "/var/lib/splitmq/broker-a-n0": f"/var/lib/splitmq/broker-a-{member}"}
            missing = [line for line in own if line not in n0_props]
            assert not missing, f"DEPLOY.md's DLedger properties no longer have {missing}, which the prose varies"
            mapped = sub(sub(n0_props, fixed), own)
            left = re.findall(r"10\.0\.0\.\d:\d+|:40911|:9876|=10911", mapped)  # a host:port the prose does not give
            props = sub(sub(mapped, DEPLOY_HOSTS), d.paths)
            assert not left, (f"{member}'s properties still name {left} after mapping DEPLOY.md's hosts and "
                              f"ports:\n{props}")
            instance = f"broker-a-{member}"
            (d.etc / f"{instance}.properties").write_text(props)
            run(append.replace("broker-a-master", instance), d.work, d.env)  # "Append broker-secure.properties"
            fd = socks[host].fileno()
            b = Server(f"{d.broker_start.replace('%i', instance)} --dledger-fd {fd}", tmp_path, d.env, (fd,))
            servers.append(b)
            members[member] = b
        ready = {m: b.wait_for(r"broker ready name=broker-a .*listen=(\S+) .*dledger=(\S+)")
                 for m, b in members.items()}
    finally:
        for sock in socks.values():  # each member holds its own copy; a killed member's port closes with it
            sock.close()
    for (m, match), host in zip(ready.items(), DEPLOY_HOSTS, strict=True):
        assert match.group(2) == peer_ports[f"{host}:40911"], \
            f"{m} on {host} serves its peer port at {match.group(2)}, not {host}:40911's: {match.group(0)}"
    # The operator's shell of "Checking it" (the nameservers, the CA and the admin account) runs the commands;
    # the waits in between ask the same cluster in-process, as that account (no CLI start-up per poll).
    checks = next(b for b in d.sh if "splitmq cluster list" in b)
    prelude = "\n".join(ln for ln in sub(sub(checks, d.ns_addr), d.paths).splitlines()
                        if ln.startswith(("export ", "set -a")))
    secure = d.etc / "secure"
    keys = dict(ln.split("=", 1) for ln in (secure / "admin.credentials").read_text().split())
    admin = Admin(";".join(d.ns_addr.values()), client_config=ClientConfig(tls_ca_file=str(secure / "tls/ca.pem")),
                  credentials=Credentials(keys["SPLITMQ_ACCESS_KEY"], keys["SPLITMQ_SECRET_KEY"]))

    def master(but: str | None = None) -> str | None:
        """The peer id of the leader registered as broker-a's master (id 0), unless it is ``but``."""
        st = admin.dledger_status("broker-a").get(0, {})
        return st["selfId"] if st.get("role") == "LEADER" and st.get("selfId") != but else None

    addr = {m: match.group(1) for m, match in ready.items()}
    with admin:
        first = poll_until(master, 30, "a leader of broker-a registered as its master", interval_s=0.1,
                           ignore=(ClientError,))
        out = run(f"{prelude}\nsplitmq dledger status -b broker-a", d.work, d.env).stdout  # as the prose says
        assert re.search(rf"^{first}\s.*\sLEADER\s", out, re.M), out
        out = run(f"{prelude}\nsplitmq topic create -t Payments -r 4 -w 4 -c prod", d.work, d.env).stdout
        assert "topic Payments created on broker-a" in out, out
        out = run(f"{prelude}\nsplitmq produce -t Payments before-failover", d.work, d.env).stdout
        assert "sent status=SEND_OK queue=broker-a/" in out, out  # stored on two of the three members
        # Followers copy topics from the leader every slaveMetadataSyncInterval ("create topics that long before
        # a failover can matter"): wait until both know as many as the leader.
        want = admin.broker_runtime(addr[first])["topicCount"]
        poll_until(lambda: all(admin.broker_runtime(addr[m])["topicCount"] == want for m in members if m != first),
                   30, f"broker-a's followers knowing the leader's {want} topics", interval_s=0.2)
        # The leader dies.
        dead = members[first].proc
        dead.kill()
        dead.wait(timeout=10)
        second = poll_until(lambda: master(but=first), 30, f"a leader of broker-a other than the killed {first}",
                            interval_s=0.1, ignore=(ClientError,))
    # The route may name the dead leader for a moment more: a send is retried until the new master takes it.
    last: list[subprocess.CompletedProcess[str]] = []

    def sent() -> bool:
        last[:] = [subprocess.run(["bash", "-e", "-c", f"{prelude}\nsplitmq produce -t Payments after-failover"],
                                  cwd=d.work, env=d.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)]
        return last[0].returncode == 0

    try:
        poll_until(sent, 30, f"a send to Payments acknowledged after {second} took over from {first}",
                   interval_s=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast send: exit {last[0].returncode}\n{last[0].stdout}{last[0].stderr}") from None
    assert "sent status=SEND_OK queue=broker-a/" in last[0].stdout, last[0].stdout  # on both members left
    assert "Traceback" not in last[0].stderr, last[0].stderr
    out = run(f"{prelude}\nsplitmq consume -t Payments -g audit --from-beginning --count 2 --timeout 10",
              d.work, d.env).stdout
    assert "before-failover" in out and "after-failover" in out, out
