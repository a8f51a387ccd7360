"""Structure figures of the package, from its source alone (``ast``; no imports run).

    python scripts/structure_report.py [rbzarr]

Prints one finding a line, then the figures the restructure is done by:

- root modules: the ``.py`` files directly in the package folder (at most 12);
- wide classes: classes whose chain of package classes (the class and all its ancestors
  in the package) is defined across more than 2 modules (0);
- reach-ins: ``obj._name`` where ``obj`` is not ``self`` / ``cls`` / ``super()`` (dunders
  excluded), and ``from rbzarr.x import _name`` across modules (0);
- import cycles between the package's modules (0), counting every import (inside functions
  and under ``if TYPE_CHECKING:`` too), and separately the import-time ones (module level,
  outside ``if TYPE_CHECKING:``).  A package's ``__init__`` importing its own submodules
  re-exports them: those imports are not counted;
- docstring share: the lines that docstrings (module, class, function) span, over the
  non-blank lines of the package.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_ROOT_MODULES = 12
MAX_BASE_MODULES = 2
OWN_NAMES = {"self", "cls"}


@dataclass(frozen=True)
class Module:
    """One module of the package: its dotted name, file, parsed source and package-ness."""

    name: str
    path: Path
    tree: ast.Module
    source: str

    @property
    def is_package(self) -> bool:
        """Whether this is a package's ``__init__``."""
        return self.path.name == "__init__.py"


def load_modules(root: Path) -> dict[str, Module]:
    """Dotted module name -> module, for every ``.py`` file below ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        source = path.read_text()
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(source, str(path)), source)
    return found


def is_private(name: str) -> bool:
    """``_name``, not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def absolute_module(node: ast.ImportFrom, module: Module) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: -(node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


# --- reach-ins -----------------------------------------------------------------------------


def reach_ins(module: Module, package: str) -> Iterator[tuple[int, str]]:
    """``obj._name`` on another object and private names imported from another module."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in OWN_NAMES
            via_super = (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            )
            if not (own or via_super):
                yield node.lineno, f"{ast.unparse(owner)}.{node.attr}"
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(node, module)
            if source == package or source.startswith(package + "."):
                for alias in node.names:
                    if is_private(alias.name):
                        yield node.lineno, f"from {source} import {alias.name}"


# --- wide classes --------------------------------------------------------------------------


def imported_names(module: Module, known: set[str]) -> dict[str, tuple[str, str | None]]:
    """Local name -> (package module, name in it; None for the module itself)."""
    names: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            source = absolute_module(node, module)
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{source}.{alias.name}" in known:
                    names[local] = (f"{source}.{alias.name}", None)
                elif source in known:
                    names[local] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    names[alias.asname] = (alias.name, None)
    return names


class ClassIndex:
    """Resolves base-class expressions to classes defined in the package."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        known = set(modules)
        self.imports = {name: imported_names(module, known) for name, module in modules.items()}
        self.classes = {
            name: {node.name: node for node in module.tree.body if isinstance(node, ast.ClassDef)}
            for name, module in modules.items()
        }

    def find(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """``module.Class`` that ``name`` means in ``module`` (through re-exports), if any."""
        if module in seen:
            return None
        if name in self.classes[module]:
            return f"{module}.{name}"
        target = self.imports[module].get(name)
        if target is None or target[1] is None:
            return None
        return self.find(target[0], target[1], seen | {module})

    def resolve(self, module: str, expression: ast.expr) -> str | None:
        """The package class a base expression (``Name``, ``mod.Name``, ``Name[T]``) means."""
        if isinstance(expression, ast.Subscript):
            return self.resolve(module, expression.value)
        if isinstance(expression, ast.Name):
            return self.find(module, expression.id)
        if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name):
            target = self.imports[module].get(expression.value.id)
            if target is not None and target[1] is None:
                return self.find(target[0], expression.attr)
        return None

    def bases(self, qualified: str) -> list[str]:
        """The direct package base classes of ``module.Class``."""
        module, _, name = qualified.rpartition(".")
        node = self.classes[module][name]
        found = (self.resolve(module, base) for base in node.bases)
        return [base for base in found if base is not None]

    def ancestors(self, qualified: str) -> set[str]:
        """Every package class ``module.Class`` derives from, itself excluded."""
        found: set[str] = set()
        pending = self.bases(qualified)
        while pending:
            base = pending.pop()
            if base not in found:
                found.add(base)
                pending.extend(self.bases(base))
        return found

    def all_classes(self) -> Iterator[str]:
        """``module.Class`` of every module-level class."""
        for module, classes in self.classes.items():
            for name in classes:
                yield f"{module}.{name}"


def wide_classes(index: ClassIndex) -> Iterator[tuple[str, list[str]]]:
    """Classes whose chain (the class and its package ancestors) spans more than two modules."""
    for qualified in index.all_classes():
        chain = {qualified, *index.ancestors(qualified)}
        modules = sorted({name.rpartition(".")[0] for name in chain})
        if len(modules) > MAX_BASE_MODULES:
            yield qualified, modules


# --- import cycles -------------------------------------------------------------------------


def imports(
    module: Module, tables: dict[str, dict[str, tuple[str, str | None]]], eager_only: bool
) -> set[str]:
    """Package modules that ``module`` imports (at import time only, if ``eager_only``).

    A name imported from a package counts as imported from the submodule that the package
    re-exports it from; the package's own imports of its submodules do not count.
    """
    found: set[str] = set()
    nodes = eager_nodes(module.tree.body) if eager_only else ast.walk(module.tree)
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # ``from pkg import mod`` depends on ``pkg.mod``; ``from mod import x`` on ``mod``.
            # The parent packages' ``__init__`` that any import runs are not counted.
            base = absolute_module(node, module)
            targets = [defining_module(tables, base, alias.name) for alias in node.names]
        for target in targets:
            known = package_module(target, tables)
            if known and known != module.name and not re_exports(module, known):
                found.add(known)
    return found


def package_module(dotted: str, tables: dict[str, dict[str, tuple[str, str | None]]]) -> str:
    """The longest prefix of ``dotted`` that is a package module ("" if none)."""
    while dotted and dotted not in tables:
        dotted = dotted.rpartition(".")[0]
    return dotted


def defining_module(
    tables: dict[str, dict[str, tuple[str, str | None]]], source: str, name: str
) -> str:
    """The module that ``from source import name`` really reads, through re-exports."""
    seen: set[str] = set()
    while source in tables and source not in seen:
        seen.add(source)
        if f"{source}.{name}" in tables:
            return f"{source}.{name}"
        target = tables[source].get(name)
        if target is None or not target[0].startswith(source + "."):
            return source  # defined here, or imported from outside the package's own folder
        if target[1] is None:
            return target[0]
        source, name = target[0], target[1]
    return source


def re_exports(module: Module, target: str) -> bool:
    """Whether ``module`` is a package's ``__init__`` importing one of its own submodules."""
    return module.is_package and target.startswith(module.name + ".")


def eager_nodes(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at import time (outside functions, classes, TYPE_CHECKING)."""
    for statement in body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            yield from eager_nodes(statement.orelse)
        elif isinstance(statement, ast.If | ast.Try | ast.With):
            yield statement
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(statement, block, []):
                    yield from eager_nodes(getattr(child, "body", [child]))
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


# --- docstring share -----------------------------------------------------------------------


def docstring_lines(module: Module) -> int:
    """Lines spanned by the docstrings of the module and its classes and functions."""
    count = 0
    documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(module.tree):
        if isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            count += (first.end_lineno or first.lineno) - first.lineno + 1
    return count


def non_blank_lines(module: Module) -> int:
    """Lines holding anything but whitespace."""
    return sum(1 for line in module.source.splitlines() if line.strip())


# --- report --------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """Print the findings and the figures for the package folder in ``argv[1]``."""
    root = Path(argv[1] if len(argv) > 1 else "rbzarr").resolve()
    package = root.name
    modules = load_modules(root)
    figures: dict[str, str] = {}

    root_modules = sorted(path.name for path in root.glob("*.py"))
    figures["root modules"] = f"{len(root_modules)} (at most {MAX_ROOT_MODULES})"
    print(f"root modules     {' '.join(root_modules)}")

    wide = list(wide_classes(ClassIndex(modules)))
    for qualified, base_modules in wide:
        print(f"wide class       {qualified}: chain in {', '.join(base_modules)}")
    figures["wide classes"] = str(len(wide))

    count = 0
    for module in modules.values():
        relative = module.path.relative_to(root.parent)
        for line, text in reach_ins(module, package):
            count += 1
            print(f"reach-in         {relative}:{line}: {text}")
    figures["reach-ins"] = str(count)

    known = set(modules)
    tables = {name: imported_names(module, known) for name, module in modules.items()}
    for eager_only, label in ((False, "import cycles"), (True, "import-time cycles")):
        graph = {name: imports(module, tables, eager_only) for name, module in modules.items()}
        components = cycles(graph)
        for component in components:
            print(f"{label[:-1]:<16} {' <-> '.join(component)}")
        figures[label] = str(len(components))

    documented = sum(docstring_lines(module) for module in modules.values())
    written = sum(non_blank_lines(module) for module in modules.values())
    figures["docstring share"] = f"{documented / written:.1%} ({documented} of {written} lines)"

    print("figures: " + "; ".join(f"{key} {value}" for key, value in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
