"""A throwaway CA for local clusters and tests (``LocalCluster(tls=True)``); the contexts themselves are
:mod:`common.tls`'s, shared with the servers."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs

from common.tls import TlsConfigError

__all__ = ["LocalTlsFiles", "generate_local_tls_files"]


@attrs.frozen
class LocalTlsFiles:
    """A throwaway CA and one server certificate for ``127.0.0.1`` / ``localhost`` (local clusters and tests)."""

    ca_file: str
    """PEM of the CA: give it to clients (``ClientConfig(tls_ca_file=...)``) and to brokers (``tlsCaFile``)."""
    cert_file: str
    """PEM certificate for ``127.0.0.1``, ``::1`` and ``localhost`` signed by the CA (server and client use)."""
    key_file: str
    """Its private key (mode 0600)."""


_OPENSSL_TIMEOUT_S = 60.0


def _san(hosts: Sequence[str]) -> str:
    entries = ["IP:127.0.0.1", "IP:::1", "DNS:localhost"]
    for host in hosts:
        try:
            entries.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            if not host or any(c in host for c in ",\n\r ") or not host.isascii():
                raise TlsConfigError(f"{host!r} is neither an IP address nor a host name") from None
            entries.append(f"DNS:{host}")
    return "subjectAltName=" + ",".join(dict.fromkeys(entries))


def generate_local_tls_files(directory: str | os.PathLike[str], *, days: int = 30,
                             hosts: Sequence[str] = ()) -> LocalTlsFiles:
    """Make a CA and a loopback server certificate in ``directory`` with the ``openssl`` command-line tool.

    The CA key is deleted once it has signed (nothing can issue more certificates from it). ``hosts`` adds IP
    addresses and names to the certificate (``splitmq secure init`` makes one certificate for every host of a
    small cluster); without them it is for local clusters only.

    Raises:
        TlsConfigError: ``openssl`` is not installed or failed (its message is included).
    """
    exe = shutil.which("openssl")
    if exe is None:
        raise TlsConfigError("LocalCluster(tls=True) needs the openssl command-line tool to make a throwaway CA")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = out / "ca.key", out / "ca.pem"
    key, csr, cert = out / "server.key", out / "server.csr", out / "server.pem"
    ext = out / "server.ext"
    ext.write_text(f"{_san(hosts)}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid,issuer\n", encoding="ascii")
    steps = [
        [exe, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(ca_key), "-out", str(ca_cert), "-days", str(days), "-subj", "/CN=SplitMQ local CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [exe, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost"],
        [exe, "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
         "-out", str(cert), "-days", str(days), "-extfile", str(ext)],
    ]
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=_OPENSSL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TlsConfigError(f"openssl failed: {e}") from None
        if done.returncode != 0:
            raise TlsConfigError(f"openssl {cmd[1]} failed: {done.stderr.decode(errors='replace').strip()}")
    for leftover in (ca_key, csr, ext, out / "ca.srl"):
        leftover.unlink(missing_ok=True)
    os.chmod(key, 0o600)
    os.chmod(cert, 0o644)
    return LocalTlsFiles(ca_file=str(ca_cert), cert_file=str(cert), key_file=str(key))
