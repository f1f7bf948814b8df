"""The ``splitmq`` command line: every subcommand, its options and its help text (argparse).

Each leaf parser sets ``func`` (the handler, called with the parsed namespace and an
:class:`~client.cli._output.Output`) and ``leaf`` (itself, so a late check can still fail as a usage error).
Usage errors print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any, NoReturn

from client.cli import _admin_cmds, _cluster_up, _completion, _dledger_cmds, _msg_cmds, _secure_cmd
from client.cli._dashboard_cmd import add_dashboard
from common.codes import Perm

__all__ = ["build_parser"]

DEFAULT_TIMEOUT_S = 10.0
PROG = "splitmq"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``prog: error: ... (see 'prog --help')``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{value} is out of range, expected {bound}")
        return value

    parse.__name__ = "integer"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _common(*, json_opt: bool = True, namesrv: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S) -> _Parser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("common options")
    if namesrv:
        g.add_argument("-n", "--namesrv", metavar="ADDR", default=os.environ.get("NAMESRV_ADDR"),
                       help="nameserver address(es), 'host:port;host:port' (default: $NAMESRV_ADDR)")
    g.add_argument("--timeout", type=_positive_float, default=timeout_s, metavar="S",
                   help=f"bound in seconds on each wait of this command (default: {timeout_s:g})")
    if json_opt:
        g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument("--debug", action="store_true", help="log to stderr and show tracebacks")
    return p


def _leaf(group: Any, name: str, func: Callable[..., int], help_text: str, *,
          parents: list[argparse.ArgumentParser]) -> _Parser:
    p: _Parser = group.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".",
                                  parents=parents)
    p.set_defaults(func=func, leaf=p)
    return p


def _topic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--topic", required=True, help="topic name")
    p.add_argument("-r", "--read-queues", type=_int_in(1, 1024), default=8, metavar="N",
                   help="read queues per broker group (default: 8)")
    p.add_argument("-w", "--write-queues", type=_int_in(1, 1024), default=8, metavar="N",
                   help="write queues per broker group (default: 8)")
    p.add_argument("-p", "--perm", type=_int_in(0, 7), default=int(Perm.READ | Perm.WRITE), metavar="PERM",
                   help="permission bits: 2 write, 4 read, 6 both (default: 6)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-c", "--cluster", help="create on every master of this cluster")
    where.add_argument("-b", "--broker-name", metavar="BROKER_NAME", help="create on this broker group's master")


def _add_account(parser: _Parser) -> None:
    """Global options: the account every request of the command is signed with (docs/SECURITY.md)."""
    g = parser.add_argument_group("account (ACL)")
    g.add_argument("--access-key", metavar="AK", default=os.environ.get("SPLITMQ_ACCESS_KEY"),
                   help="access key that signs every request (default: $SPLITMQ_ACCESS_KEY)")
    g.add_argument("--secret-key", metavar="SK", default=os.environ.get("SPLITMQ_SECRET_KEY"),
                   help="its secret key (default: $SPLITMQ_SECRET_KEY; prefer the variable: a command line is "
                        "visible to other users of the machine)")
    t = parser.add_argument_group("TLS")
    t.add_argument("--tls-ca", metavar="PEM", default=os.environ.get("SPLITMQ_TLS_CA"),
                   help="talk TLS to every server, verifying them against this CA file (default: $SPLITMQ_TLS_CA)")


def _add_cluster(sub: Any, common: _Parser) -> None:
    cl = sub.add_parser("cluster", help="start a local cluster, list brokers",
                        description="Start a local cluster in the foreground, or list the brokers a nameserver knows.")
    cs = cl.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    up = _leaf(cs, "up", _cluster_up.cmd_cluster_up, "run a local nameserver and broker groups until Ctrl-C",
               parents=[_common(json_opt=False, namesrv=False, timeout_s=30.0)])
    up.add_argument("--root", required=True, metavar="DIR", help="directory for stores, configs and logs")
    up.add_argument("--groups", type=_int_in(1, 26), default=1, metavar="N", help="broker groups (default: 1)")
    up.add_argument("--slaves", type=_int_in(0, 8), default=1, metavar="M", help="slaves per group (default: 1)")
    up.add_argument("--mode", choices=("async", "sync", "dledger"), default="async",
                    help="replication: ASYNC_MASTER or SYNC_MASTER with --slaves slaves, or dledger: each group a "
                         "Raft group of --peers members that elect their master (default: async)")
    up.add_argument("--peers", type=_int_in(1, 9), default=3, metavar="P",
                    help="--mode dledger: members per group, 3 survives one failure, 5 two (default: 3)")
    up.add_argument("--set", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="broker .properties key for every broker (repeatable), e.g. --set slaveReadEnable=true; "
                         "--set autoCreateTopicEnable=true lets a send create a topic (off by default)")
    up.add_argument("--acl", action="store_true",
                    help="turn the ACL on: write an accounts file with an admin account and a cluster secret, "
                         "start every server with it, print the file's path and the admin access key")
    up.add_argument("--tls", action="store_true",
                    help="turn TLS on: make a throwaway CA and a loopback certificate, serve every port with it and "
                         "print the CA file to pass as --tls-ca")
    up.add_argument("--secure", action="store_true",
                    help="--acl and --tls together, and the cluster secret at the nameservers too: every file "
                         "written with mode 0600 where it holds a secret; prints how a client uses them")
    _leaf(cs, "list", _admin_cmds.cmd_cluster_list, "list the brokers of each cluster", parents=[common])


def _add_secure(sub: Any) -> None:
    sc = sub.add_parser("secure", help="make the files of a secure cluster",
                        description="Make the files of a secure cluster (docs/DEPLOY.md, docs/SECURITY.md).")
    ss = sc.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    init = _leaf(ss, "init", _secure_cmd.cmd_secure_init,
                 "write a CA and certificate, accounts, the cluster secret and the broker and nameserver settings",
                 parents=[])
    init.add_argument("--out", required=True, metavar="DIR", help="directory to write (secrets with mode 0600)")
    init.add_argument("--host", action="append", required=True, metavar="ADDR",
                      help="an address (or name) the servers are reached at; repeat for every host")
    init.add_argument("--install-dir", default=None, metavar="PATH",
                      help="where DIR will be copied on every host, as written into the settings (default: DIR)")
    init.add_argument("--days", type=_int_in(1, 3650), default=365, help="certificate validity (default: 365)")


def _add_topic(sub: Any, common: _Parser) -> None:
    tp = sub.add_parser("topic", help="create, update and inspect topics",
                        description="Create, update and inspect topics (mqadmin updateTopic, topicRoute, ...).")
    ts = tp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    for name, verb in (("create", "create"), ("update", "update")):
        p = _leaf(ts, name, _admin_cmds.cmd_topic_update, f"{verb} a topic on masters (all, a cluster's, or one group's)",
                  parents=[common])
        _topic_options(p)
    p = _leaf(ts, "route", _admin_cmds.cmd_topic_route, "show a topic's route from the nameserver", parents=[common])
    p.add_argument("-t", "--topic", required=True, help="topic name")
    p = _leaf(ts, "status", _admin_cmds.cmd_topic_status, "show min/max offsets and last store time per queue",
              parents=[common])
    p.add_argument("-t", "--topic", required=True, help="topic name")
    _leaf(ts, "list", _admin_cmds.cmd_topic_list, "list the topics the nameserver knows", parents=[common])


def _add_admin(sub: Any, common: _Parser) -> None:
    gp = sub.add_parser("group", help="subscription groups", description="Manage subscription groups.")
    gs = gp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    for name in ("create", "update"):
        p = _leaf(gs, name, _admin_cmds.cmd_group_update,
                  "create or update a subscription group on every master (mqadmin updateSubGroup)", parents=[common])
        p.add_argument("-g", "--group", required=True, help="consumer group name")
        p.add_argument("--broker-id", type=_int_in(0), default=0, metavar="N",
                       help="member consumers pull from by default (default: 0, the master)")
        p.add_argument("--slow-broker-id", type=_int_in(0), default=1, metavar="N",
                       help="member to pull from when consumption falls behind (default: 1)")
        p.add_argument("--retry-max-times", type=_int_in(-1), default=16, metavar="N",
                       help="redeliveries before a message goes to the dead-letter topic (default: 16)")
        p.add_argument("-c", "--cluster", help="only the masters of this cluster")

    hp = sub.add_parser("ha", help="replication status", description="Master/slave replication status.")
    hs = hp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = _leaf(hs, "status", _admin_cmds.cmd_ha_status, "show the master's view of each slave (haStatus)",
              parents=[common])
    p.add_argument("-b", "--broker-name", required=True, metavar="BROKER_NAME", help="broker group name")

    cp = sub.add_parser("consumer", help="consumer groups", description="Consumer group progress.")
    cps = cp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = _leaf(cps, "progress", _admin_cmds.cmd_consumer_progress,
              "show broker offset, consumer offset and lag per queue", parents=[common])
    p.add_argument("-g", "--group", required=True, help="consumer group name")
    p.add_argument("-t", "--topic", help="only this topic (default: every topic the group committed offsets for)")

    bp = sub.add_parser("broker", help="broker runtime", description="Broker runtime information.")
    bs = bp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = _leaf(bs, "status", _admin_cmds.cmd_broker_status, "show a broker's runtime information (GET /runtime)",
              parents=[common])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-b", "--broker-name", metavar="BROKER_NAME", help="broker group name (with --broker-id)")
    which.add_argument("--addr", metavar="HOST:PORT", help="the broker's listen address")
    p.add_argument("-i", "--broker-id", type=_int_in(0), default=0, metavar="N",
                   help="member of --broker-name (default: 0, the master)")
    p = _leaf(bs, "clean", _admin_cmds.cmd_broker_clean,
              "delete expired commit-log files now, whatever the hour (every member of the group)", parents=[common])
    p.add_argument("-b", "--broker-name", required=True, metavar="BROKER_NAME", help="broker group name")


def _add_dledger(sub: Any, common: _Parser) -> None:
    dp = sub.add_parser("dledger", help="DLedger groups: status, leadership transfer",
                        description="Inspect a DLedger (Raft) broker group and move its leadership (docs/DLEDGER.md).")
    ds = dp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = _leaf(ds, "status", _dledger_cmds.cmd_dledger_status,
              "show each peer's role, term, leader, end and committed index, and lag (exit 1 without a leader)",
              parents=[common])
    p.add_argument("-b", "--broker-name", required=True, metavar="BROKER_NAME", help="broker group name")
    p = _leaf(ds, "transfer", _dledger_cmds.cmd_dledger_transfer,
              "hand the group's leadership to a peer; returns once the route shows it as the master",
              parents=[common])
    p.add_argument("-b", "--broker-name", required=True, metavar="BROKER_NAME", help="broker group name")
    p.add_argument("--to", required=True, metavar="PEER", help="the peer to lead, as in dLegerPeers (n0, n1, ...)")


def _add_messages(sub: Any, common: _Parser) -> None:
    mp = sub.add_parser("msg", help="query messages", description="Find stored messages.")
    ms = mp.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = _leaf(ms, "query", _msg_cmds.cmd_msg_query, "find messages by msgId or by key", parents=[common])
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--id", metavar="MSG_ID", help="offset msgId, or unique msgId (needs -t)")
    how.add_argument("--key", help="message key (needs -t)")
    p.add_argument("-t", "--topic", help="topic to search")
    p.add_argument("--max-body", type=_int_in(0), default=200, metavar="CHARS",
                   help="cut printed bodies at CHARS characters, 0 for no limit (default: 200)")

    p = _leaf(sub, "produce", _msg_cmds.cmd_produce,
              "send messages: bodies from arguments, '-' for stdin lines, --file, or --count/--size",
              parents=[common])
    p.epilog = (f"Exit code {_msg_cmds.EXIT_STORED_NOT_REPLICATED}: every message was stored, but at least one "
                "answered SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT or FLUSH_DISK_TIMEOUT (on the master, not yet "
                "on its slave or disk; a resend would duplicate it). 1: a send failed. 0: every message SEND_OK.")
    p.add_argument("bodies", nargs="*", metavar="BODY", help="message bodies; '-' reads one message per stdin line")
    p.add_argument("-t", "--topic", required=True, help="topic name")
    p.add_argument("--file", metavar="F", help="send each line of file F as a message")
    p.add_argument("--count", type=_int_in(1), metavar="N", help="send N generated messages")
    p.add_argument("--size", type=_int_in(1, 4 * 1024 * 1024), default=128, metavar="B",
                   help="body size in bytes of generated messages (default: 128)")
    p.add_argument("--threads", type=_int_in(1, 64), default=4, metavar="T",
                   help="sending threads for --count (concurrent sends are batched; default: 4)")
    p.add_argument("--tags", help="message tag")
    p.add_argument("--keys", help="message keys, separated by commas or spaces")
    p.add_argument("-g", "--group", default="CLI_PRODUCER_GROUP", help="producer group (default: CLI_PRODUCER_GROUP)")
    p.add_argument("--create", action="store_true",
                   help="create the topic (8 queues per broker group) when it does not exist; without it a "
                        "missing topic is an error, never created by the send")

    p = _leaf(sub, "consume", _msg_cmds.cmd_consume,
              "pull and print messages; stops after --count messages or --timeout seconds without one",
              parents=[common])
    p.add_argument("-t", "--topic", required=True, help="topic name")
    p.add_argument("-g", "--group", default="CLI_CONSUMER_GROUP", help="consumer group (default: CLI_CONSUMER_GROUP)")
    p.add_argument("--from-slave", action="store_true", help="pin every pull to the slave (broker id 1)")
    p.add_argument("--from-beginning", action="store_true",
                   help="start at each queue's min offset (default: the group's offset, else the queue's end)")
    p.add_argument("--count", type=_int_in(1), metavar="N", help="stop after N messages")
    p.add_argument("--subexpr", default="*", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB' (default: *)")
    p.add_argument("--no-commit", action="store_true", help="do not commit the group's offsets")
    p.add_argument("--max-body", type=_int_in(0), default=200, metavar="CHARS",
                   help="cut printed bodies at CHARS characters, 0 for no limit (default: 200)")


def _add_completion(sub: Any, root: argparse.ArgumentParser) -> None:
    p = _leaf(sub, "completion", _completion.cmd_completion,
              "print a shell completion script: eval \"$(splitmq completion bash)\" (or zsh)", parents=[])
    p.add_argument("shell", choices=_completion.SHELLS, help="the shell to complete in")
    p.set_defaults(root_parser=root)  # the script is made from the whole parser


def _version() -> str:
    try:
        return importlib.metadata.version("splitmq")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``splitmq`` parser with every subcommand."""
    parser = _Parser(
        prog=PROG,
        description="SplitMQ command-line tool: run a local cluster, administer topics and groups (mqadmin), "
                    "produce and consume messages.",
        epilog="Every subcommand has its own --help. Exit codes: 0 ok, 1 operational error, 2 usage error, "
               "3 (produce) every message stored but at least one without its replica or disk flush "
               "(SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT: do not resend it).",
    )
    _add_account(parser)
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    common = _common()
    _add_cluster(sub, common)
    _add_secure(sub)
    _add_topic(sub, common)
    _add_admin(sub, common)
    _add_dledger(sub, common)
    _add_messages(sub, common)
    add_dashboard(sub, common)
    _add_completion(sub, parser)
    return parser

