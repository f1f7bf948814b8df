"""SplitMQ benchmarks: a small registry of named entries, each returning rows for one table.

Run ``python -m benchmarks NAME [NAME ...] [--quick]`` (``all`` runs every entry). An entry is a function
``(quick: bool) -> list[Row]`` registered in :data:`ENTRIES` as ``"module:function"`` (imported lazily, so one
entry's dependencies do not burden another). Every row carries a baseline measured in the same run, so the
ratio column means the same thing on any machine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import attrs

__all__ = ["ENTRIES", "Row", "format_table", "load_entry", "run_entries"]

#: name -> "module:function". Add a line here to add an entry.
ENTRIES: dict[str, str] = {
    "acl": "benchmarks.acl_bench:run",
    "chaos": "benchmarks.chaos:run_rows",
    "cli": "benchmarks.cli_bench:run",
    "client": "benchmarks.client_bench:run",
    "clientmetrics": "benchmarks.metrics_bench:run",
    "consumer": "benchmarks.consumer_bench:run",
    "disk": "benchmarks.disk_bench:run",
    "dledger": "benchmarks.dledger_bench:run",
    "fresh": "benchmarks.fresh_bench:run",
    "fuzz": "benchmarks.fuzz_bench:run",
    "isolation": "benchmarks.isolation_bench:run",
    "ha": "benchmarks.ha_bench:run_rows",
    "idempotence": "benchmarks.idempotence_bench:run",
    "peers": "benchmarks.peers_bench:run",
    "replication": "benchmarks.replication_bench:run",
    "retention": "benchmarks.soak_bench:run_cleaner_overhead",
    "soak": "benchmarks.soak_bench:run",
    "spark": "benchmarks.spark_bench:run",
    "store": "benchmarks.store_bench:run",
    "timer": "benchmarks.timer_bench:run",
    "tls": "benchmarks.tls_bench:run",
}


@attrs.frozen
class Row:
    """One measurement and its same-run baseline."""

    name: str
    """What was measured."""
    value: float
    """The figure, in ``unit``."""
    unit: str
    """``msgs/s``, ``s``, ``MB/s``..."""
    baseline_name: str = ""
    """What the baseline is (e.g. raw mmap copy of the same bytes)."""
    baseline: float = 0.0
    """The baseline figure in the same unit."""
    target: str = ""
    """The goal, as text (``>= 300000``)."""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None


def load_entry(name: str) -> Callable[[bool], list[Row]]:
    """The function of a registered entry.

    Raises:
        KeyError: unknown entry (the message lists the known ones).
    """
    try:
        target = ENTRIES[name]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(sorted(ENTRIES))}") from None
    module, _, func = target.partition(":")
    fn: Callable[[bool], list[Row]] = getattr(importlib.import_module(module), func)
    return fn


def run_entries(names: list[str], *, quick: bool = False) -> list[tuple[str, list[Row]]]:
    """Run entries in order; ``all`` expands to every registered one."""
    if "all" in names:
        names = sorted(ENTRIES)
    return [(name, load_entry(name)(quick)) for name in names]


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}"


def format_table(title: str, rows: list[Row]) -> str:
    """A plain-text table: name, value, unit, baseline, ratio (value / baseline), target."""
    header = ("benchmark", "value", "unit", "baseline", "baseline value", "ratio", "target")
    lines = [
        (r.name, _fmt(r.value), r.unit, r.baseline_name, _fmt(r.baseline) if r.baseline else "",
         f"{r.ratio:.2f}x" if r.ratio is not None else "", r.target)
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    out = [f"== {title} ==", "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    for line in lines:
        out.append("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    return "\n".join(out)
