"""The Spark ceiling row of ``python -m benchmarks spark``: a source that costs nothing reads the connector's schema,
every row it promises."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import spark_bench
from spark_connector.arrow import spark_schema

pytestmark = [pytest.mark.spark]


def test_the_prebuilt_source_yields_every_row_in_the_connector_schema(spark: Any) -> None:
    rate = spark_bench.bench_spark_floor(spark, 3 * 4096 * 2, partitions=2)
    df = spark.read.format("splitmq-prebuilt").option("partitions", "3").option("batches", "2").load()
    assert df.schema == spark_schema(False)
    assert df.count() == 3 * 2 * 4096
    assert df.where("queueId = 0 and length(body) = 1024").count() == 3 * 2 * 4096
    assert rate > 0
