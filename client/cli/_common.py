"""What every ``splitmq`` command shares: the nameserver argument, the client settings, an admin session."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from client._admin import Admin
from client._instance import ClientConfig
from client.protocol.signing import Credentials

__all__ = ["client_config", "credentials_of", "namesrv_of", "open_admin", "split_keys"]

#: Bound on opening one connection (a dead host fails fast even with a long ``--timeout``).
CONNECT_TIMEOUT_MAX_S = 3.0


def namesrv_of(args: argparse.Namespace) -> str:
    """The command's nameserver address; a usage error (exit 2) when neither ``-n`` nor ``NAMESRV_ADDR`` gives one."""
    ns = (getattr(args, "namesrv", None) or "").strip()
    if not ns.strip(";").strip():
        args.leaf.error("no nameserver address: pass -n/--namesrv HOST:PORT or set NAMESRV_ADDR")
    return ns


def credentials_of(args: argparse.Namespace) -> Credentials | None:
    """The account of ``--access-key``/``--secret-key`` (or ``SPLITMQ_ACCESS_KEY``/``SPLITMQ_SECRET_KEY``), None
    when neither is given; a usage error (exit 2) when only one is, or the access key is malformed. No message
    here ever holds the secret key."""
    access_key = getattr(args, "access_key", None) or None
    secret_key = getattr(args, "secret_key", None) or None
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        _usage_error(args, "--access-key and --secret-key go together (or SPLITMQ_ACCESS_KEY and SPLITMQ_SECRET_KEY)")
    try:
        return Credentials(access_key, secret_key)
    except ValueError as e:
        _usage_error(args, str(e))


def _usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    args.leaf.error(message)
    raise SystemExit(2)  # leaf.error exits; this line is for the type checker


def client_config(args: argparse.Namespace) -> ClientConfig:
    """Client settings bounded by the command's ``--timeout``, signed with its account when one is given."""
    timeout_s: float = args.timeout
    return ClientConfig(request_timeout_s=timeout_s, connect_timeout_s=min(timeout_s, CONNECT_TIMEOUT_MAX_S),
                        close_timeout_s=1.0, credentials=credentials_of(args))


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
