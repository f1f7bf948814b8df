"""``splitmq`` without servers: help texts, usage errors, the error funnel, text formatting."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys

import pytest

from client.cli import _run, build_parser, main
from client.cli._common import split_keys
from client.cli._msg_cmds import _payload
from client.cli._output import Output, cell, fmt_body, fmt_time_ms
from client.errors import BrokerError, TopicNotExistError

LEAVES = [
    ("cluster", "up"), ("cluster", "list"), ("topic", "create"), ("topic", "update"), ("topic", "route"),
    ("topic", "status"), ("topic", "list"), ("group", "update"), ("ha", "status"), ("consumer", "progress"),
    ("msg", "query"), ("broker", "status"), ("produce",), ("consume",),
]


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code or 0)


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_has_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: splitmq {' '.join(path)} ")
    assert "--debug" in out and "--timeout" in out
    if path != ("cluster", "up"):
        assert "-n ADDR, --namesrv ADDR" in out and "NAMESRV_ADDR" in out


@pytest.mark.parametrize("group", ["cluster", "topic", "group", "ha", "consumer", "broker", "msg"])
def test_group_help_lists_actions(group: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code([group, "--help"]) == 0
    out = capsys.readouterr().out
    for leaf in (p[1] for p in LEAVES if p[0] == group and len(p) == 2):
        assert f"    {leaf} " in out


@pytest.mark.parametrize("argv", [
    [], ["topic"], ["topic", "create"], ["topic", "create", "-t", "T", "-w", "2000"],
    ["consume", "-t", "T", "--count", "0"], ["cluster", "up", "--root", "x", "--mode", "fast"],
    ["cluster", "up", "--root", "x", "--set", "novalue"], ["broker", "status", "-n", "h:1"],
    ["topic", "list", "--timeout", "nan"],
])
def test_usage_errors_are_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "error:" in err and "--help" in err


def _args(func: object, *, debug: bool = False) -> argparse.Namespace:
    return argparse.Namespace(func=func, debug=debug)


def _out() -> tuple[Output, io.StringIO, io.StringIO]:
    o, e = io.StringIO(), io.StringIO()
    return Output(o, e), o, e


def _raise(exc: BaseException) -> object:
    def func(args: argparse.Namespace, out: Output) -> int:
        raise exc

    return func


def test_client_error_is_one_line_with_the_broker() -> None:
    out, _, err = _out()
    exc = TopicNotExistError("topic[X] not exist", broker_addr="127.0.0.1:10911", broker_role="SLAVE")
    assert _run(_args(_raise(exc)), out) == 1
    assert err.getvalue() == "splitmq: error: [code=17] topic[X] not exist [broker 127.0.0.1:10911 SLAVE]\n"


def test_unexpected_error_hints_at_debug() -> None:
    out, _, err = _out()
    assert _run(_args(_raise(RuntimeError("boom"))), out) == 1
    assert err.getvalue() == ("splitmq: error: unexpected RuntimeError: boom "
                              "(run again with --debug for the traceback)\n")
    out, _, err = _out()
    assert _run(_args(_raise(RuntimeError("boom")), debug=True), out) == 1
    assert "Traceback" in err.getvalue() and err.getvalue().endswith("splitmq: error: unexpected RuntimeError: boom\n")


def test_os_value_and_interrupt_errors() -> None:
    out, _, err = _out()
    assert _run(_args(_raise(FileNotFoundError(2, "No such file or directory", "x.txt"))), out) == 1
    assert err.getvalue() == "splitmq: error: No such file or directory: x.txt\n"
    out, _, err = _out()
    assert _run(_args(_raise(ValueError("bad namesrv"))), out) == 1
    assert err.getvalue() == "splitmq: error: bad namesrv\n"
    out, _, err = _out()
    assert _run(_args(_raise(KeyboardInterrupt())), out) == 130
    assert _run(_args(lambda a, o: 0), out) == 0
    assert _run(_args(_raise(BrokerError.for_code(1, "disk full"))), out) == 1


def test_a_nameserver_without_a_port_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    # Exit 2 (usage), nothing dialled: 'localhost' used to be tried at port 80 and reported as refused.
    assert main(["topic", "list", "-n", "127.0.0.1:9876;localhost"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitmq: error: namesrv_addr entry 'localhost' is not 'host:port'"), err
    assert "'localhost:9876'" in err


def test_table_is_aligned_and_splits_into_columns() -> None:
    out, o, _ = _out()
    out.table(("NAME", "ID", "NOTE"), [("broker-a", 0, "two words"), ("b", 12, None), ("c", True, 1.25)])
    lines = o.getvalue().splitlines()
    assert lines[0] == "NAME      ID   NOTE"
    assert [line.split() for line in lines[1:]] == [["broker-a", "0", "two_words"], ["b", "12", "-"],
                                                    ["c", "yes", "1.2"]]
    out, o, _ = _out()
    out.table(("A",), [])
    assert o.getvalue() == "A\n(none)\n"


def test_kv_and_json() -> None:
    out, o, _ = _out()
    out.kv([("role", "SLAVE"), ("masterLinkUp", True), ("x", None)])
    assert o.getvalue() == "role:         SLAVE\nmasterLinkUp: yes\nx:            -\n"
    out, o, _ = _out()
    out.json({"b": 1, "a": [1]}, compact=True)
    assert o.getvalue() == '{"a":[1],"b":1}\n'
    assert json.loads(o.getvalue()) == {"a": [1], "b": 1}


def test_formatting_helpers() -> None:
    assert fmt_body(b"line1\nline2", 0) == "line1\\nline2"
    assert fmt_body(b"abcdef", 3) == "abc..."
    assert fmt_body(b"\xff ok", 10) == "\ufffd ok"
    assert fmt_time_ms(None) == "n/a" and fmt_time_ms(0) == "n/a" and fmt_time_ms(True) == "n/a"
    assert fmt_time_ms(1_700_000_000_123).endswith(".123")
    assert cell("") == "-" and cell(False) == "no"
    assert split_keys("a,b  c,") == ("a", "b", "c") and split_keys(None) == ()
    assert [len(_payload(i, n)) for i, n in ((0, 1), (5, 13), (7, 100))] == [1, 13, 100]
    assert _payload(42, 20).startswith(b"000000000042:")


def test_parser_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESRV_ADDR", "10.0.0.1:9876")
    args = build_parser().parse_args(["topic", "create", "-t", "T"])
    assert (args.namesrv, args.timeout, args.read_queues, args.write_queues, args.perm) == \
        ("10.0.0.1:9876", 10.0, 8, 8, 6)
    args = build_parser().parse_args(["cluster", "up", "--root", "d", "--set", "a=1", "--set", "b = 2"])
    assert (args.groups, args.slaves, args.mode, args.timeout, args.set) == (1, 1, "async", 30.0,
                                                                            [("a", "1"), ("b", "2")])


def test_cli_imports_no_server_code() -> None:
    code = ("import sys, client.cli, client.cli._admin_cmds, client.cli._msg_cmds, client.cli._cluster_up; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('broker', 'nameserver')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.strip() == "[]"
