"""Render ``docs/OPERATIONS.md`` from the code, so the operations guide cannot drift from it.

The tables come from the definitions themselves: broker keys from :data:`broker.config.KEYS` (converters),
:class:`broker.config.BrokerConfig` (defaults) and :data:`broker.config.KEY_DOCS` (meanings); nameserver
options from its argument parser; metrics from the broker's and the nameserver's Prometheus registries. The
prose around them lives here.

    python docs/gen_operations.py           # rewrite docs/OPERATIONS.md
    python docs/gen_operations.py --check   # exit 1 when the file is out of date

``tests/docs/test_operations_doc.py`` runs the same comparison.
"""

from __future__ import annotations

import argparse
import enum
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.metrics import MetricWrapperBase  # noqa: E402

from broker.config import KEY_DOCS, KEYS, BrokerConfig  # noqa: E402
from broker.metrics import BrokerMetrics  # noqa: E402
from nameserver.__main__ import build_parser  # noqa: E402
from nameserver.routeinfo import RouteInfo  # noqa: E402
from nameserver.server import NamesrvConfig, create_app  # noqa: E402

OUTPUT = ROOT / "docs" / "OPERATIONS.md"

#: Keys whose default depends on the machine or the environment: shown as words, not as a value.
_DYNAMIC_DEFAULTS = {
    "brokerName": "the host name",
    "namesrvAddr": "`$NAMESRV_ADDR`",
    "haListenPort": "listenPort + 1",
}
#: Words for nameserver options whose argparse help is empty.
_OPTION_HELP = {"log_level": "logging threshold", "log_format": "log line format (see Logging)"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(key: str, value: Any) -> str:
    if key in _DYNAMIC_DEFAULTS:
        return _DYNAMIC_DEFAULTS[key]
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, tuple):
        value = ";".join(value)
    elif value is None:
        value = ""
    return f"`{value}`" if value != "" else "(empty)"


def broker_key_rows() -> list[str]:
    """One table row per broker ``.properties`` key, in the order of :data:`KEYS`.

    Raises:
        KeyError: a key has no entry in KEY_DOCS (the message names it).
    """
    defaults = BrokerConfig(broker_name="host")  # the host name default is machine-dependent
    rows = []
    for key, (field, _) in KEYS.items():
        if key not in KEY_DOCS:
            raise KeyError(f"broker key {key!r} has no KEY_DOCS entry in broker/config.py")
        rows.append(f"| `{key}` | {_cell(_default(key, getattr(defaults, field)))} | {_cell(KEY_DOCS[key])} |")
    return rows


def nameserver_option_rows() -> list[str]:
    """One row per command-line option of ``python -m nameserver``."""
    rows = []
    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        opts = ", ".join(f"`{o}`" for o in action.option_strings)
        choices = f" ({' / '.join(map(str, action.choices))})" if action.choices else ""
        words = action.help or _OPTION_HELP.get(action.dest, "")
        rows.append(f"| {opts} | `{action.default}` | {_cell(words + choices)} |")
    return rows


def _described(collector: Any) -> Iterator[tuple[str, str, Sequence[str], str]]:
    """``(name, type, label names, help)`` of each metric a collector registers: a prometheus_client metric's own,
    or the families another collector describes (the broker's data-path counts)."""
    if isinstance(collector, MetricWrapperBase):
        yield collector._name, str(collector._type), collector._labelnames, collector._documentation
    else:
        for family in collector.describe():
            yield family.name, str(family.type), getattr(family, "_labelnames", ()), family.documentation


def _metric_rows(collectors: Iterable[Any]) -> list[str]:
    rows = []
    for c in collectors:
        for base, kind, labelnames, doc in _described(c):
            name = base + ("_total" if kind == "counter" else "")
            labels = ", ".join(labelnames) or "-"
            origin = "SplitMQ" if base.startswith("splitmq_") else "RocketMQ 5 exporter"
            rows.append(f"| `{name}` | {kind} | {labels} | {origin} | {_cell(doc)} |")
    return rows


def broker_metric_rows() -> list[str]:
    """The broker's metrics, read from a fresh :class:`BrokerMetrics` registry."""
    metrics = BrokerMetrics("DefaultCluster", "broker-a", "ASYNC_MASTER")
    return _metric_rows(metrics.registry._collector_to_names)


def nameserver_metric_rows() -> list[str]:
    """The nameserver's metrics, read from the registry of a fresh app."""
    registry = CollectorRegistry(auto_describe=True)
    create_app(RouteInfo(), registry=registry)
    return _metric_rows(registry._collector_to_names)


def render() -> str:
    """The whole text of ``docs/OPERATIONS.md``."""
    table_head = ["| metric | type | labels | name from | meaning |", "|---|---|---|---|---|"]
    parts = [
        _INTRO,
        "## Broker configuration keys\n",
        _BROKER_KEYS_INTRO,
        "| key | default | meaning |",
        "|---|---|---|",
        *broker_key_rows(),
        "",
        _BROKER_CLI,
        "## Nameserver options\n",
        _NAMESRV_INTRO,
        "| option | default | meaning |",
        "|---|---|---|",
        *nameserver_option_rows(),
        "",
        f"Largest request body: {NamesrvConfig().max_body_bytes} bytes (HTTP 413 above). Exit codes: 0 after "
        "SIGTERM/SIGINT, 1 when the address cannot be bound, 2 for a bad argument (one line on stderr).\n",
        "## Metrics\n",
        _METRICS_INTRO,
        "### Broker (`GET /metrics` on `listenPort`)\n",
        *table_head,
        *broker_metric_rows(),
        "",
        "### Nameserver (`GET /metrics`)\n",
        *table_head,
        *nameserver_metric_rows(),
        "",
        _STATUS,
        _PORTS,
        _LAYOUT,
        _LOGGING,
    ]
    return "\n".join(parts).rstrip("\n") + "\n"


_INTRO = """\
# SplitMQ operations

How to run and watch SplitMQ's processes: every configuration key with its default, the nameserver's
options, the metrics, ports, files on disk and logs. The message flow is in `ARCHITECTURE.md`, the wire
formats in `PROTOCOL.md`.

> Generated by `docs/gen_operations.py` from the code (`broker/config.py`, `broker/metrics.py`,
> `nameserver/__main__.py`, `nameserver/server.py`). Change those, then run `python docs/gen_operations.py`;
> `tests/docs/test_operations_doc.py` fails while this file is out of date.
"""

_BROKER_KEYS_INTRO = """\
A broker reads a Java-style `.properties` file (`-c FILE`) with RocketMQ's camelCase keys, so existing
RocketMQ broker files work; `--set key=value` (repeatable) overrides one key. Every value is checked at
start: a bad one stops the broker with exit code 2 and one line naming the key and the value (where RocketMQ
silently keeps the default). Unknown keys are ignored with one warning naming them. Keys marked SplitMQ do not
exist in RocketMQ. Times are in milliseconds.
"""

_BROKER_CLI = """\
Broker command line: `python -m broker -c FILE [--set KEY=VALUE ...] [-n NAMESRV] [--log-level LEVEL]
[--log-format text|json]` (console script `splitmq-broker`); `-n` overrides `namesrvAddr`. Once it serves,
the broker prints one line on stdout, `broker ready name=NAME id=N role=ROLE listen=HOST:PORT ha=HOST:PORT`,
with the real ports. SIGTERM or SIGINT shuts it down gracefully (parked pulls answered, unregistered from the
nameservers, metadata persisted, store flushed) with exit code 0. Exit codes: 2 bad configuration, 3 corrupt
or unusable store (see `truncateCorruptCommitLog`), 1 any other start failure (a port in use...).
"""

_NAMESRV_INTRO = """\
`python -m nameserver [options]` (console script `splitmq-nameserver`) prints `nameserver ready
listen=HOST:PORT` on stdout once it serves. It keeps nothing on disk: brokers register again every
`registerNameServerPeriod`, so a restarted nameserver knows the whole cluster again within one period.
Clients list every nameserver (`host:port;host:port`) and fail over between them.
"""

_METRICS_INTRO = """\
Prometheus text format. Metrics named after RocketMQ 5's exporter keep its names and labels (`cluster`,
`node_type`, `node_id` = the broker group, `topic`); names starting with `splitmq_` are SplitMQ's own.
`splitmq_pull_served_total{role}` shows read/write splitting at work: compare masters and slaves. Counters
start at zero when a process starts.
"""

_STATUS = """\
### Status endpoints

Besides `/metrics`, every broker answers `GET /runtime` (role, commit-log min/max/flushed offsets,
`dispatchBehindBytes`, `putTps`, parked pulls, topic count; on a slave its master and `masterLinkUp`) and
`GET /ha` (on a master, each connected slave's `ackOffset`, `diff`, `inSync` and transfer speed, and
`ackWaiters`, the SYNC_MASTER sends waiting for acks; on a slave, its link to the master). `inSync` is the rule
a SYNC_MASTER send applies (`diff < haMaxGapNotInSync`): while fewer slaves are in sync than
`inSyncReplicas - 1`, a SYNC_MASTER answers every send SLAVE_NOT_AVAILABLE (unless `enableAutoInSyncReplicas`
lowers the need). The CLI shows both: `splitmq broker status`, `splitmq ha status`. The exact fields are in
`PROTOCOL.md`.

Read at scrape time, beside the table above: `rocketmq_storage_size`, `rocketmq_storage_flush_behind_bytes`,
`rocketmq_storage_dispatch_behind_bytes`, `rocketmq_consumer_lag_messages{consumer_group,topic}`, the HA gauges
`splitmq_ha_*`, and for retention `splitmq_disk_used_ratio{part}` (used fraction of the partition holding
`commitlog`, `consumequeue`, `index`, at the last disk check), `splitmq_commitlog_min_offset`,
`splitmq_store_writeable` (0 while sends are refused for a full disk or a write error),
`splitmq_retention_files_deleted_total` and `splitmq_retention_bytes_reclaimed_total`. `GET /runtime` has the
same figures (`storeWriteable`, `storeNotWriteableReason`, `diskUsedRatio`, `retentionFilesDeleted`,
`retentionBytesReclaimed`). The duplicate window of idempotent sends (`duplicateWindowMs` above; 0 turns it and
these off): `splitmq_duplicate_window_keys` (keys held), `splitmq_duplicates_total` (messages answered with
their first copy instead of being stored again) and `splitmq_duplicate_window_evicted_early_total` (keys that
left before `duplicateWindowMs` because the window held `duplicateWindowMaxKeys`: when it moves, raise the bound
or accept a shorter window); `GET /runtime`'s `duplicateWindow` has them with `rebuiltKeys`, what the last
rebuild from the log found.

## Retention and disk space

A broker deletes old commit-log files by itself (RocketMQ's clean services), on masters and slaves alike. Every
`cleanResourceInterval` (10 s) it measures the partitions holding the commit log, the consume queues and the
index (`statvfs`), then deletes the oldest commit-log files whose last write is `fileReservedTime` (72 h) old,
at most `deleteFileBatchMax` (10) per pass, `deleteCommitLogFilesInterval` (100 ms) apart, when the hour is one
of `deleteWhen` (`04`), when the commit log's partition is above `diskMaxUsedSpaceRatio` (75 %), or when an
operator asks (`splitmq broker clean -b NAME`, `Admin.clean_expired_files`, `POST /commitlog/clean`: expired
files go now, whatever the hour). Above `diskSpaceCleanForciblyRatio` (85 %) the oldest files go even before
they expire. Each deletion takes the consume-queue and index files that only pointed into the deleted file
with it and moves each queue's min offset to its first message still stored; a consumer below it gets
PULL_OFFSET_MOVED and continues from there (the SDK logs how many messages it skipped), and the broker logs
how many messages each group lost that it had not consumed. Never deleted: the file being written, and any
file holding bytes not yet flushed or dispatched into the consume queues. A deleted file a reader still holds
stays mapped until the reader is done (at most `destroyMapedFileIntervalForcibly`, 120 s).

Above `diskSpaceWarningLevelRatio` (90 %) on any of the three partitions, or after a failed write, sends get
SERVICE_NOT_AVAILABLE (14, HTTP 503) with a message that says the disk is full and shows the three ratios;
reads keep working; while sends are refused the disks are measured every second, and writes resume by
themselves once usage is back below the ratio. A slave that was away while its master deleted the files it
needed next starts its commit log again at the master's oldest file (its older messages are gone from the
group anyway).
"""

_PORTS = """\
## Ports

| process | setting | default | what |
|---|---|---|---|
| nameserver | `--listen` | 9876 | HTTP: registration, routes, `/metrics` |
| broker | `listenPort` | 10911 | HTTP: send, pull, admin, `/runtime`, `/ha`, `/metrics` |
| broker | `haListenPort` | `listenPort + 1` | raw TCP: the master-to-slave commit-log stream (opened on every broker) |

Port 0 lets the OS choose; the ready line on stdout gives the real port (`LocalCluster` and
`splitmq cluster up` rely on it). Restart a broker on the same ports: slaves may have its HA address in
`haMasterAddress`, and clients keep its address in their routes until the next refresh.
"""

_LAYOUT = """\
## On-disk layout (`storePathRootDir`)

| path | content |
|---|---|
| `commitlog/<20-digit start offset>` | commit-log files of `mappedFileSizeCommitLog` bytes, preallocated; records back to back, byte-identical on master and slaves |
| `consumequeue/<topic>/<queueId>/<20-digit start>` | 20-byte units (`commitLogOffset`, `size`, `tagsCode`), one chain per queue |
| `index/<yyyyMMddHHmmssSSS>` | hash index of keys and unique ids (with `messageIndexEnable`) |
| `checkpoint` | flushed timestamps and offset, used by recovery after a crash |
| `abort` | exists while the broker runs; found at start, it means a crash (full recovery) |
| `lock` | file lock: two brokers cannot open one store |
| `config/topics.json` | topic table (slaves copy the master's) |
| `config/subscriptionGroup.json` | subscription groups (`brokerId`, `whichBrokerWhenConsumeSlowly`, retries) |
| `config/consumerOffset.json` | committed consumer offsets, written every `flushConsumerOffsetInterval` |
| `config/delayOffset.json` | progress of each delay level |
| `config/delayDelivery.json` | the master's delayed-delivery journal (no delivery lost or repeated across a crash) |
| `config/timerProgress.json` | the master's timed-delivery progress in `rmq_sys_wheel_timer` and its journal (see "Timed delivery") |

Each `config/*.json` file is written atomically and keeps its previous version as `<name>.bak`, which is read
when the file is missing or broken. Commit-log, consume-queue and index files are deleted by age and disk
usage (see "Retention and disk space").

`LocalCluster(root)` and `splitmq cluster up --root DIR` put each broker in `DIR/<name>-<id>/`
(`broker.properties`, `store/`) and each process's output in `DIR/logs/<name>-<id>.log`.

## Timed delivery

A message sent with `deliver_at_ms` / `delay_s` (RocketMQ 5 timer messages) is parked by the master in the system
topic `rmq_sys_wheel_timer` (one queue) and put back under its topic at its time, within a few ms (the
acceptance bound is 1 s). `timerMaxDelaySec` (7 days) bounds the delay; `timerRollWindowSlot` and
`timerMaxInMemory` bound what the master holds in memory -- later messages stay in the log and are read again as
time advances. The queue is the durable record: after a crash the master rebuilds its index from
`config/timerProgress.json` and delivers each message exactly once (`python -m benchmarks timer` measures it
across a SIGKILL).

Caveats: retention deletes commit-log files by age (`fileReservedTime`, 72 h by default) whatever they hold, so
keep it longer than the longest delay in use, or a parked message expires before its time (logged as
"expired before delivery"). A slave replicates the topic but not the progress file; a slave or DLedger member
that becomes master starts from its own (older) progress and delivers again what the old master already
delivered -- duplicates, never losses.
"""

_LOGGING = """\
## Logging

Both servers log to stderr, one line per record; stdout carries only the ready line.

| option | values | effect |
|---|---|---|
| `--log-level` | `DEBUG`, `INFO` (default), `WARNING`, `ERROR` | threshold of the root logger |
| `--log-format` | `text` (default) | `2024-01-01 12:00:00,000 INFO [broker-a/0/ASYNC_MASTER] broker.controller: ...` |
| `--log-format` | `json` | one JSON object per line: `ts`, `level`, `broker` (brokers only), `logger`, `msg`, and `exc` with a traceback |

Every broker line names its broker as `brokerName/brokerId/ROLE`, so the logs of a cluster can be merged.
The SDK only logs through `logging.getLogger(__name__)` and installs no handler; the `splitmq` CLI logs to
stderr with `--debug`.
"""


def main(argv: list[str] | None = None) -> int:
    """Write ``docs/OPERATIONS.md``, or with ``--check`` compare it with the rendering (exit 1 on a difference)."""
    p = argparse.ArgumentParser(description="Render docs/OPERATIONS.md from the code.")
    p.add_argument("--check", action="store_true", help="exit 1 when docs/OPERATIONS.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is out of date; run: python docs/gen_operations.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
