"""The chaos cluster: a :class:`~client.cluster.LocalCluster` (one nameserver, broker groups of a master and a
slave) plus what the nemesis needs that a plain local cluster does not have:

* each slave reaches its master's HA port through a relay it can cut (:mod:`benchmarks.chaos.link_proxy`): the
  slave's ``haMasterAddress`` names the relay, so the slave is restarted once at start with that setting;
* each broker's disk can be filled: its store on a small tmpfs when running as root (a filler file takes the
  free space, so the next file the store allocates fails with ENOSPC), else the broker runs through
  :mod:`benchmarks.chaos.faulty_broker`, whose store file layer fails every allocation and write on a signal;
* health waits with deadlines (every process up, every broker registered, every slave linked) and the
  replication lag of a group (``GET /ha`` of its master).

Everything listens on loopback, on ports the OS chose (restarts keep them). :meth:`ChaosCluster.close` stops
every process and unmounts what it mounted, also after a failure (use it as a context manager).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Literal

import attrs
import httpx

from benchmarks.chaos.faulty_broker import DISK_FULL, DISK_ROOM
from client.cluster import BrokerHandle, ClusterError, LocalCluster, NameserverHandle

__all__ = ["ChaosCluster", "ChaosClusterError", "ClusterSpec", "DiskMode", "Lag", "Target", "pick_disk_mode"]

log = logging.getLogger(__name__)

DiskMode = Literal["tmpfs", "fault-layer"]
#: A process the nemesis acts on.
Target = BrokerHandle | NameserverHandle

#: Broker settings of every chaos cluster (the profile's own come on top).
BASE_BROKER_CONFIG: dict[str, str] = {
    # Fast registration and metadata sync: a restarted broker or nameserver is whole again within about a second.
    "registerNameServerPeriod": "1000",
    "registerNameServerPeriodMinMs": "500",
    "slaveMetadataSyncInterval": "1000",
    "haSendHeartbeatInterval": "1000",
    "flushConsumerOffsetInterval": "500",
    "messageIndexEnable": "false",
    # The disk-fill fault tests the refusal at diskSpaceWarningLevelRatio and the way back; forced deletion of
    # young files (past diskSpaceCleanForciblyRatio) would drop acknowledged messages the checker reads back.
    "cleanFileForciblyEnable": "false",
    # The broker's answer to a send that waits for a paused slave arrives within the SDK's 3 s send timeout
    # (FLUSH_SLAVE_TIMEOUT instead of a client timeout).
    "syncFlushTimeout": "2000",
    # Slaves serve reads, and any consumer behind the end of the commit log is sent to one: the consumers of
    # the workload read from masters and slaves alike, as the SDK's read split directs them.
    "slaveReadEnable": "true",
    "accessMessageInMemoryMaxRatio": "0",
    "maxTransferCountOnMessageInMemory": "256",
    "maxTransferBytesOnMessageInMemory": str(1 << 20),
    "maxTransferCountOnMessageInDisk": "256",
    "maxTransferBytesOnMessageInDisk": str(1 << 20),
}
_SEND_CODES = re.compile(r'^splitmq_send_requests_total\{code="(\d+)"\} (\S+)$', re.MULTILINE)
#: Response codes of a stored message (SEND_OK and the not-fully-durable ones).
_STORED = frozenset({"0", "10", "11", "12"})
#: Bound on one control request to a server (they answer in milliseconds when up).
HTTP_TIMEOUT_S = 2.0
#: Bound on the link relay's start and on each of its answers.
PROXY_TIMEOUT_S = 10.0


class ChaosClusterError(RuntimeError):
    """The cluster could not be set up, or a wait ran out (the message says what was missing)."""


@attrs.frozen
class ClusterSpec:
    """Shape of a chaos cluster."""

    mode: Literal["sync", "async"] = "sync"
    """SYNC_MASTER or ASYNC_MASTER groups."""
    groups: int = 2
    """Broker groups (``broker-a``, ``broker-b``...), each a master and one slave."""
    commitlog_file_size_bytes: int = 256 << 10
    """Small commit-log files: on tmpfs, a full disk bites when the store allocates a file, so files must come
    often (one every second or two at the workload's rate)."""
    disk: DiskMode = "fault-layer"
    """How a disk is filled."""
    tmpfs_size_bytes: int = 256 << 20
    """Size of each broker's tmpfs (``disk="tmpfs"``)."""
    broker_config: Mapping[str, str] = attrs.field(factory=dict)
    """More broker settings (win over :data:`BASE_BROKER_CONFIG`)."""


@attrs.frozen
class Lag:
    """A group's replication state at one moment (``GET /ha`` of its master)."""

    master_max_offset: int
    """The master's commit-log max offset."""
    slave_ack_offset: int
    """The slave's last acked offset (-1 when no slave is connected)."""

    @property
    def bytes(self) -> int:
        return self.master_max_offset - max(self.slave_ack_offset, 0)


def pick_disk_mode(requested: str = "auto") -> DiskMode:
    """``tmpfs`` when asked, or when ``auto`` and this process can mount one (root, and a container that lets
    root mount); else ``fault-layer``."""
    if requested in ("tmpfs", "fault-layer"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"disk mode must be auto, tmpfs or fault-layer, got {requested!r}")
    return "tmpfs" if _can_mount_tmpfs() else "fault-layer"


def _can_mount_tmpfs() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory(prefix="splitmq-chaos-probe-") as d:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True, check=False)
        if r.returncode != 0:
            return False
        subprocess.run(["umount", d], capture_output=True, check=False)
    return True


def _copy_if_there(src: str, dst: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(src, dst)


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> str:
    """The next stdout line of ``proc`` within ``timeout_s``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise ChaosClusterError(f"{what}: no answer within {timeout_s} s (got {buf!r})")
            chunk = os.read(fd, 1)  # one byte at a time: never read past the line into the next answer
            if not chunk:
                raise ChaosClusterError(f"{what}: the process exited (code {proc.wait(5)}); got {buf!r}")
            buf += chunk
    return buf.decode().strip()


class LinkRelays:
    """The relay process of every HA link (:mod:`benchmarks.chaos.link_proxy`)."""

    def __init__(self, upstreams: list[str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.chaos.link_proxy", *upstreams], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        try:
            line = _read_line(self.proc, PROXY_TIMEOUT_S, "link relay start")
            if not line.startswith("link-proxy ready listen="):
                raise ChaosClusterError(f"link relay: unexpected ready line {line!r}")
        except BaseException:
            self.close()
            raise
        self.addrs = line.split("=", 1)[1].split(",")

    def command(self, verb: str, index: int) -> None:
        """``cut`` or ``heal`` link ``index``; returns once the relay applied it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{verb} {index}\n".encode())
        self.proc.stdin.flush()
        answer = _read_line(self.proc, PROXY_TIMEOUT_S, f"link relay {verb} {index}")
        if answer != f"ok {verb} {index}":
            raise ChaosClusterError(f"link relay {verb} {index}: answered {answer!r}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # end of stdin: the relay stops by itself
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


class ChaosCluster:
    """A local cluster the nemesis can kill, pause, fill and cut (see the module docstring).

    Args:
        root: directory of stores, configs and logs (``logs/`` has one file per process).
        spec: the cluster's shape.
    """

    def __init__(self, root: Path, spec: ClusterSpec) -> None:
        self.root = root
        self.spec = spec
        self.local = LocalCluster(root, broker_groups=spec.groups, slaves_per_group=1, mode=spec.mode,
                                  broker_config={**BASE_BROKER_CONFIG, **spec.broker_config},
                                  commitlog_file_size_bytes=spec.commitlog_file_size_bytes)
        self.relays: LinkRelays | None = None
        self._mounted: list[Path] = []
        self._http = httpx.Client(timeout=HTTP_TIMEOUT_S)

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> ChaosCluster:
        """Start every process, put the relays on the HA links and wait until every slave is linked."""
        try:
            for b in self.local.brokers:
                if self.spec.disk == "tmpfs":
                    self._mount(b.store_dir)
                else:
                    b.entry_module = "benchmarks.chaos.faulty_broker"
            self.local.start()
            masters = [self.local.broker(g, 0) for g in self.groups]
            self.relays = LinkRelays([m.ha_addr for m in masters], self.root / "logs" / "link-proxy.log")
            for g, relay in zip(self.groups, self.relays.addrs, strict=True):
                slave = self.local.broker(g, 1)
                slave.stop()
                slave.write_config(relay)
                slave.start()
            self.wait_healthy(30.0)
        except BaseException:
            self.close()
            raise
        return self

    def keep_stores(self, dest: Path) -> list[Path]:
        """Copy every broker's store to ``dest/<broker>`` (a failed run's evidence: on tmpfs the stores go with the
        unmount); returns the copies. A file that changes or vanishes meanwhile is skipped, not an error."""
        kept = []
        for b in self.local.brokers:
            if b.store_dir.is_dir():
                to = dest / b.store_dir.parent.name
                shutil.copytree(b.store_dir, to, dirs_exist_ok=True, ignore_dangling_symlinks=True,
                                copy_function=_copy_if_there)
                kept.append(to)
        return kept

    def close(self) -> None:
        """Stop every process (paused ones too), the relays, and unmount. Idempotent."""
        self.local.stop(timeout_s=10.0)
        if self.relays is not None:
            self.relays.close()
            self.relays = None
        for path in reversed(self._mounted):
            r = subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
            if r.returncode != 0:
                log.warning("umount %s failed: %s", path, r.stderr.decode(errors="replace").strip())
        self._mounted.clear()
        self._http.close()

    def __enter__(self) -> ChaosCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mount(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.spec.tmpfs_size_bytes}", "tmpfs", str(path)],
                           capture_output=True, check=False)
        if r.returncode != 0:
            raise ChaosClusterError(f"cannot mount a tmpfs on {path} (disk mode tmpfs needs root): "
                                    f"{r.stderr.decode(errors='replace').strip()}")
        self._mounted.append(path)

    # --- accessors -------------------------------------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        return self.local.namesrv_addr

    @property
    def groups(self) -> list[str]:
        return list(self.local.group_names)

    @property
    def nameserver(self) -> NameserverHandle:
        return self.local.nameserver_handles[0]

    def processes(self) -> list[Target]:
        """The nameserver and every broker."""
        return [self.nameserver, *self.local.brokers]

    def master(self, group: str) -> BrokerHandle:
        return self.local.broker(group, 0)

    def slave(self, group: str) -> BrokerHandle:
        return self.local.broker(group, 1)

    # --- faults ----------------------------------------------------------------------------------------------

    @staticmethod
    def signal(target: Target, sig: int) -> None:
        """Send ``sig`` to a running process (nothing when it is down)."""
        if target.running() and target.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, sig)

    def fill_disk(self, b: BrokerHandle) -> None:
        """The broker's disk is full from now on (see the module docstring)."""
        if self.spec.disk == "fault-layer":
            self.signal(b, DISK_FULL)
            return
        # Leave less than a commit-log file: the store's next allocation fails. The broker writes meanwhile, so
        # what statvfs shows may be gone a moment later: take it in steps, each smaller than the one refused.
        reserve = self.spec.commitlog_file_size_bytes // 4
        fd = os.open(self._filler(b), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for _ in range(16):
                st = os.statvfs(b.store_dir)
                room = st.f_bavail * st.f_frsize - reserve
                if room <= 0:
                    return
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, room)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    reserve *= 2
        finally:
            os.close(fd)

    def free_disk(self, b: BrokerHandle) -> None:
        """Undo :meth:`fill_disk`."""
        if self.spec.disk == "fault-layer":
            self.signal(b, DISK_ROOM)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._filler(b))

    def disk_bite(self, b: BrokerHandle) -> Callable[[], bool]:
        """Called right after :meth:`fill_disk`: a test that turns true once the broker has met the full disk.

        A master has met it when it refused a send (a response code other than the stored ones); a slave when
        its master's commit log went past the point where the slave had to write (with the fault layer, any
        byte; on tmpfs, the start of the second file after the slave's position, as the store allocates one
        file ahead).
        """
        if b.broker_id == 0:
            base = self.refused_sends(b)
            return lambda: self.refused_sends(b) > base
        s0 = self.max_offset(b)
        size = self.spec.commitlog_file_size_bytes
        mark = s0 if self.spec.disk == "fault-layer" else (s0 // size + 2) * size
        master = self.master(b.name)
        return lambda: self.max_offset(master) > mark

    def refused_sends(self, b: BrokerHandle) -> int:
        """Sends the broker refused without storing them (``splitmq_send_requests_total`` of other codes than
        0, 10, 11 and 12); -1 when it does not answer."""
        try:
            r = self._http.get(f"http://{b.addr}/metrics")
            r.raise_for_status()
        except (httpx.HTTPError, OSError):
            return -1
        return sum(int(float(m.group(2))) for m in _SEND_CODES.finditer(r.text) if m.group(1) not in _STORED)

    def max_offset(self, b: BrokerHandle) -> int:
        """The broker's commit-log max offset; -1 when it does not answer."""
        try:
            return int(self.get_json(b.addr, "/runtime")["commitLogMaxOffset"])
        except (httpx.HTTPError, OSError, KeyError, ValueError):
            return -1

    @staticmethod
    def _filler(b: BrokerHandle) -> Path:
        return b.store_dir / "chaos-filler"

    def cut_link(self, group: str) -> None:
        """Close the group's HA connection and refuse new ones."""
        assert self.relays is not None
        self.relays.command("cut", self.groups.index(group))

    def heal_link(self, group: str) -> None:
        assert self.relays is not None
        self.relays.command("heal", self.groups.index(group))

    # --- observations and waits ------------------------------------------------------------------------------

    def get_json(self, addr: str, path: str) -> Any:
        """``GET`` a server's JSON status (``/ha``, ``/runtime``, ``/topics``...)."""
        r = self._http.get(f"http://{addr}{path}")
        r.raise_for_status()
        return r.json()

    def lag(self, group: str) -> Lag | None:
        """The group's replication state, or None when its master does not answer."""
        try:
            ha = self.get_json(self.master(group).addr, "/ha")
            acks = [int(s["ackOffset"]) for s in ha.get("slaves", [])]
            return Lag(int(ha["masterMaxOffset"]), max(acks) if acks else -1)
        except (httpx.HTTPError, OSError, KeyError, ValueError):
            return None

    def wait_healthy(self, timeout_s: float) -> None:
        """Until every process runs, every broker is registered and every slave is linked to its master.

        Raises:
            ChaosClusterError: not within ``timeout_s`` (names what is missing).
        """
        deadline = time.monotonic() + timeout_s
        down = [repr(p) for p in self.processes() if not p.running()]
        if down:
            raise ChaosClusterError(f"processes not running: {down}")
        try:
            self.local.wait_registered(timeout_s)
        except ClusterError as e:
            raise ChaosClusterError(str(e)) from None
        unlinked = list(self.groups)
        while True:
            unlinked = [g for g in unlinked if not self._linked(g)]
            if not unlinked:
                return
            if time.monotonic() > deadline:
                raise ChaosClusterError(f"slaves of {unlinked} not linked to their masters within {timeout_s} s")
            time.sleep(0.02)  # polling the masters with a deadline

    def _linked(self, group: str) -> bool:
        try:
            ha = self.get_json(self.master(group).addr, "/ha")
        except (httpx.HTTPError, OSError, ValueError):
            return False
        return int(ha.get("connectionCount", 0)) >= 1

    def wait_settled(self, timeout_s: float) -> None:
        """Until every slave has its master's whole commit log and every broker dispatched all of it.

        Raises:
            ChaosClusterError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        for g in self.groups:
            try:
                self.local.wait_slave_caught_up(g, timeout_s=max(0.1, deadline - time.monotonic()))
            except ClusterError as e:
                raise ChaosClusterError(str(e)) from None
        behind: dict[str, Any] = {}
        while True:
            behind = {}
            for b in self.local.brokers:
                try:
                    n = int(self.get_json(b.addr, "/runtime")["dispatchBehindBytes"])
                except (httpx.HTTPError, OSError, KeyError, ValueError) as e:
                    n = -1
                    behind[repr(b)] = repr(e)
                if n:
                    behind.setdefault(repr(b), n)
            if not behind:
                return
            if time.monotonic() > deadline:
                raise ChaosClusterError(f"brokers not done dispatching within {timeout_s} s: {behind}")
            time.sleep(0.05)  # polling the brokers with a deadline


def resume_all(cluster: ChaosCluster) -> None:
    """SIGCONT to every process (a paused one must not outlive a failed run)."""
    for p in cluster.processes():
        cluster.signal(p, signal.SIGCONT)
