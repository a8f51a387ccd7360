"""Names below a location: what a plain child name is, and how temporary files are named.

:func:`safe_name` is the check behind :meth:`~rbzarr.storage.io.location.Location.child`: a
name that could leave its root (``..``, separators, absolute parts, NUL and other control
characters) is refused, naming the root; :func:`safe_key` checks each part of a
``/``-joined field key.  A name that stands for a number (a trajectory's folder, a writer's
slot, a log record) is read by :func:`number_name`: ASCII digits only, as rbzarr writes
them (``str.isdigit`` also admits superscripts and other scripts' digits, which ``int``
then refuses or reads).
An atomic write goes through a sibling named by :func:`temporary_name`; a
leftover one of an interrupted write (ours or zarr's ``LocalStore``'s) is recognised by
:func:`is_temporary_name`.  :func:`bytes_by_prefix` totals file sizes by path prefix.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import defaultdict
from collections.abc import Mapping

from rbzarr.errors import UnsafePathError

__all__ = [
    "TEMP_SUFFIX",
    "bytes_by_prefix",
    "is_digits",
    "is_temporary_name",
    "number_name",
    "safe_key",
    "safe_name",
    "temporary_name",
]

# Temporary files of an interrupted atomic write: ours (``<name>.tmp-<hex>``) and those of
# zarr's LocalStore (``<stem>.<hex>.partial``).
TEMP_SUFFIX = ".tmp-"
_TEMPORARY_NAME = re.compile(
    rf".+{re.escape(TEMP_SUFFIX)}[0-9a-f]{{32}}|.+\.[0-9a-f]{{32}}\.partial"
)
# A number as rbzarr writes it in a name: ASCII digits, no sign, no leading zero.
_NUMBER = re.compile(r"0|[1-9][0-9]*")
_DIGITS = re.compile(r"[0-9]+")
# Separators, NUL and the other control characters.
_FORBIDDEN = re.compile(r"[/\\\x00-\x1f\x7f]")


# Temporary names: this process's random 16 hex digits (new in a forked child), then a
# counter's 16.  No call per name lets go of the GIL (``uuid4`` reads the system's random
# source each time, and a writer thread taking the GIL back waits for the caller's thread).
_names = itertools.count()
_process_token = os.urandom(8).hex()


def _renew_process_token() -> None:
    """A forked child's token: its names must differ from those its parent goes on making."""
    global _process_token  # noqa: PLW0603 - the module's one token, replaced whole
    _process_token = os.urandom(8).hex()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_process_token)


def temporary_name(path: str) -> str:
    """A fresh sibling of ``path`` to write before renaming onto it: ``<path>.tmp-<32 hex>``."""
    return f"{path}{TEMP_SUFFIX}{_process_token}{next(_names) % (1 << 64):016x}"


def is_temporary_name(name: str) -> bool:
    """Whether file name ``name`` is left over from an interrupted atomic write (ours, zarr's)."""
    return _TEMPORARY_NAME.fullmatch(name) is not None


def number_name(name: str) -> int | None:
    """The number a name like ``"17"`` stands for (ASCII digits, written as ``str(n)``
    writes it), else ``None``."""
    return int(name) if isinstance(name, str) and _NUMBER.fullmatch(name) else None


def is_digits(text: str, length: int | None = None) -> bool:
    """Whether ``text`` is ASCII digits only (``length`` of them, when given)."""
    return (
        isinstance(text, str)
        and _DIGITS.fullmatch(text) is not None
        and (length is None or len(text) == length)
    )


def safe_name(name: str, root: str = "") -> str:
    """``name`` if it is a plain file name, else :class:`UnsafePathError` naming ``root``."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or _FORBIDDEN.search(name) is not None  # "/" included: nothing absolute is left
    ):
        raise UnsafePathError(f"unsafe name {name!r}: it must be a plain file name inside {root!r}")
    return name


def safe_key(key: str, root: str = "") -> str:
    """``key`` if each of its ``/``-separated parts is a plain name (:func:`safe_name`)."""
    if not isinstance(key, str):
        raise UnsafePathError(f"unsafe key {key!r}: expected a str inside {root!r}")
    for part in key.split("/"):
        safe_name(part, root)
    return key


def bytes_by_prefix(sizes: Mapping[str, int]) -> dict[str, int]:
    """Total bytes below every one- and two-part prefix of ``sizes``' ``/``-joined paths.

    A file counts as its own prefix: ``totals["trajectory_3_.pt"]`` is a file's size and
    ``totals["trajectories/3"]`` the size of a directory's files.
    """
    totals: dict[str, int] = defaultdict(int)
    for path, size in sizes.items():
        parts = path.split("/")
        for depth in {1, min(2, len(parts))}:
            totals["/".join(parts[:depth])] += size
    return dict(totals)
