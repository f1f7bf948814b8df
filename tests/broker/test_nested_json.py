"""Deeply nested JSON is a bad request, not a crash: every JSON endpoint of a real broker and a real nameserver
answers it with a 4xx carrying INVALID_PARAMETER (json.loads raises RecursionError on it, not ValueError)."""

from __future__ import annotations

import httpx
import pytest

from tests.broker.procs import Servers

pytestmark = pytest.mark.integration

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 50_000 + b"1" + b"}" * 50_000

BROKER_JSON_POSTS = ["/topic", "/subscription-group", "/heartbeat", "/client/unregister", "/offset/consumer",
                     "/consumer/sendback"]
NAMESERVER_JSON_POSTS = ["/broker/register", "/broker/unregister", "/broker/wipe-write-perm",
                         "/broker/add-write-perm"]


@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT], ids=["array", "object"])
def test_deeply_nested_json_is_a_4xx_everywhere(servers: Servers, body: bytes) -> None:
    ns = servers.nameserver()
    b = servers.broker({"brokerName": "nest", "namesrvAddr": ns.addr, "maxRequestBodyBytes": str(1 << 20)},
                       name="nest")
    targets = [(b.url, p) for p in BROKER_JSON_POSTS] + [(ns.url, p) for p in NAMESERVER_JSON_POSTS]
    for base, path in targets:
        with httpx.Client(base_url=base, timeout=30) as c:
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
            assert r.json()["code"] == 29 and "JSON" in r.json()["remark"], (path, r.text[:200])
