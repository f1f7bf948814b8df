"""The store's append event in a running broker: every append (a send, a send-back, a delayed redelivery) reaches
each subscriber exactly once — the HA service (it was woken twice per send before), the dispatch driver and the
put rate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.codec import encode_batch
from common.codes import BrokerRole
from common.message import Message
from common.wire import decode_send_reply
from tests import waiting
from tests.broker.delay_support import FakeClock, make_store
from tests.broker.fakes import STORE_HOST, http_client


def _controller(tmp_path: Path, clock: FakeClock) -> BrokerController:
    cfg = BrokerConfig(store_path_root_dir=str(tmp_path), broker_role=BrokerRole.ASYNC_MASTER, broker_name="broker-a",
                       listen_port=0, ha_listen_port=0, message_delay_level="1s 2s 3s",
                       auto_create_topic_enable=True)  # its sends go to topic T, created by the first one
    store: Any = make_store(tmp_path / "store", clock)
    return BrokerController(cfg, store, addr="127.0.0.1:10911", store_host=STORE_HOST, clock_ms=clock)


def test_each_append_wakes_the_real_ha_service_once(tmp_path: Path) -> None:
    clock = FakeClock()

    async def main() -> None:
        ctrl = _controller(tmp_path, clock)
        store = ctrl.store
        wakes: list[int] = []
        # The real HA service, its wake-up counted (an idle slave would be sent the new frames from inside it).
        ctrl.ha_service.notify_new_data = lambda: wakes.append(store.max_physical_offset)  # type: ignore[method-assign]
        await ctrl.start()
        try:
            async with http_client(ctrl) as client:
                ends = []
                for i in range(3):
                    body = encode_batch([Message("T", b"m%d" % i), Message("T", b"n%d" % i)], born_timestamp_ms=1)
                    r = await client.post("/send", params={"topic": "T", "queueId": 0}, content=body)
                    assert r.status_code == 200, r.text
                    assert decode_send_reply(r.content).queue_offset == 2 * i
                    ends.append(store.max_physical_offset)
                r = await client.post("/consumer/sendback", json={"group": "g", "offset": 0, "delayLevel": 1})
                assert r.status_code == 200, r.text
                ends.append(store.max_physical_offset)
                assert wakes == ends  # one wake per append, each after the bytes were in the log
                clock.advance(1100)  # the 1 s level is due: the schedule service puts the copy back
                await waiting.wait_until(lambda: store.max_physical_offset > ends[-1], 10.0, "the redelivery")
                assert wakes == [*ends, store.max_physical_offset]
                clock.advance(1000)
                assert ctrl.put_rate.per_second() == 0.5  # the put rate counts appends too: 5 in the last 10 s
        finally:
            await ctrl.stop()

    asyncio.run(main())
