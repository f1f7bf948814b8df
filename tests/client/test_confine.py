"""``client.confine``: the command prefix keeps the process id, joins the cgroup and keeps to the CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from client.confine import MemoryCgroup, cgroup_unavailable_reason, confine_prefix

SHOW = "import os; print(os.getpid(), ','.join(map(str, sorted(os.sched_getaffinity(0)))), flush=True); " \
       "print(open('/proc/self/cgroup').read())"


def _run(prefix: list[str]) -> tuple[int, str, str]:
    proc = subprocess.Popen([*prefix, sys.executable, "-c", SHOW], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    first, _, cgroups = out.partition("\n")
    pid, cpus = first.split()
    assert int(pid) == proc.pid, "the prefix must exec, not fork: the caller's pid is the server's"
    return int(pid), cpus, cgroups


def test_cpus_only() -> None:
    cpu = min(os.sched_getaffinity(0))
    _, cpus, _ = _run(confine_prefix(cpus={cpu}))
    assert cpus == str(cpu)


def test_nothing_to_do_still_runs_the_command() -> None:
    _, cpus, _ = _run(confine_prefix())
    assert cpus == ",".join(map(str, sorted(os.sched_getaffinity(0))))


def test_bad_usage_exits_2() -> None:
    prefix = confine_prefix()
    assert subprocess.run([*prefix[:-1], "--bogus", "x", "--", "true"]).returncode == 2
    assert subprocess.run(prefix).returncode == 2


def test_joins_the_cgroup_and_the_cgroup_is_removed_after() -> None:
    reason = cgroup_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a writable memory cgroup: {reason}")
    with MemoryCgroup.create(f"splitmq-test-{uuid.uuid4().hex[:8]}", 64 << 20) as cg:
        _, _, cgroups = _run(confine_prefix(cg))
        assert cg.pids() == []  # the process has exited: its cgroup is empty again
    name = os.path.basename(cg.path)
    assert any(line.endswith("/" + name) for line in cgroups.splitlines()), cgroups
    assert not os.path.exists(cg.path)
