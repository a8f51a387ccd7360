"""Convert a store from one layout to another (zarr, pt, pkl), whole or a subset."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from rbzarr.analysis.cluster import TrajectoryTasks
from rbzarr.errors import StoreExistsError
from rbzarr.shared_doc import shared_doc
from rbzarr.storage.index import format_records
from rbzarr.storage.index.schema import check_schema, schema_from_json
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class, open_store
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.storage.zarr.layout import CODECS_KEY

__all__ = ["COPY_FAILURES", "COPY_RETURNS", "copied_documents", "export_store"]

# Metadata keys the exported index recomputes; the rest are carried over unchanged.
# Written anew by the target (``layout_version`` and the codecs are the target layout's
# own, if any: an export re-encodes with the target's codecs).
_RECOMPUTED = (
    "trajectory_format",
    "size",
    "total_samples",
    "trajectory_counter",
    "layout_version",
    CODECS_KEY,
)

# The sections :func:`export_store` and :func:`~rbzarr.analysis.recode.recode_store` share.
COPY_RETURNS = """
Returns
-------
Documents
    The documents written to ``destination``.
"""
COPY_FAILURES = """
CheckpointNotFoundError
    ``source`` is not a store, or a listed trajectory's data is missing.
CorruptStoreError
    A trajectory or its priority file is damaged (``rbzarr verify`` names it).
StorageUnavailableError
    A backend failed.
"""


def _select(
    index: TrajectoryIndex, ids: Iterable[int] | None, last: int | None, where: str
) -> list[int]:
    """The ids to export, in the source's insertion order.

    Raises
    ------
    ValueError
        Both ``ids`` and ``last``, a negative ``last``, or ids the index does not list.
    """
    if ids is not None and last is not None:
        raise ValueError("pass either ids or last, not both")
    if last is not None:
        if last < 0:
            raise ValueError(f"last must be >= 0, got {last}")
        return index.id_list[len(index.id_list) - last :] if last else []
    if ids is None:
        return list(index.id_list)
    wanted = {int(i) for i in ids}
    missing = sorted(wanted.difference(index.id_list))
    if missing:
        raise ValueError(f"{where}: ids {missing} are not in the store's trajectory_id_list")
    return [i for i in index.id_list if i in wanted]


@shared_doc(copy_returns=COPY_RETURNS, copy_failures=COPY_FAILURES)
def export_store(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    trajectory_format: str,
    *,
    ids: Iterable[int] | None = None,
    last: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    tasks: TrajectoryTasks | None = None,
) -> Documents:
    """Copy the store at ``source`` to a new store at ``destination`` in another layout.

    The priority files stored beside the exported trajectories
    (:attr:`~rbzarr.storage.index.store_index.StoreIndex.priorities`) are copied too.  The
    trajectories are encoded with the target layout's default codecs, which its metadata
    records (``rbzarr recode`` chooses codecs).

    Parameters
    ----------
    source, destination
        Local paths or fsspec URLs; ``destination`` must not hold a store yet.
    trajectory_format
        The destination's layout: ``"zarr"``, ``"pt"`` or ``"pkl"``.
    ids
        Export only these trajectory ids (kept in the source's order).
    last
        Export only the last ``last`` ids of the source's trajectory_id_list.
    storage_options, destination_options
        fsspec options for the source and the destination.
    progress
        Show a progress bar on stderr.
    tasks
        Copies the trajectories, one task each on a dask cluster when it has a client
        (:func:`~rbzarr.analysis.cluster.connect`); the documents are written here, last.

    {copy_returns}

    Raises
    ------
    StoreExistsError
        ``destination`` already holds a store or trajectory data (nothing is written).
    ValueError
        Unknown format, both ``ids`` and ``last``, a negative ``last``, or ids the source
        does not list.
    {copy_failures}
    """
    target_class = layout_class(trajectory_format)
    reader, documents = open_store(source, storage_options)
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    selected = index.subset(_select(index, ids, last, reader.location.url))
    writer = target_class(Location.from_url(destination, destination_options))
    if StoreIndex.open(writer.location).exists or writer.list_ids():
        raise StoreExistsError(
            f"{writer.location.url} already holds a store; export writes only to a new location"
        )
    entries = [selected.entries[i] for i in selected.id_list]
    # The schema is copied only once the data confirms it (each trajectory is validated
    # against it on its way too).
    schema = schema_from_json(documents.metadata.get("schema"))
    if schema is not None and entries:
        check_schema(schema, reader, entries[-1])
    # Decode and re-encode even between equal formats: every trajectory passes the
    # safe loaders and validation on its way, so an export is also a check.
    (tasks or TrajectoryTasks()).copy(reader, writer, entries, progress)
    exported = copied_documents(reader, writer, selected, documents, trajectory_format)
    return format_records.write_documents(writer, exported)


def copied_documents(
    reader: TrajectoryLayout,
    writer: TrajectoryLayout,
    copied: TrajectoryIndex,
    documents: Documents,
    trajectory_format: str,
) -> Documents:
    """The documents of a copy of ``copied`` (in ``trajectory_format``, with the source's
    other metadata), after carrying the priorities stored beside its trajectories along."""
    entries = [copied.entries[i] for i in copied.id_list]
    # Same ids, and before the index: the copy lists no trajectory without its priorities.
    StoreIndex.assumed(reader.location).priorities.carry(
        StoreIndex.assumed(writer.location).priorities, [(e, e) for e in entries]
    )
    extra = {k: v for k, v in documents.metadata.items() if k not in _RECOMPUTED}
    return copied.to_documents(trajectory_format, extra=extra)
