"""The shell commands of README.md, docs/DEPLOY.md and docs/DASHBOARD.md run as written (issue 40, point 5).

The commands are read out of the documents' fenced ``sh`` blocks (and DEPLOY.md's ``properties`` and ``ini``
blocks, which name the files and the commands its servers run), so a document and this test cannot drift. Before
a command runs, only what :data:`DEPLOY_HOSTS` and the substitution tables below name is replaced, each for a
reason the document itself gives:

* DEPLOY.md's three hosts ``10.0.0.1..3`` become the loopback addresses ``127.0.0.1..3`` (Linux routes all of
  127/8 to loopback), its fixed ports (nameserver ``:9876``, ``listenPort=10911/10921``) become port 0, the
  real port read from each server's ready line (ports race-free), and its system paths (``/etc/splitmq``,
  ``/var/lib/splitmq``, ``/opt/splitmq/venv``) live under the test's temporary directory, the venv being the
  one the suite runs in. DASHBOARD.md's ``/tmp/mq`` and ``--listen 127.0.0.1:8080`` get the same treatment.
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
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.command = command
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
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


def test_deploy_recipe_runs_on_loopback(tmp_path: Path, servers: list[Server]) -> None:
    """DEPLOY.md from "Make the security files" to "Checking it": the secure files made as written, the three
    nameservers started by the unit's ExecStart, broker-a's master and slave from the two properties files with
    the secure keys appended by the block that says so, then the operator's checks, all as written but for the
    hosts, ports and paths mapped as the module docstring says."""
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
    hosts = {**ns_addr, **DEPLOY_HOSTS, "listenPort=10911": "listenPort=0", "listenPort=10921": "listenPort=0"}
    # The properties files the prose names, the secure keys appended by the block that does it.
    master_props, slave_props = blocks(text, "properties")[:2]
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "broker-a-master.properties").write_text(sub(sub(master_props, hosts), paths))
    (etc / "broker-a-slave.properties").write_text(sub(sub(slave_props, hosts), paths))
    append = sub(next(b for b in sh if "broker-secure.properties >>" in b), paths)
    run(append, work, env)
    run(append.replace("broker-a-master", "broker-a-slave"), work, env)  # "to each broker's file"
    # The brokers: the template unit's ExecStart with %i.
    unit = next(b for b in blocks(text, "ini") if "splitmq-broker" in b)
    broker_start = sub(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1), paths)  # type: ignore[union-attr]
    for instance in ("broker-a-master", "broker-a-slave"):
        b = Server(broker_start.replace("%i", instance), tmp_path, env)
        servers.append(b)
        b.wait_for(r"broker ready name=broker-a")
    # Checking it: the operator's commands.
    checks = next(b for b in sh if "splitmq cluster list" in b)
    out = run(runnable(sub(sub(checks, ns_addr), paths)), work, env).stdout
    assert "topic Orders created on broker-a" in out
    assert "group billing created or updated on broker-a" in out
