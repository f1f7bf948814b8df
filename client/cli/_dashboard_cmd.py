"""``splitmq dashboard``: serve the web dashboard of a cluster until Ctrl-C (docs/DASHBOARD.md)."""

from __future__ import annotations

import argparse
from typing import Any

from client.cli._common import credentials_of, namesrv_of
from client.cli._output import Output

__all__ = ["PROBE_TIMEOUT_MAX_S", "add_dashboard"]

#: Bound in seconds on each request the dashboard makes (``--timeout`` can only lower it).
PROBE_TIMEOUT_MAX_S = 1.0


def cmd_dashboard(args: argparse.Namespace, out: Output) -> int:
    """Print ``dashboard=URL`` first (scripts read it), then serve; with ``--read-only`` the page changes nothing."""
    from client.dashboard import DashboardServer  # the servers' HTTP runtime only loads for this command

    # Each probe and query is bounded by --timeout, at most PROBE_TIMEOUT_MAX_S: a member slower than that to
    # say how it is doing is shown as not answering, and a hung member must not stall the page.
    server = DashboardServer(namesrv_of(args), args.listen, interval_s=args.interval,
                             request_timeout_s=min(args.timeout, PROBE_TIMEOUT_MAX_S),
                             credentials=credentials_of(args),  # with the ACL on: an admin account
                             tls_ca_file=getattr(args, "tls_ca", None) or None, read_only=args.read_only,
                             allowed_hosts=args.allow_host or ())
    out.out.write(f"dashboard={server.url}\n")
    out.out.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C before the server caught the signal: a requested stop, not an error
        pass
    out.out.write("dashboard stopped\n")
    return 0


def _listen(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in [0, 65535], got {text!r}")
    return text


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0.1 <= value <= 60:
        raise argparse.ArgumentTypeError(f"expected seconds in [0.1, 60], got {text!r}")
    return value


def add_dashboard(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``dashboard`` on the subcommand table ``sub``."""
    help_text = ("serve a web dashboard of the cluster (topology, replication, lag, messages, dead letters, "
                 "metrics; topic, group and offset actions)")
    p = sub.add_parser("dashboard", help=help_text, description=help_text[:1].upper() + help_text[1:] + ".",
                       parents=[common])
    p.set_defaults(func=cmd_dashboard, leaf=p)
    p.add_argument("--listen", type=_listen, default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address to serve on; port 0 picks a free one (default: 127.0.0.1:8080)")
    p.add_argument("--read-only", action="store_true",
                   help="refuse every action (topic and group updates, offset resets): the page only shows")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="a host name the page may be opened by, besides IP addresses, localhost and the --listen "
                        "host (repeatable; other names are refused, a guard against DNS rebinding)")
    p.add_argument("--interval", type=_interval, default=1.0, metavar="S",
                   help="seconds between two sweeps of the cluster (default: 1)")
