"""No import circle in ``broker/``: the graph of its modules' imports — every import statement, the ones under
``if TYPE_CHECKING:`` and inside functions included — is acyclic. A collaborator that needs the controller (or a
processor that needs another's module for a helper) shows up here as a cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module under ``package_dir`` (a package ``x`` is its ``x/__init__.py``)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imported(name: str, path: Path, node: ast.AST) -> Iterator[str]:
    """The dotted names an import statement may load (a module, or a name that may be a submodule)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, *([node.module] if node.module else [])])
        yield base
        yield from (f"{base}.{a.name}" for a in node.names)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in its source."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _imported(name, path, node):
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None when the graph is acyclic (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        todo = [iter(sorted(graph[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_the_broker_has_no_import_circle() -> None:
    graph = import_graph(ROOT / "broker")
    assert "broker.processor.send" in graph and "broker.store.reader" in graph  # the walk saw the packages
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in broker/: " + " -> ".join(cycle or [])


def test_no_processor_imports_the_controller() -> None:
    graph = import_graph(ROOT / "broker")
    offenders = sorted(m for m, edges in graph.items() if "broker.controller" in edges and m != "broker.__main__")
    assert offenders == [], f"modules importing the controller: {offenders}"


def test_a_type_checking_circle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n")
    (pkg / "c.py").write_text("def f():\n    import pkg.a\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("")
    assert find_cycle(import_graph(pkg)) is None
