"""A store's committed trajectories read as numpy arrays, without torch (``rbzarr show``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.analysis.listing import StoreListing
from rbzarr.buffer.local_cache_settings import LocalCacheSettings
from rbzarr.storage.index.schema import schema_from_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.trajectory.steps import continuing_runs

if TYPE_CHECKING:
    from rbzarr.storage.rlinf.documents import Entry
    from rbzarr.trajectory.model import Schema

__all__ = ["StoreArrays"]


class StoreArrays(StoreListing):
    """The committed trajectories of a store and its layout, whose
    :meth:`~rbzarr.storage.layout.TrajectoryLayout.read_arrays` and
    :meth:`~rbzarr.storage.layout.TrajectoryLayout.read_row_arrays` decode into numpy: a
    zarr store is read without importing torch (the pickled tensors of a pt or pkl store
    need it).  :class:`~rbzarr.analysis.view.BufferView` reads the same store as tensors,
    and samples it.

    Parameters
    ----------
    url, storage_options
        As for :class:`~rbzarr.analysis.listing.StoreListing`.
    layout_options
        Keyword arguments of the store's layout by format name, as for
        :func:`~rbzarr.analysis.view.open_buffer`.
    local_cache_dir, local_cache_bytes
        A local copy of a remote zarr store's shards, as for
        :func:`~rbzarr.analysis.view.open_buffer`.

    Raises
    ------
    ValueError
        ``local_cache_bytes`` is not positive, or is given without ``local_cache_dir``;
        and what :class:`~rbzarr.analysis.listing.StoreListing` raises.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
        *,
        layout_options: Mapping[str, Mapping[str, Any]] | None = None,
        local_cache_dir: str | os.PathLike[str] | None = None,
        local_cache_bytes: int | None = None,
    ) -> None:
        cache = LocalCacheSettings.of(local_cache_dir, local_cache_bytes)
        super().__init__(url, storage_options)
        kind = layout_class(self.format)
        options = {**cache.layout_options(kind), **(layout_options or {}).get(self.format, {})}
        self.layout = kind(self.location, **options)
        self._schema: Schema | None = None

    @property
    def ids(self) -> list[int]:
        """Committed trajectory ids, in index order."""
        return list(self.entries)

    def entry(self, trajectory_id: int) -> Entry:
        """The index entry of ``trajectory_id`` (``KeyError`` if not committed), as
        :meth:`~rbzarr.analysis.view.BufferView.entry` gives it."""
        found = self.entries.get(trajectory_id)
        if found is None:
            raise KeyError(f"{self.url}: trajectory {trajectory_id} is not in the index")
        return found

    def run_continues(self, across_trajectories: bool = True) -> list[bool]:
        """Per id of :attr:`ids`: whether the next trajectory continues its run (all false
        unless ``across_trajectories``), as :meth:`~rbzarr.analysis.view.BufferView.run_continues`
        says."""
        return continuing_runs(list(self.entries.values()), across_trajectories)

    def keys(self) -> list[str]:
        """Flat field keys of the first trajectory, in its field order (``[]``: none)."""
        ids = self.ids
        return [] if not ids else self.layout.field_names(self.entry(ids[0]))

    def schema(self) -> Schema:
        """Sampled keys with their dtype names and trailing shapes (empty for an empty
        store): from ``metadata.json`` when rbzarr wrote the store, else from its first
        trajectory (read as tensors)."""
        if self._schema is None:
            schema = schema_from_json(self.metadata.get("schema"))
            if schema is None and self.ids:
                from rbzarr.trajectory.model import validate  # noqa: PLC0415 (torch)

                schema = validate(self.layout.read(self.entry(self.ids[0]))).schema
            if schema is None:
                return {}
            self._schema = schema
        return dict(self._schema)
