"""SplitMQ's exceptions: one hierarchy, each error with a ``code`` and ``retriable``.

The SDK raises them and re-exports them as :mod:`client.errors` (the name users import); the servers raise the
same classes inside a handler and the router turns them into the coded error answer.

::

    ClientError                      code, retriable, broker_addr, broker_role
    ├── ConfigError                  a setting the caller passed cannot work (also a ValueError; never retried)
    │   └── TlsConfigError           a certificate, key or CA file cannot be used (common.tls)
    ├── ClientClosedError            the client was closed (or never started)
    ├── RouteNotFoundError           no route for a topic / no master for a broker group    (refresh route)
    ├── BrokerNotFoundError          "The broker[<name>] not exist"                         (refresh route)
    ├── TransportError               connection refused, reset, or timed out               (retriable)
    │   ├── NameServerUnavailableError   no nameserver answered at all (each one's failure named)
    │   ├── BrokerConnectError
    │   ├── RequestTimeoutError
    │   └── TlsError                 the TLS handshake failed: wrong CA, name, or TLS on one side only (never retried)
    ├── SendFailedError              every attempt of a send failed; ``attempts`` says why
    ├── ProtocolViolationError       a server answered bytes we cannot parse
    └── BrokerError                  a server answered with a non-success RocketMQ code
        ├── BrokerSystemError (1), SystemBusyError (2), RequestCodeNotSupportedError (3)
        ├── MessageIllegalError (13), ServiceNotAvailableError (14), NoPermissionError (16)
        │   └── AccessDeniedError (16)   the ACL refused the request (never retried)
        ├── TopicNotExistError (17), QueryNotFoundError (22), SubscriptionGroupNotExistError (26)
        └── InvalidParameterError (29)

``BrokerError.for_code(code, remark, ...)`` builds the most specific class for a code. Errors raised by the
SDK's own validation (an oversize message, a bad topic name) use the same classes with no ``broker_addr``.
This module is pure.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AccessDeniedError",
    "BrokerConnectError",
    "BrokerError",
    "BrokerNotFoundError",
    "BrokerSystemError",
    "ClientClosedError",
    "ClientError",
    "ConfigError",
    "InvalidParameterError",
    "MessageIllegalError",
    "NameServerUnavailableError",
    "NoPermissionError",
    "ProtocolViolationError",
    "QueryNotFoundError",
    "RequestCodeNotSupportedError",
    "RequestTimeoutError",
    "RouteNotFoundError",
    "SendFailedError",
    "ServiceNotAvailableError",
    "SubscriptionGroupNotExistError",
    "SystemBusyError",
    "TlsError",
    "TopicNotExistError",
    "TransportError",
]


class ClientError(Exception):
    """Root of every SplitMQ client error.

    Attributes:
        code: RocketMQ response code where one exists, else -1.
        retriable: whether retrying the same call may succeed.
        invalid_metadata: whether the cached route should be refreshed before a retry.
        broker_addr: the ``host:port`` that answered, when a server did.
        broker_role: that server's role (``ASYNC_MASTER``, ``SLAVE``...), when known.
    """

    code: ClassVar[int] = -1
    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False

    def __init__(self, message: str, *, broker_addr: str | None = None, broker_role: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.broker_addr = broker_addr
        self.broker_role = broker_role

    def __str__(self) -> str:
        where = ""
        if self.broker_addr:
            where = f" [broker {self.broker_addr}" + (f" {self.broker_role}" if self.broker_role else "") + "]"
        return f"{self.message}{where}"


class ClientClosedError(ClientError):
    """The client, producer or consumer is closed."""


class ConfigError(ClientError, ValueError):
    """A setting the caller passed cannot work (a nameserver address without a port, a TLS file that is not one);
    the message names the setting and what to write instead. Raised when the client is made, before any request;
    it is a ValueError too, as Python's own argument errors are."""


class RouteNotFoundError(ClientError):
    """No route information for a topic (``No route info of this topic``)."""

    code = 17
    retriable = True
    invalid_metadata = True


class BrokerNotFoundError(ClientError):
    """A broker group has no usable address in the route (``The broker[<name>] not exist``)."""

    retriable = True
    invalid_metadata = True


class TransportError(ClientError):
    """The request did not get an answer: connection refused or reset, or a timeout.

    Attributes:
        request_sent: False when the request never left (no connection was made: refused, a connect timeout, no
            pooled connection in time, a failed TLS handshake), so a send that failed so stored nothing; True
            when it may have reached the server (reset, or no answer in time): the server may have acted on it.
    """

    retriable = True
    request_sent: bool = True


class NameServerUnavailableError(TransportError):
    """No nameserver answered at all: each was refused, reset or timed out (the message names each one and its
    failure). A nameserver that answered "no such topic" gives :class:`RouteNotFoundError` instead."""


class BrokerConnectError(TransportError):
    """Could not connect to (or lost the connection with) a server."""


class RequestTimeoutError(TransportError):
    """A request ran past its timeout."""


class TlsError(TransportError):
    """The TLS handshake with a server failed: its certificate is not signed by the CA the client was given
    (``tls_ca_file``), does not name the address dialled, or only one side speaks TLS. The message says which.
    Retrying cannot fix a configuration, so it is not retried."""

    retriable = False


class ProtocolViolationError(ClientError):
    """A server answered with bytes that do not follow docs/PROTOCOL.md."""


class SendFailedError(ClientError):
    """Every attempt of a send failed.

    Attributes:
        attempts: ``(broker_name, error)`` for each attempt, in order.
    """

    retriable = True

    def __init__(self, message: str, *, attempts: list[tuple[str, ClientError]] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


class BrokerError(ClientError):
    """A server answered with a non-success response code."""

    _registry: ClassVar[dict[int, type[BrokerError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.code >= 0 and "code" in cls.__dict__:  # a subclass that keeps its parent's code is chosen apart
            BrokerError._registry[cls.code] = cls

    def __init__(
        self, message: str, *, code: int | None = None, broker_addr: str | None = None,
        broker_role: str | None = None,
    ) -> None:
        super().__init__(message, broker_addr=broker_addr, broker_role=broker_role)
        if code is not None and code != type(self).code:
            self.code = code  # type: ignore[misc]  # an unregistered code keeps its own number

    @staticmethod
    def for_code(
        code: int, message: str, *, broker_addr: str | None = None, broker_role: str | None = None
    ) -> BrokerError:
        """The most specific error class for ``code`` (a plain BrokerError for unknown codes)."""
        cls = BrokerError._registry.get(code, BrokerError)
        return cls(message, code=code, broker_addr=broker_addr, broker_role=broker_role)

    def __str__(self) -> str:
        return f"[code={self.code}] {super().__str__()}"


class BrokerSystemError(BrokerError):
    code = 1
    retriable = True


class SystemBusyError(BrokerError):
    code = 2
    retriable = True


class RequestCodeNotSupportedError(BrokerError):
    code = 3


class MessageIllegalError(BrokerError):
    """The message (or a name in it) breaks a rule: size, topic name, properties."""

    code = 13


class ServiceNotAvailableError(BrokerError):
    """The broker cannot take the request now (a slave asked to store, shutting down, disk full)."""

    code = 14
    retriable = True


class NoPermissionError(BrokerError):
    """The broker or the topic refuses the operation (its ``perm``); a send tries another broker group."""

    code = 16
    retriable = True


class AccessDeniedError(NoPermissionError):
    """The ACL refused the request (docs/SECURITY.md): it was unsigned, its account or signature did not verify,
    or the account lacks the permission the message names (``PUB`` on a topic, ``SUB`` on a group, ``admin``).

    Never retried: another attempt, broker or nameserver would refuse it the same way; fix the ``credentials=``
    or the accounts file. The servers mark these answers (``"acl": true`` in the error body) so that the SDK
    tells them from a topic's or a broker's ``perm``, which a send does retry elsewhere.
    """

    retriable = False


class TopicNotExistError(BrokerError):
    code = 17
    retriable = True
    invalid_metadata = True


class QueryNotFoundError(BrokerError):
    code = 22


class SubscriptionGroupNotExistError(BrokerError):
    code = 26


class InvalidParameterError(BrokerError):
    code = 29
