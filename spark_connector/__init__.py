"""PySpark connector for SplitMQ: the ``rocketmq`` Python data source (batch and streaming, read and write).

::

    import spark_connector
    spark_connector.register(spark)
    df = (spark.read.format("rocketmq").option("nameserver", "127.0.0.1:9876").option("topic", "T").load())

Reads have a fixed schema (see :func:`spark_connector.arrow.spark_schema`); writes take ``body`` plus optional
``topic``, ``tags``, ``keys``, ``properties``, ``queueId`` and ``brokerName`` columns with ``mode("append")``.
"""

from __future__ import annotations

from typing import Any

from spark_connector.source import RocketMQDataSource

__all__ = ["FORMAT", "RocketMQDataSource", "register"]

#: The format name to use with ``spark.read.format(...)``.
FORMAT = "rocketmq"


def register(spark: Any) -> None:
    """Register :class:`RocketMQDataSource` with ``spark`` under the format name ``"rocketmq"``."""
    spark.dataSource.register(RocketMQDataSource)
