"""The Spark connector and the benchmarks use the SDK through its public names only (issue 10, point 7).

Every ``import`` and ``from ... import`` in ``spark_connector/`` and ``benchmarks/`` -- at module level or inside
a function -- is read with ``ast``: no module path may hold a segment starting with ``_`` below ``client``
(``client._routing``), and no name imported from ``client`` or one of its public modules may start with ``_``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spark_connector", "benchmarks")


def private_sdk_imports(source: str) -> list[str]:
    """``line: import`` of every private SDK name ``source`` imports."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if _private_module(node.module):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module.split(".")[0] == "client":
                found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_")]
    return found


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "client" and any(p.startswith("_") for p in parts[1:])


def test_the_check_sees_every_kind_of_private_import() -> None:
    source = ("import client._transport\nfrom client._routing import X\nfrom client.protocol import _hidden\n"
              "def f():\n    from client._producer_core import check_batch\n"
              "from client import Producer\nfrom client.lowlevel import BrokerClient\nimport client.errors\n")
    assert private_sdk_imports(source) == [
        "1: import client._transport", "2: from client._routing import ...",
        "3: from client.protocol import _hidden", "5: from client._producer_core import ...",
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_sdk_name_is_imported(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules found under {package}/"
    bad = {str(f.relative_to(ROOT)): hits for f in files if (hits := private_sdk_imports(f.read_text()))}
    assert bad == {}, "private SDK names imported; use client / client.lowlevel / common instead"
