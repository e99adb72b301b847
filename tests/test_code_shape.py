"""The code's shape (issue 32, item 9): no function in `sparqrl/` over 80 lines.

A function's length is its whole span, `def` line to last line, so a factory's nested closures count in the
factory's length (DESIGN.md: "Avoid its 800-line train function"). Read with `ast`, nothing is imported.
A new long function fails the suite, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sparqrl

PACKAGE_DIR = Path(sparqrl.__file__).parent
MAX_LINES = 80


def long_functions(source: str, name: str = "<source>", limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """('file:line qualified.name', lines) of every function over `limit` lines, longest first. Functions
    nested in a function are part of its span and not listed again; methods are listed as Class.method."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found.append((f"{name}:{child.lineno} {prefix}{child.name}", lines))
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source, name), "")
    return sorted(found, key=lambda item: -item[1])


def package_long_functions(root: Path = PACKAGE_DIR) -> list[tuple[str, int]]:
    """`long_functions` of every module of the package, longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        found += long_functions(path.read_text(), str(path.relative_to(root.parent)))
    return sorted(found, key=lambda item: -item[1])


def test_long_functions_counts_nested_closures_and_methods():
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    source = f"def factory():\n    def inner():\n{body}\n    return inner\n\nclass C:\n    def m(self):\n{body}\n"
    found = long_functions(source, "m.py")
    assert found == [("m.py:1 factory", 83), ("m.py:86 C.m", 81)]
    assert long_functions(source, "m.py", limit=83) == []


def test_no_function_over_80_lines():
    found = package_long_functions()
    assert not found, "functions over 80 lines: " + "; ".join(f"{where} ({lines})" for where, lines in found)
