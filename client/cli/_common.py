"""What every ``splitmq`` command shares: the nameserver argument, the client settings, an admin session."""

from __future__ import annotations

import argparse
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import httpx

from client._admin import Admin
from client._instance import ClientConfig
from client._routing import parse_namesrv_addr
from client.cli._output import Output
from common.errors import ClientError
from common.signing import Credentials
from common.tls import TlsConfigError, client_context, describe_tls_failure

__all__ = ["check_namesrv", "client_config", "credentials_of", "namesrv_of", "open_admin", "split_keys"]

#: Bound on opening one connection (a dead host fails fast even with a long ``--timeout``).
CONNECT_TIMEOUT_MAX_S = 3.0
#: How long a nameserver may stay silent before the command says it is waiting for it.
WAIT_NOTICE_AFTER_S = 1.0
#: How often the waiting line is redrawn on a terminal.
WAIT_TICK_S = 0.25


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


def _probe(addr: str, timeout_s: float, tls_ca: str | None = None) -> None:
    """One ``GET /cluster``: any HTTP answer counts (even a refusal means a server is there and talking)."""
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_MAX_S))
    if tls_ca is None:
        httpx.get(f"http://{addr}/cluster", timeout=timeout)
    else:
        httpx.get(f"https://{addr}/cluster", timeout=timeout, verify=client_context(tls_ca, ca_option="--tls-ca"))


def _probe_failure(addr: str, err: BaseException, timeout_s: float) -> str:
    if isinstance(err, TlsConfigError):
        return str(err)
    cause: BaseException | None = err
    for _ in range(8):  # httpx wraps httpcore's error, which wraps the ssl module's
        if cause is None:
            break
        tls = describe_tls_failure(cause, addr, "--tls-ca")
        if tls is not None:
            return tls
        cause = cause.__cause__ or cause.__context__
    if isinstance(err, httpx.RemoteProtocolError):
        return (f"nameserver {addr} closed the connection without answering: if the cluster has TLS on, pass "
                f"--tls-ca (or SPLITMQ_TLS_CA)")
    if isinstance(err, httpx.ConnectError):
        return f"nameserver {addr} refused the connection or cannot be reached: is it running? " \
               f"(check -n/--namesrv or NAMESRV_ADDR)"
    if isinstance(err, httpx.TimeoutException):
        return f"nameserver {addr} did not answer within {timeout_s:g} s: is {addr} a SplitMQ nameserver? " \
               f"(check -n/--namesrv or NAMESRV_ADDR, or raise --timeout)"
    return f"nameserver {addr} gave no usable answer ({type(err).__name__}: {err}): check -n/--namesrv"


def check_namesrv(args: argparse.Namespace, out: Output) -> None:
    """Wait, at most ``--timeout`` seconds, until one of the command's nameservers answers an HTTP request.

    Every command starts by asking a nameserver something; a host that accepts connections but never answers
    (a wrong port, a stopped process, a firewall that drops replies) would otherwise surface as a timeout deep
    inside the first SDK call, naming whatever that call was after. Asking first lets the error name the
    nameserver and the bound, and lets the wait show progress.

    Raises:
        ClientError: no nameserver answered; one line per the reason (refused, silent), naming each address.
    """
    addrs = parse_namesrv_addr(namesrv_of(args))  # ConfigError naming an entry without a port: dial nothing
    timeout_s: float = args.timeout
    started = time.monotonic()
    answers: queue.Queue[tuple[str, BaseException | None]] = queue.Queue(maxsize=len(addrs))
    for addr in addrs:  # daemon threads: one nameserver that answered is enough, a silent one must not hold exit
        threading.Thread(target=_probe_into, args=(addr, timeout_s, answers, getattr(args, "tls_ca", None)), daemon=True,
                         name=f"splitmq-probe-{addr}").start()
    pending = set(addrs)
    failures: dict[str, str] = {}
    noticed = False
    while pending:
        try:
            addr, err = answers.get(timeout=WAIT_TICK_S)
        except queue.Empty:
            pass
        else:
            pending.discard(addr)
            if err is None:
                out.end_progress()
                return
            failures[addr] = _probe_failure(addr, err, timeout_s)
        waited = time.monotonic() - started
        if pending and waited >= WAIT_NOTICE_AFTER_S:
            who = ", ".join(sorted(pending))
            if out.tty:
                out.progress(f"waiting for nameserver {who} to answer: {waited:.0f} s of {timeout_s:g} s")
            elif not noticed:
                out.info(f"waiting for nameserver {who} to answer (up to {timeout_s:g} s)")
            noticed = True
    out.end_progress()
    raise ClientError("; ".join(failures[a] for a in addrs))


def _probe_into(addr: str, timeout_s: float, answers: queue.Queue[tuple[str, BaseException | None]],
                tls_ca: str | None) -> None:
    try:
        _probe(addr, timeout_s, tls_ca)
    except Exception as e:  # handed to the waiting thread, which words it
        answers.put((addr, e))
    else:
        answers.put((addr, None))


def client_config(args: argparse.Namespace) -> ClientConfig:
    """Client settings bounded by the command's ``--timeout``, signed with its account when one is given."""
    timeout_s: float = args.timeout
    return ClientConfig(request_timeout_s=timeout_s, connect_timeout_s=min(timeout_s, CONNECT_TIMEOUT_MAX_S),
                        close_timeout_s=1.0, credentials=credentials_of(args),
                        tls_ca_file=getattr(args, "tls_ca", None) or None)


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
