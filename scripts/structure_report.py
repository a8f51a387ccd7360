"""Structure figures of the package, from its source alone (no imports run).

    python scripts/structure_report.py [rbzarr]

Prints, one finding a line then the totals:

- reach-ins: ``obj._name`` where ``obj`` is not ``self`` / ``cls`` (dunders excluded), and
  ``from rbzarr.x import _name`` across modules;
- import cycles between the package's modules, counting imports that run at import time
  (module level, outside ``if TYPE_CHECKING:``), and separately any import at all;
- modules over 400 lines and functions over 50 statements (ruff's PLR0915 way: every
  statement, nested blocks included, nested function bodies not).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 400
MAX_STATEMENTS = 50
OWN_NAMES = {"self", "cls"}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def reach_ins(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in OWN_NAMES):
                yield node.lineno, f"{ast.unparse(owner)}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            for alias in node.names:
                if _is_private(alias.name):
                    yield node.lineno, f"from {node.module} import {alias.name}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imports(tree: ast.Module, name: str, known: set[str], eager_only: bool) -> set[str]:
    """Package modules that ``name`` imports (at import time only, if ``eager_only``)."""
    found: set[str] = set()
    nodes = _eager_nodes(tree.body) if eager_only else ast.walk(tree)
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # ``from pkg import mod`` depends on ``pkg.mod``; ``from mod import x`` on ``mod``.
            # The parent packages' ``__init__`` that any import runs are not counted.
            base = _absolute(node, name)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _absolute(node: ast.ImportFrom, name: str) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".")[: -node.level]
    return ".".join([*parts, node.module] if node.module else parts)


def _eager_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            yield from _eager_nodes(statement.orelse)
        elif isinstance(statement, ast.If | ast.Try | ast.With):
            yield statement
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(statement, block, []):
                    yield from _eager_nodes(getattr(child, "body", [child]))
        elif not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield statement


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def statements(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    count = 0
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.stmt):
            count += 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
        pending.extend(ast.iter_child_nodes(node))
    return count


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "rbzarr").resolve()
    package = root.name
    found = modules(root)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in found.items()}
    totals = {"reach-ins": 0, "long modules": 0, "long functions": 0}
    for name, tree in trees.items():
        relative = found[name].relative_to(root.parent)
        for line, text in reach_ins(tree, package):
            totals["reach-ins"] += 1
            print(f"reach-in        {relative}:{line}: {text}")
        lines = len(found[name].read_text().splitlines())
        if lines > MAX_LINES:
            totals["long modules"] += 1
            print(f"long module     {relative}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = statements(node)
                if count > MAX_STATEMENTS:
                    totals["long functions"] += 1
                    print(f"long function   {relative}:{node.lineno}: {node.name} ({count})")
    known = set(trees)
    for eager_only, label in ((True, "import-time cycle"), (False, "any-import cycle")):
        graph = {name: imports(tree, name, known, eager_only) for name, tree in trees.items()}
        components = cycles(graph)
        totals[label + "s"] = len(components)
        for component in components:
            print(f"{label:<15} {' <-> '.join(component)}")
    print("totals: " + ", ".join(f"{key} {value}" for key, value in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
