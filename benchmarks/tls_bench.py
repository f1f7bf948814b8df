"""What TLS costs on the data path (issue 14 item 5): the same work against a plain cluster and a TLS one.

Two one-group clusters (no slave) run side by side: ``LocalCluster()`` and ``LocalCluster(tls=True)``, whose
clients use ``ClientConfig(tls_ca_file=...)``: every request and answer is encrypted by the client and the broker
(AES-GCM with the stdlib's default ciphers; connections are pooled, so handshakes are not in the figures). The
rounds are those of :mod:`benchmarks.acl_bench` (the same :class:`~benchmarks.acl_bench.Side`):

* ``send_batch`` -- ``Producer.send_batch`` of 64 messages of 1 KiB from one thread, msgs/s;
* ``pull``       -- ``PullConsumer.pull`` of 32 per request from one thread over every queue of a pre-filled
  topic, every message decoded, msgs/s.

Rounds interleave (off, on, on, off, ...) so a noisy neighbour weighs on both sides; each figure is the median of
its rounds and the ratio is TLS on / TLS off (reported, no target). CPU per message, client plus broker, is
reported too. ``python -m benchmarks tls [--quick]``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import Row
from benchmarks.acl_bench import FULL, QUICK, AclFigures, Profile, Side, interleave, rows
from client import ClientConfig
from client.cluster import LocalCluster

__all__ = ["measure", "run"]


def measure(root: Path, profile: Profile) -> AclFigures:
    """Start a plain and a TLS cluster under ``root``, run ``profile``'s interleaved rounds, stop them. The
    figures' ``off``/``on`` sides are TLS off/on.

    Raises:
        RuntimeError: a pull run read another number of messages than the topic holds.
    """
    with LocalCluster(root / "off", broker_groups=1, slaves_per_group=0) as off_cluster, \
            LocalCluster(root / "on", broker_groups=1, slaves_per_group=0, tls=True) as on_cluster:
        off = Side(off_cluster.namesrv_addr, None, profile.pull_messages, off_cluster.broker("broker-a", 0).pid,
                   name="TlsBench")
        on = Side(on_cluster.namesrv_addr, ClientConfig(tls_ca_file=on_cluster.tls_ca_file), profile.pull_messages,
                  on_cluster.broker("broker-a", 0).pid, name="TlsBench")
        return interleave(off, on, profile)


def run(quick: bool) -> list[Row]:
    """Runner entry (``python -m benchmarks tls``)."""
    profile = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as d:
        f = measure(Path(d), profile)
    return rows(f, profile, "TLS", ratio_target="report", cpu_target="report")
