"""``LocalCluster``: nameservers and broker groups as local processes, for tests, demos and benchmarks.

Spawns ``python -m nameserver`` and ``python -m broker`` with :data:`sys.executable` (no server code is imported
here), learns each server's real ports from its ready line, and cleans every process up on ``stop()``, at exit
of the ``with`` block, and at interpreter exit::

    with LocalCluster(tmp_path, broker_groups=2, slaves_per_group=1, mode="sync") as cluster:
        producer = Producer("g", cluster.namesrv_addr)
        cluster.kill_master("broker-a")
        cluster.broker("broker-a", 0).start()          # same store, same ports
        cluster.wait_slave_caught_up("broker-a", timeout_s=10)

Layout under ``root_dir``: ``<name>-<id>/broker.properties`` and ``<name>-<id>/store`` per broker,
``logs/<server>.log`` with each server's stdout and stderr, and with ``acl=True`` ``acl/plain_acl.toml`` (the
accounts file, mode 0600).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from client.secure import write_private
from client.tls import LocalTlsFiles, generate_local_tls_files
from common.signing import Credentials, fresh_authorization
from common.tls import TlsConfigError, client_context

__all__ = ["DLEDGER", "BrokerHandle", "ClusterError", "LocalCluster", "NameserverHandle"]

log = logging.getLogger(__name__)

_NAMESRV_READY = re.compile(r"nameserver ready listen=(\S+)")
#: Broker settings that choose its addresses: a cluster whose ``broker_config`` sets one starts its brokers in
#: order (:meth:`LocalCluster.start`) instead of binding their ports first.
_PORT_KEYS = frozenset({"listenPort", "haListenPort", "brokerIP1", "bindAddress"})
_BROKER_READY = re.compile(r"broker ready name=(\S+) id=(-?\d+) role=(\S+) listen=(\S+) ha=(\S*)")
_LIVE: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


class ClusterError(RuntimeError):
    """A server of the local cluster failed to start, or a wait ran out."""


def _http_json(addr: str, path: str, timeout_s: float = 2.0, credentials: Credentials | None = None,
               tls: ssl.SSLContext | None = None) -> Any:
    req = urllib.request.Request(f"{'https' if tls is not None else 'http'}://{addr}{path}")
    if credentials is not None:  # an ACL cluster: its own waits sign as the admin account
        req.add_header("Authorization", fresh_authorization(credentials, "GET", path, b"", addr))
    with urllib.request.urlopen(req, timeout=timeout_s, context=tls) as resp:
        return json.loads(resp.read())




def write_accounts_file(path: Path, admin: Credentials) -> None:
    """The accounts file of an ACL cluster: one ``admin`` account (docs/SECURITY.md), readable by its owner only
    (it holds a secret key)."""
    text = ("# SplitMQ ACL accounts, written by LocalCluster(acl=True)\n"
            "[[accounts]]\n"
            f"accessKey = {json.dumps(admin.access_key)}\n"
            f"secretKey = {json.dumps(admin.secret_key)}\n"
            "admin = true\n"
            'defaultTopicPerm = "PUB|SUB"\n'
            'defaultGroupPerm = "SUB"\n')
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


#: A listening socket a server process inherits, and the option that names its descriptor (``--listen-fd``).
_Inherited = tuple[str, socket.socket]


class _Process:
    """One server process: stdout drained into its log file by a thread that also watches for the ready line."""

    def __init__(self, label: str, log_path: Path, ready_re: re.Pattern[str]) -> None:
        self.label = label
        self.log_path = log_path
        self.ready_re = ready_re
        self.proc: subprocess.Popen[bytes] | None = None
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, args: list[str], cwd: Path, prefix: tuple[str, ...] = (), *,
              lend: Sequence[_Inherited] = (), give: Sequence[_Inherited] = ()) -> None:
        """Start the process with ``args``; each socket of ``lend`` and ``give`` is passed to it after its flag
        (``FLAG FD``). ``lend`` stays the caller's; ``give`` is closed here once the process has its copy."""
        handed = [*lend, *give]
        args = [*args, *(arg for flag, sock in handed for arg in (flag, str(sock.fileno())))]
        try:
            self._popen(args, cwd, prefix, tuple(sock.fileno() for _, sock in handed))
        finally:
            for _, sock in give:
                sock.close()

    def _popen(self, args: list[str], cwd: Path, prefix: tuple[str, ...], pass_fds: tuple[int, ...]) -> None:
        self._ready.clear()
        self.match = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the drain thread
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, *args], stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL, cwd=cwd,
            env=env, start_new_session=True, pass_fds=pass_fds,
        )
        assert self.proc.stdout is not None
        threading.Thread(target=self._drain, args=(self.proc.stdout, logf), daemon=True,
                         name=f"drain-{self.label}").start()

    def _drain(self, out: IO[bytes], logf: IO[bytes]) -> None:
        try:
            for raw in iter(out.readline, b""):
                logf.write(raw)
                logf.flush()
                if not self._ready.is_set():
                    m = self.ready_re.search(raw.decode("utf-8", "replace"))
                    if m:
                        self.match = m
                        self._ready.set()
        finally:
            logf.close()
            out.close()

    def wait_ready(self, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc.returncode if self.proc else None
                raise ClusterError(f"{self.label} exited with code {code} before its ready line; "
                                   f"log {self.log_path}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ClusterError(f"{self.label} printed no ready line within {timeout_s} s; "
                                   f"log {self.log_path}:\n{self.tail()}")
        assert self.match is not None
        return self.match

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused process can't handle SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %.1f s; killing it", self.label, timeout_s)
            self.kill()


def _listener() -> socket.socket:
    """A listening socket on a loopback port the OS picks, for a server process to inherit (race-free: nobody else
    can take the port meanwhile, and the address is known before the process starts)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _addr(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


class NameserverHandle:
    """A nameserver process of the cluster."""

    def __init__(self, index: int, root: Path, start_timeout_s: float) -> None:
        self.index = index
        self.addr = ""
        self._root = root
        self._timeout = start_timeout_s
        self.acl_file: Path | None = None
        """The accounts file the nameserver enforces (an ACL cluster), else None."""
        self.secret_file: Path | None = None
        """The file holding the brokers' ``haAuthSecret`` (an ACL cluster), given to ``--ha-auth-secret-file``."""
        self.tls_files: LocalTlsFiles | None = None
        """The certificate it serves TLS with (a TLS cluster), else None."""
        self._proc = _Process(f"nameserver-{index}", root / "logs" / f"nameserver-{index}.log", _NAMESRV_READY)
        self._first_ports: list[_Inherited] = []
        """The port bound here for the first start (:meth:`prebind`), given to the process."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def prebind(self) -> None:
        """Bind the port of the first start here, so that its address is known before the process runs."""
        sock = _listener()
        self._first_ports = [("--listen-fd", sock)]
        self.addr = _addr(sock)

    def spawn(self) -> None:
        listen = self.addr or "127.0.0.1:0"  # a restart keeps the port clients know
        args = ["-m", "nameserver", "--listen", listen]
        if self.acl_file is not None:
            args += ["--acl-enable", "--acl-file", str(self.acl_file)]
        if self.secret_file is not None:  # registrations then need the brokers' cluster account too
            args += ["--ha-auth-secret-file", str(self.secret_file)]
        if self.tls_files is not None:
            args += ["--tls-cert", self.tls_files.cert_file, "--tls-key", self.tls_files.key_file]
        give, self._first_ports = self._first_ports, []  # a restart binds the port itself
        self._proc.spawn(args, self._root, give=give)

    def wait_ready(self) -> None:
        self.addr = self._proc.wait_ready(self._timeout).group(1)

    def start(self) -> None:
        """(Re)start on the same port."""
        self.spawn()
        self.wait_ready()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._proc.stop(timeout_s)

    def kill(self) -> None:
        self._proc.kill()

    def running(self) -> bool:
        return self._proc.running()


class BrokerHandle:
    """One broker process (``broker(name, broker_id)``): ports and store survive restarts. In DLedger mode
    ``broker_id`` is the member's index (``n0``, ``n1``, ...): the id it registers with follows the election."""

    def __init__(self, cluster: LocalCluster, name: str, broker_id: int, role: str) -> None:
        self.name = name
        self.broker_id = broker_id
        self.role = role
        self.peer_sock: socket.socket | None = None
        """DLedger mode: the member's peer port, bound here and inherited by each (re)start of the broker."""
        self.dir = cluster.root_dir / f"{name}-{broker_id}"
        self.store_dir = self.dir / "store"
        self.config_path = self.dir / "broker.properties"
        self.addr = ""
        self.ha_addr = ""
        self.entry_module = "broker"
        """The module run as ``python -m``: a harness may set a wrapper of the broker's entry point (one that
        injects store faults, say) before the broker starts."""
        self._first_ports: list[_Inherited] = []
        """The HTTP and HA ports bound here for the first start (:meth:`prebind`), given to the process."""
        self.command_prefix: list[str] = []
        """Argv put before the interpreter on every (re)start: a program that sets something up and execs the rest
        of its arguments in the same process (so :attr:`pid` stays the broker's), such as
        :func:`client.confine.confine_prefix` (a memory cgroup and CPUs, to emulate a host of its own)."""
        self._cluster = cluster
        self._proc = _Process(f"{name}-{broker_id}", cluster.root_dir / "logs" / f"{name}-{broker_id}.log",
                              _BROKER_READY)

    def __repr__(self) -> str:
        return f"BrokerHandle({self.name}[{self.broker_id}] {self.role} {self.addr} pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    def running(self) -> bool:
        return self._proc.running()

    def write_config(self, master_ha_addr: str | None) -> None:
        c = self._cluster
        props: dict[str, str] = {
            "brokerClusterName": c.cluster_name,
            "brokerName": self.name,
            "brokerId": str(self.broker_id),
            "brokerRole": self.role,
            "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": c.namesrv_addr,
            "brokerIP1": "127.0.0.1",
            "listenPort": "0",
            "haListenPort": "0",
            "storePathRootDir": str(self.store_dir),
            "enablePropertyFilter": "true",  # SQL92 subscriptions (RocketMQ's default is false)
        }
        if c.commitlog_file_size_bytes:
            props["mappedFileSizeCommitLog"] = str(c.commitlog_file_size_bytes)
            # An index file sized for the same scale (about 8 MiB instead of 420 MB per broker).
            props["maxHashSlotNum"] = str(LOCAL_INDEX_HASH_SLOTS)
            props["maxIndexNum"] = str(LOCAL_INDEX_ENTRIES)
        if master_ha_addr:
            props["haMasterAddress"] = master_ha_addr
        if self.role == DLEDGER:
            del props["brokerId"], props["brokerRole"], props["haListenPort"]
            props.update(c.dledger_properties(self))
        props.update(LOCAL_BROKER_DEFAULTS)
        props.update(c.acl_properties())
        props.update(c.tls_properties())
        props.update(c.broker_config)
        self.dir.mkdir(parents=True, exist_ok=True)
        # An ACL cluster's broker config holds the broker's secret key: readable by its owner only.
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if c.acl else 0o644)
        if c.acl:
            os.fchmod(fd, 0o600)  # a file left by an earlier run keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))

    def prebind(self) -> None:
        """Bind the HTTP and HA ports of the first start here (a DLedger member has no HA port), so that their
        addresses are known before the process runs: its slaves and its nameservers can start alongside it."""
        http = _listener()
        self._first_ports = [("--listen-fd", http)]
        self.addr = _addr(http)
        if self.role != DLEDGER:
            ha = _listener()
            self._first_ports.append(("--ha-fd", ha))
            self.ha_addr = _addr(ha)

    def spawn(self) -> None:
        args = ["-m", self.entry_module, "-c", str(self.config_path)]
        give, self._first_ports = self._first_ports, []
        if not give:  # a restart binds its ports itself, the same ones: the route and haMasterAddress stay right
            if self.addr:
                args += ["--set", f"listenPort={self.addr.rsplit(':', 1)[1]}"]
            if self.ha_addr:
                args += ["--set", f"haListenPort={self.ha_addr.rsplit(':', 1)[1]}"]
        lend = [("--dledger-fd", self.peer_sock)] if self.peer_sock is not None else []
        self._proc.spawn(args, self.dir, tuple(self.command_prefix), lend=lend, give=give)

    def wait_ready(self) -> None:
        m = self._proc.wait_ready(self._cluster.start_timeout_s)
        self.addr, self.ha_addr = m.group(4), m.group(5)

    def start(self) -> None:
        """(Re)start on the same store and ports; returns once the broker serves."""
        if self.running():
            raise ClusterError(f"{self.name}[{self.broker_id}] is already running (pid {self.pid})")
        self.spawn()
        self.wait_ready()

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        self._proc.kill()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL after ``timeout_s``."""
        self._proc.stop(timeout_s)

    def pause(self) -> None:
        """SIGSTOP: the process stays, its sockets stay open, nothing answers."""
        self._proc.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        self._proc.signal(signal.SIGCONT)

    def runtime(self) -> dict[str, Any]:
        """``GET /runtime`` of this broker (signed as the admin in an ACL cluster)."""
        obj = _http_json(self.addr, "/runtime", credentials=self._cluster.admin_credentials,
                         tls=self._cluster.tls_context)
        assert isinstance(obj, dict)
        return obj


#: The role of a DLedger member's handle (its broker role follows the election).
DLEDGER = "DLEDGER"
#: Entry-index file size of a local cluster's DLedger members (32 bytes per entry: 256 Ki entries per file).
LOCAL_ENTRY_INDEX_FILE_SIZE = 8 << 20

#: Commit-log file size of a local cluster's brokers (see ``LocalCluster``).
LOCAL_COMMITLOG_FILE_SIZE = 64 << 20
LOCAL_INDEX_HASH_SLOTS = 100_000
LOCAL_INDEX_ENTRIES = 400_000
#: Broker settings a local cluster starts with (``broker_config`` wins). Read/write splitting is the point of a
#: master/slave cluster, so slaves serve reads (RocketMQ's broker default, kept by the broker itself, is
#: ``slaveReadEnable=false``), and a slave copies its master's topics every second instead of every 10 s, so a
#: consumer pinned to the slave finds a topic created a moment ago.
LOCAL_BROKER_DEFAULTS: Mapping[str, str] = {"slaveReadEnable": "true", "slaveMetadataSyncInterval": "1000"}


class LocalCluster:
    """A local SplitMQ cluster of processes.

    Args:
        root_dir: where stores, configs and logs go.
        broker_groups: broker groups ``broker-a``, ``broker-b``, ...
        slaves_per_group: slaves per group (ids 1..n); ignored in DLedger mode.
        mode: ``"async"`` (ASYNC_MASTER), ``"sync"`` (SYNC_MASTER) or ``"dledger"`` (each group a Raft group of
            ``peers_per_group`` members that elect their master, docs/DLEDGER.md).
        peers_per_group: DLedger mode: members per group (3 tolerates one failure, 5 two).
        nameservers: nameserver processes.
        broker_config: extra ``.properties`` keys for every broker (win over the defaults, which include
            :data:`LOCAL_BROKER_DEFAULTS`: ``slaveReadEnable=true``; pass ``{"slaveReadEnable": "false"}`` for
            RocketMQ's default, where slaves serve only while their master is down). Brokers keep their own
            ``autoCreateTopicEnable=false``: create topics with :class:`~client.Admin` (a send to a topic nobody
            created is an error naming it); ``{"autoCreateTopicEnable": "true"}`` brings RocketMQ's default back.
        commitlog_file_size_bytes: ``mappedFileSizeCommitLog`` of every broker. A local cluster defaults to
            64 MiB files (the broker's own default, 1 GiB, is meant for production disks: each broker preallocates
            two files); None keeps the broker default.
        start_timeout_s: bound on each server's startup.
        cluster_name: ``brokerClusterName``.
        acl: turn the ACL on (docs/SECURITY.md): write an accounts file with one admin account (random keys, see
            :attr:`admin_credentials`) and a random cluster secret, start the nameservers with ``--acl-enable
            --acl-file`` and every broker with ``aclEnable``, ``aclFile``, the admin account as its own
            (``accessKey``/``secretKey``) and the cluster secret (``haAuthSecret``). Off by default: a local
            cluster binds loopback only.
        tls: turn TLS on everywhere (docs/SECURITY.md): make a throwaway CA and a certificate for
            ``127.0.0.1``/``localhost`` in ``tls/`` (needs the ``openssl`` tool), serve every nameserver, broker,
            HA and DLedger port with it, and give every broker the CA (``tlsCaFile``) to verify the others.
            Clients pass :attr:`tls_ca_file` (``ClientConfig(tls_ca_file=cluster.tls_ca_file)``).
    """

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        *,
        broker_groups: int = 1,
        slaves_per_group: int = 1,
        mode: Literal["async", "sync", "dledger"] = "async",
        peers_per_group: int = 3,
        nameservers: int = 1,
        broker_config: Mapping[str, str] | None = None,
        commitlog_file_size_bytes: int | None = LOCAL_COMMITLOG_FILE_SIZE,
        start_timeout_s: float = 30.0,
        cluster_name: str = "DefaultCluster",
        acl: bool = False,
        tls: bool = False,
    ) -> None:
        if mode not in ("async", "sync", "dledger"):
            raise ValueError(f"mode must be 'async', 'sync' or 'dledger', got {mode!r}")
        if mode == "dledger" and peers_per_group < 1:
            raise ValueError(f"peers_per_group must be >= 1, got {peers_per_group}")
        if not 1 <= broker_groups <= 26 or slaves_per_group < 0 or nameservers < 1:
            raise ValueError("need 1..26 broker groups, >= 0 slaves per group and >= 1 nameserver")
        self.root_dir = Path(root_dir).absolute()  # brokers run in their own directory: a relative root breaks
        self.mode = mode
        self.cluster_name = cluster_name
        self.broker_config = {str(k): str(v) for k, v in (broker_config or {}).items()}
        self.commitlog_file_size_bytes = commitlog_file_size_bytes
        self.start_timeout_s = start_timeout_s
        self.nameserver_handles = [NameserverHandle(i, self.root_dir, start_timeout_s) for i in range(nameservers)]
        master_role = "SYNC_MASTER" if mode == "sync" else "ASYNC_MASTER"
        self.group_names = [f"broker-{chr(ord('a') + i)}" for i in range(broker_groups)]
        self._brokers: dict[tuple[str, int], BrokerHandle] = {}
        for name in self.group_names:
            if mode == "dledger":
                for i in range(peers_per_group):
                    self._brokers[(name, i)] = BrokerHandle(self, name, i, DLEDGER)
                continue
            self._brokers[(name, 0)] = BrokerHandle(self, name, 0, master_role)
            for sid in range(1, slaves_per_group + 1):
                self._brokers[(name, sid)] = BrokerHandle(self, name, sid, "SLAVE")
        self.acl = acl
        self.acl_file: Path | None = self.root_dir / "acl" / "plain_acl.toml" if acl else None
        """The accounts file (``acl=True``), else None."""
        self.admin_credentials: Credentials | None = (
            Credentials(f"admin-{secrets.token_hex(4)}", secrets.token_urlsafe(24)) if acl else None)
        """The admin account of an ACL cluster (pass it as ``credentials=``); None without ACL."""
        self.ha_auth_secret: str | None = secrets.token_urlsafe(24) if acl else None
        """The cluster secret of the HA and DLedger ports (``haAuthSecret``) of an ACL cluster."""
        for ns in self.nameserver_handles:
            ns.acl_file = self.acl_file
            ns.secret_file = self.root_dir / "acl" / "cluster.secret" if acl else None
        self.tls = tls
        self._tls_dir = self.root_dir / "tls"
        self.tls_ca_file: str | None = str(self._tls_dir / "ca.pem") if tls else None
        """The CA of a TLS cluster (``ClientConfig(tls_ca_file=...)``, ``splitmq --tls-ca``); None without TLS.
        The file exists once the cluster has started."""
        self.tls_context: ssl.SSLContext | None = None
        """A client context trusting :attr:`tls_ca_file` (set at start of a TLS cluster)."""
        self._started = False

    def acl_properties(self) -> dict[str, str]:
        """The ACL keys of every broker's ``.properties`` (empty without ACL)."""
        if self.acl_file is None or self.admin_credentials is None:
            return {}
        props = {"aclEnable": "true", "aclFile": str(self.acl_file),
                 "accessKey": self.admin_credentials.access_key, "secretKey": self.admin_credentials.secret_key}
        if self.ha_auth_secret is not None:  # the HA and DLedger ports' handshake (issue 14 item 4)
            props["haAuthSecret"] = self.ha_auth_secret
        return props

    def tls_properties(self) -> dict[str, str]:
        """The TLS keys of every broker's ``.properties`` (empty without TLS)."""
        if not self.tls:
            return {}
        return {"tlsEnable": "true", "tlsCertFile": str(self._tls_dir / "server.pem"),
                "tlsKeyFile": str(self._tls_dir / "server.key"), "tlsCaFile": str(self._tls_dir / "ca.pem")}

    def _make_tls_files(self) -> None:
        try:
            files = generate_local_tls_files(self._tls_dir)
        except TlsConfigError as e:
            raise ClusterError(str(e)) from None
        self.tls_context = client_context(files.ca_file)
        for ns in self.nameserver_handles:
            ns.tls_files = files

    # --- lifecycle ---

    def start(self) -> LocalCluster:
        """Start every nameserver and broker (at once, their ports bound here first; in turn when ``broker_config``
        chooses the brokers' addresses); return once every broker is in the nameservers."""
        if self._started:
            raise ClusterError("cluster already started")
        self._started = True
        _LIVE.add(self)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.acl_file is not None and self.admin_credentials is not None:
                write_accounts_file(self.acl_file, self.admin_credentials)
            if self.ha_auth_secret is not None:
                write_private(self.root_dir / "acl" / "cluster.secret", self.ha_auth_secret + "\n")
            if self.tls:
                self._make_tls_files()
            if self.mode == "dledger":
                self._bind_peer_ports()
            masters = [b for b in self._brokers.values() if b.broker_id == 0 or b.role == DLEDGER]
            slaves = [b for b in self._brokers.values() if b not in masters]
            # Every port bound here first, so that every process starts at once: a broker's registrations and a
            # slave's HA connection wait in their server's accept queue until it serves. A configuration that
            # chooses the brokers' addresses itself starts them in order, each learning the ports of the last.
            at_once = not _PORT_KEYS & self.broker_config.keys()
            for ns in self.nameserver_handles:
                ns.prebind()
                ns.spawn()
            if at_once:
                for b in self._brokers.values():
                    b.prebind()
            else:
                for ns in self.nameserver_handles:
                    ns.wait_ready()
            for b in masters:
                b.write_config(None)
                b.spawn()
            if not at_once:
                for b in masters:
                    b.wait_ready()
            for b in slaves:
                b.write_config(self._brokers[(b.name, 0)].ha_addr)
                b.spawn()
            for ns in self.nameserver_handles:
                ns.wait_ready()
            for b in (*masters, *slaves):
                b.wait_ready()
            self.wait_registered(timeout_s=self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop every process (brokers SIGTERM then SIGKILL after ``timeout_s``). Idempotent."""
        for b in self._brokers.values():
            b._proc.signal(signal.SIGCONT)
            if b.running():
                assert b._proc.proc is not None
                b._proc.proc.terminate()
        for b in self._brokers.values():
            b.stop(timeout_s)
        for ns in self.nameserver_handles:
            ns.stop(timeout_s)
        for b in self._brokers.values():
            if b.peer_sock is not None:
                b.peer_sock.close()
                b.peer_sock = None
        _LIVE.discard(self)

    def _bind_peer_ports(self) -> None:
        """Bind every member's peer port here (race-free: the OS picks, nobody else can take it meanwhile); each
        broker inherits its socket, on every restart."""
        for b in self._brokers.values():
            if b.peer_sock is None:
                b.peer_sock = _listener()

    def dledger_properties(self, member: BrokerHandle) -> dict[str, str]:
        """The ``.properties`` keys of a DLedger member of this cluster."""
        peers = [b for (n, _), b in self._brokers.items() if n == member.name]
        return {
            "enableDLegerCommitLog": "true",
            "dLegerGroup": member.name,
            "dLegerPeers": ";".join(f"n{b.broker_id}-127.0.0.1:{b.peer_sock.getsockname()[1]}"
                                    for b in peers if b.peer_sock is not None),
            "dLegerSelfId": f"n{member.broker_id}",
            "mappedFileSizeForEntryIndex": str(LOCAL_ENTRY_INDEX_FILE_SIZE),
        }

    def __enter__(self) -> LocalCluster:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- accessors ---

    @property
    def namesrv_addr(self) -> str:
        """Nameserver addresses, ``;``-joined."""
        return ";".join(ns.addr for ns in self.nameserver_handles)

    def broker(self, name: str, broker_id: int) -> BrokerHandle:
        """The handle of ``name``'s member ``broker_id``."""
        try:
            return self._brokers[(name, broker_id)]
        except KeyError:
            raise KeyError(f"no broker {name}[{broker_id}] in this cluster; have {sorted(self._brokers)}") from None

    @property
    def brokers(self) -> list[BrokerHandle]:
        return list(self._brokers.values())

    def kill_master(self, name: str) -> BrokerHandle:
        """SIGKILL the master of group ``name`` (DLedger mode: its current leader); returns its handle
        (``.start()`` brings it back)."""
        b = self.leader(name) if self.mode == "dledger" else self.broker(name, 0)
        b.kill()
        return b

    def members(self, name: str) -> list[BrokerHandle]:
        """Every broker of group ``name``."""
        return [b for (n, _), b in self._brokers.items() if n == name]

    def leader(self, name: str, timeout_s: float = 30.0) -> BrokerHandle:
        """DLedger mode: the member of ``name`` that serves as master (elected, caught up, id 0).

        Raises:
            ClusterError: none within ``timeout_s`` (the message gives each member's role).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            roles: dict[str, str] = {}
            for b in self.members(name):
                if not b.running():
                    roles[f"n{b.broker_id}"] = "down"
                    continue
                try:
                    rt = b.runtime()
                except (OSError, ValueError):
                    roles[f"n{b.broker_id}"] = "unreachable"
                    continue
                roles[f"n{b.broker_id}"] = f"{rt.get('role')} id={rt.get('brokerId')}"
                if rt.get("brokerId") == 0 and rt.get("role") != "SLAVE":
                    return b
            if time.monotonic() > deadline:
                raise ClusterError(f"no leader of {name} serving as master within {timeout_s} s: {roles}")
            time.sleep(0.05)  # polling the members with a deadline

    # --- waits ---

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Until every running broker appears in every running nameserver's ``GET /cluster``."""
        deadline = time.monotonic() + timeout_s
        want = {b.addr for b in self._brokers.values() if b.running()}
        missing: set[str] = want
        while True:
            missing = set()
            for ns in self.nameserver_handles:
                if not ns.running():
                    continue
                try:
                    info = _http_json(ns.addr, "/cluster", credentials=self.admin_credentials, tls=self.tls_context)
                    seen = {a for bd in info.get("brokerAddrTable", {}).values()
                            for a in bd.get("brokerAddrs", {}).values()}
                except (OSError, ValueError):
                    seen = set()
                missing |= want - seen
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"brokers {sorted(missing)} not registered with the nameservers within {timeout_s} s")
            time.sleep(0.05)  # polling the nameserver with a deadline

    def wait_slave_caught_up(self, name: str, timeout_s: float = 30.0) -> None:
        """Until every running slave of ``name`` has the master's commit-log max offset and knows as many topics
        (a slave serves a topic only once its metadata sync copied it: up to ``slaveMetadataSyncInterval``, 10 s,
        after the topic was created).

        Raises:
            ClusterError: not caught up within ``timeout_s`` (the message gives both offsets and topic counts).
        """
        master = self.leader(name, timeout_s) if self.mode == "dledger" else self.broker(name, 0)
        slaves = [b for b in self.members(name) if b is not master and b.running()]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                m = master.runtime()
                want = (int(m["commitLogMaxOffset"]), int(m["topicCount"]))
                have = {s.broker_id: (int(r["commitLogMaxOffset"]), int(r["topicCount"]))
                        for s in slaves for r in (s.runtime(),)}
            except (OSError, ValueError, KeyError):
                want, have = (-1, -1), {}
            if want[0] >= 0 and len(have) == len(slaves) and all(
                    off >= want[0] and topics >= want[1] for off, topics in have.values()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"slaves of {name} not caught up within {timeout_s} s: master (commitLogMaxOffset, "
                                   f"topicCount) {want}, slaves {have}")
            time.sleep(0.05)  # polling the brokers with a deadline


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        try:
            cluster.stop(timeout_s=5.0)
        except Exception as e:  # at exit, keep stopping the others
            log.warning("stopping a local cluster at exit failed: %s", e)
