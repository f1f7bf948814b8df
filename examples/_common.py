"""What every example shares: the ``--messages`` / ``--namesrv`` arguments and a cluster to run against.

Not an example itself (the leading underscore keeps it out of ``tests/examples``). Each example either talks
to the nameserver given with ``--namesrv`` or starts a throw-away :class:`client.cluster.LocalCluster` --
a nameserver plus broker processes on loopback ports the OS picks -- and stops it at the end.

An SDK error that ends an example (a wrong ``--namesrv``, a broker that went away) is printed as one line naming
the example and what to check, not as a traceback: these are programs a newcomer runs first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Literal

from client import Admin, ClientConfig
from client.cluster import ClusterError, LocalCluster
from client.errors import ClientError

#: Bound on the first question to a ``--namesrv`` nameserver (a wrong address fails in seconds, not minutes).
NAMESRV_CHECK_TIMEOUT_S = 5.0

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
    """Yield ``(nameserver address, started LocalCluster)``, or ``(namesrv, None)`` for a running cluster.

    A :class:`~client.errors.ClientError` or :class:`~client.cluster.ClusterError` out of the ``with`` body ends
    the program with one line on stderr and exit code 1.
    """
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "example"
    try:
        if namesrv:
            _check_namesrv(namesrv)
            print(f"using the cluster at {namesrv}")
            yield namesrv, None
            return
        with _local_cluster(broker_groups, slaves_per_group, mode, broker_config) as started:
            yield started
    except (ClientError, ClusterError) as e:
        hint = " (check --namesrv HOST:PORT, or leave it out to start a local cluster)" if namesrv else ""
        raise SystemExit(f"{name}: error: {e}{hint}") from None


def _check_namesrv(namesrv: str) -> None:
    """Ask the nameserver for the cluster list with a short bound, so a wrong address fails first and clearly."""
    config = ClientConfig(request_timeout_s=NAMESRV_CHECK_TIMEOUT_S, connect_timeout_s=NAMESRV_CHECK_TIMEOUT_S)
    with Admin(namesrv, client_config=config) as admin:
        admin.cluster_info()


@contextlib.contextmanager
def _local_cluster(broker_groups: int, slaves_per_group: int, mode: Literal["async", "sync"],
                   broker_config: Mapping[str, str] | None) -> Iterator[tuple[str, LocalCluster]]:
    with tempfile.TemporaryDirectory(prefix="splitmq-example-") as root:
        started = time.perf_counter()
        with LocalCluster(root, broker_groups=broker_groups, slaves_per_group=slaves_per_group,
                          mode=mode, broker_config=broker_config,
                          commitlog_file_size_bytes=COMMITLOG_FILE_SIZE_BYTES) as c:
            print(f"started a local cluster in {time.perf_counter() - started:.1f} s: nameserver {c.namesrv_addr}, "
                  + ", ".join(f"{b.name}[{b.broker_id}] {b.role}" for b in c.brokers))
            yield c.namesrv_addr, c
