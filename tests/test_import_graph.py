"""The package's import graph (DESIGN.md, "Dependencies point one way"): no import cycle at any depth, and the
shared lower layers import nothing from the layers that drive them.

The graph is read from the source with `ast`, not by importing: every `import` and `from ... import` of a
sparqrl module, at any nesting level (a function-level, lazy import counts like one at the top: it ties the
modules together just the same, only later), relative ones resolved. `from PKG import NAME` is an edge to the
submodule PKG.NAME where one exists, else to PKG. The implicit import of a module's parent packages is not an
edge: a package's `__init__` may load its own submodules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sparqrl

PACKAGE_DIR = Path(sparqrl.__file__).parent
LOWER = ("sparqrl.envs", "sparqrl.nets", "sparqrl.replay", "sparqrl.returns")
"""Shared parts that the algorithms use and that never use them."""
UPPER = ("sparqrl.algos", "sparqrl.runners", "sparqrl.meta", "sparqrl.cli")
"""What drives the shared parts (DESIGN.md: algos use them, runners drive algos, meta drives runners)."""


def module_name(path: Path, root: Path) -> str:
    """'pkg/sub/mod.py' -> 'pkg.sub.mod'; a package's '__init__.py' is the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names one import statement reaches: `import a.b` -> a.b; `from .x import y` -> pkg.x.y
    (a candidate: `import_graph` keeps the longest prefix that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package in `root` that it imports (any nesting level; no self-edges)."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, package):
                while target not in files and "." in target:
                    target = target.rpartition(".")[0]
                if target in files and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a] (each imports the next), or None: a depth-first search that meets a
    module still on its path."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_cycle_finder_finds_a_long_cycle_and_passes_a_tree():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"e"}, "d": set(), "e": {"b"}, "f": {"a"}}
    assert find_cycle(graph) == ["b", "c", "e", "b"]
    del graph["e"]
    assert find_cycle(graph) is None
    assert find_cycle({"x": {"y"}, "y": {"x"}}) == ["x", "y", "x"]


def test_the_graph_reads_every_kind_of_import(tmp_path):
    root = tmp_path / "pkg"
    for sub in ("", "sub"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    (root / "low.py").write_text("X = 1\n")
    (root / "sub" / "mod.py").write_text("def f():\n    if True:\n        from ..low import X\n    return X\n")
    (root / "sub" / "other.py").write_text("from . import mod\nimport pkg.low\n")
    (root / "top.py").write_text("from pkg.sub import other, missing_name\nimport os\n")
    assert import_graph(root) == {
        "pkg": set(), "pkg.low": set(), "pkg.sub": set(), "pkg.sub.mod": {"pkg.low"},
        "pkg.sub.other": {"pkg.sub.mod", "pkg.low"}, "pkg.top": {"pkg.sub.other", "pkg.sub"},
    }
    (root / "low.py").write_text("def g():\n    from pkg import top\n")  # a lazy import closes a circle
    assert find_cycle(import_graph(root)) == ["pkg.low", "pkg.top", "pkg.sub.other", "pkg.low"]


def test_sparqrl_has_no_import_cycle():
    cycle = find_cycle(import_graph(PACKAGE_DIR))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_shared_layers_import_nothing_above_them():
    graph = import_graph(PACKAGE_DIR)
    assert _within("sparqrl.envs.gym_env", LOWER) and "sparqrl.envs" in graph  # the graph covers them
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _within(m, LOWER)
                    for t in targets if _within(t, UPPER))
    assert not upward, "a shared layer imports one above it: " + "; ".join(upward)
