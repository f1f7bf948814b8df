"""``python -I _exec_confined.py [--procs FILE] [--cpus 0,1] -- COMMAND ARG...``: join a cgroup (this process's
id written to ``FILE``, a ``cgroup.procs``), keep to the CPUs given, then exec ``COMMAND`` in this same process.

The command prefix :func:`client.confine.confine_prefix` builds. Run by its path with ``-I`` (no site, no
project on the path), it imports the standard library only and starts in a few milliseconds. Everything the
command allocates or caches from its first instruction on (page cache included) is charged to the cgroup, and
its process id stays the one its parent knows.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    procs, cpus = "", ""
    while argv and argv[0] != "--":
        if len(argv) < 2 or argv[0] not in ("--procs", "--cpus"):
            print(f"usage: _exec_confined.py [--procs FILE] [--cpus LIST] -- COMMAND...; got {argv!r}",
                  file=sys.stderr)
            return 2
        if argv[0] == "--procs":
            procs = argv[1]
        else:
            cpus = argv[1]
        argv = argv[2:]
    command = argv[1:]
    if not command:
        print("_exec_confined.py: no command after --", file=sys.stderr)
        return 2
    if procs:
        with open(procs, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
