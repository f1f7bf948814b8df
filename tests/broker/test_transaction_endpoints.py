"""The transaction endpoints and hooks of the broker over fakes: a prepared send lands in the half topic, bad
requests get clear 4xx errors, a slave refuses ends and hands out no checks, and the check service follows the
broker's role (started on becoming master, stopped on becoming slave, as a DLedger role change does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.config import BrokerRole
from common.codec import decode_records, encode_batch
from common.codes import SysFlag
from common.message import Message
from common.properties import PGROUP, REAL_QID, REAL_TOPIC, TRAN_MSG
from common.wire import decode_send_reply
from tests.broker.fakes import run_with_broker

END = {"group": "P", "topic": "T", "transactionId": "ABC", "commitLogOffset": "0", "commitOrRollback": "COMMIT"}


def _prepared(n: int = 1, **msg: Any) -> bytes:
    return encode_batch([Message("T", b"half", properties={PGROUP: "P", TRAN_MSG: "true"}, **msg)] * n,
                        born_timestamp_ms=1, uniq_keys=[f"U{i}" for i in range(n)],
                        sys_flag=int(SysFlag.TRANSACTION_PREPARED))


def test_a_prepared_send_is_stored_in_the_half_topic_and_bad_requests_are_refused(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        r = await client.post("/send", params={"topic": "T", "queueId": "2", "group": "P"}, content=_prepared())
        assert r.status_code == 200, r.text
        reply = decode_send_reply(r.content)
        stored = decode_records(ctrl.store.look_message_by_offset(reply.commit_log_offsets[0]))[0]
        assert stored.topic == "RMQ_SYS_TRANS_HALF_TOPIC" and stored.queue_id == 0
        assert (stored.properties[REAL_TOPIC], stored.properties[REAL_QID]) == ("T", "2")
        assert not stored.sys_flag & int(SysFlag.TRANSACTION_ROLLBACK)
        r = await client.post("/send", params={"topic": "T", "queueId": "0"}, content=_prepared(2))
        assert (r.status_code, r.json()["code"]) == (400, 13) and "one message" in r.json()["remark"]
        r = await client.post("/send", params={"topic": "T", "queueId": "0"}, content=_prepared(delay_level=1))
        assert (r.status_code, r.json()["code"]) == (400, 13) and "delay level" in r.json()["remark"]
        r = await client.post("/send", params={"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0"},
                              content=encode_batch([Message("T", b"x")], born_timestamp_ms=1, uniq_keys=["A"]))
        assert (r.status_code, r.json()["code"]) == (403, 16)
        r = await client.post("/transaction/end", params={**END, "commitLogOffset": "999999"})
        assert (r.status_code, r.json()["code"]) == (404, 22) and "no half message" in r.json()["remark"]
        r = await client.post("/transaction/end", params=END)  # offset 0 holds the half message of U0
        assert (r.status_code, r.json()["code"]) == (400, 29) and "transactionId 'U0'" in r.json()["remark"]
        r = await client.post("/transaction/end", params={**END, "commitOrRollback": "PERHAPS"})
        assert (r.status_code, r.json()["code"]) == (400, 29) and "commitOrRollback" in r.json()["remark"]
        r = await client.get("/transaction/checks", params={"group": "P", "timeoutMs": "-1"})
        assert (r.status_code, r.json()["code"]) == (400, 29) and "timeoutMs" in r.json()["remark"]
        r = await client.get("/transaction/checks", params={"group": "P", "timeoutMs": "0"})
        assert (r.status_code, r.json()) == (200, {"checks": []})
        r = await client.get("/pull", params={"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0", "group": "G",
                                              "offset": "0"})
        assert (r.status_code, r.json()["code"]) == (403, 16)

    run_with_broker(tmp_path, scenario)


def test_a_slave_refuses_ends_and_answers_check_polls_at_once(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        assert not ctrl.transactions.running
        r = await client.post("/transaction/end", params=END)
        assert (r.status_code, r.json()["code"]) == (503, 14) and "SLAVE" in r.json()["remark"]
        r = await client.get("/transaction/checks", params={"group": "P", "timeoutMs": "30000"})
        assert (r.status_code, r.json()) == (200, {"checks": []})

    run_with_broker(tmp_path, scenario, role=BrokerRole.SLAVE)


def test_the_check_service_follows_the_role(tmp_path: Path) -> None:
    async def scenario(ctrl: Any, client: Any) -> None:
        assert ctrl.transactions.running and ctrl.runtime_info()["transactions"]["running"]
        await ctrl._became_slave()
        assert not ctrl.transactions.running
        await ctrl._became_master()
        assert ctrl.transactions.running

    run_with_broker(tmp_path, scenario)
