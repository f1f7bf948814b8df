"""``splitmq cluster up``: a :class:`~client.cluster.LocalCluster` in the foreground until SIGINT or SIGTERM.

Prints ``namesrv=HOST:PORT`` (flushed, its own line) as soon as every broker is registered, and writes the same
address to ``ROOT/namesrv.addr`` (so another shell can ``export NAMESRV_ADDR=$(cat ROOT/namesrv.addr)``; the
nameserver's port is picked by the OS, never a fixed one that another cluster may hold), then the brokers (in
``--mode dledger`` once each group has elected its leader, with each member's peer id and elected role).
Slaves serve reads (``slaveReadEnable=true``, :data:`client.cluster.LOCAL_BROKER_DEFAULTS`); ``--set
slaveReadEnable=false`` gives RocketMQ's broker default. Topics are created with ``splitmq topic create`` (brokers
keep ``autoCreateTopicEnable=false``; ``--set autoCreateTopicEnable=true`` lets a send create one).
The first SIGINT/SIGTERM stops every process (brokers first, SIGKILL after the ``--timeout`` grace) and the
command exits 0 saying so; further signals during the stop are ignored so the stop is not cut short.
With ``--acl`` every server enforces the ACL; the admin access key and the accounts file's path are printed (the
secret key only lives in that file). ``--secure`` is ``--acl --tls`` and prints how a client uses the files.
"""

from __future__ import annotations

import argparse
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

from client.cli._output import Output
from client.cluster import ClusterError, LocalCluster

__all__ = ["cmd_cluster_up"]

#: How often the foreground loop checks that every server process is still alive.
WATCH_INTERVAL_S = 1.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The file under ``--root`` that holds the running cluster's nameserver address.
ADDR_FILE = "namesrv.addr"


class _StopRequested(BaseException):
    """Raised in the main thread by the first SIGINT/SIGTERM (BaseException: no ``except Exception`` eats it)."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def _raise_stop(signum: int, frame: types.FrameType | None) -> None:
    for sig in _SIGNALS:  # only the first signal interrupts; the stop itself must run to its end
        signal.signal(sig, signal.SIG_IGN)
    raise _StopRequested(signal.Signals(signum).name)


def _install(handler: Callable[[int, types.FrameType | None], Any] | int) -> dict[int, Any]:
    return {sig: signal.signal(sig, handler) for sig in _SIGNALS}


def _print_brokers(cluster: LocalCluster, out: Output) -> None:
    if cluster.mode == "dledger":
        _print_dledger_members(cluster, out)
        return
    out.table(("NAME", "ID", "ROLE", "ADDR", "HA_ADDR", "PID"),
              [(b.name, b.broker_id, b.role, b.addr, b.ha_addr, b.pid) for b in cluster.brokers])


def _print_dledger_members(cluster: LocalCluster, out: Output) -> None:
    """One row per member once each group serves writes: its peer id, the id and role the election gave it."""
    for name in cluster.group_names:
        cluster.leader(name, timeout_s=cluster.start_timeout_s)
    rows = []
    for b in cluster.brokers:
        try:
            rt = b.runtime()
            broker_id, role = rt.get("brokerId"), rt.get("role")
        except (OSError, ValueError):
            broker_id, role = None, "unreachable"
        peer_addr = ":".join(map(str, b.peer_sock.getsockname())) if b.peer_sock is not None else None
        rows.append((b.name, f"n{b.broker_id}", broker_id, role, b.addr, peer_addr, b.pid))
    out.table(("NAME", "PEER", "ID", "ROLE", "ADDR", "PEER_ADDR", "PID"), rows)


def _watch(cluster: LocalCluster, out: Output) -> None:
    """Until a signal: report (once each) servers that exited on their own; the rest keep running."""
    reported: set[str] = set()
    wake = threading.Event()  # never set: a bounded, signal-interruptible wait
    while True:
        wake.wait(WATCH_INTERVAL_S)
        for b in cluster.brokers:
            label = f"{b.name}[{b.broker_id}]"
            if not b.running() and label not in reported:
                reported.add(label)
                out.warn(f"broker {label} (pid {b.pid}) exited; log {b.log_path}")
        for ns in cluster.nameserver_handles:
            label = f"nameserver-{ns.index}"
            if not ns.running() and label not in reported:
                reported.add(label)
                out.warn(f"{label} (pid {ns.pid}) exited; logs in {cluster.root_dir / 'logs'}")
        if len(reported) == len(cluster.brokers) + len(cluster.nameserver_handles):
            raise ClusterError(f"every server of the cluster exited; logs in {cluster.root_dir / 'logs'}")


def cmd_cluster_up(args: argparse.Namespace, out: Output) -> int:
    """Start the cluster, print ``namesrv=`` and the brokers, run until SIGINT/SIGTERM, then stop everything."""
    try:
        cluster = LocalCluster(args.root, broker_groups=args.groups, slaves_per_group=args.slaves, mode=args.mode,
                               peers_per_group=args.peers, broker_config=dict(args.set), start_timeout_s=args.timeout,
                               acl=args.acl or args.secure, tls=args.tls or args.secure)
    except ValueError as e:
        args.leaf.error(str(e))
    previous = _install(_raise_stop)
    code = 0
    try:
        members = f"{args.peers} DLedger peer(s)" if args.mode == "dledger" else f"{args.slaves} slave(s)"
        out.info(f"starting {args.groups} broker group(s) x {members}, mode {args.mode}, in {cluster.root_dir}")
        cluster.start()
        (cluster.root_dir / ADDR_FILE).write_text(cluster.namesrv_addr + "\n")
        out.line(f"namesrv={cluster.namesrv_addr}")
        if cluster.admin_credentials is not None:  # the secret stays in the file, never on the terminal
            out.line(f"acl: admin access key {cluster.admin_credentials.access_key}; its secret key is in "
                     f"{cluster.acl_file} (accounts file, mode 0600)")
        if cluster.tls_ca_file is not None:
            out.line(f"tls: CA file {cluster.tls_ca_file} (pass --tls-ca or SPLITMQ_TLS_CA)")
        if args.secure and cluster.admin_credentials is not None:
            out.line(f"secure: every file holding a secret is mode 0600; clients: "
                     f"ClientConfig(tls_ca_file={cluster.tls_ca_file!r}, credentials=Credentials("
                     f"{cluster.admin_credentials.access_key!r}, <secretKey of {cluster.acl_file}>)); CLI: "
                     f"SPLITMQ_TLS_CA={cluster.tls_ca_file} SPLITMQ_ACCESS_KEY="
                     f"{cluster.admin_credentials.access_key} SPLITMQ_SECRET_KEY=<that secretKey>")
        _print_brokers(cluster, out)
        out.info(f"logs in {cluster.root_dir / 'logs'}; press Ctrl-C to stop")
        _watch(cluster, out)
    except _StopRequested as stop:
        out.info(f"received {stop.signame}; stopping the cluster")
    except ClusterError as e:
        out.error(f"cluster: {e}")
        code = 1
    finally:
        _install(signal.SIG_IGN)
        (cluster.root_dir / ADDR_FILE).unlink(missing_ok=True)  # a stale address would point at nothing
        try:
            cluster.stop(timeout_s=args.timeout)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code == 0:
        out.line("cluster stopped")
    return code
