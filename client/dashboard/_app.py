"""The dashboard's HTTP side: one static page, a JSON API to read, and three operator actions, as a router
(served by :class:`remoting.server.HttpServer`, see ``_server.py``).

Routes::

    GET  /                     the page (static/index.html, with this process's action token); /static/...
    GET  /api/state            the collector's newest snapshot; ?range=S: the totals' history S seconds back
    GET  /api/messages         the message browser: ?topic=&broker=&queue=&offset=[&max=], ?topic=&key=,
                               ?msgId=[&topic=], ?topic=&time=MS[&max=]
    GET  /api/metrics          ?addr=HOST:PORT of a member the sweep has seen: its metrics, parsed
    POST /api/actions/topic    create or update a topic on every master (of a cluster)
    POST /api/actions/group    create or update a subscription group on every master
    POST /api/actions/reset-offset   set an offline group's offsets of a topic to earliest, latest or a time

An action is a deliberate POST: its ``Authorization`` header must carry the token the page was served with
(a cross-site page can neither read it nor send the header without a CORS preflight, which is never granted),
and the ``Host`` it was addressed to must be an IP address, ``localhost`` or the host it listens on (a
DNS-rebinding page names its own host). It writes with the account given in its body (``accessKey``,
``secretKey``), never with the dashboard's own: with the ACL on, only an admin account passes (the action first
reads a master's runtime with it, an admin-only endpoint). ``--read-only`` turns the actions off.

Errors are JSON ``{"code", "codeName", "remark"}`` -- the cluster's own code and words where it answered --
with a 4xx status naming the bad argument, or 502 when the cluster did not answer; never a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from typing import Any

from client import Admin, ClientConfig, Credentials, MessageExt, MessageQueue, PullConsumer, PullStatus
from client.dashboard._collector import BROWSER_GROUP, Collector
from common.codes import ResponseCode
from common.errors import ClientError, NoPermissionError
from common.requests import ArgumentError
from remoting.router import Request, Response, Router, error_response, json_response

__all__ = ["ACTION_PATHS", "BROWSER_GROUP", "TOKEN_SCHEME", "build_app", "parse_metrics"]

#: The ``Authorization`` scheme of an action: ``SplitMQ-Dashboard <token>``.
TOKEN_SCHEME = "SplitMQ-Dashboard"
ACTION_PATHS = ("/api/actions/topic", "/api/actions/group", "/api/actions/reset-offset")

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


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


def _coded(code: int, remark: str, status: int | None = None) -> Response:
    """An error answer naming the code as RocketMQ does (``TOPIC_NOT_EXIST``...) beside its number."""
    r = error_response(code, remark)
    body = json.loads(r.body)
    body["codeName"] = _code_name(code)
    return Response(json.dumps(body).encode(), status or r.status, r.content_type)


def _failed(e: ClientError) -> Response:
    """A cluster answer that was an error: its own code and 4xx when it has one, else 502 (not answered)."""
    if e.code >= 0:
        r = _coded(e.code, ClientError.__str__(e))  # the message and where, without BrokerError's "[code=N]"
        if r.status >= 500:
            r.status = 502
        return r
    return _coded(ResponseCode.SYSTEM_ERROR, f"the cluster did not answer: {e}", 502)


def _host_name(host: str) -> str:
    text = host.strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rpartition(":")[0] if text.count(":") == 1 else text


class Guard:
    """The router's gate (its ``authorize`` hook): actions need the page's token and a trusted ``Host``; the page
    itself (which carries the token) is served only to a trusted ``Host``.

    Args:
        token: the secret the page is served with.
        hosts: names the dashboard may be addressed by besides IP addresses and ``localhost``.
    """

    def __init__(self, token: str, hosts: Iterable[str] = ()) -> None:
        self._expected = f"{TOKEN_SCHEME} {token}".encode()
        self._hosts = {"localhost", *(h.lower() for h in hosts)}

    def trusted_host(self, host: str) -> bool:
        if not host:
            return False
        name = _host_name(host)
        if name in self._hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def __call__(self, request: Request, authorization: bytes | None) -> None:
        if request.method == "GET" and request.path != "/":
            return
        if request.path == "/" and not request.host:
            return  # not a browser (every browser sends Host): nothing to rebind
        if not self.trusted_host(request.host):
            raise NoPermissionError(
                f"the dashboard was addressed as {request.host!r}, which is not an IP address, localhost or the "
                "host it listens on: refused (a guard against DNS rebinding); open it by its address")
        if request.method == "POST" and (authorization is None or not hmac.compare_digest(authorization,
                                                                                          self._expected)):
            raise NoPermissionError("an action needs the token of the dashboard's page in its Authorization "
                                    "header: send it from the page (a guard against cross-site requests)")


def build_app(collector: Collector, namesrv_addr: str, *, token: str = "", read_only: bool = False,
              hosts: Iterable[str] = (), client_config: ClientConfig | None = None) -> Router:
    """The router over ``collector`` (whose admin session also answers the browser's queries).

    Args:
        collector: the sweeps.
        namesrv_addr: the cluster's nameservers.
        token: the action token the page is served with (empty: no action passes the gate).
        read_only: refuse every action.
        hosts: names besides IP addresses and ``localhost`` the page may be addressed by (the listen host).
        client_config: settings of the sessions the actions open (timeouts, TLS).
    """
    browser = _Browser(collector, namesrv_addr)
    actions = _Actions(collector, namesrv_addr, client_config or ClientConfig(), read_only, signed=_signed(collector))
    static = {path: (resources.files("client.dashboard").joinpath("static", name).read_bytes(), ctype)
              for path, (name, ctype) in _STATIC.items()}
    page, ctype = static["/"]
    static["/"] = (page.replace(b'name="splitmq-token" content=""',
                                b'name="splitmq-token" content="' + token.encode() + b'"'), ctype)

    def static_route(path: str) -> Callable[[Request], Awaitable[Response]]:
        body, ctype = static[path]

        async def serve(_: Request) -> Response:
            return Response(body, 200, ctype)
        return serve

    async def state(request: Request) -> Response:
        range_s = request.int_arg("range", 0, lo=0, hi=7 * 24 * 3600) if request.query.get("range") else None
        snap = collector.snapshot(range_s or None)
        snap["actions"] = {"readOnly": read_only, "signed": actions.signed}
        return json_response(snap)

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

    def action(do: Callable[[dict[str, Any]], str]) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            if read_only:
                return _coded(ResponseCode.NO_PERMISSION, "this dashboard was started with --read-only: it "
                              "changes nothing", 403)
            try:
                body = request.json()
                did = await asyncio.to_thread(do, body)
            except ArgumentError as e:
                return _coded(e.code, str(e), 400)
            except ClientError as e:
                return _failed(e)
            except ValueError as e:  # a bad name or number, as the SDK's validators say it
                return _coded(ResponseCode.INVALID_PARAMETER, str(e), 400)
            return json_response({"ok": True, "did": did})
        return serve

    routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
        ("GET", path): static_route(path) for path in _STATIC}
    routes[("GET", "/api/state")] = state
    routes[("GET", "/api/metrics")] = metrics
    routes[("GET", "/api/messages")] = messages
    routes[("POST", "/api/actions/topic")] = action(actions.topic)
    routes[("POST", "/api/actions/group")] = action(actions.group)
    routes[("POST", "/api/actions/reset-offset")] = action(actions.reset_offset)
    return Router(routes, max_body_bytes=4096, authorize=Guard(token, hosts))


def _signed(collector: Collector) -> bool:
    """Whether the dashboard's own session signs its requests (the cluster has the ACL on)."""
    try:
        return collector.admin.client.config.credentials is not None
    except ClientError:
        return False


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
            raise ArgumentError("pass msgId=, or topic= with key=, with time= or with broker=, queue= and offset=")
        if q.get("time"):
            since = request.int_arg("time", lo=0, hi=1 << 62)
            max_nums = request.int_arg("max", 16, lo=1, hi=MAX_BROWSE)
            return _locked(self._collector, lambda: self._since(topic, since, max_nums))
        if q.get("key"):
            key = q["key"]
            return list(_locked(self._collector, lambda: self._collector.admin.query_messages_by_key(
                topic, key, max_num=MAX_BROWSE)))[:MAX_BROWSE]
        broker = request.arg("broker")
        mq = MessageQueue(topic, broker, request.int_arg("queue", lo=0, hi=1 << 20))
        offset = request.int_arg("offset", 0, lo=0, hi=(1 << 63) - 1)
        max_nums = request.int_arg("max", 16, lo=1, hi=MAX_BROWSE)
        return _locked(self._collector, lambda: self._pull(mq, offset, max_nums))

    def _since(self, topic: str, since_ms: int, max_nums: int) -> list[MessageExt]:
        """The first ``max_nums`` messages of ``topic`` stored at or after ``since_ms``, by store time: each
        queue searched for its first offset at that time and read from there."""
        admin = self._collector.admin
        found: list[MessageExt] = []
        with PullConsumer(BROWSER_GROUP, self._namesrv) as consumer:
            for mq, _, hi in admin.topic_offsets(topic):
                offset = admin.search_offset(mq, since_ms)
                if offset >= hi:
                    continue
                result = consumer.pull(mq, offset, max_nums)
                found.extend(m for m in result.msg_found_list if m.store_timestamp >= since_ms)
        found.sort(key=lambda m: (m.store_timestamp, m.broker_name, m.queue_id, m.queue_offset))
        return found[:max_nums]

    def _pull(self, mq: MessageQueue, offset: int, max_nums: int) -> list[MessageExt]:
        # A consumer per browse: it shares the admin's client instance, so opening one is cheap, and nothing
        # is left open when the dashboard stops.
        with PullConsumer(BROWSER_GROUP, self._namesrv) as consumer:
            result = consumer.pull(mq, offset, max_nums)
        if result.pull_status is PullStatus.OFFSET_ILLEGAL:
            raise ArgumentError(f"offset {offset} is outside {mq.topic}/{mq.broker_name}/{mq.queue_id} "
                                f"[{result.min_offset}, {result.max_offset})")
        return list(result.msg_found_list)


def _text(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"{name} is required (a non-empty string)")
    return value.strip()


def _int(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ArgumentError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be true or false, got {value!r}")
    return value


class _Actions:
    """What an operator may change from the page; each opens a session with the account the request names."""

    def __init__(self, collector: Collector, namesrv_addr: str, config: ClientConfig, read_only: bool, *,
                 signed: bool) -> None:
        self._collector = collector
        self._namesrv = namesrv_addr
        self._config = config
        self.read_only = read_only
        self.signed = signed
        """The dashboard's own session signs (ACL on): the page asks the operator for an admin account."""

    def _session(self, body: dict[str, Any]) -> Admin:
        """An admin session with the request's account (none: unsigned), checked to be an admin one: it must
        read a master's runtime, which the ACL allows admin accounts only."""
        ak, sk = body.get("accessKey") or "", body.get("secretKey") or ""
        if bool(ak) != bool(sk):
            raise ArgumentError("give both accessKey and secretKey, or neither")
        credentials = Credentials(str(ak), str(sk)) if ak else None
        admin = Admin(self._namesrv, client_config=self._config, credentials=credentials)
        try:
            masters = admin.cluster_info().master_addrs()
            if not masters:
                raise ClientError("no master is registered with the nameserver: nothing to write to")
            admin.broker_runtime(next(iter(sorted(masters.values()))))
        except BaseException:
            admin.close()
            raise
        return admin

    def topic(self, body: dict[str, Any]) -> str:
        """``updateTopic``: create or update ``topic`` with ``queueNums`` read and write queues and ``perm``."""
        topic = _text(body, "topic")
        queues = _int(body, "queueNums", 4, 1, 1024)
        perm = _int(body, "perm", 6, 2, 6)
        if perm not in (2, 4, 6):
            raise ArgumentError(f"perm must be 2 (write only), 4 (read only) or 6 (read and write), got {perm}")
        cluster = body.get("cluster") or None
        with self._session(body) as admin, self._collector.admin_lock:
            names = admin.create_topic(topic, queue_nums=queues, perm=perm, cluster=cluster)
        return (f"create topic to {', '.join(names)} success: {topic} has {queues} read and {queues} write "
                f"queues on each, perm {perm}")

    def group(self, body: dict[str, Any]) -> str:
        """``updateSubGroup``: create or update a subscription group on every master."""
        group = _text(body, "group")
        which = _int(body, "whichBrokerWhenConsumeSlowly", 1, 0, 64)
        retries = _int(body, "retryMaxTimes", 16, 0, 64)
        retry_queues = _int(body, "retryQueueNums", 1, 1, 64)
        enable = _bool(body, "consumeEnable", True)
        broadcast = _bool(body, "consumeBroadcastEnable", True)
        with self._session(body) as admin, self._collector.admin_lock:
            names = admin.update_subscription_group(group, which_broker_when_consume_slowly=which,
                                                    retry_max_times=retries, retry_queue_nums=retry_queues,
                                                    consume_enable=enable, consume_broadcast_enable=broadcast)
        return (f"create subscription group to {', '.join(names)} success: {group} (consumeEnable={enable}, "
                f"retryMaxTimes={retries}, whichBrokerWhenConsumeSlowly={which})")

    def reset_offset(self, body: dict[str, Any]) -> str:
        """``resetOffsetByTime`` of an offline group: every queue of the topic to earliest, latest or a time."""
        group, topic = _text(body, "group"), _text(body, "topic")
        to = _text(body, "to", "earliest")
        ts = _int(body, "timestampMs", None, 0, 1 << 62) if to == "timestamp" else None
        with self._session(body) as admin, self._collector.admin_lock:
            offsets = admin.reset_consumer_offset(group, topic, to=to, timestamp_ms=ts)
        where = ", ".join(f"{mq.broker_name}/{mq.queue_id}={off}" for mq, off in sorted(offsets.items()))
        return f"reset offset of {group} on {topic} to {to} success: {where}"
