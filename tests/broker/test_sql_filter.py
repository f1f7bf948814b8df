"""``GET /pull`` with ``expressionType=SQL92`` against a fake store: the broker filters by message properties
(``enablePropertyFilter=true``), refuses a bad expression with SUBSCRIPTION_PARSE_FAILED and any SQL92 pull with
NO_PERMISSION naming the key when the filter is off; TAG pulls never decode a property."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker import tag_filter
from common.codec import encode_batch
from common.codes import ResponseCode
from common.message import Message
from tests.broker.test_pull import pull

C = ResponseCode
SQL = {"expressionType": "SQL92"}


async def put_props(ctrl: Any, client: Any, rows: list[dict[str, str]], tags: str | None = None) -> None:
    body = encode_batch([Message("T", f"m{i}".encode(), tags=tags, properties=p) for i, p in enumerate(rows)],
                        born_timestamp_ms=1)
    r = await client.post("/send", params={"topic": "T", "queueId": 0}, content=body)
    assert r.status_code == 200, r.text
    ctrl.store.dispatch_available()


def test_sql_pull_returns_only_matching_messages(tmp_path: Path) -> None:
    from tests.broker.fakes import run_with_broker

    rows = [{"region": "EU", "amount": "150"}, {"region": "US", "amount": "500"}, {"amount": "900"},
            {"region": "EU", "amount": "50"}, {"region": "EU", "amount": "abc"}, {"region": "EU", "amount": "101"}]

    async def scenario(ctrl: Any, client: Any) -> None:
        await put_props(ctrl, client, rows, tags="A")
        head, msgs = await pull(client, 0, subExpression="region = 'EU' AND amount > 100", **SQL)
        assert (head.code, [m.body for m in msgs]) == (C.SUCCESS, [b"m0", b"m5"])
        assert head.next_begin_offset == 6
        _, msgs = await pull(client, 0, subExpression="region IS NULL OR TAGS = 'B'", **SQL)
        assert [m.body for m in msgs] == [b"m2"]
        head, msgs = await pull(client, 0, subExpression="region = 'ASIA'", **SQL)  # skipped, offset moves on
        assert (head.code, head.next_begin_offset, msgs) == (C.PULL_RETRY_IMMEDIATELY, 6, [])
        _, msgs = await pull(client, 0, maxNums=1, subExpression="amount > 100", **SQL)
        assert [m.body for m in msgs] == [b"m0"]  # refused records count toward no limit
        _, msgs = await pull(client, 1, maxNums=1, subExpression="amount > 100", **SQL)
        assert [m.body for m in msgs] == [b"m1"]
        r = await client.get("/pull", params={"group": "cg", "topic": "T", "queueId": 0, "offset": 0,
                                              "subExpression": "amount > 'x'", **SQL})
        assert (r.status_code, r.json()["code"]) == (400, 23)
        assert "cannot be compared" in r.json()["remark"]
        r = await client.get("/pull", params={"group": "cg", "topic": "T", "queueId": 0, "offset": 0,
                                              "subExpression": "a = 1", "expressionType": "XPATH"})
        assert (r.status_code, r.json()["code"]) == (400, 29)
        assert "expressionType" in r.json()["remark"]

    run_with_broker(tmp_path, scenario, enable_property_filter=True)


def test_sql_pull_refused_when_the_filter_is_off(tmp_path: Path) -> None:
    from tests.broker.fakes import run_with_broker

    async def scenario(ctrl: Any, client: Any) -> None:
        await put_props(ctrl, client, [{"a": "1"}])
        r = await client.get("/pull", params={"group": "cg", "topic": "T", "queueId": 0, "offset": 0,
                                              "subExpression": "a = 1", **SQL})
        assert (r.status_code, r.json()["code"]) == (403, 16)
        assert "enablePropertyFilter=false" in r.json()["remark"]
        _, msgs = await pull(client, 0)  # TAG pulls are untouched
        assert len(msgs) == 1

    run_with_broker(tmp_path, scenario)


def test_tag_pulls_never_decode_properties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.broker.fakes import run_with_broker

    decoded: list[int] = []
    real = tag_filter.decode_properties

    def counting(data: Any) -> dict[str, str]:
        decoded.append(1)
        return real(data)

    monkeypatch.setattr(tag_filter, "decode_properties", counting)

    async def scenario(ctrl: Any, client: Any) -> None:
        await put_props(ctrl, client, [{"a": "1"}, {"a": "2"}], tags="A")
        _, msgs = await pull(client, 0, subExpression="A")
        _, msgs2 = await pull(client, 0)
        assert (len(msgs), len(msgs2), decoded) == (2, 2, [])
        _, msgs = await pull(client, 0, subExpression="a = 2", **SQL)
        assert len(msgs) == 1 and len(decoded) == 2  # once per candidate record

    run_with_broker(tmp_path, scenario, enable_property_filter=True)


def test_heartbeat_with_an_sql_subscription_is_checked(tmp_path: Path) -> None:
    from tests.broker.fakes import run_with_broker

    def body(expression: str, kind: str = "SQL92") -> dict[str, Any]:
        return {"clientId": "c1", "consumerGroups": [{"group": "cg", "subscriptions": [
            {"topic": "T", "expression": expression, "expressionType": kind}]}]}

    def ids(ctrl: Any) -> list[str]:
        return sorted(ctrl.clients.consumers.get("cg", {}))

    async def on(ctrl: Any, client: Any) -> None:
        r = await client.post("/heartbeat", json=body("a > 1"))
        assert (r.status_code, r.json(), ids(ctrl)) == (200, {}, ["c1"])
        r = await client.post("/heartbeat", json=body("a >"))
        assert r.status_code == 200 and [x["code"] for x in r.json()["refusedSubscriptions"]] == [23]
        r = await client.post("/heartbeat", json=body("a", kind="XPATH"))
        assert (r.status_code, r.json()["code"]) == (400, 29)

    async def off(ctrl: Any, client: Any) -> None:
        r = await client.post("/heartbeat", json=body("a > 1"))
        # Kept (the client stays in its group), with the error every pull of it gets.
        assert (r.status_code, ids(ctrl)) == (200, ["c1"])
        [refused] = r.json()["refusedSubscriptions"]
        assert (refused["topic"], refused["code"]) == ("T", 16) and "enablePropertyFilter" in refused["remark"]
        assert (await client.post("/heartbeat", json=body("TagA", kind="TAG"))).json() == {}

    run_with_broker(tmp_path / "on", on, enable_property_filter=True)
    run_with_broker(tmp_path / "off", off)
