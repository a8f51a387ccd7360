"""Names below a location: what a plain child name is, and how temporary files are named.

:func:`safe_name` is the check behind :meth:`~rbzarr.storage.location.Location.child`: a
name that could leave its root (``..``, separators, absolute parts, NUL) is refused, naming
the root.  Atomic writes go through a temporary file named with :data:`TEMP_SUFFIX`; a
leftover one of an interrupted write (ours or zarr's ``LocalStore``'s) is recognised by
:func:`is_temporary_name`.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from rbzarr.errors import UnsafePathError

__all__ = ["TEMP_SUFFIX", "is_temporary_name", "safe_name"]

# Temporary files of an interrupted atomic write: ours (``<name>.tmp-<hex>``) and those of
# zarr's LocalStore (``<stem>.<hex>.partial``).
TEMP_SUFFIX = ".tmp-"
_TEMPORARY_NAME = re.compile(r".+\.tmp-[0-9a-f]{32}|.+\.[0-9a-f]{32}\.partial")


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is a leftover temporary file of an interrupted atomic write.

    Parameters
    ----------
    name
        A file name (no directories).

    Returns
    -------
    bool
        ``True`` for ``<name>.tmp-<32 hex>`` (ours) and ``<stem>.<32 hex>.partial`` (zarr's
        ``LocalStore``).
    """
    return _TEMPORARY_NAME.fullmatch(name) is not None


_FORBIDDEN = ("/", "\\", "\x00")


def safe_name(name: str, root: str = "") -> str:
    """Return ``name`` if it is a plain file name, else refuse it.

    Parameters
    ----------
    name
        The name to check.
    root
        The location it would go below, named in the error.

    Returns
    -------
    str
        ``name`` itself.

    Raises
    ------
    UnsafePathError
        ``name`` is not a string, is empty, ``.`` or ``..``, contains ``/``, ``\\`` or
        NUL, or is absolute.
    """
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(ch in name for ch in _FORBIDDEN)
        or PurePosixPath(name).is_absolute()
    ):
        raise UnsafePathError(f"unsafe name {name!r}: it must be a plain file name inside {root!r}")
    return name
