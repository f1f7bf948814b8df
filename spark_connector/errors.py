"""The errors a Spark user of the connector sees, each one line that says what is wrong and what to do.

Spark runs a Python data source's code (planning on the driver, reads on the executors) in Python worker
processes, and hands what one raises to the user as the text ``traceback.format_exception`` gives: the
traceback first, the message last. A ``load()`` with a bad option used to arrive as 8 to 13 lines of frames
inside an ``AnalysisException``, the message at the bottom. Two rules fix that:

* every error the connector means for the user is a :class:`ConnectorError` whose message is one line: what is
  wrong (naming the option, the queue and the offsets involved) and what to do, in that order;
* the entry points Spark calls (:func:`user_facing`) let such an error leave the worker without its traceback:
  they set ``SPARK_HIDE_TRACEBACK`` in the worker's environment just before it propagates, which PySpark's
  worker reads when it formats the exception (``pyspark.util.handle_worker_exception``). Every worker that
  reports an exception exits right after, so the setting dies with that process and hides nothing else. Errors
  the connector does not expect (a bug) keep their traceback.

The SDK's errors that mean something to a job (a nameserver or broker that does not answer, a topic without a
route, a refused account) are translated into one-liners at the same boundary (:func:`explain`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from client.errors import (
    AccessDeniedError,
    BrokerError,
    ClientError,
    NameServerUnavailableError,
    NoPermissionError,
    RouteNotFoundError,
    TlsError,
    TransportError,
)

__all__ = [
    "ClusterUnreachableError",
    "ConnectorError",
    "DataLossError",
    "OptionError",
    "explain",
    "user_facing",
    "user_facing_iter",
]

F = TypeVar("F", bound=Callable[..., Any])

#: What PySpark's worker reads to format an exception without its traceback.
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"


class ConnectorError(RuntimeError):
    """An error meant for the job's user: one line, what is wrong, then what to do."""


class OptionError(ConnectorError, ValueError):
    """A ``rocketmq`` source or sink option is missing or has a bad value; the message names the option."""


class DataLossError(ConnectorError):
    """Offsets a query needs are gone or belong to another store; the message names the queues, the offsets and
    ``failOnDataLoss``."""


class ClusterUnreachableError(ConnectorError):
    """The nameserver or the brokers could not be asked (down, wrong address, refused account)."""


def explain(e: ClientError, *, nameserver: str, what: str) -> ConnectorError:
    """The one-line error a job shows for an SDK error met while ``what`` (``"planning the read of T"``).

    Args:
        e: the SDK's error.
        nameserver: the ``nameserver`` option (the addresses to check).
        what: the step that failed, for the message.
    """
    detail = " ".join(str(e).split())
    if isinstance(e, AccessDeniedError | NoPermissionError):
        return ClusterUnreachableError(
            f"{what}: the cluster refused this job's account ({detail}); check options accessKey/secretKey and the "
            "account's permissions (docs/SECURITY.md)")
    if isinstance(e, TlsError):
        return ClusterUnreachableError(f"{what}: TLS failed ({detail}); check option tlsCaFile")
    if isinstance(e, NameServerUnavailableError):
        return ClusterUnreachableError(
            f"{what}: no nameserver of option nameserver={nameserver} answers ({detail}); check the address "
            "and that the nameserver runs")
    if isinstance(e, RouteNotFoundError):
        return ClusterUnreachableError(
            f"{what}: the nameserver ({nameserver}) has no route for the topic ({detail}); check options "
            "topic/subscribe, or create the topic first")
    if isinstance(e, TransportError):
        return ClusterUnreachableError(
            f"{what}: a broker did not answer ({detail}); check that the broker group is up and that its "
            "registered address (brokerIP1) is reachable from here")
    if isinstance(e, BrokerError):
        return ClusterUnreachableError(f"{what}: a broker refused the request ({detail})")
    return ClusterUnreachableError(f"{what}: {detail}")


def _hide_traceback() -> None:
    os.environ[HIDE_TRACEBACK_ENV] = "1"


def user_facing(fn: F) -> F:
    """Wrap an entry point Spark calls: a :class:`ConnectorError` leaves it as one line (module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConnectorError:
            _hide_traceback()
            raise

    return wrapper  # type: ignore[return-value]


def user_facing_iter(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """:func:`user_facing` for a generator (``read``): the error is raised while Spark iterates."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            yield from fn(*args, **kwargs)
        except ConnectorError:
            _hide_traceback()
            raise

    return wrapper
