"""The broker's ACL rules: what each endpoint needs (docs/SECURITY.md, issue 14 item 2).

One row per route the broker serves; ``tests/broker/test_acl_rules.py`` checks that the router has no route
without a row, so a new endpoint cannot be left open by mistake (the gate refuses such a route anyway).

RocketMQ's ``PlainAccessValidator`` is the model: a send needs PUB on its topic; a pull, offset commits and
queries need SUB on the topic and the group they name; heartbeats, unregistration, send-backs and queue locks
need SUB on the consumer groups (a ``%RETRY%G`` / ``%DLQ%G`` topic is group G's, see :mod:`remoting.acl`);
metadata, status and operations need ``admin``. ``GET /message`` (by commit-log offset) names no topic before it reads the
record, so it needs admin.

Transactions (issue 17): ``POST /transaction/end`` needs PUB on its ``topic`` argument, as the send of the
message did -- the broker checks that the half message it ends has that ``REAL_TOPIC``, so an account cannot end
a transaction of a topic it may not publish to; the producer group is not checked, as RocketMQ does not permission
producer groups. ``GET /transaction/checks`` hands out the half messages of a producer group whatever their
topics, so it needs the group itself with PUB (``groupPerms = ["G=PUB"]``; a consumer group's usual ``SUB``
is not enough).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from remoting.acl import Action
from remoting.acl_gate import (
    ADMIN,
    AclGate,
    Principal,
    Rule,
    all_of,
    group_arg,
    json_strings,
    load_acl_file,
    topic_arg,
)
from remoting.router import Request

__all__ = ["BROKER_RULES", "build_gate"]

log = logging.getLogger(__name__)

PUB, SUB = Action.PUB, Action.SUB


def _heartbeat(principal: Principal, request: Request) -> None:
    """Each consumer group needs SUB, and each topic it subscribes to SUB; producer groups need no permission
    (a producer's heartbeat only lists it)."""
    body = request.json()
    for group in json_strings(body, "consumerGroups", "[]", "group"):
        principal.need_group(group)
    for topic in json_strings(body, "consumerGroups", "[]", "subscriptions", "[]", "topic"):
        principal.need_topic(topic, SUB)


def _unregister(principal: Principal, request: Request) -> None:
    for group in json_strings(request.json(), "consumerGroups", "[]"):
        principal.need_group(group)


def _sendback(principal: Principal, request: Request) -> None:
    for group in json_strings(request.json(), "group"):
        principal.need_group(group)


def _commit_offsets(principal: Principal, request: Request) -> None:
    body = request.json()
    for group in json_strings(body, "group"):
        principal.need_group(group)
    for topic in set(json_strings(body, "offsets", "[]", "topic")):
        principal.need_topic(topic, SUB)


def _queue_lock(principal: Principal, request: Request) -> None:
    """Locking or unlocking queues of orderly consumption: SUB on the group and on each queue's topic (what the
    same consumer needs to pull them)."""
    body = request.json()
    for group in json_strings(body, "consumerGroup"):
        principal.need_group(group)
    for topic in set(json_strings(body, "mqSet", "[]", "topic")):
        principal.need_topic(topic, SUB)


def _producer_group(principal: Principal, request: Request) -> None:
    group = request.query.get("group")
    if group is not None:
        principal.need_group(group, PUB)


_TOPIC_SUB = topic_arg("topic", SUB)


def _any_account(principal: Principal, request: Request) -> None:
    """Any signed account: the group identity is an opaque id every reader that keeps offsets needs (a Spark
    job's account has SUB on its topic only, and the id names no topic)."""

#: ``{(method, path): rule}`` for every broker endpoint.
BROKER_RULES: Mapping[tuple[str, str], Rule] = {
    # data path
    ("POST", "/send"): topic_arg("topic", PUB),
    ("GET", "/pull"): all_of(_TOPIC_SUB, group_arg("group")),
    ("POST", "/consumer/sendback"): _sendback,
    ("POST", "/transaction/end"): topic_arg("topic", PUB),
    ("GET", "/transaction/checks"): _producer_group,
    # clients and consumer groups
    ("POST", "/heartbeat"): _heartbeat,
    ("POST", "/client/unregister"): _unregister,
    ("GET", "/consumer/ids"): group_arg("group"),
    ("GET", "/consumer/pulls"): all_of(_TOPIC_SUB, group_arg("group")),
    ("GET", "/offset/consumer"): all_of(_TOPIC_SUB, group_arg("group")),
    ("POST", "/offset/consumer"): _commit_offsets,
    ("POST", "/queue/lock"): _queue_lock,
    ("POST", "/queue/unlock"): _queue_lock,
    # queue offsets and message queries
    ("GET", "/offset/min"): _TOPIC_SUB,
    ("GET", "/offset/max"): _TOPIC_SUB,
    ("GET", "/offset/search"): _TOPIC_SUB,
    ("GET", "/offset/storetime"): _TOPIC_SUB,
    ("GET", "/message/key"): _TOPIC_SUB,
    ("GET", "/message/uniq"): _TOPIC_SUB,
    ("GET", "/message"): ADMIN,
    # metadata and operations
    ("POST", "/topic"): ADMIN,
    ("GET", "/topics"): ADMIN,
    ("POST", "/subscription-group"): ADMIN,
    ("GET", "/subscription-groups"): ADMIN,
    ("GET", "/offsets"): ADMIN,
    ("GET", "/delay-offsets"): ADMIN,
    ("GET", "/runtime"): ADMIN,
    ("GET", "/identity"): _any_account,
    ("GET", "/ha"): ADMIN,
    ("GET", "/metrics"): ADMIN,  # or the aclMetricsToken bearer token, checked by the gate
    ("POST", "/commitlog/clean"): ADMIN,
    ("GET", "/dledger"): ADMIN,
    ("POST", "/dledger/transfer"): ADMIN,
}


def build_gate(*, acl_file: str, tolerance_ms: int, nonce_cache_max: int, metrics_token: str,
               clock_ms: Callable[[], int], server_names: Iterable[str] = ()) -> AclGate:
    """The broker's gate over the accounts file as it is now (the caller watches it for changes).

    Raises:
        AclFileError: the file does not load (the broker refuses to start without its accounts).
    """
    config = load_acl_file(acl_file)
    log.info("ACL on: %d account(s) from %s", len(config.accounts), acl_file)
    return AclGate(config, BROKER_RULES, tolerance_ms=tolerance_ms, nonce_cache_max=nonce_cache_max,
                   clock_ms=clock_ms, metrics_token=metrics_token or None, server_names=server_names)
