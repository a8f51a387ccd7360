"""Format names to layout classes, and the one place an existing store is opened.

The registry maps a ``trajectory_format`` name to a dotted path
(``"rbzarr.storage.zarr.layout:ZarrLayout"``) and imports the module on first use, so the
layout ABC never imports its implementations.  :func:`open_store` is how every caller opens
a store that already exists: it reads the store's index (its catalog,
:class:`~rbzarr.storage.index.store_index.StoreIndex`, detects the format) and builds the
layout of the format it names.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.storage.index.store_index import StoreIndex, stored_format
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Documents

if TYPE_CHECKING:
    from rbzarr.storage.layout import TrajectoryLayout

__all__ = ["known_formats", "layout_class", "open_store", "register_layout"]

_LAYOUTS: dict[str, str | type[TrajectoryLayout]] = {
    "zarr": "rbzarr.storage.zarr.layout:ZarrLayout",
    "pt": "rbzarr.storage.rlinf.file_layout:PtLayout",
    "pkl": "rbzarr.storage.rlinf.file_layout:PklLayout",
}


def register_layout(name: str, target: str | type[TrajectoryLayout]) -> None:
    """Register a layout (a class or ``"package.module:Class"``) as ``trajectory_format=name``."""
    if isinstance(target, str) and target.count(":") != 1:
        raise ValueError(f"layout target {target!r}: expected 'package.module:ClassName'")
    current = _LAYOUTS.get(name)
    if current is not None and current != target:
        raise ValueError(f"trajectory_format {name!r} is already registered to {current!r}")
    _LAYOUTS[name] = target


def known_formats() -> list[str]:
    """The registered format names, sorted."""
    return sorted(_LAYOUTS)


def layout_class(name: str) -> type[TrajectoryLayout]:
    """The layout class registered as ``name``, importing its module on first use."""
    target = _LAYOUTS.get(name) if isinstance(name, str) else None
    if target is None:
        raise ValueError(f"unknown trajectory_format {name!r}; expected one of {known_formats()}")
    if isinstance(target, str):
        from rbzarr.storage.layout import TrajectoryLayout  # noqa: PLC0415 (torch, when needed)

        module_name, _, class_name = target.partition(":")
        target = getattr(importlib.import_module(module_name), class_name)
        if not (isinstance(target, type) and issubclass(target, TrajectoryLayout)):
            raise TypeError(f"{_LAYOUTS[name]!r} is not a TrajectoryLayout subclass")
        _LAYOUTS[name] = target
    return target


def open_store(
    url: str | os.PathLike[str] | Location,
    storage_options: Mapping[str, Any] | None = None,
    layout_options: Mapping[str, Mapping[str, Any]] | None = None,
    window: int | None = None,
) -> tuple[TrajectoryLayout, Documents]:
    """Open the existing store at ``url`` in the layout its metadata names, with its documents
    (the union of every writer's).

    ``layout_options`` holds keyword arguments for the layout by format name (only the stored
    format's apply).  With a ``window`` of trajectories, a large store's documents hold only
    its last ``window`` (:meth:`~rbzarr.storage.index.store_index.StoreIndex.read`).
    """
    location = Location.from_url(url, storage_options)
    documents = StoreIndex.assumed(location).read(window)
    fmt = stored_format(documents.metadata)
    options = dict((layout_options or {}).get(fmt, {}))
    return layout_class(fmt)(location, **options), documents
