"""``splitmq --access-key/--secret-key`` (or ``SPLITMQ_ACCESS_KEY``/``SPLITMQ_SECRET_KEY``): the account of every
request of the command; a half-given account is a usage error; the secret key is never printed."""

from __future__ import annotations

import pytest

from client import Credentials
from client.cli import build_parser, main
from client.cli._common import client_config

SECRET = "sk-never-printed"


def _config(argv: list[str]) -> Credentials | None:
    args = build_parser().parse_args(argv)
    return client_config(args).credentials


def test_global_options_and_env_vars_give_the_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPLITMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("SPLITMQ_SECRET_KEY", raising=False)
    assert _config(["topic", "list", "-n", "h:1"]) is None
    assert _config(["--access-key", "ops", "--secret-key", SECRET, "topic", "list", "-n", "h:1"]) == \
        Credentials("ops", SECRET)
    monkeypatch.setenv("SPLITMQ_ACCESS_KEY", "env-ak")
    monkeypatch.setenv("SPLITMQ_SECRET_KEY", SECRET)
    assert _config(["topic", "list", "-n", "h:1"]) == Credentials("env-ak", SECRET)
    assert _config(["--access-key", "flag-ak", "topic", "list", "-n", "h:1"]) == Credentials("flag-ak", SECRET)


@pytest.mark.parametrize("argv", [
    ["--access-key", "ops", "topic", "list", "-n", "127.0.0.1:1"],
    ["--secret-key", SECRET, "topic", "list", "-n", "127.0.0.1:1"],
    ["--access-key", "a,b", "--secret-key", SECRET, "topic", "list", "-n", "127.0.0.1:1"],
])
def test_a_half_or_bad_account_is_a_usage_error_without_the_secret(
        argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPLITMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("SPLITMQ_SECRET_KEY", raising=False)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "access" in err.lower()
    assert SECRET not in err


def test_help_names_the_options_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for text in ("--access-key", "--secret-key", "SPLITMQ_ACCESS_KEY", "SPLITMQ_SECRET_KEY"):
        assert text in out
    assert build_parser().parse_args(["cluster", "up", "--root", "x", "--acl"]).acl is True
    assert build_parser().parse_args(["cluster", "up", "--root", "x"]).acl is False
