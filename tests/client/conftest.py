"""A scripted fake cluster behind ``httpx.MockTransport``, for cases real servers can't produce on demand."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest

from client._instance import AsyncClientInstance, ClientInstance
from common import codec, wire
from common.codes import ResponseCode
from common.route import BrokerData, QueueData, TopicRouteData


class FakeCluster:
    """Nameservers and brokers answering from tables; ``script[addr]`` lists what the next requests get.

    Script actions: ``"ok"``, an int response code (error JSON for codes >= 13 or 1/2, a stored-but status for
    10/11/12), ``"connect"`` (ConnectError), ``"timeout"`` (ReadTimeout), and for pulls ``"refuse"`` (a slave
    with ``slaveReadEnable=false`` whose master link is up: PULL_RETRY_IMMEDIATELY, offset unchanged, suggest 0).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.routes: dict[str, TopicRouteData] = {}
        self.nameservers_down: set[str] = set()
        self.script: dict[str, list[Any]] = {}
        self.requests: list[httpx.Request] = []
        self.next_queue_offset: dict[tuple[str, str, int], int] = {}
        self.next_phy: dict[str, int] = {}
        self.send_gate: Callable[[httpx.Request], None] | None = None
        self.pull_suggest: dict[str, int] = {}
        self.broker_ids: dict[str, int] = {}
        self.namesrv = f"ns-{uuid.uuid4().hex[:8]}:9876"

    def add_topic(self, topic: str, groups: dict[str, dict[int, str]], queues: int = 2, perm: int = 6) -> None:
        self.routes[topic] = TopicRouteData(
            tuple(QueueData(name, queues, queues, perm) for name in sorted(groups)),
            tuple(BrokerData("C", name, addrs) for name, addrs in sorted(groups.items())),
        )
        for addrs in groups.values():
            for bid, addr in addrs.items():
                self.broker_ids[addr] = bid

    def sends(self, addr: str | None = None) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == "/send" and (addr is None or _addr(r) == addr)]

    def handler(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        addr = _addr(request)
        path = request.url.path
        if path == "/route":
            return self._route(addr, request)
        action = "ok"
        with self.lock:
            queue = self.script.get(addr)
            if path in ("/send", "/pull", "/offset/consumer") and queue:
                action = queue.pop(0)
        if action == "connect":
            raise httpx.ConnectError("connection refused (scripted)", request=request)
        if action == "timeout":
            raise httpx.ReadTimeout("timed out (scripted)", request=request)
        if path == "/send":
            return self._send(addr, request, action)
        if path == "/pull":
            return self._pull(addr, request, action)
        if path == "/offset/consumer" and request.method == "POST":
            return httpx.Response(200, json={"updated": 1})
        if path == "/offset/consumer":
            return httpx.Response(404, json={"code": 22, "remark": "not found"})
        if path in ("/offset/max", "/offset/min", "/offset/search"):
            return httpx.Response(200, json={"offset": self.broker_ids.get(addr, 0) + 100})
        if path == "/heartbeat":
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"code": 3, "remark": f"no {path}"})

    def _route(self, addr: str, request: httpx.Request) -> httpx.Response:
        if addr in self.nameservers_down:
            raise httpx.ConnectError("nameserver down (scripted)", request=request)
        topic = dict(parse_qsl(request.url.query.decode()))["topic"]
        route = self.routes.get(topic)
        if route is None:
            return httpx.Response(404, json={"code": 17, "remark": f"No topic route info in name server for the topic: {topic}"})
        return httpx.Response(200, content=json.dumps(route.to_json()).encode())

    def _send(self, addr: str, request: httpx.Request, action: Any) -> httpx.Response:
        if self.send_gate is not None:
            self.send_gate(request)
        code = 0 if action == "ok" else int(action)
        if code not in (0, 10, 11, 12):
            return httpx.Response(wire.http_status_for_code(code),
                                  content=wire.encode_error(code, f"scripted {ResponseCode(code).name}", broker=addr))
        q = dict(parse_qsl(request.url.query.decode()))
        items = codec.decode_batch(request.content)
        key = (addr, q["topic"], int(q["queueId"]))
        with self.lock:
            first = self.next_queue_offset.get(key, 0)
            self.next_queue_offset[key] = first + len(items)
            phy0 = self.next_phy.get(addr, 0)
            offsets = [phy0 + 1000 * i for i in range(len(items))]
            self.next_phy[addr] = phy0 + 1000 * len(items)
        host = codec.pack_host("127.0.0.1", 10911)
        return httpx.Response(200, content=wire.encode_send_reply(code, int(q["queueId"]), first, host, offsets))

    def _pull(self, addr: str, request: httpx.Request, action: Any) -> httpx.Response:
        q = dict(parse_qsl(request.url.query.decode()))
        code, suggest = (20, 0) if action == "refuse" else (19, self.pull_suggest.get(addr, 0))
        head = wire.encode_pull_header(code, int(q["offset"]), 0, int(q["offset"]), suggest,
                                       self.broker_ids.get(addr, 0), 0)
        return httpx.Response(200, content=head)


def _addr(request: httpx.Request) -> str:
    return f"{request.url.host}:{request.url.port}"


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    """A fake cluster; ``fake.instance()`` registers a shared ClientInstance over it for ``fake.namesrv``."""
    f = FakeCluster()
    held: list[ClientInstance] = []
    f.instance = lambda: held.append(ClientInstance.acquire(  # type: ignore[attr-defined]
        f.namesrv, transport=httpx.MockTransport(f.handler))) or held[-1]
    yield f
    for inst in held:
        inst.release()


def async_instance(f: FakeCluster) -> AsyncClientInstance:
    """Register an async instance over ``f`` on the running loop (call inside the loop)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0)  # a real request suspends: let concurrent senders queue up behind it
        return f.handler(request)

    return AsyncClientInstance.acquire(f.namesrv, transport=httpx.MockTransport(handler))


@pytest.fixture
def async_fake_instance() -> Callable[[FakeCluster], AsyncClientInstance]:
    return async_instance
