"""The peer servers of ``python -m benchmarks peers``: Redis (a master and a replica) and NATS (one JetStream
server, or three in a cluster), each a child process on loopback in a temporary directory, stopped on exit.

Peers are optional: :func:`redis_missing` and :func:`nats_missing` say what is not installed (the server binary
from Debian, the Python client from the ``bench`` extra) and how to install it, so the benchmark can skip a
peer with that hint instead of failing.

Ports: NATS binds port ``-1`` (its own "pick a free port") for clients and writes what it bound to a ports file.
Redis cannot (``--port 0`` turns TCP off), and a JetStream cluster needs each route port before the servers
start, so those ports are picked by binding port 0 and closing it; another process may take such a port in the
moment between, so a start that fails to bind is retried with new ports, a bounded number of times.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["NatsServers", "PeerStartError", "RedisPair", "find_binary", "nats_missing", "redis_missing"]

#: How to get each peer (Debian package for the server, the ``bench`` extra for the Python clients).
REDIS_INSTALL = "apt-get install redis-server && pip install 'splitmq[bench]'  (redis, hiredis)"
NATS_INSTALL = "apt-get install nats-server && pip install 'splitmq[bench]'  (nats-py)"
#: Debian puts nats-server in /usr/sbin, which is not on every user's PATH.
_EXTRA_BIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_START_ATTEMPTS = 5
_START_TIMEOUT_S = 20.0
_BIND_ERRORS = ("Address already in use", "address already in use")


class PeerStartError(RuntimeError):
    """A peer server did not come up (the message has the end of its log)."""


def find_binary(name: str) -> str | None:
    """The path of ``name`` on PATH or in the sbin directories Debian installs servers to."""
    extra = os.pathsep.join(_EXTRA_BIN_DIRS)
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + extra)


def _missing(binary: str, modules: tuple[str, ...], hint: str) -> str | None:
    absent = [] if find_binary(binary) else [binary]
    absent += [m for m in modules if importlib.util.find_spec(m) is None]
    return f"{', '.join(absent)} not installed; install with: {hint}" if absent else None


def redis_missing() -> str | None:
    """None when Redis can run here, else what is missing and how to install it."""
    return _missing("redis-server", ("redis", "hiredis"), REDIS_INSTALL)


def nats_missing() -> str | None:
    """None when NATS JetStream can run here, else what is missing and how to install it."""
    return _missing("nats-server", ("nats",), NATS_INSTALL)


def _pick_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(pred: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise PeerStartError(f"{what} not within {timeout_s} s{_log_tail(log)}")
        time.sleep(0.02)  # polling a starting server with a deadline


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return "; log ends: " + " | ".join(log.read_text(errors="replace").splitlines()[-5:])


class _Child:
    """One server process, its log file, and a bounded stop."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def bind_failed(self) -> bool:
        return self.exited() and any(e in self.log.read_text(errors="replace") for e in _BIND_ERRORS)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)


class _Servers:
    """Context-manager plumbing shared by the peers: every child is stopped on exit, even after a failed start."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._children: list[_Child] = []

    def _spawn(self, args: list[str], log: Path) -> _Child:
        child = _Child(args, log)
        self._children.append(child)
        return child

    def _stop_children(self) -> None:
        for child in self._children:
            child.stop()
        self._children.clear()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop_children()


class RedisPair(_Servers):
    """A Redis master and one replica (``--replicaof``) on loopback, with Redis's built-in defaults otherwise
    (RDB snapshots per its default ``save`` rule, no AOF): the configuration a user gets from ``redis-server``,
    but for ``repl-diskless-sync-delay 0``, which only makes the replica's first sync start at once.

    Use as ``with RedisPair(root) as pair:``; :attr:`master_port` and :attr:`replica_port` are set once the
    replica's link is up.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.master_port = 0
        self.replica_port = 0
        self._binary = find_binary("redis-server") or "redis-server"

    def __enter__(self) -> RedisPair:
        try:
            # The master waits 5 s (by default) for more replicas before the first full sync; there is one.
            self.master_port = self._start("master", ["--repl-diskless-sync-delay", "0"])
            self.replica_port = self._start("replica", ["--replicaof", "127.0.0.1", str(self.master_port)])
            _wait_for(self._linked, _START_TIMEOUT_S, "redis replica link up", self.root / "redis-replica.log")
        except BaseException:
            self._stop_children()
            raise
        return self

    def _start(self, label: str, extra: list[str]) -> int:
        data = self.root / f"redis-{label}"
        data.mkdir(parents=True, exist_ok=True)
        log = self.root / f"redis-{label}.log"
        for _ in range(_START_ATTEMPTS):
            port = _pick_port()
            child = self._spawn([self._binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                                 "--daemonize", "no", *extra], log)
            _wait_for(lambda c=child, p=port: c.exited() or self._pings(p),  # type: ignore[misc]
                      _START_TIMEOUT_S, f"redis {label}", log)
            if not child.exited():
                return port
            if not child.bind_failed():
                raise PeerStartError(f"redis {label} exited with {child.proc.returncode}{_log_tail(log)}")
        raise PeerStartError(f"redis {label}: no free port in {_START_ATTEMPTS} attempts{_log_tail(log)}")

    @staticmethod
    def _pings(port: int) -> bool:
        import redis

        try:
            with redis.Redis(port=port, socket_timeout=1) as r:
                return bool(r.ping())
        except redis.ConnectionError:
            return False

    def _linked(self) -> bool:
        import redis

        with redis.Redis(port=self.replica_port, socket_timeout=2) as r:
            return r.info("replication").get("master_link_status") == "up"


class NatsServers(_Servers):
    """``size`` nats-server processes with JetStream (file storage, the server's defaults otherwise); more than
    one form a cluster (routes to each other), which a stream with ``num_replicas=3`` needs.

    Use as ``with NatsServers(root, 3) as nats:``; :attr:`urls` are the client URLs once every server is up.
    """

    def __init__(self, root: Path, size: int) -> None:
        super().__init__(root)
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.urls: list[str] = []
        self._binary = find_binary("nats-server") or "nats-server"

    def __enter__(self) -> NatsServers:
        try:
            for _ in range(_START_ATTEMPTS):
                if self._start_all():
                    return self
                self._stop_children()
            raise PeerStartError(f"nats cluster of {self.size}: no free route ports in {_START_ATTEMPTS} attempts")
        except BaseException:
            self._stop_children()
            raise

    def _start_all(self) -> bool:
        """Start every server; False when one could not bind its route port (try again with new ports)."""
        route_ports = [_pick_port() for _ in range(self.size)] if self.size > 1 else []
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
        children: list[tuple[_Child, Path]] = []
        for i in range(self.size):
            name = f"n{i + 1}"
            ports_dir = self.root / f"nats-{name}-ports"
            shutil.rmtree(ports_dir, ignore_errors=True)
            ports_dir.mkdir(parents=True)
            args = [self._binary, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(self.root / f"nats-{name}"),
                    "-n", name, "--ports_file_dir", str(ports_dir)]
            if route_ports:
                args += ["--cluster_name", "bench", "--cluster", f"nats://127.0.0.1:{route_ports[i]}",
                         "--routes", routes]
            children.append((self._spawn(args, self.root / f"nats-{name}.log"), ports_dir))
        self.urls = []
        for child, ports_dir in children:
            _wait_for(lambda c=child, d=ports_dir: c.exited() or _client_url(d) is not None,  # type: ignore[misc]
                      _START_TIMEOUT_S, "nats-server ports file", child.log)
            url = _client_url(ports_dir)
            if url is None:  # it exited
                if child.bind_failed():
                    return False
                raise PeerStartError(f"nats-server exited with {child.proc.returncode}{_log_tail(child.log)}")
            self.urls.append(url)
        return True


def _client_url(ports_dir: Path) -> str | None:
    """The client URL from nats-server's ports file, None until it is there and whole."""
    for f in ports_dir.iterdir():
        try:
            return str(json.loads(f.read_text())["nats"][0])
        except (ValueError, KeyError, IndexError):
            return None
    return None
