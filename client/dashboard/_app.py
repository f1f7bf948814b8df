"""The dashboard's HTTP side: one static page and a read-only JSON API, as a router (served by
:class:`remoting.server.HttpServer`, see ``_server.py``).

Routes (all ``GET``; nothing here changes the cluster)::

    /                    the page (static/index.html); /static/app.js, /static/app.css
    /api/state           the collector's newest snapshot (topology, replication, topics, consumers)
    /api/messages        the message browser: ?topic=&broker=&queue=&offset=[&max=], ?topic=&key=, ?msgId=[&topic=]
    /api/metrics         ?addr=HOST:PORT of a member the sweep has seen: its metrics, parsed

Errors are JSON ``{"code", "remark"}`` with a 4xx status naming the bad argument, or 502 when the cluster did
not answer; never a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from client import MessageExt, MessageQueue, PullConsumer, PullStatus
from client.dashboard._collector import Collector
from common.codes import ResponseCode
from common.errors import ClientError
from common.requests import ArgumentError
from remoting.router import Request, Response, Router, error_response, json_response

__all__ = ["BROWSER_GROUP", "build_app", "parse_metrics"]

#: The group the message browser pulls with; it never commits an offset.
BROWSER_GROUP = "SPLITMQ_DASHBOARD_BROWSER"
#: Messages one browser request returns at most.
MAX_BROWSE = 64
#: Characters of a body shown in the browser.
BODY_PREVIEW_CHARS = 512
#: Metric samples returned at most for one broker.
MAX_METRIC_SAMPLES = 2000

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, limit: int = MAX_METRIC_SAMPLES) -> list[dict[str, Any]]:
    """Samples of a Prometheus text exposition as ``{"name", "labels", "value"}``, leaving out the
    ``_created`` timestamps and histogram buckets (the page shows counts, sums and gauges)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name = m.group(1)
        if name.endswith(("_created", "_bucket")):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append({"name": name, "labels": labels, "value": value if math.isfinite(value) else str(value)})
        if len(out) >= limit:
            break
    return out


def _message_json(m: MessageExt) -> dict[str, Any]:
    body = m.body.decode("utf-8", "replace")
    return {
        "msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "topic": m.topic, "broker": m.broker_name,
        "queueId": m.queue_id, "queueOffset": m.queue_offset, "tags": m.tags, "keys": list(m.keys),
        "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp, "storeHost": m.store_host,
        "bornHost": m.born_host, "reconsumeTimes": m.reconsume_times, "bodySize": len(m.body),
        "body": body[:BODY_PREVIEW_CHARS], "bodyTruncated": len(body) > BODY_PREVIEW_CHARS,
        "properties": {k: v for k, v in m.properties.items() if not k.startswith("__")},
    }


def _failed(e: ClientError) -> Response:
    """A cluster answer that was an error: its own code and 4xx when it has one, else 502 (not answered)."""
    if e.code >= 0:
        r = error_response(e.code, str(e))
        if r.status >= 500:
            r.status = 502
        return r
    r = error_response(ResponseCode.SYSTEM_ERROR, f"the cluster did not answer: {e}")
    r.status = 502
    return r


def build_app(collector: Collector, namesrv_addr: str) -> Router:
    """The router over ``collector`` (whose admin session also answers the browser's queries)."""
    browser = _Browser(collector, namesrv_addr)
    static = {path: (resources.files("client.dashboard").joinpath("static", name).read_bytes(), ctype)
              for path, (name, ctype) in _STATIC.items()}

    def static_route(path: str) -> Callable[[Request], Awaitable[Response]]:
        body, ctype = static[path]

        async def serve(_: Request) -> Response:
            return Response(body, 200, ctype)
        return serve

    async def state(_: Request) -> Response:
        return json_response(collector.snapshot())

    async def metrics(request: Request) -> Response:
        addr = request.arg("addr")
        if addr not in collector.known_addrs():
            raise ArgumentError(f"addr {addr!r} is not a member of this cluster (pick one from the cluster view)")
        try:
            text = await asyncio.to_thread(_locked, collector, lambda: collector.admin.broker_metrics(addr))
        except ClientError as e:
            return _failed(e)
        return json_response({"addr": addr, "samples": parse_metrics(text)})

    async def messages(request: Request) -> Response:
        try:
            found = await asyncio.to_thread(browser.find, request)
        except ArgumentError:
            raise
        except ClientError as e:
            return _failed(e)
        return json_response({"messages": [_message_json(m) for m in found]})

    routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
        ("GET", path): static_route(path) for path in _STATIC}
    routes[("GET", "/api/state")] = state
    routes[("GET", "/api/metrics")] = metrics
    routes[("GET", "/api/messages")] = messages
    return Router(routes, max_body_bytes=4096)


def _locked(collector: Collector, call: Callable[[], Any]) -> Any:
    with collector.admin_lock:
        return call()


class _Browser:
    """The message browser's three ways in: by queue and offset (a pull that commits nothing), by key, by id."""

    def __init__(self, collector: Collector, namesrv_addr: str) -> None:
        self._collector = collector
        self._namesrv = namesrv_addr

    def find(self, request: Request) -> list[MessageExt]:
        q = request.query
        topic = q.get("topic") or None
        if q.get("msgId"):
            return [_locked(self._collector, lambda: self._collector.admin.query_message(q["msgId"], topic=topic))]
        if topic is None:
            raise ArgumentError("pass msgId=, or topic= with key= or with broker=, queue= and offset=")
        if q.get("key"):
            key = q["key"]
            return list(_locked(self._collector, lambda: self._collector.admin.query_messages_by_key(
                topic, key, max_num=MAX_BROWSE)))[:MAX_BROWSE]
        broker = request.arg("broker")
        mq = MessageQueue(topic, broker, request.int_arg("queue", lo=0, hi=1 << 20))
        offset = request.int_arg("offset", 0, lo=0, hi=(1 << 63) - 1)
        max_nums = request.int_arg("max", 16, lo=1, hi=MAX_BROWSE)
        return _locked(self._collector, lambda: self._pull(mq, offset, max_nums))

    def _pull(self, mq: MessageQueue, offset: int, max_nums: int) -> list[MessageExt]:
        # A consumer per browse: it shares the admin's client instance, so opening one is cheap, and nothing
        # is left open when the dashboard stops.
        with PullConsumer(BROWSER_GROUP, self._namesrv) as consumer:
            result = consumer.pull(mq, offset, max_nums)
        if result.pull_status is PullStatus.OFFSET_ILLEGAL:
            raise ArgumentError(f"offset {offset} is outside {mq.topic}/{mq.broker_name}/{mq.queue_id} "
                                f"[{result.min_offset}, {result.max_offset})")
        return list(result.msg_found_list)
