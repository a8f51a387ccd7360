"""A store's two JSON documents: ``metadata.json`` and ``trajectory_index.json``.

Every layout keeps them at its root in RLinf's schema; writing them is the commit point of a
store (the index first, then the metadata, each atomically).  :class:`StoreDocuments` is the
base of every layout (:class:`~rbzarr.storage.layout.TrajectoryLayout`): it reads, writes and
looks for the documents, and :func:`read_documents` reads them whatever the layout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError
from rbzarr.storage.location import Location

__all__ = [
    "INDEX_FILE",
    "METADATA_FILE",
    "Documents",
    "Entry",
    "Finding",
    "StoreDocuments",
    "read_documents",
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


class StoreDocuments:
    """The documents of the store at ``location``; the base of every layout.

    Parameters
    ----------
    location
        The store's root.
    """

    def __init__(self, location: Location) -> None:
        self.location = location

    def write_documents(self, documents: Documents) -> Documents:
        """Commit: write the index, then the metadata, each atomically.

        Call only after every trajectory the index lists is completely written.

        Parameters
        ----------
        documents
            The documents to commit.

        Returns
        -------
        Documents
            The documents as written (a layout may add what describes its format).

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """
        self.location.write_bytes(_dump(documents.trajectory_index), INDEX_FILE)
        self.location.write_bytes(_dump(documents.metadata), METADATA_FILE)
        return documents

    def read_documents(self) -> Documents:
        """Read both documents.

        Returns
        -------
        Documents
            ``metadata.json`` and ``trajectory_index.json``.

        Raises
        ------
        CheckpointNotFoundError
            A document is missing (named in the message).
        CorruptStoreError
            A document is not a JSON object.
        """
        return read_documents(self.location)

    def listed_ids(self) -> list[int] | None:
        """Ids the index document lists.

        Returns
        -------
        list of int or None
            ``trajectory_id_list``, or ``None`` when there is no index document.

        Raises
        ------
        CorruptStoreError
            The index is not a JSON object with a ``trajectory_id_list``.
        """
        if not self.location.exists(INDEX_FILE):
            return None
        ids = _read_json(self.location, INDEX_FILE).get("trajectory_id_list")
        if not isinstance(ids, list):
            raise CorruptStoreError(f"{self.location.url}/{INDEX_FILE}: no trajectory_id_list")
        return ids

    def has_documents(self) -> bool:
        """Whether a store already exists here.

        Returns
        -------
        bool
            Whether either JSON document is present.
        """
        return self.location.exists(METADATA_FILE) or self.location.exists(INDEX_FILE)

    def check_documents(self, documents: Documents) -> list[Finding]:
        """Copies of ``documents`` this layout keeps that disagree with them.

        Each finding is repaired by writing the documents again
        (:meth:`write_documents`).  The default keeps no copies.

        Parameters
        ----------
        documents
            The store's documents, as read from the JSON files.

        Returns
        -------
        list of Finding
            One per disagreeing copy.
        """
        return []


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


def _read_json(location: Location, name: str) -> dict[str, Any]:
    try:
        raw = location.read_bytes(name)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"{location.url}/{name} not found: not an rbzarr or RLinf store"
        ) from exc
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptStoreError(f"{location.url}/{name} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise CorruptStoreError(f"{location.url}/{name}: expected a JSON object")
    return document


def _dump(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, indent=2).encode()
