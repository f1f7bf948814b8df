"""Issue 40, point 6, in a real browser (headless Chromium): the dashboard at the moment it matters.

A one-group cluster where a transaction has been checked (so the broker's ``CID_SYS_RMQ_TRANS`` group and the
``RMQ_SYS_TRANS_*`` topics exist), an application group with offsets, and a push consumer that gives up on a
message (so ``%DLQ%<group>`` holds it). Checked in the page: system groups and topics listed apart and marked,
never beside the applications' cards; the "served by" column inside its card and the window; the dead-letter
view and its way into the message browser; a message found by time; and the actions -- create a topic, update
a group, reset an offline group's offsets, a reset refused while the group is online, a topic name refused --
each saying what it did or, in the cluster's code and words, why not; and an action without the page's token
refused.

Screenshots go to ``tmp_path`` and, with ``SPLITMQ_DASHBOARD_SCREENSHOTS=DIR``, to DIR (docs/dashboard).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from client import (
    Admin,
    ConsumeStatus,
    GroupConsumer,
    LocalTransactionState,
    Message,
    Producer,
    PushConsumer,
    TransactionListener,
    TransactionProducer,
)
from client.cluster import LocalCluster
from client.errors import RouteNotFoundError
from tests.dashboard.test_dashboard_browser import Page, dashboard_cmd  # noqa: F401  (a fixture)
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

TOPIC = "ActOrders"
APP_GROUP = "act-app"
DLQ_GROUP = "act-dlq"


class _CheckedLater(TransactionListener):
    """Leaves the half message undecided, then commits it when the broker checks: the check service runs, and
    stores its progress as the offsets of ``CID_SYS_RMQ_TRANS``."""

    def __init__(self) -> None:
        self.checked = threading.Event()

    def execute_local_transaction(self, msg: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg_ext: Any) -> LocalTransactionState:
        self.checked.set()
        return LocalTransactionState.COMMIT_MESSAGE


def _inside(el: Any, box: Any, width: int) -> bool:
    r, b = el.rect, box.rect
    return b["x"] <= r["x"] and r["x"] + r["width"] <= b["x"] + b["width"] + 0.5 and r["x"] + r["width"] <= width


def _fill(page: Page, form: str, values: dict[str, str]) -> None:
    from selenium.webdriver.support.ui import Select
    for name, value in values.items():
        el = page.find(f'{form} [name="{name}"]')[0]
        if el.tag_name == "select":
            Select(el).select_by_value(value)
        else:
            el.clear()
            el.send_keys(value)
    page.find(f"{form} button")[0].click()


def _result(page: Page, want: str, cls: str = "ok") -> str:
    els = page.wait(f"#action-result.{cls}", f"the action's answer containing {want!r}",
                    lambda els: want in els[0].text, timeout_s=20)
    return str(els[0].text)


def test_dashboard_actions_and_views_in_headless_chromium(cluster_factory: Callable[..., LocalCluster], browser: Any,
                                                         dashboard_cmd: Callable[[str], str],  # noqa: F811
                                                         tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException

    cluster = cluster_factory(broker_groups=1, slaves_per_group=0,
                              broker_config={"transactionCheckInterval": "500", "transactionTimeOut": "1000"})
    ns = cluster.namesrv_addr
    admin = Admin(ns)
    try:
        admin.create_topic(TOPIC, queue_nums=2)
        with Producer("act-producer", ns) as producer:
            first = producer.send(Message(TOPIC, b"order 0", keys="order-0"))
            for i in range(1, 10):
                producer.send(Message(TOPIC, f"order {i}".encode(), keys=f"order-{i}"))
            late = producer.send(Message(TOPIC, b"the late one", keys="late"))
        late_stored = admin.query_message(late.offset_msg_id).store_timestamp
        first_stored = admin.query_message(first.offset_msg_id).store_timestamp
        with GroupConsumer(APP_GROUP, ns, consume_from_where="FIRST_OFFSET", pull_suspend_s=1.0) as app:
            app.subscribe(TOPIC)  # an application group that consumed a little and left (close commits)
            poll_until(lambda: app.poll(0.2), 20, "the application group's first messages")
        listener = _CheckedLater()
        with TransactionProducer("act-tx", ns, listener, topics=[TOPIC]) as tx:
            tx.send_message_in_transaction(Message(TOPIC, b"undecided"), None)
            assert listener.checked.wait(30), "the broker did not check the transaction"
        poll_until(lambda: "CID_SYS_RMQ_TRANS" in admin.consumer_groups(), 20, "CID_SYS_RMQ_TRANS's offsets")

        def give_up(msgs: list[Any]) -> ConsumeStatus:
            return ConsumeStatus.RECONSUME_LATER
        dlq_topic = f"%DLQ%{DLQ_GROUP}"
        with PushConsumer(DLQ_GROUP, ns, give_up, consume_from_where="FIRST_OFFSET", max_reconsume_times=0,
                          pull_suspend_s=1.0) as push:
            push.subscribe(TOPIC)
            poll_until(lambda: dlq_topic in admin.topic_list()
                       and sum(hi - lo for _, lo, hi in admin.topic_offsets(dlq_topic)) > 0,
                       30, "a message in the dead-letter topic")

        url = dashboard_cmd(ns)
        page = Page(browser, url, tmp_path)
        width = int(browser.execute_script("return window.innerWidth"))

        # Consumers: the application's card; the system groups apart, marked, and not as cards.
        page.go("consumers")
        page.wait(f'.card[data-consumer="{APP_GROUP}/{TOPIC}"]', "the application's consumer card")
        page.wait('#system-groups tr[data-system-group="CID_SYS_RMQ_TRANS"]', "CID_SYS_RMQ_TRANS apart")
        assert "system" in page.texts("#system-groups h3")[0]
        cards = browser.execute_script(  # read in one go: the view is drawn again every second
            "return [...document.querySelectorAll('.card[data-consumer]')].map(e => e.dataset.consumer)")
        assert not [c for c in cards if c.startswith(("CID_", "%", "SPLITMQ_DASHBOARD"))], cards

        def served_by_inside() -> bool:  # the column and each cell within the card and the window
            card = page.find(f'.card[data-consumer="{APP_GROUP}/{TOPIC}"]')[0]
            cells = card.find_elements("css selector", "td.served")
            header = next(th for th in card.find_elements("css selector", "th") if "served by" in th.text)
            return len(cells) == 2 and all(_inside(el, card, width) for el in [header, *cells])
        poll_until(served_by_inside, 10, "the served-by column inside the consumer card and the window",
                   ignore=(StaleElementReferenceException,))
        browser.execute_script("document.getElementById('system-groups').scrollIntoView(false)")
        page.shot("consumers-system-groups", f'.card[data-consumer="{APP_GROUP}/{TOPIC}"]', "#system-groups")

        # Topics: the transaction topics listed apart, never as cards.
        page.go("topics")
        page.wait(f'.card[data-topic="{TOPIC}"]', "the topic card")
        page.wait("#system-topics", "system topics apart")
        assert "RMQ_SYS_TRANS_HALF_TOPIC" in page.texts("#system-topics")[0]
        assert not page.find('.card[data-topic^="RMQ_SYS"]') and not page.find('.card[data-topic^="%"]')

        # Dead letters: the group's DLQ with its message, and the way into the browser.
        page.go("dlq")
        page.wait(f'.card[data-dlq="{dlq_topic}"]', "the dead-letter card",
                  lambda els: int(els[0].get_attribute("data-count")) > 0 and DLQ_GROUP in els[0].text)
        page.shot("dead-letters", ".card[data-dlq]")
        poll_until(lambda: page.find(".card[data-dlq] a.browse")[0].click() or True, 10, "a click on browse",
                   ignore=(StaleElementReferenceException,))
        rows = page.wait("tr.msg", "a dead letter in the message browser")
        assert dlq_topic in rows[0].text

        # Messages by time: the late one found, nothing stored before its moment (a message stored in the same
        # millisecond may come with it).
        page.go(f"messages?topic={TOPIC}&time={late_stored}")
        page.wait("tr.msg", "the late one among the messages stored at or after its time",
                  lambda els: any(late.offset_msg_id in r.text for r in els))
        with urllib.request.urlopen(f"{url}api/messages?topic={TOPIC}&time={late_stored}", timeout=10) as resp:
            found = json.loads(resp.read())["messages"]
        assert found and all(m["storeTimestamp"] >= late_stored for m in found), found
        if first_stored < late_stored:
            assert first.offset_msg_id not in {m["offsetMsgId"] for m in found}

        # Actions. The page's mode badge says they are on; the result says what was done.
        page.go("actions")
        page.wait("#admin-account", "the actions view")
        assert page.find("#mode")[0].text == "actions on"
        _fill(page, 'form[data-action="topic"]', {"topic": "ActNew", "queueNums": "3"})
        _result(page, "create topic to broker-a success: ActNew has 3 read and 3 write queues")
        assert {qd.write_queue_nums for qd in admin.topic_route("ActNew").queue_datas} == {3}

        _fill(page, 'form[data-action="group"]', {"group": APP_GROUP, "retryMaxTimes": "3"})
        _result(page, f"create subscription group to broker-a success: {APP_GROUP}")
        master = cluster.broker("broker-a", 0).addr
        with httpx.Client(trust_env=False, timeout=5) as http:
            table = http.get(f"http://{master}/subscription-groups").json()["subscriptionGroupTable"]
        assert table[APP_GROUP]["retryMaxTimes"] == 3

        _fill(page, 'form[data-action="reset-offset"]', {"group": APP_GROUP, "topic": TOPIC, "to": "earliest"})
        done = _result(page, f"reset offset of {APP_GROUP} on {TOPIC} to earliest success")
        assert "broker-a/0=0" in done and "broker-a/1=0" in done
        assert [p.consumer_offset for p in admin.consumer_progress(APP_GROUP, TOPIC)] == [0, 0]
        page.shot("actions", page.find("#action-result")[0])

        # A group with a consumer online is not reset: the page says why, in the code's words.
        with GroupConsumer("act-online", ns, pull_suspend_s=1.0) as online:
            online.subscribe(TOPIC)
            poll_until(lambda: admin.consumer_ids("act-online", TOPIC), 20, "act-online's consumer online")
            _fill(page, 'form[data-action="reset-offset"]', {"group": "act-online", "topic": TOPIC, "to": "latest"})
            refused = _result(page, "has 1 consumer(s) online", cls="err")
            assert refused.startswith("INVALID_PARAMETER (29): consumer group act-online"), refused
        _fill(page, 'form[data-action="topic"]', {"topic": "bad topic!", "queueNums": "3"})
        refused = _result(page, "bad topic!", cls="err")
        assert refused.split(" (")[0] in ("MESSAGE_ILLEGAL", "INVALID_PARAMETER"), refused

        # A write without the page's token (what a cross-site form could send) is refused.
        status = browser.execute_async_script(
            "const done = arguments[0]; fetch('/api/actions/topic', {method: 'POST', body: '{\"topic\": \"X\"}'})"
            ".then(r => done(r.status)).catch(e => done(String(e)));")
        assert status == 403
        with pytest.raises(RouteNotFoundError):  # nothing was made
            admin.topic_route("X")
    finally:
        admin.close()
