"""Docstring sections that several public calls share, written once and filled in at import."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

__all__ = ["shared_doc"]

_Documented = TypeVar("_Documented")
# A line of a docstring that holds only ``{name}``: where a shared text goes.
_PLACEHOLDER = re.compile(r"^(?P<indent>[ ]*)\{(?P<name>\w+)\}$", re.MULTILINE)


def shared_doc(**texts: str) -> Callable[[_Documented], _Documented]:
    """A decorator replacing each docstring line ``{name}`` with ``texts[name]``, indented as
    that line (numpydoc and :func:`inspect.getdoc` read the result); an unknown name is a
    ``KeyError`` at import."""

    def indented(match: re.Match[str]) -> str:
        """The text named by ``match``, each non-blank line at the placeholder's indent."""
        lines = texts[match["name"]].strip("\n").splitlines()
        return "\n".join(match["indent"] + line if line.strip() else "" for line in lines)

    def fill(documented: _Documented) -> _Documented:
        """``documented`` with its docstring filled in."""
        documented.__doc__ = _PLACEHOLDER.sub(indented, documented.__doc__ or "")
        return documented

    return fill
