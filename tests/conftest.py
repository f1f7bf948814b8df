"""Shared fixtures: local clusters of real server processes (``client.cluster.LocalCluster``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client.cluster import LocalCluster

#: The files that take longest (measured with ``--durations=0``: each file's tests summed, on a 2-core machine
#: running the suite with two workers), run before the others (``make test`` passes ``--no-loadscope-reorder``:
#: xdist would otherwise start the files with the most tests first, and these, which have few, came last, one
#: worker running the Spark standalone tests alone while the other idled). Those that start Spark JVMs alternate
#: with those that do not, so that the two workers rarely start JVMs at the same moment. The DLedger group tests,
#: whose elections have timeouts of seconds, are left out: run among the JVMs once, a leadership transfer missed
#: its 5 s bound.
LONGEST_FIRST = (
    "spark/test_standalone.py",
    "chaos/test_chaos.py",
    "examples/test_examples.py",
    "ha/test_sync_master.py",
    "docs/test_spark_doc_commands.py",
    "cli/test_cli_integration.py",
    "spark/test_spark_source.py",
    "broker/test_soak_short.py",
    "examples/test_demo_output.py",
    "client/test_push_consumer.py",
    "spark/test_spark_offsets.py",
    "docs/test_doc_commands.py",
    "ha/test_idempotent_failover.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order; every file's tests stay in their order."""
    tests_dir = Path(__file__).resolve().parent
    rank = {tests_dir / name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """A callable ``make(**LocalCluster kwargs) -> started LocalCluster`` (each in its own tmp dir).

    Every cluster it made is stopped at teardown, also when the test failed.
    """
    made: list[LocalCluster] = []

    def make(**kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(made)}", **kwargs)
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in reversed(made):
        cluster.stop()
