"""A store re-encoded into a new zarr store with other codecs (``rbzarr recode``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from rbzarr.errors import CorruptStoreError, StoreExistsError
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.storage.zarr.codecs import parse_codecs
from rbzarr.storage.zarr.layout import CODECS_KEY, ZarrLayout

__all__ = ["recode_store"]

# Metadata the destination computes itself.
_RECOMPUTED = (
    "trajectory_format",
    "size",
    "total_samples",
    "trajectory_counter",
    "layout_version",
    CODECS_KEY,
)


def recode_store(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    codecs: Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Copy every committed trajectory of ``source`` into a new zarr store at ``destination``,
    its keys encoded with ``codecs``.

    ``source`` is only read.  Keys ``codecs`` does not name keep the codec ``source``
    records for them, unless ``codecs`` has ``"default"``.  Lossy codecs record their PSNR,
    as when writing.  An interrupted recode resumes: run it again with the same arguments and
    the trajectories already complete in ``destination`` are kept; the store's documents are
    written last, so ``destination`` is a store only once every trajectory is in it.

    Parameters
    ----------
    source
        The store read (any format).
    destination
        Where the new zarr store goes: a new location, or one an interrupted recode left.
    codecs
        ``{key: spec}`` (``"curr_obs/image": "jpeg:95"``, ``"default": "lossless"``).
    storage_options, destination_options
        fsspec options of ``source`` and ``destination``.
    progress
        Show a progress bar on stderr.

    Returns
    -------
    Documents
        The documents written to ``destination``.

    Raises
    ------
    StoreExistsError
        ``destination`` already holds a store (its documents); nothing is written.
    ValueError
        A spec is malformed, or names a key ``source`` does not have.
    CheckpointNotFoundError
        ``source`` is not a store, or a listed trajectory's data is missing.
    StorageUnavailableError
        A backend failed.
    """
    given = parse_codecs(codecs)
    reader, documents = open_store(source, storage_options)
    schema = documents.metadata.get("schema") or {}
    unknown = sorted(key for key in given if key != "default" and schema and key not in schema)
    if unknown:
        raise ValueError(f"{reader.location.url} has no key {unknown[0]!r} (keys: {list(schema)})")
    recorded = documents.metadata.get(CODECS_KEY) or {}
    merged: dict[str, Any] = dict(given)
    if "default" not in given:  # the source's own choices stay where none is given
        merged = {**{k: v for k, v in recorded.items() if k != "default"}, **given}
        merged.setdefault("default", recorded.get("default", "raw"))
    writer = ZarrLayout(Location.from_url(destination, destination_options), codecs=merged)
    if StoreIndex.open(writer.location).exists:
        raise StoreExistsError(
            f"{writer.location.url} already holds a store; recode writes only to a new "
            "location (or one an interrupted recode left)"
        )
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    entries = [index.entries[i] for i in index.id_list]
    for entry in tqdm(entries, desc="recode", unit="traj", disable=not progress):
        if _complete(writer, entry):
            continue
        writer.write(dict(entry), reader.read(entry))
    extra = {k: v for k, v in documents.metadata.items() if k not in _RECOMPUTED}
    return writer.write_documents(index.to_documents("zarr", extra=extra))


def _complete(writer: ZarrLayout, entry: Mapping[str, Any]) -> bool:
    """Whether a trajectory is already wholly in ``writer`` (its group's attributes, the
    commit marker, are written last)."""
    if not writer.contains(dict(entry)):
        return False
    try:
        return bool(writer.field_names(dict(entry))) and not writer.missing_parts(dict(entry))
    except CorruptStoreError:
        return False
