"""What every ``splitmq`` command shares: the nameserver argument, the client settings, an admin session."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from client._admin import Admin
from client._instance import ClientConfig

__all__ = ["client_config", "namesrv_of", "open_admin", "split_keys"]

#: Bound on opening one connection (a dead host fails fast even with a long ``--timeout``).
CONNECT_TIMEOUT_MAX_S = 3.0


def namesrv_of(args: argparse.Namespace) -> str:
    """The command's nameserver address; a usage error (exit 2) when neither ``-n`` nor ``NAMESRV_ADDR`` gives one."""
    ns = (getattr(args, "namesrv", None) or "").strip()
    if not ns.strip(";").strip():
        args.leaf.error("no nameserver address: pass -n/--namesrv HOST:PORT or set NAMESRV_ADDR")
    return ns


def client_config(args: argparse.Namespace) -> ClientConfig:
    """Client settings bounded by the command's ``--timeout``."""
    timeout_s: float = args.timeout
    return ClientConfig(request_timeout_s=timeout_s, connect_timeout_s=min(timeout_s, CONNECT_TIMEOUT_MAX_S),
                        close_timeout_s=1.0)


@contextmanager
def open_admin(args: argparse.Namespace) -> Iterator[Admin]:
    """An :class:`~client.Admin` for the command's nameserver, closed on exit."""
    adm = Admin(namesrv_of(args), client_config=client_config(args))
    try:
        yield adm
    finally:
        adm.close()


def split_keys(text: str | None) -> tuple[str, ...]:
    """``--keys "a,b c"`` -> ``("a", "b", "c")``."""
    if not text:
        return ()
    return tuple(k for k in text.replace(",", " ").split() if k)
