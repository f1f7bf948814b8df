"""``splitmq``: the SplitMQ command-line tool (console script ``splitmq``, or ``python -m client.cli``).

::

    splitmq cluster up --root /tmp/mq --groups 2 --slaves 1 --mode sync     # prints namesrv=HOST:PORT
    splitmq topic create -n HOST:PORT -t Orders -r 4 -w 4
    splitmq produce -n HOST:PORT -t Orders hello world
    splitmq consume -n HOST:PORT -t Orders --from-beginning --from-slave --count 2
    splitmq ha status -n HOST:PORT -b broker-a --json
    splitmq cluster up --root /tmp/mq-raft --mode dledger --peers 3                 # Raft groups, docs/DLEDGER.md
    splitmq dledger status -n HOST:PORT -b broker-a
    splitmq dledger transfer -n HOST:PORT -b broker-a --to n1

Every admin command takes ``-n/--namesrv`` (default ``$NAMESRV_ADDR``), ``--timeout S`` (default 10),
``--json`` and ``--debug``; each first checks that a nameserver answers within ``--timeout`` ("nameserver
HOST:PORT did not answer within N s" otherwise). With the ACL on, the global ``--access-key``/``--secret-key``
(or ``SPLITMQ_ACCESS_KEY``/``SPLITMQ_SECRET_KEY``, which keep the secret off the process list) sign every
request, and the secret is never printed. With TLS on, ``--tls-ca PEM`` (or ``SPLITMQ_TLS_CA``) makes every
connection TLS, verified against that CA. ``splitmq completion bash|zsh`` prints a completion script,
``splitmq --version`` the version. Exit codes: 0 ok, 1 operational error (unreachable server, unknown topic, a
broker refused), 2 usage error, 130 interrupted. Errors are one line on stderr; ``--debug`` adds the traceback.
Only :mod:`client` is imported, never the servers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from client.cli._common import check_namesrv, credentials_of
from client.cli._output import Output
from client.cli._parser import build_parser
from common.errors import BrokerNotFoundError, ClientError, ConfigError, RouteNotFoundError, TransportError

__all__ = ["build_parser", "main"]


def _run(args: argparse.Namespace, out: Output) -> int:
    debug = bool(getattr(args, "debug", False))
    try:
        if hasattr(args, "namesrv"):  # every command that talks to a cluster: first, is the nameserver there?
            credentials_of(args)  # a half or malformed account is a usage error before anything is sent
            check_namesrv(args, out)
        return int(args.func(args, out))
    except ConfigError as e:  # a setting given on the command line cannot work: a usage error
        _fail(out, str(e), debug)
        return 2
    except ClientError as e:
        _fail(out, str(e) + _hint(e), debug)
    except BrokenPipeError:
        # The reader of stdout went away (``| head``): not an error worth a message.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as e:
        _fail(out, f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), debug)
    except ValueError as e:
        _fail(out, str(e), debug)
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except Exception as e:  # the last line of defence: one line, the traceback only on request
        hint = "" if debug else " (run again with --debug for the traceback)"
        _fail(out, f"unexpected {type(e).__name__}: {e}{hint}", debug)
    return 1


#: What to do next, for the SDK errors whose message says what went wrong but not where to look.
_HINTS: tuple[tuple[type[ClientError], str], ...] = (
    (RouteNotFoundError, "check the topic name ('splitmq topic list'), or create it ('splitmq topic create -t TOPIC')"),
    (BrokerNotFoundError, "check the broker group name ('splitmq cluster list' shows them)"),
    (TransportError, "is that server running and reachable? ('splitmq cluster list' shows the brokers' addresses)"),
)


def _hint(e: ClientError) -> str:
    if str(e).startswith("nameserver ") or "topic create" in str(e):  # these word their own advice
        return ""
    for cls, hint in _HINTS:
        if isinstance(e, cls):
            return f": {hint}"
    return ""


def _fail(out: Output, message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc(file=out.err)
    out.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``splitmq`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Usage errors exit through argparse (``SystemExit(2)``) after one line on stderr.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "debug", False):
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Output(sys.stdout, sys.stderr, json_mode=bool(getattr(args, "json", False)))
    return _run(args, out)
