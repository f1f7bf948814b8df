"""docs/SPARK.md documents every option the connector accepts (the parser's own lists), with a default."""

from __future__ import annotations

import re
from pathlib import Path

from spark_connector import options

DOC = Path(__file__).resolve().parents[2] / "docs" / "SPARK.md"


def _table_rows(section: str) -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            for name in re.findall(r"`([A-Za-z.*]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_every_source_option_is_documented_with_a_default() -> None:
    rows = _table_rows("Source options")
    for name in options._SOURCE_KEYS.values():
        if name != "path":
            assert name in rows, f"source option {name} missing from docs/SPARK.md"
            assert rows[name], f"source option {name} has no default in docs/SPARK.md"
    assert "client.*" in rows


def test_every_sink_option_is_documented_with_a_default() -> None:
    rows = _table_rows("Sink options")
    for name in options._SINK_KEYS.values():
        if name != "path":
            assert rows.get(name), f"sink option {name} missing from docs/SPARK.md"
