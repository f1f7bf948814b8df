"""``python -m broker -c FILE.properties [--set key=value ...]`` (console script ``splitmq-broker``).

Startup: load the configuration (bad value -> exit 2), configure logging (every line names the broker, its id
and role), bind the HTTP socket (port 0 lets the OS choose), open the store (a corrupt store -> one line on
stderr, exit 3), start the controller (HA listener, background tasks), serve HTTP (:class:`remoting.server.HttpServer`)
in the same event loop, and print exactly one line once serving:
``broker ready name=NAME id=N role=ROLE listen=HOST:PORT ha=HOST:PORT``.
SIGTERM / SIGINT -> graceful shutdown (unregister, persist metadata, store shutdown) and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import json
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from broker.config import BrokerConfig, ConfigError, load_config, parse_set_options
from broker.controller import BrokerController
from broker.dledger.message_store import DLedgerMessageStore
from broker.peer_auth import startup_warnings
from broker.store.api import StoreCorruptError, StoreError
from broker.store.file_store import FileMessageStore
from common.codec import pack_host
from remoting.acl import AclFileError
from remoting.http import HttpLimits
from remoting.server import HttpServer, inherited_listener

__all__ = ["main"]

log = logging.getLogger("broker")

EXIT_CONFIG = 2
EXIT_STORE = 3
EXIT_START = 1
#: Bound of the HTTP server's graceful stop.
HTTP_STOP_TIMEOUT_S = 5.0


class _IdentityFilter(logging.Filter):
    """Adds ``broker`` (``name/id/ROLE``) to every record, so every line says which broker wrote it."""

    def __init__(self, identity: str) -> None:
        super().__init__()
        self.identity = identity

    def filter(self, record: logging.LogRecord) -> bool:
        record.broker = self.identity
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname, "broker": getattr(record, "broker", ""),
            "logger": record.name, "msg": record.getMessage(),
        }
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj)


def configure_logging(config: BrokerConfig, level: str, fmt: str) -> None:
    """Log to stderr, one line per record, each naming the broker (the only place logging is configured)."""
    handler = logging.StreamHandler(sys.stderr)
    mode = f"dledger-{config.dleger_self_id}" if config.enable_dleger_commit_log else config.broker_role.value
    handler.addFilter(_IdentityFilter(f"{config.broker_name}/{config.broker_id}/{mode}"))
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(broker)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="splitmq-broker", description="SplitMQ broker")
    p.add_argument("-c", "--configFile", dest="config_file", help="broker .properties file")
    p.add_argument("-n", "--namesrvAddr", dest="namesrv_addr", help="nameservers, ';'-separated (overrides the file)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one property (repeatable)")
    p.add_argument("--listen-fd", type=int, default=None, metavar="FD",
                   help="an inherited socket, bound and listening, to serve HTTP on instead of binding listenPort (a "
                        "supervisor that binds the ports itself starts its servers at once, race-free)")
    p.add_argument("--ha-fd", type=int, default=None, metavar="FD",
                   help="the same for the HA port (instead of haListenPort)")
    p.add_argument("--dledger-fd", type=int, default=None, metavar="FD",
                   help="DLedger mode: an inherited socket, bound and listening, to serve the peer port on (a "
                        "supervisor binds it, so a restarted broker keeps its port)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    return p.parse_args(argv)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: the OS chooses).

    Raises:
        OSError: the address cannot be bound (the message names it).
    """
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot bind the broker's listen address {host}:{port}: {e.strerror}") from e
    sock.setblocking(False)
    return sock


def open_store(config: BrokerConfig, store_host: bytes) -> FileMessageStore:
    """Create, load and start the file store.

    Raises:
        StoreCorruptError / StoreError: recovery failed.
    """
    store_config = config.to_store_config(store_host)
    store = (DLedgerMessageStore(store_config, self_id=config.dleger_self_id,
                                 index_file_size=config.mapped_file_size_for_entry_index)
             if config.enable_dleger_commit_log else FileMessageStore(store_config))
    store.load()
    store.start()
    return store


async def run_broker(config: BrokerConfig, dledger_fd: int | None = None, *, listen_fd: int | None = None,
                     ha_fd: int | None = None) -> int:
    """Run one broker until SIGTERM/SIGINT; returns the process exit code. ``listen_fd``, ``ha_fd``,
    ``dledger_fd``: inherited listening sockets to serve the HTTP, HA and DLedger peer ports on.

    Raises:
        OSError: a port cannot be bound, or an inherited socket is not one to serve on.
    """
    sock = (inherited_listener(listen_fd, "--listen-fd", config.bind_host) if listen_fd is not None
            else bind_socket(config.bind_host, config.listen_port))
    port = sock.getsockname()[1]
    addr = f"{config.advertised_ip}:{port}"
    store_host = pack_host(config.advertised_ip, port)
    try:
        store = open_store(config, store_host)
    except StoreCorruptError as e:
        print(f"broker {config.broker_name}: store at {config.store_root} is corrupt: {e}", file=sys.stderr,
              flush=True)
        sock.close()
        return EXIT_STORE
    except StoreError as e:
        print(f"broker {config.broker_name}: cannot open the store at {config.store_root}: {e}", file=sys.stderr,
              flush=True)
        sock.close()
        return EXIT_STORE
    try:
        ctrl = BrokerController(config, store, addr=addr, store_host=store_host)
    except AclFileError as e:
        print(f"broker {config.broker_name}: bad configuration: {e}", file=sys.stderr, flush=True)
        store.shutdown()
        sock.close()
        return EXIT_CONFIG
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        dledger_sock = inherited_listener(dledger_fd, "--dledger-fd") if dledger_fd is not None else None
        ha_sock = inherited_listener(ha_fd, "--ha-fd", config.bind_host) if ha_fd is not None else None
        await ctrl.start(dledger_sock=dledger_sock, ha_sock=ha_sock)
    except OSError as e:
        print(f"broker {config.broker_name}: {e}", file=sys.stderr, flush=True)
        await ctrl.stop()
        sock.close()
        return EXIT_START
    limits = HttpLimits(header_timeout_s=config.http_header_timeout_ms / 1000,
                        body_timeout_s=config.http_body_timeout_ms / 1000, max_connections=config.http_max_connections,
                        max_connections_per_client=config.http_max_connections_per_client,
                        loopback_only=not config.http_open)
    server = HttpServer(ctrl.router, limits, ssl=ctrl.tls.http_server if ctrl.tls is not None else None)
    try:
        await server.start(sock)
    except OSError as e:
        print(f"broker {config.broker_name}: cannot serve HTTP: {e}", file=sys.stderr, flush=True)
        await ctrl.stop()
        sock.close()
        return EXIT_START
    _freeze_startup_objects()
    dledger = f" dledger={dict(config.dleger_peers)[config.dleger_self_id]}" if ctrl.dledger is not None else ""
    tls = " tls=on" if ctrl.tls is not None else ""
    print(f"broker ready name={config.broker_name} id={ctrl.role.broker_id} role={ctrl.role_name} "
          f"listen={addr} ha={ctrl.ha_addr}{dledger}{tls}", flush=True)
    await stop.wait()
    log.info("shutting down")
    ctrl.hold.close()  # parked pulls answer now instead of holding the HTTP shutdown
    await server.shutdown(HTTP_STOP_TIMEOUT_S)
    await ctrl.stop()
    return 0


def _freeze_startup_objects() -> None:
    """Move everything allocated so far (modules, classes, config, metadata) out of the collector's sight.

    Those ~45,000 objects live as long as the process, and every full collection walked them all: 20-60 ms
    with the event loop stopped, a dozen times in ten seconds at full load, while finding nothing to free.
    Garbage made later is still collected.
    """
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m broker`` and ``splitmq-broker``; returns the exit code."""
    args = _parse_args(argv)
    try:
        overrides = parse_set_options(args.sets)
        if args.namesrv_addr:
            overrides["namesrvAddr"] = args.namesrv_addr
        loaded = load_config(args.config_file, overrides)
    except ConfigError as e:
        print(f"broker: bad configuration: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    config = loaded.config
    configure_logging(config, args.log_level, args.log_format)
    if loaded.unknown_keys:
        log.warning("unknown configuration keys ignored: %s", ", ".join(loaded.unknown_keys))
    refusal = config.protected_mode_refusal()
    if refusal is not None:
        print(f"broker {config.broker_name}: {refusal}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    for warning in startup_warnings(secret=config.ha_auth_secret, acl_enable=config.acl_enable,
                                    dledger=config.enable_dleger_commit_log, protected=config.protected_mode):
        log.warning("%s", warning)
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_broker(config, args.dledger_fd, listen_fd=args.listen_fd, ha_fd=args.ha_fd))
    except OSError as e:
        print(f"broker {config.broker_name}: {e}", file=sys.stderr, flush=True)
        return EXIT_START


if __name__ == "__main__":
    sys.exit(main())
