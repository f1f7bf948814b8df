"""The dashboard without a browser or a cluster: the metrics parser, the history bounds, the command's usage
errors, and the JSON API's answers to bad requests and to a nameserver that is not there."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from client import Admin, ClientConfig
from client.cli import main
from client.dashboard import Collector, build_app, parse_metrics
from client.dashboard._collector import (
    DOWNSAMPLE,
    HISTORY_SAMPLES,
    MAX_DRAWN,
    _Series,
    system_group,
    system_topic,
)

METRICS = """# HELP rocketmq_messages_in_total Messages stored
# TYPE rocketmq_messages_in_total counter
rocketmq_messages_in_total{cluster="C",node_id="broker-a-0",topic="T\\"1"} 6.0
rocketmq_messages_in_created{cluster="C",topic="T1"} 1.79e+09
rocketmq_rpc_latency_bucket{le="0.001"} 3.0
rocketmq_rpc_latency_count 3.0
splitmq_parked_pulls 0.0
splitmq_weird NaN
not a sample line
"""


def test_parse_metrics_keeps_samples_and_drops_created_and_buckets() -> None:
    samples = parse_metrics(METRICS)
    assert [s["name"] for s in samples] == ["rocketmq_messages_in_total", "rocketmq_rpc_latency_count",
                                           "splitmq_parked_pulls", "splitmq_weird"]
    assert samples[0]["labels"] == {"cluster": "C", "node_id": "broker-a-0", "topic": 'T\\"1'}
    assert samples[0]["value"] == 6.0
    assert samples[-1]["value"] == "nan"  # JSON has no NaN: the page gets a string
    assert len(parse_metrics(METRICS, limit=2)) == 2


def test_history_is_a_bounded_ring_and_rates_use_the_window() -> None:
    s = _Series()
    for i in range(HISTORY_SAMPLES + 50):
        s.add(i * 1000, i * 10)
    assert len(s.points) == HISTORY_SAMPLES
    assert s.points[0][0] == 50_000
    assert s.rate(now_ms=(HISTORY_SAMPLES + 49) * 1000) == pytest.approx(10.0)
    assert _Series().rate(0) == 0.0


@pytest.mark.parametrize("argv, message", [
    (["dashboard", "-n", "127.0.0.1:9876", "--listen", "nohost"], "expected HOST:PORT"),
    (["dashboard", "-n", "127.0.0.1:9876", "--listen", "127.0.0.1:70000"], "expected HOST:PORT"),
    (["dashboard", "-n", "127.0.0.1:9876", "--interval", "0"], "seconds in [0.1, 60]"),
    (["dashboard", "--listen", "127.0.0.1:0"], "no nameserver address"),
])
def test_dashboard_usage_errors_are_one_line_exit_2(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def _refused_addr() -> str:
    """An address nothing listens on (bound, never listening: connections are refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{sock.getsockname()[1]}"
    _HELD.append(sock)
    return addr


_HELD: list[socket.socket] = []


@pytest.fixture
def offline() -> Any:
    """A collector and app over a nameserver address that refuses connections."""
    ns = _refused_addr()
    admin = Admin(ns, client_config=ClientConfig(request_timeout_s=1.0, connect_timeout_s=0.5))
    collector = Collector(admin, ns)
    yield ns, collector, build_app(collector, ns)
    admin.close()
    for s in _HELD:
        s.close()
    _HELD.clear()


def _get(app: Any, method: str, path: str, query: str = "") -> tuple[int, bytes]:
    answer = asyncio.run(app.serve(method, path, query.encode(), b"", ("t", 1), None))
    return answer.status, answer.body


def test_state_says_the_nameserver_is_unreachable(offline: Any) -> None:
    ns, collector, app = offline
    collector.sweep()
    status, body = _get(app, "GET", "/api/state")
    state = json.loads(body)
    assert status == 200 and state["ok"] is False
    assert state["error"].startswith(f"nameserver {ns} unreachable")


@pytest.mark.parametrize("method, path, query, status, text", [
    ("GET", "/api/metrics", "addr=10.0.0.1:10911", 400, "not a member of this cluster"),
    ("GET", "/api/metrics", "", 400, "addr"),
    ("GET", "/api/messages", "", 400, "pass msgId="),
    ("GET", "/api/messages", "topic=T&broker=b&queue=-1", 400, "queue"),
    ("GET", "/api/messages", "topic=T&broker=b&queue=0&max=100000", 400, "max"),
    ("POST", "/api/state", "", 405, "use GET"),
    ("GET", "/nope", "", 404, "no such endpoint"),
])
def test_api_refuses_bad_requests_with_4xx(offline: Any, method: str, path: str, query: str, status: int,
                                           text: str) -> None:
    got, body = _get(offline[2], method, path, query)
    assert got == status, body
    assert text in json.loads(body)["remark"]


def test_api_reports_an_unreachable_cluster_as_502(offline: Any) -> None:
    got, body = _get(offline[2], "GET", "/api/messages", "msgId=7F000001000086C30000000000000108")
    assert got == 502, body
    assert "did not answer" in json.loads(body)["remark"]


def test_the_page_and_its_assets_are_served(offline: Any) -> None:
    app = offline[2]
    status, html = _get(app, "GET", "/")
    assert status == 200 and b'src="/static/app.js"' in html
    for asset in ("/static/app.js", "/static/app.css"):
        status, body = _get(app, "GET", asset)
        assert status == 200 and len(body) > 1000


def test_the_server_serves_the_page_until_shutdown_from_another_thread() -> None:
    import threading

    import httpx

    from client.dashboard import DashboardServer

    ns = _refused_addr()
    server = DashboardServer(ns, "127.0.0.1:0", interval_s=60.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(timeout=5, trust_env=False) as client:
            # The socket listens from the constructor on: a request made before the server accepts waits for it.
            page = client.get(server.url)
            assert page.status_code == 200 and b'src="/static/app.js"' in page.content
            assert "date" in page.headers and "server" not in page.headers
    finally:
        server.shutdown()
        thread.join(10)
        for s in _HELD:
            s.close()
        _HELD.clear()
    assert not thread.is_alive(), "serve_forever did not return after shutdown()"


# --- issue 40: system groups apart, longer history, guarded actions ------------------------------------------


@pytest.mark.parametrize("name, system", [
    ("CID_SYS_RMQ_TRANS", True), ("CID_RMQ_SYS_TRANS", True), ("TOOLS_CONSUMER", True),
    ("SPLITMQ_DASHBOARD_BROWSER", True), ("%RETRY%orders", True), ("orders", False), ("CID_orders", False),
])
def test_system_groups_are_told_apart(name: str, system: bool) -> None:
    assert system_group(name) is system


@pytest.mark.parametrize("name, system", [
    ("RMQ_SYS_TRANS_HALF_TOPIC", True), ("RMQ_SYS_TRANS_OP_HALF_TOPIC", True), ("rmq_sys_wheel_timer", True),
    ("TRANS_CHECK_MAX_TIME_TOPIC", True), ("TBW102", True), ("%DLQ%g", True), ("Orders", False),
])
def test_system_topics_are_told_apart(name: str, system: bool) -> None:
    assert system_topic(name) is system


def test_long_history_is_downsampled_and_bounded() -> None:
    """Seven hours of one sample a second: the total keeps 5 minutes raw, an hour at 10 s, six hours at 1 min
    (the stretch's maximum), so a peak that left the raw ring long ago is still drawn; an answer is at most
    MAX_DRAWN points."""
    s = _Series(long=True)
    hours = 7
    peak_at = 3600  # one spike, an hour in
    for i in range(hours * 3600):
        s.add(i * 1000, 1000.0 if i == peak_at else float(i % 7))
    points = len(s.points) + sum(len(t) for t in s.tiers)
    assert points <= HISTORY_SAMPLES + sum(n for n, _ in DOWNSAMPLE)
    assert [t.maxlen for t in s.tiers] == [n for n, _ in DOWNSAMPLE]
    now = (hours * 3600 - 1) * 1000
    six_hours = s.render(now - 6 * 3600 * 1000)
    assert len(six_hours) <= MAX_DRAWN
    assert six_hours[0][0] <= now - 5.9 * 3600 * 1000, six_hours[0]  # reaches back six hours
    assert max(v for _, v in six_hours) == 1000.0  # the spike survived both folds and the thinning
    assert [t for t, _ in six_hours] == sorted(t for t, _ in six_hours)
    last5 = s.render(now - (HISTORY_SAMPLES - 1) * 1000)
    assert len(last5) == HISTORY_SAMPLES and last5[-1] == [now, float((hours * 3600 - 1) % 7)]
    assert len(_Series().render(0)) == 0  # a short series has no tiers


def _call(app: Any, method: str, path: str, *, body: dict[str, Any] | None = None, auth: bytes | None = None,
          host: bytes | None = b"127.0.0.1:8080") -> tuple[int, dict[str, Any]]:
    data = json.dumps(body or {}).encode()
    answer = asyncio.run(app.serve(method, path, b"", data, ("t", 1), auth, host))
    return answer.status, json.loads(answer.body) if answer.body.startswith(b"{") else {"page": answer.body}


TOKEN = "tok3n"


@pytest.fixture
def guarded(offline: Any) -> Any:
    ns, collector, _ = offline
    return build_app(collector, ns, token=TOKEN, hosts=["dash.internal"])


def test_an_action_needs_the_page_token(guarded: Any) -> None:
    for auth in (None, b"SplitMQ-Dashboard wrong", b"Basic dG9rM24="):
        status, body = _call(guarded, "POST", "/api/actions/topic", body={"topic": "T"}, auth=auth)
        assert status == 403 and body["code"] == 16 and "token of the dashboard's page" in body["remark"], body


@pytest.mark.parametrize("host, trusted", [
    (b"127.0.0.1:8080", True), (b"localhost:8080", True), (b"[::1]:8080", True), (b"10.1.2.3", True),
    (b"dash.internal:8080", True), (b"evil.example:8080", False), (None, False),
])
def test_an_action_needs_a_host_that_cannot_be_rebound(guarded: Any, host: bytes | None, trusted: bool) -> None:
    status, body = _call(guarded, "POST", "/api/actions/topic", body={"topic": "T"},
                         auth=f"SplitMQ-Dashboard {TOKEN}".encode(), host=host)
    if trusted:  # past the gate: the offline cluster does not answer
        assert status == 502 and "did not answer" in body["remark"], body
    else:
        assert status == 403 and "DNS rebinding" in body["remark"], body


def test_the_page_carries_its_token_to_trusted_hosts_only(guarded: Any) -> None:
    status, body = _call(guarded, "GET", "/", host=b"127.0.0.1:8080")
    assert status == 200 and f'name="splitmq-token" content="{TOKEN}"'.encode() in body["page"]
    status, body = _call(guarded, "GET", "/", host=b"evil.example:8080")
    assert status == 403 and "DNS rebinding" in body["remark"]
    status, _ = _call(guarded, "GET", "/api/state", host=b"evil.example:8080")
    assert status == 200  # reading the JSON API stays open to scripts, as before


@pytest.mark.parametrize("path, body, text", [
    ("/api/actions/topic", {}, "topic is required"),
    ("/api/actions/topic", {"topic": "T", "queueNums": 0}, "queueNums must be an integer in [1, 1024]"),
    ("/api/actions/topic", {"topic": "T", "perm": 5}, "perm must be 2"),
    ("/api/actions/group", {"group": "g", "consumeEnable": "yes"}, "consumeEnable must be true or false"),
    ("/api/actions/reset-offset", {"group": "g"}, "topic is required"),
    ("/api/actions/reset-offset", {"group": "g", "topic": "T", "to": "timestamp"}, "timestampMs must be"),
    ("/api/actions/topic", {"topic": "T", "accessKey": "ak"}, "give both accessKey and secretKey"),
])
def test_actions_refuse_bad_arguments_with_the_code_name(guarded: Any, path: str, body: dict[str, Any],
                                                         text: str) -> None:
    status, answer = _call(guarded, "POST", path, body=body, auth=f"SplitMQ-Dashboard {TOKEN}".encode())
    assert status == 400 and answer["codeName"] == "INVALID_PARAMETER" and text in answer["remark"], answer


def test_a_read_only_dashboard_refuses_every_action(offline: Any) -> None:
    ns, collector, _ = offline
    app = build_app(collector, ns, token=TOKEN, read_only=True)
    status, body = _call(app, "POST", "/api/actions/reset-offset", body={"group": "g", "topic": "T"},
                         auth=f"SplitMQ-Dashboard {TOKEN}".encode())
    assert status == 403 and body["codeName"] == "NO_PERMISSION" and "--read-only" in body["remark"], body
    collector.sweep()
    status, state = _call(app, "GET", "/api/state")
    assert state["actions"] == {"readOnly": True, "signed": False}


def test_state_answers_a_longer_range_from_the_downsampled_totals(offline: Any) -> None:
    _, collector, app = offline
    collector.sweep()
    status, state = _call(app, "GET", "/api/state")
    assert status == 200 and state["systemGroups"] == [] and state["deadLetters"] == []
    answer = asyncio.run(app.serve("GET", "/api/state", b"range=3600", b"", ("t", 1), None, None))
    assert answer.status == 200
    answer = asyncio.run(app.serve("GET", "/api/state", b"range=-1", b"", ("t", 1), None, None))
    assert answer.status == 400 and b"range" in answer.body


def test_the_server_serves_the_page_by_ip_and_allowed_names_only() -> None:
    import threading

    import httpx

    from client.dashboard import DashboardServer

    server = DashboardServer(_refused_addr(), "127.0.0.1:0", interval_s=60.0, allowed_hosts=["dash.example"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.url.rstrip("/").rsplit(":", 1)[1]
    try:
        with httpx.Client(timeout=5, trust_env=False) as client:
            for host, status in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200),
                                 (f"dash.example:{port}", 200), (f"rebound.example:{port}", 403)):
                page = client.get(server.url, headers={"Host": host})
                assert page.status_code == status, (host, page.text[:200])
            assert "DNS rebinding" in page.json()["remark"]
    finally:
        server.shutdown()
        thread.join(10)
        for s in _HELD:
            s.close()
        _HELD.clear()
