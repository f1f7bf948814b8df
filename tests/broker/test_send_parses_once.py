"""A ``/send`` reads each message's properties once (issue 10, point 5): the batch is decoded into items that
carry tags, keys, unique key, delay level and WAIT, and nothing after the decoding parses the properties again
-- not the WAIT rule of the send processor, not the store's delay reroute.

The broker here is the real application (its router served on loopback by the servers' HTTP runtime, the send
processor, a real file store). Every property reader in the loaded ``common`` / ``client`` / ``broker`` modules is
wrapped with a counter that counts only calls made by the request itself: the router's entry is wrapped to set a
context variable while it answers, in the context the protocol runs the answer in (and that a task carrying it on
copies), so the dispatcher, the delay service and any thread started before do not count. Dispatch of
the stored records is a separate, later pass over the commit log (on a slave it is the only one) and scans each
record once more; that is not part of the send path and is not counted.
"""

from __future__ import annotations

import contextvars
import struct
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.store.dispatch import SCHEDULE_TOPIC
from common.codec import BATCH_ITEM_HEAD, BATCH_MAGIC, body_crc
from common.codes import ResponseCode
from common.properties import encode_properties
from common.wire import decode_send_reply
from tests.broker.delay_support import FakeClock, make_store
from tests.broker.fakes import run_with_broker

#: Every function that reads a property string: the scanner and the whole-map decoder of
#: common.properties, and the single-key readers that the scanner replaced (named so that this test
#: keeps counting if one of them comes back).
PROPERTY_READERS = ("scan_properties", "decode_properties", "find_prop", "_find_property")

_IN_SEND: contextvars.ContextVar[bool] = contextvars.ContextVar("in_send", default=False)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[bytes]]:
    """How many times each property string was read during a request marked by ``_IN_SEND``."""
    seen: Counter[bytes] = Counter()

    def counting(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(data: Any, *args: Any, **kwargs: Any) -> Any:
            if _IN_SEND.get():
                seen[data.encode() if isinstance(data, str) else bytes(data)] += 1
            return fn(data, *args, **kwargs)

        return wrapper

    wrapped: dict[int, Callable[..., Any]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("common.", "client.", "broker.")):
            continue
        for attr in PROPERTY_READERS:
            fn = getattr(module, attr, None)
            if callable(fn):
                wrapper = wrapped.setdefault(id(fn), counting(fn))
                monkeypatch.setattr(module, attr, wrapper)
    assert wrapped, "no property reader found to count"
    yield seen


def _item(body: bytes, raw: bytes) -> bytes:
    return (BATCH_ITEM_HEAD.pack(34 + len(body) + len(raw), BATCH_MAGIC, body_crc(body), 0, 0, 1, len(body)) + body
            + struct.pack(">H", len(raw)) + raw)


def test_a_send_reads_each_message_properties_once(tmp_path: Path, reads: Counter[bytes]) -> None:
    # Every message says WAIT=false (so the WAIT rule must look at all of them) and half are delayed (so the
    # store reroutes them to SCHEDULE_TOPIC_XXXX): the two places that parsed the properties again.
    props = [encode_properties({"TAGS": f"Tag{i % 2}", "KEYS": f"k{i} order-{i}", "user": "x", "WAIT": "false",
                                "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": f"{i:032X}", **({"DELAY": "2"} if i % 2 else {})})
             for i in range(8)]
    body = b"".join(_item(f"m{i}".encode(), raw) for i, raw in enumerate(props))
    store = make_store(tmp_path / "store", FakeClock())

    async def scenario(ctrl: Any, client: Any) -> None:
        serve = ctrl.router.serve
        marked: list[str] = []

        async def serve_marked(*args: Any) -> Any:
            marked.append(args[1])
            _IN_SEND.set(True)
            try:
                return await serve(*args)
            finally:
                _IN_SEND.set(False)  # not reset(): a task may carry the answer on, in a copy of the context

        ctrl.router.serve = serve_marked
        r = await client.post("/send", params={"topic": "T", "queueId": 0}, content=body)
        ctrl.router.serve = serve
        assert marked == ["/send"]  # the request was counted through the wrapper
        assert r.status_code == 200, r.text
        assert decode_send_reply(r.content).code == ResponseCode.SUCCESS
        assert [reads[p] for p in props] == [1] * len(props), "reads of each message's properties by the send"
        assert set(reads) == set(props), "the send read property strings that are none of its messages'"
        # The single read still routed the delayed half: 4 messages in T, 4 in the level-2 schedule queue.
        while store.dispatch_available():
            pass
        assert store.get_max_offset_in_queue("T", 0) == 4
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 1) == 4

    run_with_broker(tmp_path, scenario, store=store)
