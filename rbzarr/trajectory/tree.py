"""Nested dicts of tensors: the one place that walks them.

The flat form maps ``"/"``-joined key paths to tensors, in walk order (depth first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["SEP", "flatten", "leaves", "map_flat", "unflatten"]

SEP = "/"

Tree = Mapping[str, Any]

# Keys become path parts in a store: never a relative part or a Zarr metadata document.
_RESERVED = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


def leaves(tree: Tree, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(path, value)`` for every non-dict value of ``tree``, depth first.

    Keys become path parts in a store, so each must be a plain name: non-empty, not ``"."``,
    ``".."`` or a Zarr metadata document name, and free of ``"/"``, ``"\\"`` and NUL.
    """
    for key, value in tree.items():
        if key not in _plain and not _is_plain(key):
            raise ValueError(
                f"invalid key {key!r} under {prefix or '<root>'!r}: keys must be plain "
                f"names (non-empty strings, not '.', '..' or a Zarr metadata name, without "
                f"{SEP!r}, '\\' or NUL)"
            )
        path = f"{prefix}{SEP}{key}" if prefix else key
        if isinstance(value, Mapping):
            yield from leaves(value, path)
        else:
            yield path, value


def _is_plain(key: object) -> bool:
    """Whether ``key`` is a plain name (see :func:`leaves`); remembered when it is."""
    if (
        not isinstance(key, str)
        or key in ("", ".", "..")
        or key in _RESERVED
        or any(ch in key for ch in (SEP, "\\", "\x00"))
    ):
        return False
    if len(_plain) >= _PLAIN_SIZE:
        _plain.clear()
    _plain.add(key)
    return True


# Keys found plain: a trajectory's keys are checked once, not on every add.
_plain: set[str] = set()
_PLAIN_SIZE = 4096


def flatten(tree: Tree) -> dict[str, Any]:
    """Return the flat form of ``tree``: ``{"a/b": leaf, ...}``."""
    return dict(leaves(tree))


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the nested form of a flat dict; the inverse of :func:`flatten`."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, name = path.split(SEP)
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return tree


def map_flat(
    fn: Callable[[str, torch.Tensor], torch.Tensor], flat: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Apply ``fn(path, tensor)`` to every entry of a flat dict, keeping the order."""
    return {path: fn(path, tensor) for path, tensor in flat.items()}
