"""Issue 16's acceptance of ``splitmq dashboard``, in a real browser (headless Chromium).

A local cluster of two groups with a slave each (``slaveReadEnable=true``; ``accessMessageInMemoryMaxRatio=0``
so that a pull finding messages counts as reading cold data and the master suggests the slave, broker/store/
reader.py), a producer and a lagging consumer. The command is started as a user would (``python -m client.cli
dashboard --listen 127.0.0.1:0``) and each view is loaded, checked in the DOM and photographed: the groups, a
paused slave's lag, the consumer's lag, the member serving its pulls changing from 0 to 1, the message browser's
three ways in, a broker's metrics, a killed master shown as down within 3 s, and the nameserver going away.

Screenshots go to ``tmp_path``; with ``SPLITMQ_DASHBOARD_SCREENSHOTS=DIR`` they are also copied to DIR (that is
how docs/dashboard/*.png are made: ``SPLITMQ_DASHBOARD_SCREENSHOTS=docs/dashboard pytest tests/dashboard``).
"""

from __future__ import annotations

import os
import select
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.slow, pytest.mark.timeout(90)]

TOPIC = "DashOrders"
GROUP = "dash-lagging"
DOWN_WITHIN_S = 3.0


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


class Page:
    """The dashboard page in the browser: navigation, DOM waits and checked screenshots."""

    def __init__(self, driver: Any, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots
        self.copy_to = os.environ.get("SPLITMQ_DASHBOARD_SCREENSHOTS")

    def go(self, fragment: str) -> None:
        self.driver.get(self.url + "#/" + fragment)

    def find(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By
        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def wait(self, css: str, what: str, cond: Callable[[list[Any]], bool] = bool, timeout_s: float = 15.0) -> list[Any]:
        from selenium.common.exceptions import StaleElementReferenceException

        def check() -> list[Any] | None:
            els = self.find(css)
            return els if els and cond(els) else None
        return poll_until(check, timeout_s, f"{what} ({css}); page text: {self.text()[:600]!r}", interval_s=0.05,
                          ignore=(StaleElementReferenceException,))

    def texts(self, css: str) -> list[str]:
        """The text of each element ``css`` matches now, found afresh when a redraw (a live view is drawn again
        every second) made them stale."""
        from selenium.common.exceptions import StaleElementReferenceException

        return poll_until(lambda: [str(e.text) for e in self.find(css)] or None, 5.0, f"the text of {css}",
                          interval_s=0.05, ignore=(StaleElementReferenceException,))

    def text(self) -> str:
        try:
            return str(self.driver.execute_script("return document.body.innerText"))
        except Exception as e:  # the message of a failed wait must not fail itself
            return f"<no text: {e}>"

    def _placed(self, name: str, must_show: tuple[Any, ...]) -> bool:
        height = self.driver.execute_script("return window.innerHeight")
        for item in must_show:
            els = self.find(item) if isinstance(item, str) else [item]
            assert els, f"{name}: nothing matches {item!r}"
            for el in els:
                assert el.is_displayed(), f"{name}: {el.text!r} is not displayed"
                top = el.rect["y"] - self.driver.execute_script("return window.scrollY")
                assert top >= 0 and top + el.rect["height"] <= height, f"{name}: {el.text[:80]!r} is outside the shot"
        return True

    def shot(self, name: str, *must_show: Any) -> bytes:
        """Photograph the viewport; every element of ``must_show`` (an element, or a CSS selector: each element it
        matches) must be displayed inside it. A live view is drawn again every second: give it selectors, found
        afresh when a redraw made the elements stale."""
        from selenium.common.exceptions import StaleElementReferenceException

        poll_until(lambda: self._placed(name, must_show), 5.0, f"{name}: the elements to show, not redrawn meanwhile",
                   interval_s=0.05, ignore=(StaleElementReferenceException,))
        data: bytes = self.driver.get_screenshot_as_png()
        width, h = _png_size(data)
        assert width >= 800 and h >= 600, f"{name}: screenshot of {width}x{h}"
        assert len(data) > 10_000, f"{name}: a {len(data)}-byte screenshot is blank"
        (self.shots / f"{name}.png").write_bytes(data)
        if self.copy_to:
            Path(self.copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.shots / f"{name}.png", Path(self.copy_to) / f"{name}.png")
        return data


@pytest.fixture
def dashboard_cmd(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start ``splitmq dashboard`` for a nameserver; returns its URL from the first stdout line (its stderr goes
    to ``tmp_path/dashboard.log``)."""
    procs: list[subprocess.Popen[str]] = []

    def start(namesrv: str) -> str:
        with open(tmp_path / "dashboard.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "client.cli", "dashboard", "-n", namesrv,
                                     "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20.0)
        assert ready, "splitmq dashboard printed nothing within 20 s"
        line = proc.stdout.readline().strip()
        assert line.startswith("dashboard=http://127.0.0.1:") and line.endswith("/"), line
        return line.split("=", 1)[1]

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def _served_by(rows: list[Any], want: str) -> bool:
    return len(rows) == 4 and all(r.get_attribute("data-served-by") == want for r in rows)


def test_dashboard_views_in_headless_chromium(cluster_factory: Callable[..., LocalCluster], browser: Any,
                                              dashboard_cmd: Callable[[str], str], tmp_path: Path) -> None:
    started = time.monotonic()
    cluster = cluster_factory(broker_groups=2, slaves_per_group=1,
                              broker_config={"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": "0"})
    ns = cluster.namesrv_addr
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queue_nums=2)
        admin.update_subscription_group(GROUP, which_broker_when_consume_slowly=1)
    consumer = PullConsumer(GROUP, ns)
    producer = Producer("dash-producer", ns)
    try:
        queues = sorted(consumer.fetch_subscribe_message_queues(TOPIC), key=lambda q: (q.broker_name, q.queue_id))
        offsets: dict[MessageQueue, int] = {}
        for mq in queues:  # caught up: nothing to read, the master answers
            r = consumer.pull(mq, 0, 4)
            assert r.pull_status is PullStatus.NO_NEW_MSG and r.served_by_broker_id == 0, r
            consumer.update_consume_offset(mq, 0)
            offsets[mq] = 0

        url = dashboard_cmd(ns)
        page = Page(browser, url, tmp_path)

        # Cluster: both groups, master and slave, all up.
        page.go("cluster")
        page.wait('tr[data-up="true"]', "four members up", lambda els: len(els) == 4)
        groups = page.find(".card[data-group]")
        assert [g.get_attribute("data-group") for g in groups] == ["broker-a", "broker-b"]
        assert "ASYNC_MASTER" in page.text() and "SLAVE" in page.text()
        page.shot("cluster", ".card[data-group]")

        # Consumers, caught up: every queue's last pulls served by the master.
        page.go("consumers")
        rows = page.wait("tr[data-served-by]", "last pulls served by 0", lambda els: _served_by(els, "0"))
        page.shot("consumers-caught-up", "tr[data-served-by]")

        # The producer sends a burst; the consumer reads a little of it and falls behind.
        special = producer.send(Message(TOPIC, b'{"order": "special"}', tags="vip", keys="order-special"))
        for i in range(8):
            producer.send_batch([Message(TOPIC, f'{{"order": {i * 40 + j}}}'.encode() + b" " * 600,
                                         tags="std", keys=f"order-{i * 40 + j}") for j in range(40)])
        for name in cluster.group_names:
            cluster.wait_slave_caught_up(name, timeout_s=10)
        served: list[int] = []
        for _ in range(2):
            for mq in queues:
                r = consumer.pull(mq, offsets[mq], 4)
                served.append(r.served_by_broker_id)
                offsets[mq] = r.next_begin_offset
                consumer.update_consume_offset(mq, offsets[mq])
        assert served[:4] == [0, 0, 0, 0] and served[4:] == [1, 1, 1, 1], f"served by {served}"

        page.wait("tr[data-served-by]", "last pulls served by 1", lambda els: _served_by(els, "1"))
        card = page.texts(".card[data-consumer]")[0]
        assert f"{GROUP}" in card and "1 slave" in card
        rows_text = page.texts("tr[data-served-by]")
        assert all("0 at" in r and "→ 1 at" in r for r in rows_text), rows_text
        total_lag = 321 - sum(offsets.values())
        assert f"lag {total_lag:,}" in card, card
        page.shot("consumers", ".card[data-consumer]")

        # Topics: min/max offsets per queue.
        page.go("topics")
        page.wait(f'.card[data-topic="{TOPIC}"]', "the topic card")
        topic_card = page.texts(f'.card[data-topic="{TOPIC}"]')[0]
        assert "broker-a" in topic_card and "broker-b" in topic_card and "msgs/s" in topic_card
        page.shot("topics", f'.card[data-topic="{TOPIC}"]')

        # Message browser: by key, by msgId, by queue and offset.
        page.go(f"messages?topic={TOPIC}&key=order-special")
        hit = page.wait("tr.msg", "the message found by key")
        assert len(hit) == 1 and special.offset_msg_id in hit[0].text and "vip" in hit[0].text
        page.shot("messages", hit[0])
        page.go(f"messages?msgId={special.offset_msg_id}")
        page.wait("tr.msg", "the message found by msgId", lambda els: special.offset_msg_id in els[0].text)
        page.go(f"messages?topic={TOPIC}&broker=broker-b&queue=1&offset=2&max=3")
        rows = page.wait("tr.msg", "three messages of one queue", lambda els: len(els) == 3)
        assert [r.find_elements("css selector", "td")[3].text for r in rows] == ["2", "3", "4"]
        for query, status, text in ((f"topic={TOPIC}&broker=broker-b&queue=1&offset=99999", 400, "is outside"),
                                    ("topic=NoSuchTopic&key=k", 404, "NoSuchTopic")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{url}api/messages?{query}", timeout=10)
            assert refused.value.code == status and text in refused.value.read().decode(), query

        # Metrics of a master.
        master_b = cluster.broker("broker-b", 0)
        page.go(f"metrics?addr={master_b.addr}&filter=splitmq_")
        metric = page.wait("tr.metric", "pull metrics of broker-b's master")
        assert "splitmq_pull_served_total" in page.text()
        page.shot("metrics", metric[0])

        # Replication: broker-b's slave paused while the producer goes on; its lag shows, in bytes and time.
        slave_b = cluster.broker("broker-b", 1)
        slave_b.pause()
        try:
            for i in range(4):
                producer.send_batch([Message(TOPIC, b"x" * 1000, keys=f"late-{i}-{j}") for j in range(20)],
                                    MessageQueue(TOPIC, "broker-b", i % 2))
            page.go("replication")
            page.wait('.card[data-slave="broker-b/1"]', "broker-b's slave lagging",
                                lambda els: int(els[0].get_attribute("data-diff") or 0) > 40_000
                                and float(els[0].get_attribute("data-lag-s") or 0) > 0)
            lagging_text = page.texts('.card[data-slave="broker-b/1"]')[0]
            assert "NOT ANSWERING" in lagging_text and "KiB" in lagging_text
            page.shot("replication", ".card[data-slave]")
        finally:
            slave_b.resume()

        # A killed master shows as down within 3 s.
        page.go("cluster")
        page.wait('tr[data-up="true"]', "four members up again", lambda els: len(els) == 4)
        cluster.kill_master("broker-a")
        killed = time.monotonic()
        page.wait('tr[data-member="broker-a/0"][data-up="false"]', "broker-a's master down",
                         timeout_s=DOWN_WITHIN_S)
        elapsed = time.monotonic() - killed
        assert elapsed <= DOWN_WITHIN_S, elapsed
        # The reason is the runtime request's error: refused once the process is gone, or, when the request raced
        # the kill (a connection the dying process's backlog took), closed without an answer.
        down_text = page.texts('tr[data-member="broker-a/0"][data-up="false"]')[0]
        assert "DOWN" in down_text
        assert "connection refused" in down_text or "connection closed without an answer" in down_text, down_text
        closed = ("runtime of 127.0.0.1:1: RemoteProtocolError: 127.0.0.1:1 closed the connection without a "
                  "complete response")
        assert browser.execute_script("return shortError(arguments[0])", closed) == "connection closed without an answer"
        color = browser.execute_script(
            "return getComputedStyle(document.querySelector('tr[data-up=\"false\"] .badge.down')).backgroundColor")
        assert color == "rgb(207, 34, 46)", color
        page.shot("cluster-master-down", 'tr[data-member="broker-a/0"][data-up="false"]')

        # The nameserver goes away: a clear error on the page, not a stale view.
        for handle in cluster.nameserver_handles:
            handle.kill()
        page.wait("#banner", "the nameserver error", lambda els: els[0].is_displayed()
                           and "unreachable" in els[0].text)
        assert ns in page.texts("#banner")[0]
    finally:
        consumer.close()
        producer.close()
    assert time.monotonic() - started < 60
