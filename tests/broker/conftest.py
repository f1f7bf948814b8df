"""Fixtures for broker tests: real server subprocesses (see procs.py), stopped at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.procs import Servers


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """Start brokers / nameservers in this test; every one is stopped at teardown."""
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Like ``servers`` but shared by a module (for fuzz tests against one running broker)."""
    s = Servers(tmp_path_factory.mktemp("servers"))
    try:
        yield s
    finally:
        s.close()
