"""Every public call carries a numpydoc docstring: summary, Parameters, Returns, Yields.

The public calls are what each module exports in ``__all__``, with the public methods and
properties of the classes among them.  numpydoc's own validator reads them; "Raises" is
checked by ruff (``DOC501``: an exception raised in the body is named in the docstring).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator

import pytest
from numpydoc.validate import validate

import rbzarr

# GL08: no docstring; PR01: a parameter not documented; PR02: a documented parameter that
# does not exist; RT01: no Returns section for a function that returns; YD01: no Yields.
CHECKS = ("GL08", "PR01", "PR02", "RT01", "YD01")

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(rbzarr.__path__, "rbzarr.")
    if not any(part.startswith("_") for part in info.name.split("."))
)


def public_names(module_name: str) -> Iterator[str]:
    """The dotted names of the module's exports and their classes' public members."""
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module_name:
            continue  # re-exported: checked where it is defined
        yield f"{module_name}.{name}"
        if not inspect.isclass(obj):
            continue
        for member_name, member in vars(obj).items():
            if member_name.startswith("_"):
                continue
            function = member.__func__ if isinstance(member, staticmethod | classmethod) else member
            if isinstance(function, property) or inspect.isfunction(function):
                yield f"{module_name}.{name}.{member_name}"


def test_every_module_declares_its_exports():
    missing = [name for name in MODULES if not hasattr(importlib.import_module(name), "__all__")]
    assert missing == []


@pytest.mark.parametrize("module_name", MODULES)
def test_public_calls_have_numpydoc_sections(module_name):
    problems = [
        f"{name}: {code} {message}"
        for name in public_names(module_name)
        for code, message in validate(name)["errors"]
        if code in CHECKS
    ]
    assert problems == [], "\n".join(problems)


def test_the_check_catches_a_missing_section():
    report = validate(f"{__name__}.public_names")  # this module, as pytest imported it
    codes = {code for code, _ in report["errors"]}
    assert {"PR01", "YD01"} <= codes
