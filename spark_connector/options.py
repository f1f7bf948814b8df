"""Option parsing and validation for the ``rocketmq`` Spark source and sink.

Spark hands a data source its options as a case-insensitive mapping whose keys arrive lower-cased and whose
values are all strings. Everything is validated here, on the driver, when ``load()`` calls ``schema()``, so a
bad option fails before any task runs and the message names the option as the user spelled it in the docs.
An unknown source option fails too, naming the nearest known one (a typo such as ``startingOffset`` would
otherwise read from the default position without a word); an unknown sink option only logs a warning.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import attrs

from client import ClientConfig, Credentials
from common.selector import EXPRESSION_TYPES, SQL92, TAG
from spark_connector.errors import OptionError
from spark_connector.offsets import (
    EARLIEST,
    LATEST,
    OffsetMap,
    OffsetSpec,
    parse_offsets_json,
    parse_timestamps_json,
)

log = logging.getLogger(__name__)

__all__ = [
    "OptionError",
    "SinkOptions",
    "SourceOptions",
    "parse_sink_options",
    "parse_source_options",
    "redacted",
]

PULL_FROM_CHOICES = ("auto", "master", "slave")
#: Pull defaults sized for analytical reads: large answers, several in flight (brokers cap what they send).
DEFAULT_PULL_BATCH_SIZE = 1024
DEFAULT_PULL_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_PULL_CONCURRENCY = 4
MAX_PULL_CONCURRENCY = 64
DEFAULT_SEND_CONCURRENCY = 4
#: Kafka's default ``maxTriggerDelay``: with ``minOffsetsPerTrigger``, a micro-batch runs at the latest this long
#: after the previous one, however little is new.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

#: Canonical (documented) spelling of every source option, keyed by its lower-cased form.
_SOURCE_KEYS = {
    k.lower(): k
    for k in (
        "nameserver", "namesrvAddr", "topic", "subscribe", "subscribePattern", "subExpression", "expressionType",
        "filterPushdown", "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp", "endingOffsets",
        "endingTimestamp", "endingOffsetsByTimestamp", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
        "maxTriggerDelay", "minPartitions", "maxRecordsPerPartition", "failOnDataLoss", "pullFrom", "slaveFallback",
        "pullBatchSize", "pullMaxBytes", "pullConcurrency", "pullTimeoutMs", "pullRetries", "retryBackoffMs",
        "includeProperties", "includeHeaders", "group", "commitOffsetsToBroker", "maxBatchRows", "maxBatchBytes",
        "path", "accessKey", "secretKey", "tlsCaFile",
    )
}
_SINK_KEYS = {
    k.lower(): k
    for k in ("nameserver", "namesrvAddr", "topic", "producerGroup", "sendTimeoutMs", "retries", "sendConcurrency",
              "idempotent", "path", "checkpointLocation", "accessKey", "secretKey", "tlsCaFile")
}
_CLIENT_PREFIX = "client."


#: Options whose values are never shown (lower-cased; Spark's own ``spark.redaction.regex`` hides them too).
_SECRET_OPTIONS = frozenset({"secretkey"})


def redacted(options: Mapping[str, Any]) -> dict[str, str]:
    """``options`` for display: the secret key's value replaced (for reprs, logs and plan strings)."""
    return {str(k): "<redacted>" if str(k).lower() in _SECRET_OPTIONS else str(v) for k, v in options.items()}


@attrs.frozen
class SourceOptions:
    """Validated options of a batch or streaming read."""

    nameserver: str
    """Nameserver addresses, ``;``-joined."""
    topics: tuple[str, ...] = ()
    """Topics to read (``topic`` or ``subscribe``); empty with ``subscribePattern``."""
    topic_pattern: str | None = None
    """``subscribePattern``: read every topic whose whole name matches this regular expression."""
    streaming: bool = False
    """Whether these options belong to a ``readStream`` (changes defaults and what is allowed)."""
    sub_expression: str = "*"
    """The subscription: a tag filter ``*`` / ``TagA || TagB``, or an SQL92 filter with ``expression_type``."""
    expression_type: str = TAG
    """``TAG`` or ``SQL92`` (``expressionType``): how the brokers read ``sub_expression``."""
    filter_pushdown: bool = True
    """Batch reads: hand Spark's filters on tags, keys, store times, offsets and queues to the brokers."""
    starting_offsets: OffsetSpec = EARLIEST
    """``"earliest"``, ``"latest"`` or ``{(topic, brokerName, queueId): offset}`` with -2/-1 markers."""
    starting_timestamp_ms: int | None = None
    """Start each queue at the first message stored at or after this time; beats the two below."""
    starting_offsets_by_timestamp: OffsetMap | None = None
    """``startingOffsetsByTimestamp``: per queue, the time to start at; beats ``starting_offsets`` for the queues it
    names."""
    ending_offsets: OffsetSpec = LATEST
    """Batch only: ``"latest"`` or a JSON map (-1 = latest)."""
    ending_timestamp_ms: int | None = None
    """Batch only: end each queue at the first message stored at or after this time."""
    ending_offsets_by_timestamp: OffsetMap | None = None
    """Batch only, ``endingOffsetsByTimestamp``: per queue, the time to end at."""
    max_offsets_per_trigger: int | None = None
    """Streaming: the most offsets per micro-batch, prorated by backlog."""
    min_offsets_per_trigger: int | None = None
    """Streaming: skip a trigger while fewer offsets than this are new (at most ``max_trigger_delay_ms``)."""
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    """Streaming, with ``min_offsets_per_trigger``: the longest a micro-batch waits for that many."""
    min_partitions: int | None = None
    """Split queue ranges so the task count reaches about this many."""
    max_records_per_partition: int | None = None
    """Split any queue range larger than this many offsets."""
    fail_on_data_loss: bool = True
    """Fail when planned offsets are gone (expired or a queue vanished); else warn and skip."""
    pull_from: str = "auto"
    """``auto`` (follow broker suggestions), ``master`` (broker id 0 only) or ``slave`` (prefer id 1)."""
    slave_fallback: bool = True
    """Pull from a slave of the group when its master is unreachable."""
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    """``maxNums`` of each pull request (the broker may cap it: ``maxTransferCountOnMessageInMemory``)."""
    pull_max_bytes: int = DEFAULT_PULL_MAX_BYTES
    """``maxBytes`` of each pull request (the broker may cap it: ``maxTransferBytesOnMessageInMemory``)."""
    pull_concurrency: int = DEFAULT_PULL_CONCURRENCY
    """Pulls one task keeps in flight (consecutive offset windows of its range; answers used in order)."""
    pull_timeout_s: float = 10.0
    """Timeout of each pull request."""
    pull_retries: int = 3
    """Failed attempts per pull (with a route refresh) before the task fails."""
    retry_backoff_s: float = 0.5
    """Pause between pull retries."""
    include_properties: bool = False
    """Add the ``properties map<string,string>`` column."""
    group: str | None = None
    """Consumer group used only to report progress with ``commit_offsets_to_broker``."""
    commit_offsets_to_broker: bool = False
    """Streaming: write each committed end offset to the master as ``group``'s consumer offset."""
    max_batch_rows: int = 4096
    """Row cap of each Arrow batch that ``read()`` yields."""
    max_batch_bytes: int = 8 * 1024 * 1024
    """Byte cap (message bodies and properties) of each Arrow batch that ``read()`` yields."""
    client: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    """``client.*`` options with the prefix removed, passed through to the SDK."""
    credentials: Credentials | None = None
    """``accessKey``/``secretKey``: the account every request is signed with (its repr hides the secret)."""
    tls_ca_file: str | None = None
    """``tlsCaFile``: TLS on every connection, servers verified against this CA file (None: plain HTTP)."""

    def client_config(self) -> ClientConfig | None:
        """The SDK configuration of ``accessKey``/``secretKey`` and ``tlsCaFile`` (None when neither is set)."""
        if self.credentials is None and self.tls_ca_file is None:
            return None
        return ClientConfig(credentials=self.credentials, tls_ca_file=self.tls_ca_file)

    @property
    def topic(self) -> str:
        """The one topic of a single-topic read (the first of several).

        Raises:
            ValueError: the read names no topic (``subscribePattern``).
        """
        if not self.topics:
            raise ValueError(f"subscribePattern {self.topic_pattern!r} names no single topic")
        return self.topics[0]

    def describe_topics(self) -> str:
        """The topics as a message names them."""
        if self.topic_pattern is not None:
            return f"topics matching {self.topic_pattern!r}"
        return ("topic " if len(self.topics) == 1 else "topics ") + ", ".join(self.topics)


@attrs.frozen
class SinkOptions:
    """Validated options of a batch or streaming write."""

    nameserver: str
    """Nameserver addresses, ``;``-joined."""
    topic: str | None = None
    """Destination topic; overrides a ``topic`` column."""
    producer_group: str = "spark-producer"
    """Producer group name."""
    send_timeout_s: float = 3.0
    """Timeout of each send."""
    retries: int = 2
    """Retries of a failed send (the SDK's ``retry_times_when_send_failed``)."""
    send_concurrency: int = DEFAULT_SEND_CONCURRENCY
    """Send requests one write task keeps in flight."""
    idempotent: bool = True
    """``idempotent``: deterministic row keys sent with the idempotent bit (exactly-once through replays within the
    brokers' duplicate window); False: random keys, at-least-once."""
    client: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    """``client.*`` options with the prefix removed."""
    credentials: Credentials | None = None
    """``accessKey``/``secretKey``: the account every request is signed with (its repr hides the secret)."""
    tls_ca_file: str | None = None
    """``tlsCaFile``: TLS on every connection, servers verified against this CA file (None: plain HTTP)."""


class _Reader:
    """Typed access to a lower-cased option mapping; each getter names the option in its error.

    Args:
        options: Spark's option mapping.
        known: the documented options, keyed by their lower-cased spelling.
        strict: an unknown option is an :class:`OptionError` (the source) rather than a warning (the sink).
    """

    def __init__(self, options: Mapping[str, Any], known: Mapping[str, str], *, strict: bool) -> None:
        self.values: dict[str, str] = {}
        self.client: dict[str, str] = {}
        unknown: list[str] = []
        for key, value in options.items():
            low = str(key).lower()
            if low.startswith(_CLIENT_PREFIX) and len(low) > len(_CLIENT_PREFIX):
                self.client[str(key)[len(_CLIENT_PREFIX):]] = str(value)
            elif low in known:
                self.values[low] = "" if value is None else str(value)
            else:
                unknown.append(str(key))
        if unknown and strict:
            hints = []
            for name in sorted(unknown):
                near = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.6)
                hints.append(f"{name} (did you mean {known[near[0]]}?)" if near else name)
            raise OptionError(f"unknown rocketmq source option {', '.join(hints)}: remove it or fix its name "
                              f"(every option is in docs/SPARK.md, client.* passes SDK settings through)")
        if unknown:
            log.warning("rocketmq: ignoring unknown option(s) %s; known options: %s",
                        ", ".join(sorted(unknown)), ", ".join(sorted(known.values())))

    def has(self, name: str) -> bool:
        return name.lower() in self.values

    def get_str(self, name: str, default: str | None = None) -> str | None:
        v = self.values.get(name.lower())
        if v is None:
            return default
        v = v.strip()
        if not v:
            raise OptionError(f"option {name} is empty")
        return v

    def get_int(self, name: str, default: int | None = None, *, minimum: int | None = None) -> int | None:
        v = self.get_str(name)
        if v is None:
            return default
        try:
            n = int(v)
        except ValueError:
            raise OptionError(f"option {name} must be an integer, got {v!r}") from None
        if minimum is not None and n < minimum:
            raise OptionError(f"option {name} must be >= {minimum}, got {n}")
        return n

    def get_bool(self, name: str, default: bool) -> bool:
        v = self.get_str(name)
        if v is None:
            return default
        low = v.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise OptionError(f"option {name} must be true or false, got {v!r}")


def _nameserver(r: _Reader) -> str:
    raw = r.get_str("nameserver") or r.get_str("namesrvAddr")
    if raw is None:
        raise OptionError("option nameserver is required (host:port[;host:port]); alias namesrvAddr")
    addrs = [a.strip() for a in raw.replace(",", ";").split(";") if a.strip()]
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option nameserver: {a!r} is not host:port")
    if not addrs:
        raise OptionError("option nameserver is empty")
    return ";".join(addrs)


def _tls_ca_file(r: _Reader) -> str | None:
    """``tlsCaFile``: a CA file that exists here (the driver); the executors need it at the same path."""
    path = r.get_str("tlsCaFile")
    if path is not None and not os.path.isfile(path):
        raise OptionError(f"option tlsCaFile: no such file {path!r} (it must exist at that path on the driver and "
                          f"on every executor)")
    return path


def _credentials(r: _Reader) -> Credentials | None:
    """``accessKey`` and ``secretKey``: both or neither. No error names the secret's value (nor the access key's:
    a user may have swapped them)."""
    access_key, secret_key = r.get_str("accessKey"), r.get_str("secretKey")
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        missing = "accessKey" if access_key is None else "secretKey"
        raise OptionError(f"option {missing} is required with option "
                          f"{'secretKey' if missing == 'accessKey' else 'accessKey'}")
    try:
        return Credentials(access_key, secret_key)
    except ValueError as e:
        raise OptionError(f"option accessKey/secretKey: {e}") from None


def _checked_topic(name: str, topic: str) -> str:
    from common.properties import validate_topic

    try:
        validate_topic(topic)
    except Exception as e:
        raise OptionError(f"option {name}: {e}") from None
    return topic


def _topic(r: _Reader, *, required: bool) -> str | None:
    topic = r.get_str("topic")
    if topic is None:
        if required:
            raise OptionError("option topic is required")
        return None
    if "," in topic:
        raise OptionError(f"option topic names one topic, got {topic!r}: use option subscribe for several")
    return _checked_topic("topic", topic)


def _source_topics(r: _Reader) -> tuple[tuple[str, ...], str | None]:
    """``(topics, pattern)`` from exactly one of ``topic``, ``subscribe`` and ``subscribePattern``."""
    given = [name for name in ("topic", "subscribe", "subscribePattern") if r.has(name)]
    if not given:
        raise OptionError("option topic is required (or subscribe=T1,T2, or subscribePattern=regex)")
    if len(given) > 1:
        raise OptionError(f"options {' and '.join(given)} both choose the topics: give only one of topic, "
                          "subscribe and subscribePattern")
    if given[0] == "topic":
        topic = _topic(r, required=True)
        assert topic is not None
        return (topic,), None
    if given[0] == "subscribe":
        raw = r.get_str("subscribe") or ""
        topics = [t.strip() for t in raw.split(",") if t.strip()]
        if not topics:
            raise OptionError(f"option subscribe names no topic: {raw!r} (comma-separated topic names)")
        if len(set(topics)) != len(topics):
            raise OptionError(f"option subscribe names a topic twice: {raw!r}")
        return tuple(sorted(_checked_topic("subscribe", t) for t in topics)), None
    pattern = r.get_str("subscribePattern") or ""
    try:
        re.compile(pattern)
    except re.error as e:
        raise OptionError(f"option subscribePattern {pattern!r} is not a regular expression: {e}") from None
    return (), pattern


_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|min|h|d)?$")
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(r: _Reader, name: str, default: int) -> int:
    """A duration as Spark writes them (``15m``, ``30s``, ``500ms``, ``2h``; a bare number is milliseconds)."""
    v = r.get_str(name)
    if v is None:
        return default
    m = _DURATION.match(v.strip().lower())
    if m is None:
        raise OptionError(f"option {name} must be a duration such as 15m, 30s or 500ms, got {v!r}")
    return int(m.group(1)) * _DURATION_MS[m.group(2)]


def _timestamps_option(r: _Reader, name: str) -> OffsetMap | None:
    v = r.get_str(name)
    if v is None:
        return None
    try:
        return parse_timestamps_json(json.loads(v))
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name} is not valid JSON: {e}") from None
    except ValueError as e:
        raise OptionError(f"option {name}: {e}") from None


def _subscription(r: _Reader) -> tuple[str, str]:
    """``(subExpression, expressionType)``; an SQL92 expression is parsed here, so a bad one fails at load()."""
    expression_type = (r.get_str("expressionType", TAG) or TAG).upper()
    if expression_type not in EXPRESSION_TYPES:
        raise OptionError(f"option expressionType must be TAG or SQL92, got {expression_type!r}")
    sub = r.get_str("subExpression", "*") or "*"
    if expression_type == SQL92:
        from common.sql92 import SqlFilterError, compile_sql

        try:
            compile_sql(sub)
        except SqlFilterError as e:
            raise OptionError(f"option subExpression is not an SQL92 filter: {e}") from None
    return sub, expression_type


def _include_properties(r: _Reader) -> bool:
    props = r.get_bool("includeProperties", False) if r.has("includeProperties") else None
    headers = r.get_bool("includeHeaders", False) if r.has("includeHeaders") else None
    if props is not None and headers is not None and props != headers:
        raise OptionError("options includeHeaders and includeProperties disagree: they are the same switch (the "
                          "properties column holds RocketMQ's user properties, Kafka's headers); give one")
    return bool(props if props is not None else headers)


def _concurrency(r: _Reader, name: str, default: int) -> int:
    n = r.get_int(name, default, minimum=1) or default
    if n > MAX_PULL_CONCURRENCY:
        raise OptionError(f"option {name} must be <= {MAX_PULL_CONCURRENCY}, got {n}")
    return n


def _offset_option(r: _Reader, name: str, default: OffsetSpec, *, allow: tuple[str, ...]) -> OffsetSpec:
    v = r.get_str(name)
    if v is None:
        return default
    low = v.lower()
    if low in (EARLIEST, LATEST):
        if low not in allow:
            raise OptionError(f"option {name}: {low!r} is not allowed here; use {' or '.join(allow)} or JSON")
        return low
    if not v.startswith("{"):
        raise OptionError(f"option {name} must be {' | '.join(allow)} or JSON "
                          f'{{"topic":{{"brokerName":{{"queueId":offset}}}}}}, got {v!r}')
    allow_earliest = EARLIEST in allow
    try:
        return parse_offsets_json(json.loads(v), allow_earliest=allow_earliest)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name} is not valid JSON: {e}") from None
    except ValueError as e:
        raise OptionError(f"option {name}: {e}") from None


def parse_source_options(options: Mapping[str, Any], *, streaming: bool | None) -> SourceOptions:
    """Validate the options of a ``spark.read`` / ``spark.readStream`` on format ``rocketmq``.

    Args:
        options: Spark's option mapping (keys in any case, values strings).
        streaming: True for ``readStream``, False for ``read``, None when not known yet (``schema()``):
            then only the checks that hold for both run.

    Returns:
        The validated options.

    Raises:
        OptionError: a required option is missing or a value is malformed; the message names the option.
    """
    r = _Reader(options, _SOURCE_KEYS, strict=True)
    topics, pattern = _source_topics(r)
    nameserver = _nameserver(r)
    starting: OffsetSpec
    ending: OffsetSpec
    if streaming is None:  # schema() at load(): the mode is not known yet, so accept what either allows
        starting = _offset_option(r, "startingOffsets", EARLIEST, allow=(EARLIEST, LATEST))
        ending = _offset_option(r, "endingOffsets", LATEST, allow=(LATEST,))
    elif streaming:
        for batch_only in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if r.has(batch_only):
                raise OptionError(f"option {batch_only} is for batch reads only; a stream has no end")
        starting = _offset_option(r, "startingOffsets", LATEST, allow=(EARLIEST, LATEST))
        ending = LATEST
    else:
        for stream_only in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                            "commitOffsetsToBroker"):
            if r.has(stream_only):
                raise OptionError(f"option {stream_only} is for streaming reads only")
        starting = _offset_option(r, "startingOffsets", EARLIEST, allow=(EARLIEST,))
        ending = _offset_option(r, "endingOffsets", LATEST, allow=(LATEST,))
    if isinstance(ending, dict) and any(v == -2 for v in ending.values()):
        raise OptionError("option endingOffsets: -2 (earliest) is not allowed as an end")
    pull_from = (r.get_str("pullFrom", "auto") or "auto").lower()
    if pull_from not in PULL_FROM_CHOICES:
        raise OptionError(f"option pullFrom must be one of {', '.join(PULL_FROM_CHOICES)}, got {pull_from!r}")
    sub, expression_type = _subscription(r)
    max_per_trigger = r.get_int("maxOffsetsPerTrigger", None, minimum=1)
    min_per_trigger = r.get_int("minOffsetsPerTrigger", None, minimum=1)
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise OptionError(f"option minOffsetsPerTrigger={min_per_trigger} is above maxOffsetsPerTrigger="
                          f"{max_per_trigger}: a micro-batch could never run")
    if r.has("maxTriggerDelay") and min_per_trigger is None:
        raise OptionError("option maxTriggerDelay only bounds the wait of minOffsetsPerTrigger: set that too")
    commit = r.get_bool("commitOffsetsToBroker", False)
    group = r.get_str("group")
    if commit and group is None:
        raise OptionError("option commitOffsetsToBroker=true needs option group (the consumer group to report)")
    if group is not None:
        from common.properties import validate_group

        try:
            validate_group(group)
        except Exception as e:
            raise OptionError(f"option group: {e}") from None
    timeout_ms = r.get_int("pullTimeoutMs", 10_000, minimum=1)
    backoff_ms = r.get_int("retryBackoffMs", 500, minimum=0)
    return SourceOptions(
        nameserver=nameserver,
        topics=topics,
        topic_pattern=pattern,
        streaming=bool(streaming),
        sub_expression=sub,
        expression_type=expression_type,
        filter_pushdown=r.get_bool("filterPushdown", True),
        starting_offsets=starting,
        starting_timestamp_ms=r.get_int("startingTimestamp", None, minimum=0),
        starting_offsets_by_timestamp=_timestamps_option(r, "startingOffsetsByTimestamp"),
        ending_offsets=ending,
        ending_timestamp_ms=r.get_int("endingTimestamp", None, minimum=0),
        ending_offsets_by_timestamp=_timestamps_option(r, "endingOffsetsByTimestamp"),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(r, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=r.get_int("minPartitions", None, minimum=1),
        max_records_per_partition=r.get_int("maxRecordsPerPartition", None, minimum=1),
        fail_on_data_loss=r.get_bool("failOnDataLoss", True),
        pull_from=pull_from,
        slave_fallback=r.get_bool("slaveFallback", True),
        pull_batch_size=r.get_int("pullBatchSize", DEFAULT_PULL_BATCH_SIZE, minimum=1) or DEFAULT_PULL_BATCH_SIZE,
        pull_max_bytes=r.get_int("pullMaxBytes", DEFAULT_PULL_MAX_BYTES, minimum=1024) or DEFAULT_PULL_MAX_BYTES,
        pull_concurrency=_concurrency(r, "pullConcurrency", DEFAULT_PULL_CONCURRENCY),
        pull_timeout_s=(timeout_ms or 10_000) / 1000.0,
        pull_retries=r.get_int("pullRetries", 3, minimum=0) or 0,
        retry_backoff_s=(backoff_ms or 0) / 1000.0,
        include_properties=_include_properties(r),
        group=group,
        commit_offsets_to_broker=commit,
        max_batch_rows=r.get_int("maxBatchRows", 4096, minimum=1) or 4096,
        max_batch_bytes=r.get_int("maxBatchBytes", 8 * 1024 * 1024, minimum=1024) or 8 * 1024 * 1024,
        client=r.client,
        credentials=_credentials(r),
        tls_ca_file=_tls_ca_file(r),
    )


def parse_sink_options(options: Mapping[str, Any], *, app_name: str = "app") -> SinkOptions:
    """Validate the options of a ``df.write`` / ``df.writeStream`` on format ``rocketmq``.

    Args:
        options: Spark's option mapping.
        app_name: used in the default producer group ``spark-producer-<app>``.

    Raises:
        OptionError: a required option is missing or a value is malformed.
    """
    r = _Reader(options, _SINK_KEYS, strict=False)
    nameserver = _nameserver(r)
    topic = _topic(r, required=False)
    safe_app = "".join(c if c.isalnum() or c in "_-" else "_" for c in app_name)[:100] or "app"
    group = r.get_str("producerGroup", f"spark-producer-{safe_app}") or "spark-producer"
    from common.properties import validate_group

    try:
        validate_group(group)
    except Exception as e:
        raise OptionError(f"option producerGroup: {e}") from None
    return SinkOptions(
        nameserver=nameserver,
        topic=topic,
        producer_group=group,
        send_timeout_s=(r.get_int("sendTimeoutMs", 3000, minimum=1) or 3000) / 1000.0,
        retries=r.get_int("retries", 2, minimum=0) or 0,
        send_concurrency=_concurrency(r, "sendConcurrency", DEFAULT_SEND_CONCURRENCY),
        idempotent=r.get_bool("idempotent", True),
        client=r.client,
        credentials=_credentials(r),
        tls_ca_file=_tls_ca_file(r),
    )
