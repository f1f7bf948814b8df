"""Run a local server as if it had a host of its own: a memory cgroup that bounds its memory (page cache
included) and a set of CPUs. For :class:`client.cluster.LocalCluster` (``BrokerHandle.command_prefix``), in tests
and benchmarks that emulate several hosts on one machine::

    with MemoryCgroup.create("splitmq-master", 512 << 20) as cg:
        cluster.broker("broker-a", 0).command_prefix = confine_prefix(cg, cpus={0})
        with cluster:
            ...
    # the cluster has stopped; leaving the outer block removes the cgroup

The kernel charges a cached page to the cgroup of the process that first touched it, so the server must be in
its cgroup before it writes anything: the prefix joins the cgroup and then execs the server, in one process.
A cgroup is made under this process's own memory cgroup (v1; on v2 the own cgroup must delegate the memory
controller, ``cgroup.subtree_control``), which takes root or a delegated hierarchy:
:func:`cgroup_unavailable_reason` says why it cannot be done here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from common.memory_cgroup import CgroupDir, own_memory_cgroup

__all__ = ["CgroupUnavailableError", "MemoryCgroup", "cgroup_unavailable_reason", "confine_prefix"]

_EXEC = Path(__file__).with_name("_exec_confined.py")


class CgroupUnavailableError(RuntimeError):
    """A memory cgroup cannot be made (or limited) here; the message says why."""


class MemoryCgroup:
    """A memory cgroup this process made, with a limit; :meth:`remove` (or leaving the ``with`` block) deletes
    it once its processes have exited.

    Args:
        cgroup: the cgroup's directory and hierarchy version.
    """

    def __init__(self, cgroup: CgroupDir) -> None:
        self.cgroup = cgroup

    @classmethod
    def create(cls, name: str, limit_bytes: int, *, parent: CgroupDir | None = None) -> MemoryCgroup:
        """Make ``name`` under ``parent`` (default: this process's own memory cgroup) with ``limit_bytes``.

        Raises:
            CgroupUnavailableError: no memory cgroup found, the directory cannot be made, or the limit cannot be
                written (the directory is removed again).
        """
        parent = parent or own_memory_cgroup()
        if parent is None:
            raise CgroupUnavailableError("no memory cgroup hierarchy is mounted (/proc/self/cgroup, mountinfo)")
        path = os.path.join(parent.path, name)
        try:
            os.mkdir(path)
        except OSError as e:
            raise CgroupUnavailableError(f"cannot make the memory cgroup {path}: {e}") from None
        made = cls(CgroupDir(parent.version, path))
        try:
            with open(made.cgroup.limit_file, "w", encoding="ascii") as f:
                f.write(str(limit_bytes))
        except OSError as e:
            made.remove(timeout_s=0)
            hint = " (v2: is +memory in the parent's cgroup.subtree_control?)" if parent.version == 2 else ""
            raise CgroupUnavailableError(f"cannot limit {path} to {limit_bytes} bytes: {e}{hint}") from None
        return made

    @property
    def path(self) -> str:
        return self.cgroup.path

    @property
    def procs_file(self) -> str:
        """``cgroup.procs``: writing a process id moves that process in."""
        return os.path.join(self.path, "cgroup.procs")

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name), encoding="ascii") as f:
            return f.read()

    def usage_bytes(self) -> int:
        """Memory charged now (page cache included)."""
        return int(self._read("memory.usage_in_bytes" if self.cgroup.version == 1 else "memory.current"))

    def pids(self) -> list[int]:
        return [int(p) for p in self._read("cgroup.procs").split()]

    def remove(self, timeout_s: float = 10.0) -> None:
        """Delete the cgroup, waiting up to ``timeout_s`` for its processes to be gone (a killed process leaves
        its cgroup when the kernel has finished tearing it down). Its page cache moves to the parent.

        Raises:
            OSError: still busy after ``timeout_s``, or another failure than "busy".
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.02)  # polling the kernel for the exited processes to leave, with a deadline

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def confine_prefix(cgroup: MemoryCgroup | None = None, cpus: Iterable[int] | None = None) -> list[str]:
    """The argv to put before a command so that it runs in ``cgroup`` (when given) on ``cpus`` (when given):
    a small Python program that joins, keeps to the CPUs and execs the command in the same process."""
    out = [sys.executable, "-I", str(_EXEC)]
    if cgroup is not None:
        out += ["--procs", cgroup.procs_file]
    cpu_list = sorted(set(cpus or ()))
    if cpu_list:
        out += ["--cpus", ",".join(str(c) for c in cpu_list)]
    return [*out, "--"]


def cgroup_unavailable_reason() -> str | None:
    """Why a limited memory cgroup cannot be made here (None: it can): tries to make and remove one."""
    try:
        probe = MemoryCgroup.create(f"splitmq-probe-{os.getpid()}", 64 << 20)
    except CgroupUnavailableError as e:
        return f"not root, and {e}" if os.geteuid() != 0 else str(e)
    probe.remove(timeout_s=1.0)
    return None
