"""PySpark connector for SplitMQ: the ``rocketmq`` Python data source (batch and streaming, read and write).

::

    import spark_connector
    spark_connector.register(spark)
    df = (spark.read.format("rocketmq").option("nameserver", "HOST:PORT").option("topic", "T").load())

Reads have a fixed schema (see :func:`spark_connector.arrow.spark_schema`); writes take ``body`` plus optional
``topic``, ``tags``, ``keys``, ``properties``, ``queueId`` and ``brokerName`` columns with ``mode("append")``.

Every source and sink option, with its default, the read schema, how to run on a cluster (``PYSPARK_PYTHON``,
``--py-files``, broker addresses the executors can reach) and how to tune brokers for analytical reads are in
docs/SPARK.md; :mod:`spark_connector.options` validates them. Streaming metrics in Kafka's names:
:func:`source_metrics` (with :func:`with_read_metrics` for the rows slaves served).
"""

from __future__ import annotations

from typing import Any

from spark_connector.errors import ConnectorError, DataLossError, OptionError
from spark_connector.metrics import source_metrics, with_read_metrics
from spark_connector.source import RocketMQDataSource

__all__ = ["FORMAT", "ConnectorError", "DataLossError", "OptionError", "RocketMQDataSource", "register",
           "source_metrics", "with_read_metrics"]

#: The format name to use with ``spark.read.format(...)``.
FORMAT = "rocketmq"


#: The Spark setting that lets a Python data source take filters (``pushFilters``); off, Spark refuses to plan a
#: read whose reader has ``pushFilters`` at all.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, check_workers: bool = True, filter_pushdown: bool = True) -> None:
    """Register :class:`RocketMQDataSource` with ``spark`` under the format name ``"rocketmq"``.

    Args:
        spark: the SparkSession.
        check_workers: first check that the interpreter Spark starts for its Python workers (``PYSPARK_PYTHON``
            when the session was created) can import the connector, and fail with a message saying what to set
            if not (otherwise every ``load()`` fails later with a bare ``ModuleNotFoundError``). Skipped when
            packages are shipped with ``spark.submit.pyFiles`` / ``spark.archives`` or on Spark Connect.
        filter_pushdown: set ``spark.sql.python.filterPushdown.enabled=true`` on the session, so batch reads
            hand their filters to the brokers (docs/SPARK.md, "Filter pushdown"). It only concerns Python data
            sources. With False the setting is left alone; if it is off, read with option
            ``filterPushdown=false`` (Spark refuses a reader that takes filters while it is off).

    Raises:
        RuntimeError: the workers' interpreter cannot run the connector (the message says what to do).
    """
    if check_workers:
        problem = _worker_problem(spark)
        if problem:
            raise RuntimeError(problem)
    if filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(RocketMQDataSource)


def _worker_problem(spark: Any) -> str | None:
    import sys

    from spark_connector.workers import worker_python_problem

    try:
        sc = spark.sparkContext
        python_exec = sc.pythonExec
        conf = sc.getConf()
    except Exception:  # Spark Connect has no SparkContext here: nothing to check on this side
        return None
    shipped = bool(conf.get("spark.submit.pyFiles", "") or conf.get("spark.archives", ""))
    return worker_python_problem(str(python_exec), sys.executable, shipped=shipped)
