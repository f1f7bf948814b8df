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
from client.dashboard._collector import HISTORY_SAMPLES, _Series

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
