"""The import graph: the core (bench/) never imports a plugin package, and no module imports itself back.

Every import counts, at module level or inside a function, except those under ``if TYPE_CHECKING:`` (they never
run). The core reaches tasks, attacks and defenses only through the registry, by module names as strings.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "tasks", "attacks", "defenses", "leaderboard")
PLUGIN_PACKAGES = ("tasks", "attacks", "defenses")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(tree)
    return out


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imp in _imports(path):
            while imp and imp not in modules:   # `from bench.x import y`: y may be a name, not a module
                imp = imp.rpartition(".")[0]
            if imp and imp != name and imp.split(".")[0] in PACKAGES:
                targets.add(imp)
        edges[name] = targets
    return edges


def test_the_core_imports_no_plugin_package():
    bad = sorted(f"{m} -> {t}" for m, ts in graph().items() if m.split(".")[0] == "bench"
                 for t in ts if t.split(".")[0] in PLUGIN_PACKAGES)
    assert bad == [], "the core imports plugin code; go through the registry instead:\n" + "\n".join(bad)


def test_the_project_has_no_import_cycle():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    import sys
    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tasks.a\n"
                 "def g():\n    from attacks.b import c\n    import defenses.d\n")
    assert _imports(f) >= {"attacks.b", "defenses.d"} and "tasks.a" not in _imports(f)


def test_no_test_module_imports_another():
    """Shared fixtures and data live in helper modules (tests/worlds.py, tests/boards.py): importing a test module
    from another runs its module-level code twice and couples unrelated tests."""
    offenders = []
    for path in sorted(Path(__file__).resolve().parent.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("tests.test_")]
    assert not offenders, offenders
