"""docs/SECURITY.md's threat model: every row names the test that backs it, and every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "SECURITY.md"
_NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def threat_model() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## Threat model"):text.index("\n## ", text.index("## Threat model") + 1)]


def test_every_row_of_the_threat_model_names_a_test() -> None:
    rows = [line for line in threat_model().splitlines() if line.startswith("| ") and not line.startswith("| Attack")
            and not line.startswith("|---")]
    assert len(rows) >= 20, rows
    for row in rows:
        assert _NAMED.search(row), f"a threat-model row names no test: {row[:100]}"


def test_every_named_test_exists() -> None:
    named = _NAMED.findall(threat_model())
    assert named
    for file, name in named:
        path = ROOT / file
        assert path.is_file(), f"{file} (named in docs/SECURITY.md) does not exist"
        defined = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{file} has no test {name} (named in docs/SECURITY.md)"
