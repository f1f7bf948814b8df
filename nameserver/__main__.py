"""``python -m nameserver`` / ``splitmq-nameserver``: parse arguments, set up logging, bind, serve.

Prints exactly one line to stdout once it serves: ``nameserver ready listen=HOST:PORT`` (the real bound port,
so ``--listen 127.0.0.1:0`` works). SIGTERM or SIGINT stops it gracefully with exit code 0; bad arguments give
one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

from common.tls import TlsConfigError, server_context
from nameserver.server import NamesrvConfig, serve
from remoting.acl import AclFileError
from remoting.acl_gate import DEFAULT_NONCE_CACHE_MAX, DEFAULT_TIMESTAMP_TOLERANCE_MS, load_acl_file
from remoting.http import HttpLimits
from remoting.server import inherited_listener

DEFAULT_LISTEN = "127.0.0.1:9876"
#: Environment variable holding the metrics bearer token (an argument would show in ``ps``).
METRICS_TOKEN_ENV = "SPLITMQ_ACL_METRICS_TOKEN"
#: Environment variable holding the brokers' ``haAuthSecret`` (or ``--ha-auth-secret-file``).
HA_SECRET_ENV = "SPLITMQ_HA_AUTH_SECRET"
LISTEN_BACKLOG = 1024


class _ArgParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one stderr line (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) to ``(host, port)``; raises ValueError naming the problem."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--listen {value!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"--listen {value!r}: port {port_s!r} is not an integer") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {value!r}: port {port} is outside [0, 65535]")
    return host, port


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{n} must be > 0")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = _ArgParser(prog="splitmq-nameserver", description="SplitMQ nameserver (route table over HTTP)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})")
    p.add_argument("--listen-fd", type=int, default=None, metavar="FD",
                   help="serve on this inherited socket, bound to --listen's address and listening, instead of "
                        "binding (a supervisor that binds the ports itself starts its servers at once, race-free)")
    p.add_argument("--broker-expiry-ms", type=_positive_int, default=NamesrvConfig().broker_expiry_ms,
                   help="drop a broker not heard from for this long (default 120000)")
    p.add_argument("--scan-interval-ms", type=_positive_int, default=NamesrvConfig().scan_interval_ms,
                   help="scanNotActiveBrokerInterval (default 10000)")
    p.add_argument("--acl-enable", action="store_true",
                   help="require every request to be signed by an account of --acl-file; registration needs an "
                        "admin account, and a broker group belongs to the account that registered it first "
                        "(docs/SECURITY.md)")
    p.add_argument("--acl-file", default="", metavar="PATH",
                   help="the accounts file (TOML, RocketMQ plain_acl field names), re-read when it changes")
    p.add_argument("--acl-protect-routes", action="store_true",
                   help="with --acl-enable: route, cluster and topic queries need an account too (/route?topic=T "
                        "needs PUB or SUB on T); without it they stay open. The Bearer token in "
                        f"${METRICS_TOKEN_ENV} opens GET /metrics to a scraper")
    p.add_argument("--acl-timestamp-tolerance-ms", type=_positive_int, default=DEFAULT_TIMESTAMP_TOLERANCE_MS,
                   help=f"refuse signed requests whose timestamp is further than this from the clock (default "
                        f"{DEFAULT_TIMESTAMP_TOLERANCE_MS})")
    p.add_argument("--acl-nonce-cache-max", type=_positive_int, default=DEFAULT_NONCE_CACHE_MAX,
                   help=f"signed requests the replay guard remembers at most (default {DEFAULT_NONCE_CACHE_MAX})")
    p.add_argument("--acl-server-name", action="append", default=[], metavar="HOST:PORT",
                   help="a name clients may sign requests for besides the address they connect to (a DNS name or "
                        "NAT address they dial; repeat for more). A signature names its server: one captured at "
                        "another server is refused")
    p.add_argument("--ha-auth-secret-file", default="", metavar="PATH",
                   help="a file holding the brokers' haAuthSecret (or set $" + HA_SECRET_ENV + "): registrations, "
                        "unregistrations and write-permission changes then need the cluster account derived from it "
                        "(brokers with haAuthSecret sign with it)")
    p.add_argument("--protected-mode", default="true", choices=["true", "false"],
                   help="true (default): without credentials (--acl-enable, or the cluster secret) serve loopback "
                        "peers only and refuse a non-loopback --listen; false: serve anyone without them (logged "
                        "loudly)")
    p.add_argument("--max-connections-per-client", type=_positive_int, default=HttpLimits().max_connections_per_client,
                   help="open connections from one peer address (default "
                        f"{HttpLimits().max_connections_per_client}); one more is closed at once")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="serve TLS only, presenting this certificate chain (needs --tls-key; docs/SECURITY.md)")
    p.add_argument("--tls-key", default="", metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    return p


def _configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _run(coro: Coroutine[Any, Any, None]) -> None:
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # uvloop is not available everywhere (e.g. Windows); asyncio's loop works too
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(coro)


class _StopSignals:
    """SIGTERM/SIGINT: exit 0 in each phase of the process.

    Before the event loop serves, a signal exits at once (nothing is served yet). While it serves, the loop owns
    both signals (:meth:`serve`) and either stops the server gracefully. Once the loop is closed, a late signal is
    a no-op, so the process exits 0 instead of dying by signal.
    """

    def __init__(self) -> None:
        self.served = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.served:
            raise SystemExit(0)

    async def serve(self, sock: socket.socket, config: NamesrvConfig, ready: Callable[[str], None]) -> None:
        """Serve until SIGTERM or SIGINT, then stop gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(sock, config, on_ready=ready, stop=stop)
        finally:
            self.served = True  # closing the loop gives both signals their default handlers: ours again after


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m nameserver`` and the ``splitmq-nameserver`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        host, port = parse_listen(args.listen)
    except ValueError as e:
        parser.error(str(e))
    if args.acl_enable and not args.acl_file:
        parser.error("--acl-enable needs --acl-file")
    if args.acl_enable:
        try:
            load_acl_file(args.acl_file)  # a bad file is a start error here, not a traceback later
        except AclFileError as e:
            parser.error(str(e))
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert:
        try:
            server_context(args.tls_cert, args.tls_key)  # a bad file is a start error here, not a traceback later
        except TlsConfigError as e:
            parser.error(str(e))
    secret = os.environ.get(HA_SECRET_ENV, "").encode()
    if args.ha_auth_secret_file:
        try:
            secret = Path(args.ha_auth_secret_file).read_bytes().strip()
        except OSError as e:
            parser.error(f"--ha-auth-secret-file {args.ha_auth_secret_file}: {e.strerror or e}")
        if not secret:
            parser.error(f"--ha-auth-secret-file {args.ha_auth_secret_file} is empty")
    for name in args.acl_server_name:
        try:
            parse_listen(name)
        except ValueError:
            parser.error(f"--acl-server-name {name!r} is not HOST:PORT")
    _configure_logging(args.log_level, args.log_format)
    config = NamesrvConfig(tls_cert_file=args.tls_cert, tls_key_file=args.tls_key,
                           broker_expiry_ms=args.broker_expiry_ms, scan_interval_ms=args.scan_interval_ms,
                           acl_enable=args.acl_enable, acl_file=args.acl_file,
                           acl_protect_routes=args.acl_protect_routes,
                           acl_timestamp_tolerance_ms=args.acl_timestamp_tolerance_ms,
                           acl_nonce_cache_max=args.acl_nonce_cache_max,
                           acl_metrics_token=os.environ.get(METRICS_TOKEN_ENV, ""),
                           ha_auth_secret=secret, acl_server_names=tuple(args.acl_server_name),
                           protected_mode=args.protected_mode == "true",
                           http_limits=HttpLimits(max_connections_per_client=args.max_connections_per_client))
    refusal = config.protected_mode_refusal(host)
    if refusal is not None:
        print(f"splitmq-nameserver: error: {refusal}", file=sys.stderr, flush=True)
        return 2
    try:
        sock = (inherited_listener(args.listen_fd, "--listen-fd", host) if args.listen_fd is not None
                else _bind(host, port))
    except OSError as e:
        print(f"splitmq-nameserver: error: cannot listen on {args.listen}: {e.strerror or e}", file=sys.stderr)
        return 1

    signals = _StopSignals()

    def ready(listen: str) -> None:
        print(f"nameserver ready listen={listen}", flush=True)

    signals.install()
    try:
        _run(signals.serve(sock, config, ready))
    finally:
        signals.install()  # a signal after the loop is gone: a no-op (the loop reset both handlers)
        sock.close()
    logging.getLogger("nameserver").info("nameserver stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
