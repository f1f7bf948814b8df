"""What every example shares: the ``--messages`` / ``--namesrv`` arguments and a cluster to run against.

Not an example itself (the leading underscore keeps it out of ``tests/examples``). Each example either talks
to the nameserver given with ``--namesrv`` or starts a throw-away :class:`client.cluster.LocalCluster` --
a nameserver plus broker processes on loopback ports the OS picks -- and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Literal

from client.cluster import LocalCluster

#: Small commit-log files: a fresh cluster starts fast and uses little disk (the broker default is 1 GiB).
COMMITLOG_FILE_SIZE_BYTES = 64 << 20


def parser(doc: str | None, *, messages: int) -> argparse.ArgumentParser:
    """An argument parser with ``--messages N`` (default ``messages``) and ``--namesrv HOST:PORT``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=messages, metavar="N",
                   help=f"how many messages to send (default {messages})")
    p.add_argument("--namesrv", metavar="HOST:PORT",
                   help="use this running cluster instead of starting a local one")
    return p


@contextlib.contextmanager
def cluster(namesrv: str | None, *, broker_groups: int = 1, slaves_per_group: int = 1,
            mode: Literal["async", "sync"] = "async",
            broker_config: Mapping[str, str] | None = None) -> Iterator[tuple[str, LocalCluster | None]]:
    """Yield ``(nameserver address, started LocalCluster)``, or ``(namesrv, None)`` for a running cluster."""
    if namesrv:
        print(f"using the cluster at {namesrv}")
        yield namesrv, None
        return
    with tempfile.TemporaryDirectory(prefix="splitmq-example-") as root:
        started = time.perf_counter()
        with LocalCluster(root, broker_groups=broker_groups, slaves_per_group=slaves_per_group,
                          mode=mode, broker_config=broker_config,
                          commitlog_file_size_bytes=COMMITLOG_FILE_SIZE_BYTES) as c:
            print(f"started a local cluster in {time.perf_counter() - started:.1f} s: nameserver {c.namesrv_addr}, "
                  + ", ".join(f"{b.name}[{b.broker_id}] {b.role}" for b in c.brokers))
            yield c.namesrv_addr, c
