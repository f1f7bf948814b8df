"""The house's import rules, read from the source with ``ast`` (every import statement: at module level, inside
functions and under ``if TYPE_CHECKING:``), over every package of the tree and the examples and docs scripts.

1. **Layers only look down.** Each top-level package may import only the packages :data:`MAY_IMPORT` names:
   ``common`` (what both sides speak) is the ground floor and imports nothing of the project; ``remoting`` (the
   servers' HTTP runtime) stands on it; ``broker`` and ``nameserver`` stand on both and import neither the SDK
   nor each other; the SDK (``client``) stands on ``common`` alone, but for its dashboard, which is a server
   (:data:`SUBPACKAGE_MAY_IMPORT`); the Spark connector stands on the SDK.
2. **No circle anywhere**: the graph of module imports over the whole tree is acyclic.
3. **Public names only across packages**: no module imports a private module (``client._routing``) or a private
   name (``from broker.store.file_store import _State``) of another top-level package. Inside a package its
   private modules are its own business; the tests, being white-box, are not checked.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The project's top-level packages (and script folders) whose imports are checked.
CHECKED = ("common", "remoting", "client", "broker", "nameserver", "spark_connector", "benchmarks", "examples",
           "docs")
PACKAGES = ("common", "remoting", "client", "broker", "nameserver", "spark_connector", "benchmarks")

#: Top-level package -> the project's packages it may import (besides itself).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "remoting": frozenset({"common"}),
    "broker": frozenset({"common", "remoting"}),
    "nameserver": frozenset({"common", "remoting"}),
    "client": frozenset({"common"}),
    "spark_connector": frozenset({"common", "client"}),
    # The benchmarks drive every part (a store in-process, clusters as processes); examples and docs' scripts use
    # the SDK and what the docs describe.
    "benchmarks": frozenset({"common", "remoting", "client", "broker", "nameserver", "spark_connector"}),
    "examples": frozenset({"common", "client", "spark_connector"}),
    "docs": frozenset({"common", "client", "broker", "nameserver"}),
}

#: Subpackages with a wider allowance than their package, each with its reason.
SUBPACKAGE_MAY_IMPORT: dict[str, tuple[frozenset[str], str]] = {
    "client.dashboard": (frozenset({"common", "remoting"}), "the dashboard is a web server: it serves with the "
                                                             "servers' HTTP runtime"),
}


def tracked_sources() -> list[Path]:
    """Every ``.py`` file git tracks under the checked folders."""
    out = subprocess.run(["git", "ls-files", "--", *CHECKED], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith(".py")]


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of ``path`` (a package is its ``__init__.py``)."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(name: str, path: Path, source: str) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name or None)`` for each import in ``source`` (relative imports resolved)."""
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            for a in node.names:
                yield base, a.name


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` it imports. ``from pkg import mod`` of a submodule is an edge to
    ``pkg.mod`` alone: a package's ``__init__`` that imports a submodule doing so is not a circle (the package
    object exists by then, and the submodule is loaded on its own)."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        for module, imported in imports(name, path, path.read_text(encoding="utf-8")):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in files else module
            if target in files and target != name:
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


def allowed(importer: str) -> frozenset[str]:
    """The project packages module ``importer`` may import, besides its own."""
    for sub, (extra, _why) in SUBPACKAGE_MAY_IMPORT.items():
        if importer == sub or importer.startswith(sub + "."):
            return extra
    return MAY_IMPORT[importer.split(".")[0]]


def layer_violations(name: str, path: Path, source: str) -> list[str]:
    """``importer -> imported`` for each import of a project package the layer rules forbid."""
    own = name.split(".")[0]
    bad = []
    for module, _ in imports(name, path, source):
        top = module.split(".")[0]
        if top in PACKAGES and top != own and top not in allowed(name):
            bad.append(f"{name} -> {module}")
    return sorted(set(bad))


def private_imports(name: str, path: Path, source: str) -> list[str]:
    """Private modules or names of another top-level package that ``source`` imports."""
    own = name.split(".")[0]
    bad = []
    for module, imported in imports(name, path, source):
        parts = module.split(".")
        if parts[0] not in PACKAGES or parts[0] == own:
            continue
        if any(p.startswith("_") and p != "__main__" for p in parts[1:]):
            bad.append(f"{name}: {module}")
        elif imported is not None and imported.startswith("_") and not imported.endswith("__"):
            bad.append(f"{name}: {module}.{imported}")
    return sorted(set(bad))


def _files() -> dict[str, Path]:
    return {module_name(p): p for p in tracked_sources()}


def test_the_walk_sees_the_whole_tree() -> None:
    files = _files()
    for expected in ("common.codec", "remoting.router", "client._producer", "broker.processor.send",
                     "nameserver.server", "spark_connector.source", "benchmarks.chaos.run", "examples.demo"):
        assert expected in files, expected


def test_layers_only_look_down() -> None:
    bad = [v for name, path in _files().items() for v in layer_violations(name, path, path.read_text("utf-8"))]
    assert bad == [], "imports that break the layer rules (see this module's docstring):\n" + "\n".join(bad)


def test_no_import_circle_anywhere() -> None:
    cycle = find_cycle(import_graph(_files()))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_private_name_crosses_a_package() -> None:
    bad = [v for name, path in _files().items() for v in private_imports(name, path, path.read_text("utf-8"))]
    assert bad == [], "private names imported from another package (make them public there):\n" + "\n".join(bad)


def test_no_processor_imports_the_controller() -> None:
    graph = import_graph(_files())
    offenders = sorted(m for m, edges in graph.items() if "broker.controller" in edges and m != "broker.__main__")
    assert offenders == [], f"modules importing the controller: {offenders}"


# --- the checks themselves can fail ------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    out = {}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        out[module_name(p, tmp_path)] = p
    return out


def test_a_type_checking_circle_across_packages_is_found(tmp_path: Path) -> None:
    files = _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/sub/__init__.py": "",
        "pkg/a.py": "from pkg.sub import b\n",
        "pkg/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n",
        "pkg/c.py": "def f():\n    import other.d\n",
        "other/__init__.py": "", "other/d.py": "from pkg import a\n",
    })
    assert find_cycle(import_graph(files)) == ["other.d", "pkg.a", "pkg.sub.b", "pkg.c", "other.d"]
    files["pkg.c"].write_text("")
    assert find_cycle(import_graph(files)) is None


@pytest.mark.parametrize(("name", "source", "expected"), [
    ("broker.x", "from client.errors import ClientError\n", ["broker.x -> client.errors"]),
    ("broker.x", "def f():\n    import nameserver.routeinfo\n", ["broker.x -> nameserver.routeinfo"]),
    ("common.x", "from remoting.router import Router\n", ["common.x -> remoting.router"]),
    ("client.x", "from remoting.router import Router\n", ["client.x -> remoting.router"]),
    ("client.dashboard.x", "from remoting.router import Router\n", []),
    ("nameserver.x", "from common.codes import Perm\nfrom remoting import router\n", []),
    ("spark_connector.x", "from broker.store import api\n", ["spark_connector.x -> broker.store"]),
])
def test_a_layer_break_is_found(tmp_path: Path, name: str, source: str, expected: list[str]) -> None:
    assert layer_violations(name, tmp_path / "x.py", source) == expected


@pytest.mark.parametrize(("name", "source", "expected"), [
    ("broker.dledger.m", "from broker.store.file_store import _State\n", []),  # inside its own package
    ("benchmarks.b", "from spark_connector.sink import _write_all\n", ["benchmarks.b: spark_connector.sink._write_all"]),
    ("docs.gen", "from nameserver.__main__ import _build_parser\n", ["docs.gen: nameserver.__main__._build_parser"]),
    ("client.x", "import common._lazy\n", ["client.x: common._lazy"]),
    ("client.x", "from common import _lazy\n", ["client.x: common._lazy"]),
    ("broker.x", "from nameserver.__main__ import main\n", []),
    ("client.errors", "from common.errors import __all__ as __all__\n", []),  # a dunder is not private
])
def test_a_private_import_is_found(tmp_path: Path, name: str, source: str, expected: list[str]) -> None:
    assert private_imports(name, tmp_path / "x.py", source) == expected
