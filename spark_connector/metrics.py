"""Streaming metrics of a ``rocketmq`` source: Kafka's offsets-behind-latest and the share of rows slaves served.

Kafka's source fills ``progress["sources"][i]["metrics"]`` through Spark's ``ReportsSourceMetrics``. A Python data
source cannot: PySpark 4's ``DataSourceStreamReader`` has no such hook (the JVM side,
``PythonMicroBatchStream``, does not implement it), so that map stays ``{}``. The same figures come from what the
progress does carry:

* **offsets behind latest** -- the connector reports each micro-batch's latest offsets
  (``reportLatestOffset``), which Spark puts in the progress as ``latestOffset`` next to the batch's
  ``endOffset``; :func:`source_metrics` computes Kafka's ``minOffsetsBehindLatest``, ``avgOffsetsBehindLatest``
  and ``maxOffsetsBehindLatest`` from the two, per queue, as Kafka does per partition;
* **rows served by slaves** -- every row carries ``servedBy`` (the broker id that answered its pull); the
  per-batch counts come from Spark's own observed metrics, which :func:`with_read_metrics` adds to the stream
  (``progress["observedMetrics"]``); :func:`source_metrics` adds ``rowsFromSlaves`` and ``slaveRowShare``.

::

    df = spark_connector.with_read_metrics(spark.readStream.format("rocketmq")...load())
    q = df.writeStream...start()
    ...
    spark_connector.source_metrics(q.lastProgress)
    # {"minOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "12.5", "maxOffsetsBehindLatest": "40",
    #  "rows": "100", "rowsFromSlaves": "100", "slaveRowShare": "1.0"}

Values are strings, as in Kafka's metrics map.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_connector.offsets import offsets_from_json

__all__ = ["OBSERVATION", "behind_latest", "source_metrics", "with_read_metrics"]

#: The name :func:`with_read_metrics` observes under.
OBSERVATION = "rocketmq"


def with_read_metrics(df: Any, name: str = OBSERVATION) -> Any:
    """``df`` (a ``rocketmq`` read, before any filter) observed per micro-batch: ``rows`` and ``rowsFromSlaves``
    (rows whose ``servedBy`` is a slave's id) land in the progress's ``observedMetrics[name]``."""
    from pyspark.sql import functions as F

    return df.observe(name, F.count(F.lit(1)).alias("rows"),
                      F.count(F.when(F.col("servedBy") > 0, 1)).alias("rowsFromSlaves"))


def _doc(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def behind_latest(end: Any, latest: Any) -> dict[str, str]:
    """Kafka's three offsets-behind-latest metrics from a source's ``endOffset`` and ``latestOffset`` (JSON text
    or parsed); empty when either is missing."""
    end_doc, latest_doc = _doc(end), _doc(latest)
    if not isinstance(end_doc, Mapping) or not isinstance(latest_doc, Mapping):
        return {}
    try:
        ends, latests = offsets_from_json(end_doc), offsets_from_json(latest_doc)
    except ValueError:
        return {}
    behind = [max(0, v - ends.get(k, 0)) for k, v in latests.items()]
    if not behind:
        return {}
    return {"minOffsetsBehindLatest": str(min(behind)), "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
            "maxOffsetsBehindLatest": str(max(behind))}


def _observed(progress: Mapping[str, Any], name: str) -> dict[str, str]:
    row = (progress.get("observedMetrics") or {}).get(name)
    if row is None:
        return {}
    values = row.asDict() if hasattr(row, "asDict") else dict(row)
    rows, slaves = int(values.get("rows") or 0), int(values.get("rowsFromSlaves") or 0)
    return {"rows": str(rows), "rowsFromSlaves": str(slaves),
            "slaveRowShare": str(slaves / rows) if rows else "0.0"}


def source_metrics(progress: Mapping[str, Any] | None, name: str = OBSERVATION) -> dict[str, str]:
    """Kafka-named metrics of the ``rocketmq`` source of one micro-batch's progress (``query.lastProgress``).

    Args:
        progress: the progress (a ``StreamingQueryProgress`` or its dict); None gives ``{}``.
        name: the observation of :func:`with_read_metrics`.

    Returns:
        ``minOffsetsBehindLatest``, ``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` (over every queue of
        the first source whose offsets are the connector's), and with :func:`with_read_metrics` ``rows``,
        ``rowsFromSlaves`` and ``slaveRowShare``.
    """
    if progress is None:
        return {}
    out: dict[str, str] = {}
    for source in progress.get("sources") or []:
        found = behind_latest(source.get("endOffset"), source.get("latestOffset"))
        if found:
            out.update(found)
            break
    out.update(_observed(progress, name))
    return out
