"""Hypothesis fuzzing of ``POST /send`` bodies and ``GET /pull`` arguments against one running broker: every
answer is either a well-formed binary reply or a JSON error with a RocketMQ code, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.codec import encode_batch
from common.message import Message
from common.wire import PULL_HEAD, decode_pull_header, decode_send_reply
from tests.broker.procs import ServerProcess, Servers

pytestmark = pytest.mark.integration

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KNOWN_CODES = {1, 2, 3, 13, 14, 16, 17, 22, 23, 26, 29}


@pytest.fixture(scope="module")
def fuzz_broker(module_servers: Servers) -> ServerProcess:
    b = module_servers.broker({"brokerName": "fuzz", "autoCreateTopicEnable": "true", "maxMessageSize": "8192",
                               "maxRequestBodyBytes": "262144"}, name="fuzz")
    with httpx.Client(base_url=b.url, timeout=10) as c:
        assert c.post("/topic", json={"topicName": "F", "readQueueNums": 4, "writeQueueNums": 4}).status_code == 200
        body = encode_batch([Message("F", b"seed", tags="A")], born_timestamp_ms=1)
        assert c.post("/send", params={"topic": "F", "queueId": 0}, content=body).status_code == 200
    return b


@pytest.fixture(scope="module")
def client(fuzz_broker: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_broker.url, timeout=30) as c:
        yield c


def check_error(r: httpx.Response) -> None:
    assert r.status_code != 500, r.text
    assert r.headers["content-type"] == "application/json", (r.status_code, r.text[:200])
    body = r.json()
    assert body["code"] in KNOWN_CODES and body["remark"], body


VALID = encode_batch([Message("F", b"x" * 50, tags="A", keys="k"), Message("F", b"y")], born_timestamp_ms=1)


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


@FUZZ
@given(body=st.one_of(st.binary(max_size=600), mutated_batches()),
       topic=st.one_of(st.just("F"), st.text(min_size=0, max_size=140)),
       queue_id=st.one_of(st.integers(-5, 10), st.text(max_size=12)))
def test_send_fuzz(client: httpx.Client, body: bytes, topic: str, queue_id: Any) -> None:
    r = client.post("/send", params={"topic": topic, "queueId": queue_id}, content=body)
    if r.status_code == 200:
        reply = decode_send_reply(r.content)
        assert reply.code == 0 and len(reply.commit_log_offsets) >= 1
    else:
        check_error(r)


INTS = st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=10))


@FUZZ
@given(group=st.one_of(st.just("cg"), st.text(max_size=40)),
       topic=st.one_of(st.just("F"), st.just("TBW102"), st.text(max_size=40)),
       queue_id=st.one_of(st.integers(-2, 6), INTS), offset=st.one_of(st.integers(0, 5), INTS),
       max_nums=st.one_of(st.integers(1, 64), INTS), sys_flag=st.one_of(st.sampled_from([0, 1, 4, 5]), INTS),
       sub=st.one_of(st.sampled_from(["*", "A", "A || B", "||", ""]), st.text(max_size=30)))
def test_pull_fuzz(client: httpx.Client, group: Any, topic: Any, queue_id: Any, offset: Any, max_nums: Any,
                   sys_flag: Any, sub: Any) -> None:
    r = client.get("/pull", params={"group": group, "topic": topic, "queueId": queue_id, "offset": offset,
                                    "maxNums": max_nums, "sysFlag": sys_flag, "subExpression": sub,
                                    "suspendTimeoutMs": 0})
    if r.status_code == 200:
        head = decode_pull_header(r.content)
        assert head.code in (0, 19, 20, 21)
        assert (head.count > 0) == (len(r.content) > PULL_HEAD.size)
    else:
        check_error(r)
