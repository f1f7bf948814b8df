"""The files of a secure cluster, made in one step (issue 39 item 2): ``splitmq secure init`` for real hosts,
and what ``splitmq cluster up --secure`` (``LocalCluster(acl=True, tls=True)``) makes for a local one.

:func:`generate_secure_files` writes into one directory, every file holding a secret with mode 0600:

* ``tls/ca.pem``, ``tls/server.pem``, ``tls/server.key`` -- a CA (its key deleted once it signed) and one
  certificate for every host given (and loopback);
* ``acl/plain_acl.toml`` -- the accounts: ``admin`` (operators, the CLI) and ``broker`` (every broker's own
  account), both admin, random secret keys;
* ``cluster.secret`` -- ``haAuthSecret`` of every broker, which the nameservers also read
  (``--ha-auth-secret-file``) to refuse registrations without it;
* ``broker-secure.properties`` -- the keys to add to every broker's properties file;
* ``nameserver.args`` -- the flags to add to every nameserver's command line;
* ``admin.credentials`` -- the admin account for the CLI (``SPLITMQ_ACCESS_KEY`` / ``SPLITMQ_SECRET_KEY``).

The paths written into the properties and flags are under ``install_dir``, where the directory will be copied on
every host (``/etc/splitmq/secure`` in docs/DEPLOY.md).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import attrs

from client.tls import generate_local_tls_files
from common.signing import Credentials

__all__ = ["SecureFiles", "generate_secure_files", "write_private"]


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (created so, never readable by others even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


@attrs.frozen(repr=False)
class SecureFiles:
    """What :func:`generate_secure_files` wrote (paths as written, under the output directory)."""

    directory: Path
    admin: Credentials
    broker: Credentials
    install_dir: str

    def __repr__(self) -> str:
        return f"SecureFiles({str(self.directory)!r}, admin={self.admin.access_key!r})"

    @property
    def broker_properties(self) -> Path:
        return self.directory / "broker-secure.properties"

    @property
    def nameserver_args(self) -> Path:
        return self.directory / "nameserver.args"

    def client_usage(self) -> list[str]:
        """How a client uses the files (printed by the commands; names the files, never a secret)."""
        d = self.install_dir
        return [
            f"clients: CA file {d}/tls/ca.pem; the admin account is in {d}/admin.credentials (mode 0600)",
            f"  CLI:    export SPLITMQ_TLS_CA={d}/tls/ca.pem; set -a; . {d}/admin.credentials; set +a",
            f"  SDK:    ClientConfig(tls_ca_file='{d}/tls/ca.pem', credentials=Credentials(access_key, "
            "secret_key)) with an account of acl/plain_acl.toml",
            f"  Spark:  options tlsCaFile={d}/tls/ca.pem, accessKey, secretKey",
        ]


def generate_secure_files(directory: str | os.PathLike[str], hosts: Sequence[str], *,
                          install_dir: str | None = None, days: int = 365) -> SecureFiles:
    """Make every file a secure cluster needs (see the module docstring) in ``directory``.

    Args:
        directory: where to write (created; files already there are replaced).
        hosts: the IP addresses (or names) servers are reached at; the certificate covers each.
        install_dir: where ``directory`` will live on the hosts (default: ``directory`` itself).
        days: validity of the CA and the certificate.

    Raises:
        TlsConfigError: ``openssl`` is missing or failed, or a host is neither an address nor a name.
    """
    out = Path(directory).resolve()
    d = install_dir or str(out)
    tls = generate_local_tls_files(out / "tls", days=days, hosts=hosts)
    admin = Credentials("admin", secrets.token_urlsafe(24))
    broker = Credentials("broker", secrets.token_urlsafe(24))
    accounts = "# SplitMQ accounts (splitmq secure init): add application accounts with their own permissions\n"
    for creds in (admin, broker):
        accounts += (f"[[accounts]]\naccessKey = {json.dumps(creds.access_key)}\n"
                     f"secretKey = {json.dumps(creds.secret_key)}\nadmin = true\n")
    write_private(out / "acl" / "plain_acl.toml", accounts)
    secret = secrets.token_urlsafe(32)
    write_private(out / "cluster.secret", secret + "\n")
    write_private(out / "broker-secure.properties",
                  "# add to every broker's properties file (splitmq secure init)\n"
                  f"aclEnable=true\naclFile={d}/acl/plain_acl.toml\n"
                  f"accessKey={broker.access_key}\nsecretKey={broker.secret_key}\n"
                  f"haAuthSecret={secret}\n"
                  f"tlsEnable=true\ntlsCertFile={d}/tls/server.pem\ntlsKeyFile={d}/tls/server.key\n"
                  f"tlsCaFile={d}/tls/ca.pem\n")
    write_private(out / "nameserver.args",
                  f"--acl-enable --acl-file {d}/acl/plain_acl.toml --ha-auth-secret-file {d}/cluster.secret "
                  f"--tls-cert {d}/tls/server.pem --tls-key {d}/tls/server.key\n")
    write_private(out / "admin.credentials",
                  f"SPLITMQ_ACCESS_KEY={admin.access_key}\nSPLITMQ_SECRET_KEY={admin.secret_key}\n")
    del tls
    return SecureFiles(out, admin, broker, d)
