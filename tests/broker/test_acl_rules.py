"""The broker's ACL rules, in process: every route has a rule, and each endpoint x account gets the table's
answer (403 NO_PERMISSION naming the missing permission, or through to the handler)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.acl import BROKER_RULES
from common.codec import encode_batch
from common.message import Message
from common.signing import Credentials, SigningAuth
from tests.broker.fakes import make_controller
from tests.serving import serving

ACCOUNTS = """
[[accounts]]
accessKey = "admin"
secretKey = "admin-secret"
admin = true

[[accounts]]
accessKey = "pub"
secretKey = "pub-secret"
topicPerms = ["T=PUB"]
groupPerms = ["P=PUB"]

[[accounts]]
accessKey = "sub"
secretKey = "sub-secret"
topicPerms = ["T=SUB"]
groupPerms = ["G=SUB"]
"""
CREDS = {name: Credentials(name, f"{name}-secret") for name in ("admin", "pub", "sub")}
BATCH = encode_batch([Message("T", b"x")], born_timestamp_ms=1, uniq_keys=["U0"])
RETRY_BATCH = encode_batch([Message("%RETRY%G", b"x")], born_timestamp_ms=1, uniq_keys=["U1"])
ALL, ADMIN, PUB, SUB = {"admin", "pub", "sub"}, {"admin"}, {"admin", "pub"}, {"admin", "sub"}
Q = {"topic": "T", "queueId": "0"}

#: (method, path, query, body, accounts allowed, the permission a refusal names)
TABLE: list[tuple[str, str, dict[str, str], Any, set[str], str]] = [
    ("POST", "/send", Q, BATCH, PUB, "PUB permission on topic T"),
    ("POST", "/send", {"topic": "%RETRY%G", "queueId": "0"}, RETRY_BATCH, SUB, "SUB permission on group G"),
    ("GET", "/pull", {**Q, "group": "G", "offset": "0"}, None, SUB, "SUB permission on"),
    ("POST", "/consumer/sendback", {}, {"group": "G", "offset": 0}, SUB, "SUB permission on group G"),
    ("POST", "/transaction/end", {"group": "P", "topic": "T", "transactionId": "X1", "commitLogOffset": "0",
                                  "commitOrRollback": "COMMIT"}, None, PUB, "PUB permission on topic T"),
    ("GET", "/transaction/checks", {"group": "P", "timeoutMs": "0"}, None, PUB, "PUB permission on group P"),
    ("POST", "/heartbeat", {}, {"clientId": "c", "consumerGroups": [
        {"group": "G", "subscriptions": [{"topic": "T", "expression": "*"}]}]}, SUB, "SUB permission on"),
    ("POST", "/heartbeat", {}, {"clientId": "c", "producerGroups": ["P"]}, ALL, ""),
    ("POST", "/client/unregister", {}, {"clientId": "c", "consumerGroups": ["G"]}, SUB, "group G"),
    ("GET", "/consumer/ids", {"group": "G"}, None, SUB, "SUB permission on group G"),
    ("GET", "/consumer/pulls", {"group": "G", "topic": "T"}, None, SUB, "SUB permission on"),
    ("GET", "/offset/consumer", {**Q, "group": "G"}, None, SUB, "SUB permission on"),
    ("POST", "/offset/consumer", {}, {"group": "G", "offsets": [{"topic": "T", "queueId": 0, "offset": 1}]}, SUB,
     "SUB permission on"),
    ("POST", "/offset/consumer", {}, {"group": "G", "offsets": [{"topic": "U", "queueId": 0, "offset": 1}]}, ADMIN,
     "permission on"),
    ("POST", "/queue/lock", {}, {"consumerGroup": "G", "clientId": "c",
                                 "mqSet": [{"topic": "T", "brokerName": "broker-a", "queueId": 0}]}, SUB,
     "SUB permission on"),
    ("POST", "/queue/unlock", {}, {"consumerGroup": "G", "clientId": "c",
                                   "mqSet": [{"topic": "U", "brokerName": "broker-a", "queueId": 0}]}, ADMIN,
     "permission on"),
    ("GET", "/offset/min", Q, None, SUB, "SUB permission on topic T"),
    ("GET", "/offset/max", Q, None, SUB, "SUB permission on topic T"),
    ("GET", "/offset/search", {**Q, "timestamp": "0"}, None, SUB, "SUB permission on topic T"),
    ("GET", "/offset/storetime", {**Q, "offset": "0"}, None, SUB, "SUB permission on topic T"),
    ("GET", "/message/key", {"topic": "T", "key": "k"}, None, SUB, "SUB permission on topic T"),
    ("GET", "/message/uniq", {"topic": "T", "msgId": "k"}, None, SUB, "SUB permission on topic T"),
    ("GET", "/message", {"phyOffset": "0"}, None, ADMIN, "no admin permission"),
    ("POST", "/topic", {}, {"topicName": "New"}, ADMIN, "no admin permission (POST /topic needs admin)"),
    ("GET", "/topics", {}, None, ADMIN, "no admin permission"),
    ("POST", "/subscription-group", {}, {"groupName": "G2"}, ADMIN, "no admin permission"),
    ("GET", "/subscription-groups", {}, None, ADMIN, "no admin permission"),
    ("GET", "/offsets", {}, None, ADMIN, "no admin permission"),
    ("GET", "/delay-offsets", {}, None, ADMIN, "no admin permission"),
    ("GET", "/runtime", {}, None, ADMIN, "no admin permission"),
    ("GET", "/identity", {}, None, ALL, ""),
    ("GET", "/ha", {}, None, ADMIN, "no admin permission"),
    ("GET", "/metrics", {}, None, ADMIN, "no admin permission"),
    ("POST", "/commitlog/clean", {}, None, ADMIN, "no admin permission"),
    ("GET", "/dledger", {}, None, ADMIN, "no admin permission"),
    ("POST", "/dledger/transfer", {"peer": "n1"}, None, ADMIN, "no admin permission"),
]


def acl_controller(tmp_path: Path, **config: Any) -> Any:
    tmp_path.mkdir(exist_ok=True)
    acl = tmp_path / "acl.toml"
    acl.write_text(ACCOUNTS)
    return make_controller(tmp_path, acl_enable=True, acl_file=str(acl), **config)


def test_every_route_has_a_rule_and_acl_off_installs_no_hook(tmp_path: Path) -> None:
    ctrl = acl_controller(tmp_path / "on")
    assert ctrl.router.route_keys == frozenset(BROKER_RULES), "a broker route without an ACL rule (or a stale rule)"
    assert ctrl.acl_gate is not None and ctrl.router._authorize is ctrl.acl_gate
    off = make_controller(tmp_path / "off")
    assert off.acl_gate is None and off.router._authorize is None


def test_the_table_covers_every_route() -> None:
    assert {(m, p) for m, p, *_ in TABLE} == set(BROKER_RULES)


async def _call(client: httpx.AsyncClient, method: str, path: str, query: dict[str, str], body: Any,
                creds: Credentials | None) -> httpx.Response:
    kwargs: dict[str, Any] = {"params": query}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["json"] = body
    auth = SigningAuth(creds) if creds is not None else None
    return await client.request(method, path, auth=auth, **kwargs)  # type: ignore[arg-type]


def test_each_endpoint_by_account(tmp_path: Path) -> None:
    ctrl = acl_controller(tmp_path)
    failures = []

    async def main() -> None:
        async with serving(ctrl.router) as client:
            for method, path, query, body, allowed, names in TABLE:
                for who in (None, "admin", "pub", "sub"):
                    r = await _call(client, method, path, query, body, CREDS[who] if who else None)
                    refused = r.status_code == 403
                    what = f"{method} {path} {query} as {who}: {r.status_code} {r.text[:200]}"
                    if who is None:
                        ok = refused and r.json() == {"code": 16, "remark": "request not signed / signature "
                                                      "refused", "acl": True, "broker": ctrl.addr,
                                                      "role": "ASYNC_MASTER"}
                    elif who in allowed:
                        ok = not refused
                    else:
                        remark = r.json().get("remark", "")
                        ok = refused and r.json()["code"] == 16 and f"account {who} has" in remark and names in remark
                    if not ok:
                        failures.append(what)

    asyncio.run(main())
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("token", ["s3cret-token", ""])
def test_metrics_bearer_token(tmp_path: Path, token: str) -> None:
    ctrl = acl_controller(tmp_path, acl_metrics_token=token)

    async def main() -> list[int]:
        async with serving(ctrl.router) as client:
            good = await client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
            bad = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
            elsewhere = await client.get("/runtime", headers={"Authorization": "Bearer s3cret-token"})
            return [good.status_code, bad.status_code, elsewhere.status_code]

    statuses = asyncio.run(main())
    assert statuses == ([200, 403, 403] if token else [403, 403, 403])


def test_acl_keys_are_checked_and_secrets_never_shown() -> None:
    from broker.config import ConfigError, config_from_properties

    with pytest.raises(ConfigError, match="aclEnable=true needs aclFile"):
        config_from_properties({"aclEnable": "true"}, env={})
    with pytest.raises(ConfigError, match="accessKey and secretKey go together"):
        config_from_properties({"accessKey": "b1"}, env={})
    cfg = config_from_properties({"aclEnable": "true", "aclFile": "/x.toml", "accessKey": "b1",
                                  "secretKey": "very-secret", "aclMetricsToken": "tok-secret",
                                  "aclTimestampToleranceMs": "5000"}, env={}).config
    assert (cfg.acl_enable, cfg.acl_file, cfg.access_key, cfg.acl_timestamp_tolerance_ms) == (
        True, "/x.toml", "b1", 5000)
    assert "very-secret" not in repr(cfg) and "tok-secret" not in repr(cfg)


def test_servers_bind_loopback_by_default() -> None:
    from broker.config import BrokerConfig
    from nameserver.__main__ import DEFAULT_LISTEN

    assert BrokerConfig().bind_host == "127.0.0.1"
    assert DEFAULT_LISTEN.startswith("127.0.0.1:")
