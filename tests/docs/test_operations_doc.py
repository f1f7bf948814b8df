"""``docs/OPERATIONS.md`` is generated from the code: every broker key has a meaning, and the file is current."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from broker.config import KEY_DOCS, KEYS

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_operations", ROOT / "docs" / "gen_operations.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_operations", module)
    spec.loader.exec_module(module)
    return module


def test_every_broker_key_has_a_one_line_doc() -> None:
    missing = sorted(set(KEYS) - set(KEY_DOCS))
    stale = sorted(set(KEY_DOCS) - set(KEYS))
    assert not missing, f"keys without a KEY_DOCS entry in broker/config.py: {missing}"
    assert not stale, f"KEY_DOCS entries for keys that do not exist: {stale}"
    for key, text in KEY_DOCS.items():
        assert text.strip() and "\n" not in text, f"KEY_DOCS[{key!r}] must be one non-empty line"


def test_operations_doc_is_generated_from_the_code() -> None:
    expected = _generator().render()
    actual = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    assert actual == expected, "docs/OPERATIONS.md is out of date: run python docs/gen_operations.py"


def test_every_key_and_metric_appears_in_the_doc() -> None:
    text = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    for key in KEYS:
        assert f"| `{key}` |" in text, f"{key} missing from docs/OPERATIONS.md"
    for name in ("splitmq_pull_served_total", "rocketmq_messages_in_total", "splitmq_nameserver_requests_total",
                 "--broker-expiry-ms"):
        assert name in text


def test_a_key_without_a_doc_fails_the_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _generator()
    monkeypatch.setattr(gen, "KEY_DOCS", {k: v for k, v in KEY_DOCS.items() if k != "listenPort"})
    with pytest.raises(KeyError, match="listenPort"):
        gen.render()
