"""``splitmq secure init``: the files of a secure cluster on real hosts (:mod:`client.secure`)."""

from __future__ import annotations

import argparse

from client.cli._output import Output
from client.secure import generate_secure_files
from common.tls import TlsConfigError

__all__ = ["cmd_secure_init"]


def cmd_secure_init(args: argparse.Namespace, out: Output) -> int:
    """Write the files; print where they are and how servers and clients use them (never a secret)."""
    try:
        files = generate_secure_files(args.out, args.host, install_dir=args.install_dir, days=args.days)
    except TlsConfigError as e:
        out.error(f"secure init: {e}")
        return 1
    d = files.install_dir
    out.line(f"wrote {files.directory} (secrets mode 0600); copy it to {d} on every host, owned by the servers' user")
    out.line(f"brokers:     append {d}/broker-secure.properties to every broker's properties file")
    out.line(f"nameservers: add the flags in {d}/nameserver.args to every nameserver's command line")
    for line in files.client_usage():
        out.line(line)
    return 0
