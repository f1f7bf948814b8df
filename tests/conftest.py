"""Shared fixtures: local clusters of real server processes (``client.cluster.LocalCluster``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client.cluster import LocalCluster


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
