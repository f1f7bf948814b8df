"""Citations of docs/BEHAVIOUR.md resolve inside the repository.

* Every ``BEHAVIOUR.md <number>`` / ``BEHAVIOUR.md section(s) <number>, <number>`` citation in a tracked ``.py`` or
  ``.md`` file names a numbered heading of docs/BEHAVIOUR.md (a range such as ``9.4-9.5`` names every section in
  it), and every ``decision <n>`` names an item of its decisions list.
* No tracked file points outside the repository at the team's private documents, and every relative link in
  docs/*.md and README.md names a file (or folder) the repository tracks.
* The parsers catch planted mistakes, so these tests can fail.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEHAVIOUR = "docs/BEHAVIOUR.md"
#: This file plants bad citations on purpose (see the last tests); the scan of the repository skips it.
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

_NUM = r"\d+(?:\.\d+)*"
_DASH = "[-\u2013]"  # a hyphen or an en dash
_ITEM = rf"{_NUM}(?:\s*{_DASH}\s*{_NUM})?"
_LIST = rf"{_ITEM}(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+){_ITEM})*"
#: ``BEHAVIOUR.md 2.3``, ``docs/BEHAVIOUR.md section 6.1``, ``[BEHAVIOUR.md](BEHAVIOUR.md) 2.8, 2.9.2``, and a
#: citation whose number wraps onto the next line, a Python comment line included.
CITATION = re.compile(
    rf"BEHAVIOUR\.md(?:\]\([^)\s]*BEHAVIOUR\.md\))?(?:\s|#)*(?:(?:sections?|§)\s*)?(?P<nums>{_LIST})",
    re.IGNORECASE,
)
#: ``section 9 of [BEHAVIOUR.md](BEHAVIOUR.md)``.
CITATION_BEFORE = re.compile(rf"\bsections?\s+(?P<nums>{_LIST})\s+of\s+\[?(?:docs/)?BEHAVIOUR\.md", re.IGNORECASE)
DECISION = re.compile(r"\bdecisions?\s+(?P<nums>\d+(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+)\d+)*)\b", re.IGNORECASE)
#: RocketMQ versions that may follow a citation ("docs/BEHAVIOUR.md 5, 4.9.3 rules"): not section numbers.
VERSIONS = frozenset({"4.9.3", "5.3.3"})

HEADING = re.compile(rf"^#{{2,6}}\s+(?P<num>{_NUM})\.?\s", re.MULTILINE)
DECISIONS_BLOCK = re.compile(r"^## Decisions\s*$(?P<body>.*?)(?=^## )", re.MULTILINE | re.DOTALL)
DECISION_ITEM = re.compile(r"^(\d+)\.\s", re.MULTILINE)

LINK = re.compile(r"\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
#: Written in pieces so this file does not match itself.
FORBIDDEN = ("../" + "shared", "shared" + "/spec", "CONTRACT" + ".md")


@cache
def tracked() -> tuple[str, ...]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:  # pragma: no cover - a source tree without git
        pytest.skip(f"git ls-files failed: {e}")
    return tuple(p for p in out.decode().split("\0") if p)


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def expand(item: str) -> list[str]:
    """``2.9-2.11`` -> ``2.9``, ``2.10``, ``2.11``; a range across parents names its two ends; else the number."""
    ends = [e.strip() for e in re.split(_DASH, item)]
    if len(ends) == 1:
        return ends
    lo, hi = ends
    lo_parent, _, lo_last = lo.rpartition(".")
    hi_parent, _, hi_last = hi.rpartition(".")
    if lo_parent != hi_parent or int(lo_last) > int(hi_last):
        return [lo, hi]
    prefix = f"{lo_parent}." if lo_parent else ""
    return [f"{prefix}{n}" for n in range(int(lo_last), int(hi_last) + 1)]


def cited_sections(text: str) -> list[tuple[int, str]]:
    """``(line, section number)`` of every citation of docs/BEHAVIOUR.md in ``text``."""
    found = []
    for pattern in (CITATION, CITATION_BEFORE):
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start("nums")) + 1
            for item in re.findall(_ITEM, m.group("nums")):
                if item in VERSIONS:
                    continue
                found.extend((line, n) for n in expand(item))
    return found


def cited_decisions(text: str) -> list[tuple[int, int]]:
    """``(line, decision number)`` of every ``decision N`` / ``decisions N and M`` in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, int(n))
            for m in DECISION.finditer(text) for n in re.findall(r"\d+", m.group("nums"))]


def headings(doc: str) -> set[str]:
    return {m.group("num") for m in HEADING.finditer(doc)}


def decision_numbers(doc: str) -> list[int]:
    block = DECISIONS_BLOCK.search(doc)
    return [int(n) for n in DECISION_ITEM.findall(block.group("body"))] if block else []


def bad_citations(text: str, sections: set[str], decisions: set[int]) -> list[str]:
    """Each citation in ``text`` that names no section heading or no decision, as ``line N: what``."""
    bad = [f"line {line}: section {n}" for line, n in cited_sections(text) if n not in sections]
    bad += [f"line {line}: decision {n}" for line, n in cited_decisions(text) if n not in decisions]
    return bad


def broken_links(doc_path: str, text: str, files: frozenset[str]) -> list[str]:
    """Relative link targets of the markdown file ``doc_path`` that name nothing the repository tracks."""
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents}
    base = PurePosixPath(doc_path).parent
    bad = []
    for m in LINK.finditer(FENCE.sub("", text)):
        target = m.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        path = target.split("#", 1)[0].split("?", 1)[0]
        parts: list[str] = []
        for part in (base / path).parts:
            if part == "..":
                if not parts:
                    parts = ["<outside the repository>"]
                    break
                parts.pop()
            elif part != ".":
                parts.append(part)
        resolved = "/".join(parts)
        if resolved not in files and resolved.rstrip("/") not in folders:
            bad.append(f"{doc_path}: ]({target})")
    return bad


def semantics_doc() -> str:
    assert BEHAVIOUR in tracked(), f"{BEHAVIOUR} is not tracked"
    return read(BEHAVIOUR)


def test_the_reference_numbers_its_sections_and_its_eight_decisions() -> None:
    doc = semantics_doc()
    assert decision_numbers(doc) == list(range(1, 9))
    numbers = headings(doc)
    assert {str(n) for n in range(10)} <= numbers
    assert {"2.9.1", "2.9.2", "2.9.3", "3.2.1", "7.1", "9.8"} <= numbers


def test_every_citation_names_a_section_and_every_decision_exists() -> None:
    doc = semantics_doc()
    sections, decisions = headings(doc), set(decision_numbers(doc))
    bad = []
    checked = 0
    for path in tracked():
        if not path.endswith((".py", ".md")) or path == THIS or not (ROOT / path).is_file():
            continue
        text = read(path)
        checked += len(cited_sections(text))
        bad += [f"{path} {b}" for b in bad_citations(text, sections, decisions)]
    assert checked >= 100, f"only {checked} citations found: has the citation form changed?"
    assert not bad, "citations of docs/BEHAVIOUR.md that name nothing there:\n" + "\n".join(bad)


def test_no_tracked_file_points_at_documents_outside_the_repository() -> None:
    hits = []
    for path in tracked():
        file = ROOT / path
        if not file.is_file():
            continue
        data = file.read_bytes()
        hits += [f"{path}: {word}" for word in FORBIDDEN if word.encode() in data]
    assert not hits, "\n".join(hits)


def test_relative_links_in_the_docs_resolve_to_tracked_files() -> None:
    files = frozenset(tracked())
    docs = [p for p in files if p == "README.md" or re.fullmatch(r"docs/[^/]+\.md", p)]
    assert BEHAVIOUR in docs and "docs/HA.md" in docs
    bad = [b for p in sorted(docs) for b in broken_links(p, read(p), files)]
    assert not bad, "links to files the repository does not have:\n" + "\n".join(bad)


PLANTED = (
    "# docs/BEHAVIOUR.md 2.3 and docs/BEHAVIOUR.md\n"
    "#   2.9-2.11, decision 5. See docs/BEHAVIOUR.md section 6.1, [BEHAVIOUR.md](BEHAVIOUR.md) 2.8, 2.9.2.\n"
    "docs/BEHAVIOUR.md 5, 4.9.3 rules; section 9 of [BEHAVIOUR.md](BEHAVIOUR.md); decisions 3 and 4.\n"
    "Bad: docs/BEHAVIOUR.md 2.13, docs/BEHAVIOUR.md sections 3.2 and 3.9, docs/BEHAVIOUR.md 9.7-9.9,\n"
    "section 11 of [BEHAVIOUR.md](BEHAVIOUR.md), decision 9.\n"
)


def test_the_parsers_catch_planted_mistakes() -> None:
    sections = {"2", "2.3", "2.8", "2.9", "2.9.2", "2.10", "2.11", "3.2", "5", "6.1", "9", "9.7", "9.8"}
    assert [n for _, n in cited_sections(PLANTED)] == [
        "2.3", "2.9", "2.10", "2.11", "6.1", "2.8", "2.9.2", "5", "2.13", "3.2", "3.9", "9.7", "9.8", "9.9",
        "9", "11",
    ]
    assert bad_citations(PLANTED, sections, set(range(1, 9))) == [
        "line 4: section 2.13", "line 4: section 3.9", "line 4: section 9.9", "line 5: section 11",
        "line 5: decision 9",
    ]
    doc = "## Decisions\n\n1. one\n2. two\n\n## 0. Conventions\n\n### 2.9.1 Old\n#### 3.2.1 Table\n"
    assert decision_numbers(doc) == [1, 2]
    assert headings(doc) == {"0", "2.9.1", "3.2.1"}


def test_the_link_check_catches_a_missing_file() -> None:
    files = frozenset({"README.md", "docs/HA.md", "docs/BEHAVIOUR.md", "examples/demo.py"})
    text = ("[a](BEHAVIOUR.md) [b](HA.md#roles) [c](#local) [d](https://example.com/x.md) [e](../examples/demo.py)\n"
            "[f](../examples/) [g](MISSING.md) [h](../../outside.md)\n```\n[i](in-a-code-block.md)\n```\n")
    assert broken_links("docs/HA.md", text, files) == ["docs/HA.md: ](MISSING.md)", "docs/HA.md: ](../../outside.md)"]
