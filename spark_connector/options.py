"""Option parsing and validation for the ``rocketmq`` Spark source and sink.

Spark hands a data source its options as a case-insensitive mapping whose keys arrive lower-cased and whose
values are all strings. Everything is validated here, on the driver, when ``load()`` calls ``schema()``, so a
bad option fails before any task runs and the message names the option as the user spelled it in the docs.
Unknown options only log a warning (a typo should be visible, but must not break a job).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import attrs

from client import ClientConfig, Credentials
from spark_connector.offsets import EARLIEST, LATEST, OffsetSpec, parse_offsets_json

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

#: Canonical (documented) spelling of every source option, keyed by its lower-cased form.
_SOURCE_KEYS = {
    k.lower(): k
    for k in (
        "nameserver", "namesrvAddr", "topic", "subExpression", "startingOffsets", "startingTimestamp",
        "endingOffsets", "endingTimestamp", "maxOffsetsPerTrigger", "minPartitions", "maxRecordsPerPartition",
        "failOnDataLoss", "pullFrom", "slaveFallback", "pullBatchSize", "pullMaxBytes", "pullConcurrency",
        "pullTimeoutMs", "pullRetries",
        "retryBackoffMs", "includeProperties", "group", "commitOffsetsToBroker", "maxBatchRows",
        "maxBatchBytes", "path", "accessKey", "secretKey", "tlsCaFile",
    )
}
_SINK_KEYS = {
    k.lower(): k
    for k in ("nameserver", "namesrvAddr", "topic", "producerGroup", "sendTimeoutMs", "retries", "sendConcurrency",
              "path", "accessKey", "secretKey", "tlsCaFile")
}
_CLIENT_PREFIX = "client."


#: Options whose values are never shown (lower-cased; Spark's own ``spark.redaction.regex`` hides them too).
_SECRET_OPTIONS = frozenset({"secretkey"})


def redacted(options: Mapping[str, Any]) -> dict[str, str]:
    """``options`` for display: the secret key's value replaced (for reprs, logs and plan strings)."""
    return {str(k): "<redacted>" if str(k).lower() in _SECRET_OPTIONS else str(v) for k, v in options.items()}


class OptionError(ValueError):
    """A ``rocketmq`` source or sink option is missing or has a bad value; the message names the option."""


@attrs.frozen
class SourceOptions:
    """Validated options of a batch or streaming read."""

    nameserver: str
    """Nameserver addresses, ``;``-joined."""
    topic: str
    """Topic to read."""
    streaming: bool = False
    """Whether these options belong to a ``readStream`` (changes defaults and what is allowed)."""
    sub_expression: str = "*"
    """Tag filter, ``*`` or ``TagA || TagB``."""
    starting_offsets: OffsetSpec = EARLIEST
    """``"earliest"``, ``"latest"`` or ``{(topic, brokerName, queueId): offset}`` with -2/-1 markers."""
    starting_timestamp_ms: int | None = None
    """Start each queue at the first message stored at or after this time; beats ``starting_offsets``."""
    ending_offsets: OffsetSpec = LATEST
    """Batch only: ``"latest"`` or a JSON map (-1 = latest)."""
    ending_timestamp_ms: int | None = None
    """Batch only: end each queue at the first message stored at or after this time."""
    max_offsets_per_trigger: int | None = None
    """Streaming: the most offsets per micro-batch, prorated by backlog."""
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
    client: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: dict(sorted(m.items())))
    """``client.*`` options with the prefix removed."""
    credentials: Credentials | None = None
    """``accessKey``/``secretKey``: the account every request is signed with (its repr hides the secret)."""
    tls_ca_file: str | None = None
    """``tlsCaFile``: TLS on every connection, servers verified against this CA file (None: plain HTTP)."""


class _Reader:
    """Typed access to a lower-cased option mapping; each getter names the option in its error."""

    def __init__(self, options: Mapping[str, Any], known: Mapping[str, str]) -> None:
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


def _topic(r: _Reader, *, required: bool) -> str | None:
    topic = r.get_str("topic")
    if topic is None:
        if required:
            raise OptionError("option topic is required")
        return None
    if "," in topic:
        raise OptionError(f"option topic: one topic per query is supported, got {topic!r}")
    from common.properties import validate_topic

    try:
        validate_topic(topic)
    except Exception as e:
        raise OptionError(f"option topic: {e}") from None
    return topic


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
    r = _Reader(options, _SOURCE_KEYS)
    topic = _topic(r, required=True)
    assert topic is not None
    nameserver = _nameserver(r)
    starting: OffsetSpec
    ending: OffsetSpec
    if streaming is None:  # schema() at load(): the mode is not known yet, so accept what either allows
        starting = _offset_option(r, "startingOffsets", EARLIEST, allow=(EARLIEST, LATEST))
        ending = _offset_option(r, "endingOffsets", LATEST, allow=(LATEST,))
    elif streaming:
        for batch_only in ("endingOffsets", "endingTimestamp"):
            if r.has(batch_only):
                raise OptionError(f"option {batch_only} is for batch reads only; a stream has no end")
        starting = _offset_option(r, "startingOffsets", LATEST, allow=(EARLIEST, LATEST))
        ending = LATEST
    else:
        for stream_only in ("maxOffsetsPerTrigger", "commitOffsetsToBroker"):
            if r.has(stream_only):
                raise OptionError(f"option {stream_only} is for streaming reads only")
        starting = _offset_option(r, "startingOffsets", EARLIEST, allow=(EARLIEST,))
        ending = _offset_option(r, "endingOffsets", LATEST, allow=(LATEST,))
    if isinstance(ending, dict) and any(v == -2 for v in ending.values()):
        raise OptionError("option endingOffsets: -2 (earliest) is not allowed as an end")
    pull_from = (r.get_str("pullFrom", "auto") or "auto").lower()
    if pull_from not in PULL_FROM_CHOICES:
        raise OptionError(f"option pullFrom must be one of {', '.join(PULL_FROM_CHOICES)}, got {pull_from!r}")
    sub = r.get_str("subExpression", "*") or "*"
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
        topic=topic,
        streaming=bool(streaming),
        sub_expression=sub,
        starting_offsets=starting,
        starting_timestamp_ms=r.get_int("startingTimestamp", None, minimum=0),
        ending_offsets=ending,
        ending_timestamp_ms=r.get_int("endingTimestamp", None, minimum=0),
        max_offsets_per_trigger=r.get_int("maxOffsetsPerTrigger", None, minimum=1),
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
        include_properties=r.get_bool("includeProperties", False),
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
    r = _Reader(options, _SINK_KEYS)
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
        client=r.client,
        credentials=_credentials(r),
        tls_ca_file=_tls_ca_file(r),
    )
