"""docs/GUIDE.md's snippets run as written: every ```python block, in order, in one namespace (as a reader who
pastes them into one Python session would)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "GUIDE.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[str]:
    return BLOCK.findall(GUIDE.read_text(encoding="utf-8"))


def test_the_guide_has_snippets_for_each_section() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert len(snippets()) >= 10
    for topic in ("send_batch", "AsyncProducer", "GroupConsumer", "PushConsumer", "update_consume_offset",
                  "served_by_broker_id", "client.errors"):
        assert topic in text, f"the guide should cover {topic}"


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_every_snippet_runs_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": "guide"}
    try:
        for i, code in enumerate(snippets(), 1):
            try:
                exec(compile(code, f"GUIDE.md snippet {i}", "exec"), namespace)
            except BaseException as e:
                raise AssertionError(f"GUIDE.md snippet {i} failed: {e!r}\n{code}") from e
    finally:
        cluster = namespace.get("cluster")
        if cluster is not None:
            cluster.stop()  # type: ignore[attr-defined]  # idempotent
    out = capsys.readouterr().out
    assert "served by broker id 0" in out and "after the kill, served by broker id 1" in out
