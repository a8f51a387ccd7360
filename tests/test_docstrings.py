"""The docs match the code: numpydoc sections on what users call, a docstring on every module.

What users call is the ``__all__`` of ``rbzarr`` and of its public subpackages, with the
public methods and properties of the classes among them (inherited ones included, wherever
in rbzarr they are defined).  numpydoc's validator reads the docstring that
:func:`inspect.getdoc` finds: an override without a docstring is documented by its base,
whose sections are checked against the override's own signature.  Internal modules need a
module docstring only; their helpers get one line, which this test does not check.  "Raises"
is checked by ruff (``DOC501``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from numpydoc.docscrape import get_doc_object
from numpydoc.validate import Validator, validate

import rbzarr

PUBLIC_PACKAGES = (
    "rbzarr",
    "rbzarr.analysis",
    "rbzarr.buffer",
    "rbzarr.cli",
    "rbzarr.data",
    "rbzarr.interop",
    "rbzarr.rollout",
    "rbzarr.trajectory",
)

# GL08: no docstring; PR01: a parameter not documented; PR02: a documented parameter that
# does not exist; RT01: no Returns section for a function that returns; YD01: no Yields.
CHECKS = ("GL08", "PR01", "PR02", "RT01", "YD01")

PACKAGE_ROOT = Path(rbzarr.__file__).parent

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(rbzarr.__path__, "rbzarr.")
    if not any(part.startswith("_") for part in info.name.split("."))
)


class InheritedDocValidator(Validator):
    """numpydoc's validator reading the docstring :func:`inspect.getdoc` finds."""

    def __init__(self, obj_name: Any, raw_doc: str) -> None:
        super().__init__(get_doc_object(obj_name))  # parses inspect.getdoc: maybe a base's
        self.raw_doc = raw_doc  # numpydoc takes obj.__doc__ here, which an override lacks


def documenting_member(cls: type, name: str) -> Any:
    """The first definition of ``name`` along ``cls``'s MRO with a docstring of its own.

    :func:`inspect.getdoc` walks the MRO the same way; the defining class's member when none
    has one.
    """
    definitions = [vars(klass)[name] for klass in cls.__mro__ if name in vars(klass)]
    return next((member for member in definitions if member.__doc__ is not None), definitions[0])


def problems_of(obj: Any, raw_doc: str | None) -> list[str]:
    """numpydoc's findings among ``CHECKS`` for ``obj``, with ``raw_doc`` as its docstring."""
    report = validate(obj, validator_cls=InheritedDocValidator, raw_doc=raw_doc or "")
    return [f"{code} {message}" for code, message in report["errors"] if code in CHECKS]


def public_members(cls: type) -> Iterator[str]:
    """Names of ``cls``'s public methods and properties defined in its package (maybe in a base).

    Those of a builtin or another library's base are documented there.
    """
    package = cls.__module__.partition(".")[0]
    for name in sorted(dir(cls)):
        owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
        if name.startswith("_") or owner is None or owner.__module__.partition(".")[0] != package:
            continue
        member = vars(owner)[name]
        function = member.__func__ if isinstance(member, staticmethod | classmethod) else member
        if isinstance(function, property) or inspect.isfunction(function):
            yield name


def public_objects() -> dict[str, Any]:
    """Every object in a public ``__all__``, once, by the name it is defined under."""
    found: dict[str, Any] = {}
    for package_name in PUBLIC_PACKAGES:
        package = importlib.import_module(package_name)
        for name in package.__all__:
            obj = getattr(package, name)
            defined = inspect.isclass(obj) or inspect.isfunction(obj)
            key = f"{obj.__module__}.{obj.__qualname__}" if defined else f"{package_name}.{name}"
            found.setdefault(key, obj)
    return found


PUBLIC_OBJECTS = public_objects()


def section_problems(name: str, obj: Any) -> Iterator[str]:
    """The numpydoc findings for a public object and, for a class, its public members."""
    if isinstance(obj, click.Command):
        yield from command_problems(name, obj)
        return
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # a constant: documented where it is defined
    yield from (f"{name}: {problem}" for problem in problems_of(obj, obj.__doc__))
    if not inspect.isclass(obj):
        return
    for member_name in public_members(obj):
        # The member as users reach it (its signature), read with the docstring it inherits.
        member, documenting = getattr(obj, member_name), documenting_member(obj, member_name)
        for problem in problems_of(member, documenting.__doc__):
            yield f"{name}.{member_name}: {problem}"


def command_problems(name: str, command: click.Command) -> Iterator[str]:
    """A command line's docs are its ``--help``: every command and subcommand has a text."""
    if not (command.help or "").strip():
        yield f"{name}: no help text"
    if isinstance(command, click.Group):
        for sub_name, sub in command.commands.items():
            yield from command_problems(f"{name} {sub_name}", sub)


def test_public_packages_declare_their_api():
    missing = [name for name in PUBLIC_PACKAGES if not importlib.import_module(name).__all__]
    assert missing == []


def test_every_module_declares_its_exports():
    missing = [name for name in MODULES if not hasattr(importlib.import_module(name), "__all__")]
    assert missing == []


def test_every_module_has_a_docstring():
    files = sorted(PACKAGE_ROOT.rglob("*.py"))
    missing = [
        str(path.relative_to(PACKAGE_ROOT.parent))
        for path in files
        if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    ]
    assert files and missing == []


@pytest.mark.parametrize("name", sorted(PUBLIC_OBJECTS))
def test_public_calls_have_numpydoc_sections(name):
    problems = list(section_problems(name, PUBLIC_OBJECTS[name]))
    assert problems == [], "\n".join(problems)


# What the checks must tell apart: a base with full sections, an override that inherits
# them, and overrides whose own docstring falls short of their signature.


class DocumentedBase:
    """A base class whose method carries numpydoc sections."""

    def scale(self, value: float) -> float:
        """Scale a value.

        Parameters
        ----------
        value : float
            What to scale.

        Returns
        -------
        float
            The scaled value.
        """
        return 2 * value


class InheritingOverride(DocumentedBase):
    """An override that inherits its base's docstring."""

    def scale(self, value: float) -> float:
        return 3 * value


class OneLineOverride(DocumentedBase):
    """An override whose own one-line docstring hides the base's sections."""

    def scale(self, value: float) -> float:
        """Scale by three."""
        return 3 * value


class WiderOverride(DocumentedBase):
    """An override that adds a parameter its inherited docstring does not name."""

    def scale(self, value: float, offset: float = 0.0) -> float:
        return 3 * value + offset


def undocumented_generator(count: int) -> Iterator[int]:
    """Count up."""
    yield from range(count)


def member_problems(cls: type) -> list[str]:
    """The findings of the public-member check for ``cls`` (as for a public class)."""
    return [problem for problem in section_problems(cls.__qualname__, cls) if ".scale:" in problem]


def test_the_check_catches_a_missing_section():
    problems = problems_of(undocumented_generator, undocumented_generator.__doc__)
    codes = {problem.split()[0] for problem in problems}
    assert {"PR01", "YD01"} <= codes


def test_an_override_without_a_docstring_is_documented_by_its_base():
    assert inspect.getdoc(InheritingOverride.scale) == inspect.getdoc(DocumentedBase.scale)
    assert member_problems(DocumentedBase) == []
    assert member_problems(InheritingOverride) == []


def test_an_override_whose_own_docstring_lacks_its_parameters_is_caught():
    problems = member_problems(OneLineOverride)
    assert any(problem.split(": ", 1)[1].startswith("PR01") for problem in problems), problems
    assert any("RT01" in problem for problem in problems), problems


def test_an_override_adding_an_undocumented_parameter_is_caught():
    problems = member_problems(WiderOverride)
    assert len(problems) == 1 and "PR01" in problems[0] and "offset" in problems[0], problems


def test_the_public_objects_include_inherited_members():
    # TrajectoryReplayBuffer's public methods are checked wherever rbzarr defines them.
    members = set(public_members(rbzarr.TrajectoryReplayBuffer))
    assert {"add_trajectories", "sample", "save_checkpoint", "load_checkpoint"} <= members


def test_no_docstring_cites_a_script_outside_the_repository() -> None:
    """Figures in the prose come from ``benchmarks/`` (in the repository), not probe scripts."""
    cited = {
        f"{path.relative_to(PACKAGE_ROOT)}: {match}"
        for path in PACKAGE_ROOT.rglob("*.py")
        for match in re.findall(r"/tmp/[\w./-]+\.py", path.read_text())
    }
    assert not cited
