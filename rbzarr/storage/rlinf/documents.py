"""A store's two JSON documents (``metadata.json``, ``trajectory_index.json``) and their I/O.

Every store keeps them at its root in RLinf's schema.  For a pt / pkl store, writing them
(the index first, then the metadata, each atomically) is the commit point; a zarr store's
commit point is its index log (:mod:`rbzarr.storage.index.log`) and they are its mirror,
rewritten when a writer closes.  These functions read and write them on a
:class:`~rbzarr.storage.io.location.Location`, whatever the layout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location

__all__ = [
    "INDEX_FILE",
    "METADATA_FILE",
    "Documents",
    "Entry",
    "Finding",
    "documents_exist",
    "read_documents",
    "read_metadata",
    "write_documents",
]

METADATA_FILE = "metadata.json"
INDEX_FILE = "trajectory_index.json"

# An index entry: {"uuid", "trajectory_id", "num_samples", "shape", "max_episode_length",
# "model_weights_id"} (JSON-ready values).
Entry = Mapping[str, Any]


@dataclass(frozen=True)
class Documents:
    """The two JSON documents of a store, as plain dicts in RLinf's schema.

    Parameters
    ----------
    metadata
        ``metadata.json``: the buffer's settings and counters (``trajectory_format``, ...).
    trajectory_index
        ``trajectory_index.json``: ``trajectory_id_list`` and one entry per trajectory.
    """

    metadata: dict[str, Any]
    trajectory_index: dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """Something a layout found wrong with its own data.

    Parameters
    ----------
    kind
        A short machine-readable name, e.g. ``"root_attrs_mismatch"``.
    path
        Where, ``/``-joined below the store's root (``""`` for the store itself).
    message
        What is wrong, for people.
    """

    kind: str
    path: str
    message: str


def read_documents(location: Location) -> Documents:
    """Read a store's two documents, whatever its layout.

    Parameters
    ----------
    location
        The store's root.

    Returns
    -------
    Documents
        ``metadata.json`` and ``trajectory_index.json``.

    Raises
    ------
    CheckpointNotFoundError
        A document is missing (named in the message).
    CorruptStoreError
        A document is not valid JSON or not a JSON object.
    StorageUnavailableError
        The backend failed.
    """
    return Documents(
        metadata=_read_json(location, METADATA_FILE),
        trajectory_index=_read_json(location, INDEX_FILE),
    )


def read_metadata(location: Location) -> dict[str, Any] | None:
    """``metadata.json`` alone, or ``None`` when it does not exist (malformed: a named error)."""
    try:
        return _read_json(location, METADATA_FILE)
    except CheckpointNotFoundError:
        return None


def write_documents(location: Location, documents: Documents) -> None:
    """Write the index, then the metadata, each atomically, at ``location``."""
    # Each on one line: ``indent`` takes json's pure-Python encoder, 4x slower (71 ms against
    # 17 ms for 10,000 entries), whose closures are cycles left to the garbage collector.
    location.write_bytes(json.dumps(documents.trajectory_index).encode(), INDEX_FILE)
    location.write_bytes(json.dumps(documents.metadata).encode(), METADATA_FILE)


def documents_exist(location: Location) -> bool:
    """Whether either JSON document is present at ``location``."""
    return location.exists(METADATA_FILE) or location.exists(INDEX_FILE)


def _read_json(location: Location, name: str) -> dict[str, Any]:
    """The JSON object in ``location/name``; missing or malformed is a named error."""
    try:
        raw = location.read_bytes(name)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"{location.url}/{name} not found: {location.absence()}"
        ) from exc
    document = read_json(raw, f"{location.url}/{name}")
    if not isinstance(document, dict):
        raise CorruptStoreError(f"{location.url}/{name}: expected a JSON object")
    return document
