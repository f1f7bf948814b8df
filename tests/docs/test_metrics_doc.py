"""docs/METRICS.md's instrument table names exactly the instruments the SDK creates, with their types and units,
and says which names are RocketMQ 5's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from client._metrics import _OtelExport

DOC = Path(__file__).resolve().parents[2] / "docs" / "METRICS.md"
ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| (\S+) \| [^|]+ \| ([^|]+) \|", re.M)
ROCKETMQ_CLIENT_NAMES = {"rocketmq_send_cost_time", "rocketmq_process_time", "rocketmq_delivery_latency",
                         "rocketmq_await_time", "rocketmq_consumer_cached_messages",
                         "rocketmq_consumer_cached_bytes"}


class _Meter:
    """Records what the export creates (name -> (type, unit))."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[str, str]] = {}

    def create_histogram(self, name: str, unit: str = "", **_: Any) -> object:
        self.made[name] = ("histogram", unit)
        return object()

    def create_observable_counter(self, name: str, callbacks: Any = None, unit: str = "", **_: Any) -> None:
        self.made[name] = ("counter", unit)

    def create_observable_gauge(self, name: str, callbacks: Any = None, unit: str = "", **_: Any) -> None:
        self.made[name] = ("gauge", unit)


class _Provider:
    def __init__(self) -> None:
        self.meter = _Meter()

    def get_meter(self, name: str, *_: Any, **__: Any) -> _Meter:
        assert name == "splitmq.client"
        return self.meter


def test_the_table_lists_every_instrument_with_its_type_and_unit() -> None:
    provider = _Provider()
    _OtelExport(provider)
    rows = {name: (kind, unit, origin.strip()) for name, kind, unit, origin in ROW.findall(DOC.read_text())}
    assert {n: (k, u) for n, (k, u, _) in rows.items()} == provider.meter.made
    for name, (_, _, origin) in rows.items():
        ours = name.startswith("splitmq_")
        assert origin == ("SplitMQ" if ours else "RocketMQ 5 clients"), name
        assert ours or name in ROCKETMQ_CLIENT_NAMES, f"{name} is not a RocketMQ 5 client metric name"
