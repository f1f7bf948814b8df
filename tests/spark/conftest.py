"""Fixtures of the Spark connector tests: stored-record builders, one Spark session, one local cluster.

The Spark session is session-scoped (starting one costs ~10 s): every test marked ``spark`` shares it. When
Java is missing, Spark tests fail with a message saying so rather than silently skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from common.codec import encode_properties, pack_host, record_size, write_record
from common.properties import KEYS, TAGS, UNIQ_KEY

RecordSpec = dict[str, Any]


def build_records(specs: Sequence[RecordSpec], *, topic: str = "T", queue_id: int = 0, first_offset: int = 0,
                  v6: bool = False) -> bytes:
    """Stored commit-log records back to back, as a pull response carries them.

    Each spec may set ``body`` (bytes), ``tags``, ``keys`` (str), ``uniq`` (str), ``props`` (dict), ``born_ms``,
    ``store_ms``, ``flag``, ``reconsume``; offsets count up from ``first_offset``.
    """
    buf = bytearray()
    pos = 0
    born = pack_host("::1", 5555) if v6 else pack_host("10.0.0.7", 5555)
    store = pack_host("127.0.0.1", 10911)
    for i, s in enumerate(specs):
        props = dict(s.get("props", {}))
        if s.get("tags") is not None:
            props[TAGS] = s["tags"]
        if s.get("keys") is not None:
            props[KEYS] = s["keys"]
        if s.get("uniq") is not None:
            props[UNIQ_KEY] = s["uniq"]
        raw_props = encode_properties(props)
        body = s.get("body", f"m{first_offset + i}".encode())
        size = record_size(len(body), len(topic.encode()), len(raw_props)) + (12 if v6 else 0)
        buf.extend(bytes(size))
        n = write_record(
            buf, pos, topic=topic.encode(), queue_id=queue_id, flag=s.get("flag", 0), queue_offset=first_offset + i,
            physical_offset=10_000 + pos, sys_flag=0, born_timestamp=s.get("born_ms", 1_700_000_000_000 + i),
            born_host=born, store_timestamp=s.get("store_ms", 1_700_000_000_500 + i), store_host=store,
            reconsume_times=s.get("reconsume", 0), prepared_tx_offset=0, body=body, body_crc=0,
            properties=raw_props,
        )
        del buf[pos + n:]
        pos += n
    return bytes(buf)


@pytest.fixture
def records() -> Callable[..., bytes]:
    """:func:`build_records` as a fixture."""
    return build_records


def _java_ok() -> str | None:
    java = shutil.which("java")
    if java is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        java = str(candidate) if candidate.exists() else None
    if java is None:
        return "no java executable on PATH or in JAVA_HOME: Spark tests need Java 17+ (install a JDK)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"java at {java} does not run ({e}): Spark tests need Java 17+"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole test run, with the connector registered."""
    problem = _java_ok()
    if problem:
        pytest.fail(problem)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_connector

    session = (
        SparkSession.builder.master("local[2]")
        .appName("splitmq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    try:
        yield session
    finally:
        session.stop()
