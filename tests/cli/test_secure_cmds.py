"""``splitmq secure init`` (the files of a secure cluster on real hosts) and ``splitmq cluster up --secure``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_secure_init_writes_the_files_with_their_modes_and_prints_no_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "secure"
    assert main(["secure", "init", "--out", str(out), "--host", "10.0.0.1", "--host", "10.0.0.2",
                 "--install-dir", "/etc/splitmq/secure"]) == 0
    printed = capsys.readouterr().out
    secret = (out / "cluster.secret").read_text().strip()
    assert secret and secret not in printed
    assert "broker-secure.properties" in printed and "SPLITMQ_TLS_CA=/etc/splitmq/secure/tls/ca.pem" in printed
    props = (out / "broker-secure.properties").read_text()
    assert "aclFile=/etc/splitmq/secure/acl/plain_acl.toml" in props and f"haAuthSecret={secret}" in props
    for name in ("cluster.secret", "broker-secure.properties", "nameserver.args", "admin.credentials",
                 "acl/plain_acl.toml", "tls/server.key"):
        assert (out / name).stat().st_mode & 0o777 == 0o600, name


@pytest.mark.integration
def test_cluster_up_secure_starts_acl_and_tls_and_says_how_a_client_connects(tmp_path: Path) -> None:
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITMQ_")}
    with subprocess.Popen([sys.executable, "-m", "client.cli", "cluster", "up", "--root", str(tmp_path / "c"),
                           "--slaves", "0", "--secure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, env=env) as proc:
        assert proc.stdout is not None
        try:
            lines = [proc.stdout.readline() for _ in range(4)]
            assert lines[0].startswith("namesrv="), lines
            assert lines[1].startswith("acl: admin access key ") and "mode 0600" in lines[1], lines
            assert lines[2].startswith("tls: CA file "), lines
            assert lines[3].startswith("secure: ") and "ClientConfig(tls_ca_file=" in lines[3], lines
            acl_dir = tmp_path / "c" / "acl"
            for name in ("plain_acl.toml", "cluster.secret"):
                assert (acl_dir / name).stat().st_mode & 0o777 == 0o600, name
            assert (acl_dir / "cluster.secret").read_text().strip() not in "".join(lines)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
