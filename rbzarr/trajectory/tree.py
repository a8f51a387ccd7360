"""Nested dicts of tensors: the one place that walks them.

A *tree* is a ``dict`` whose values are tensors or trees.  Most of rbzarr works on the
*flat* form of a tree: a ``dict`` from ``"/"``-joined key paths to tensors, in the order
the tree is walked (depth first, insertion order).  ``flatten`` and ``unflatten`` convert
between the two; every other module goes through them instead of recursing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["SEP", "flatten", "leaves", "map_flat", "unflatten"]

SEP = "/"

Tree = Mapping[str, Any]

# Keys become path parts in a store: never a relative part or a Zarr metadata document.
_RESERVED = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


def leaves(tree: Tree, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(path, value)`` for every non-dict value of ``tree``, depth first.

    Keys become path parts in a store, so each must be a plain name: a non-empty string
    that is not ``"."`` or ``".."``, not a Zarr metadata document name (``zarr.json``,
    ``.zarray``, ``.zgroup``, ``.zattrs``, ``.zmetadata``) and holds no ``"/"``, ``"\\"``
    or NUL.

    Parameters
    ----------
    tree
        A nested dict whose leaves are tensors (or any non-mapping value).
    prefix
        The path of ``tree`` itself inside a larger tree; ``""`` for the root.

    Yields
    ------
    tuple of (str, Any)
        The ``"/"``-joined path of a leaf (starting with ``prefix``) and the leaf.

    Raises
    ------
    ValueError
        A key is not a plain name; the message names the key and the path it is under.
    """
    for key, value in tree.items():
        if (
            not isinstance(key, str)
            or key in ("", ".", "..")
            or key in _RESERVED
            or any(ch in key for ch in (SEP, "\\", "\x00"))
        ):
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


def flatten(tree: Tree) -> dict[str, Any]:
    """Return the flat form of ``tree``: ``{"a/b": leaf, ...}``.

    Parameters
    ----------
    tree
        A nested dict of tensors.

    Returns
    -------
    dict of str to Any
        Leaves by ``"/"``-joined path, in depth-first insertion order.

    Raises
    ------
    ValueError
        A key is not a plain name (see :func:`leaves`).
    """
    return dict(leaves(tree))


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the nested form of a flat dict; the inverse of :func:`flatten`.

    Parameters
    ----------
    flat
        Values by ``"/"``-joined path, as :func:`flatten` returns them.

    Returns
    -------
    dict of str to Any
        The nested dicts, keys in the order the paths first name them.
    """
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
    """Apply ``fn(path, tensor)`` to every entry of a flat dict, keeping the order.

    Parameters
    ----------
    fn
        Called with each path and its tensor; returns the new tensor.
    flat
        Tensors by ``"/"``-joined path.

    Returns
    -------
    dict of str to torch.Tensor
        ``fn``'s results under the same paths, in the same order.
    """
    return {path: fn(path, tensor) for path, tensor in flat.items()}
