"""TLS for every SplitMQ connection (docs/SECURITY.md, "TLS"): the contexts both ends build and the message a failed
handshake turns into. (A throwaway CA for local clusters is the SDK's: :mod:`client.tls`.)

One module decides the protocol floor and the verification rules, so the SDK, the CLI, the Spark connector, the
broker's own outbound clients, the HA stream and the DLedger peer port all agree:

* TLS 1.2 at least; the stdlib's default cipher choice (no custom list to age badly);
* a client verifies the server's chain against the CA file it was given (or the system store) *and* that the
  certificate names the host it dialled (IP addresses included: servers are dialled by ``host:port``);
* servers issue no session tickets: SplitMQ connections are long-lived and pooled, so resumption buys nothing,
  and a ticket arriving after the handshake would make an idle pooled connection look readable (closed).

Nothing here runs per request: contexts are built once per client or server.
"""

from __future__ import annotations

import os
import ssl

from common.errors import ConfigError

__all__ = [
    "TlsConfigError",
    "client_context",
    "describe_tls_failure",
    "server_context",
]

_MIN_VERSION = ssl.TLSVersion.TLSv1_2


class TlsConfigError(ConfigError):
    """A certificate, key or CA file cannot be used (the message names the file and the option). A
    :class:`~common.errors.ClientError` and a ValueError."""


def _check_file(path: str, option: str) -> None:
    if not path:
        raise TlsConfigError(f"{option} is empty")
    if not os.path.isfile(path):
        raise TlsConfigError(f"{option}={path!r}: no such file")


def client_context(ca_file: str | None = None, *, cert_file: str | None = None, key_file: str | None = None,
                   ca_option: str = "tls_ca_file") -> ssl.SSLContext:
    """The context of a connecting side: verifies the server's certificate and host name.

    Args:
        ca_file: PEM file of the CA(s) that signed the servers' certificates; None: the system's trust store.
        cert_file: PEM certificate to present (mutual TLS), with ``key_file``.
        key_file: its private key.
        ca_option: how the caller names the CA option, for error messages.

    Raises:
        TlsConfigError: a file is missing or not a usable PEM file.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = _MIN_VERSION
    if ca_file is not None:
        _check_file(ca_file, ca_option)
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise TlsConfigError(f"{ca_option}={ca_file!r} is not a PEM CA file: {e}") from None
    if cert_file or key_file:
        _load_chain(ctx, cert_file or "", key_file or "", "client certificate")
    return ctx


def server_context(cert_file: str, key_file: str, *, ca_file: str | None = None,
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """The context of a listening side.

    Args:
        cert_file: PEM certificate chain of this server (its SANs must cover the address clients dial).
        key_file: its private key (PEM, unencrypted).
        ca_file: CA file that client certificates are verified against (needed with ``require_client_cert``).
        require_client_cert: mutual TLS: refuse a peer without a certificate signed by ``ca_file``.

    Raises:
        TlsConfigError: a file is missing or unusable.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _MIN_VERSION
    ctx.num_tickets = 0
    _load_chain(ctx, cert_file, key_file, "server certificate")
    if require_client_cert:
        if not ca_file:
            raise TlsConfigError("mutual TLS needs a CA file to verify client certificates")
        _check_file(ca_file, "CA file")
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise TlsConfigError(f"CA file {ca_file!r} is not a PEM CA file: {e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, what: str) -> None:
    _check_file(cert_file, f"{what} file")
    _check_file(key_file, f"{what} key file")
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise TlsConfigError(f"{what} {cert_file!r} with key {key_file!r} cannot be loaded: {e}") from None


def describe_tls_failure(exc: BaseException, addr: str, ca_option: str = "tls_ca_file") -> str | None:
    """A sentence for a failed TLS connection to ``addr``, or None when ``exc`` is no TLS failure.

    Names what went wrong in the words of the option that fixes it: a certificate the CA does not vouch for, a
    server that does not speak TLS, or a server that refused this client.
    """
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"TLS verification of {addr} failed: {exc.verify_message or exc.reason} (the server's certificate "
                f"is not signed by the CA of {ca_option}, or does not name {addr.rpartition(':')[0]})")
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if reason in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "UNEXPECTED_RECORD"):
            return (f"TLS handshake with {addr} failed ({reason}): the server does not speak TLS (is TLS on at "
                    f"the server? without it, drop {ca_option})")
        return f"TLS handshake with {addr} failed: {reason}"
    return None
