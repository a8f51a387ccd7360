"""A store's documents and what they list, read without torch (``rbzarr info`` and ``ls``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rbzarr.storage.index.store_index import StoreIndex, stored_format
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import Entry

__all__ = ["StoreListing"]


class StoreListing:
    """The committed trajectories of a store, from its documents (checked as a buffer does).

    Parameters
    ----------
    url
        The store's path, URL or :class:`~rbzarr.storage.io.location.Location`.
    storage_options
        fsspec options for ``url``.

    Raises
    ------
    CheckpointNotFoundError
        No store is at ``url`` (the message says why: a missing bucket or folder, a file).
    CorruptStoreError
        The documents are malformed.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.location = Location.from_url(url, storage_options)
        documents = StoreIndex.assumed(self.location).read()
        self.metadata = dict(documents.metadata)
        self.format = stored_format(documents.metadata)
        self._index = TrajectoryIndex.from_documents(documents, self.location.url)

    @property
    def url(self) -> str:
        """The store's location."""
        return self.location.url

    @property
    def entries(self) -> dict[int, Entry]:
        """Index entries by id, in index order."""
        return {i: self._index.entries[i] for i in self._index.id_list}

    @property
    def total_samples(self) -> int:
        """``T * B`` summed over the committed trajectories."""
        return self._index.total_samples

    @property
    def unrecorded_version(self) -> int | None:
        """The layout version of a store whose metadata records none (only the zarr layout
        is versioned)."""
        if self.format != "zarr":
            return None
        from rbzarr.storage.zarr.describe import UNRECORDED_VERSION  # noqa: PLC0415

        return UNRECORDED_VERSION

    def __len__(self) -> int:
        return len(self._index)

    def trajectory_path(self, entry: Entry) -> str:
        """The ``/``-joined path of a trajectory's data below the root."""
        if self.format == "zarr":
            from rbzarr.storage.zarr.describe import trajectory_path  # noqa: PLC0415

            return "/".join(trajectory_path(entry))
        return "/".join(layout_class(self.format)(self.location).trajectory_path(entry))

    def describe_keys(
        self, sizes: Mapping[str, int], progress: bool = False
    ) -> tuple[dict[str, dict[str, Any]], int]:
        """Per-key layout and sizes (:meth:`TrajectoryLayout.describe_keys`); a zarr store's
        from zarr's metadata alone, other formats' by reading the trajectories (torch)."""
        entries = self.entries.values()
        if self.format == "zarr":
            from rbzarr.storage.zarr.describe import describe_keys  # noqa: PLC0415

            return describe_keys(self.location, entries, sizes, progress)
        layout = layout_class(self.format)(self.location)
        return layout.describe_keys(entries, sizes, progress)
