"""Checkpoint manifests: checkpoints of a zarr store that name its trajectories, copying none.

``save_checkpoint(path)`` of a buffer with a zarr ``auto_save`` store writes one file,
``<path>/checkpoint.json``::

    {"rbzarr_checkpoint": 1, "store": "<the store's URL>", "trajectory_format": "zarr",
     "pin": "<pin id>", "created": <seconds>, "metadata": {...}, "trajectory_index": {...}}

``metadata`` and ``trajectory_index`` are exactly the two documents a copied checkpoint of
the same window holds (ids, counters, the sampler's and RNG's state, the schema, and each
trajectory's entry with its uuid, the identity its commit marker repeats), so a load draws
what a load of the copy draws.  The window's priorities (prioritized replay) are written
beside it, ``<path>/priorities/<id>.f32``, as a copy holds them: the store's own priority
files change as training goes on.

The order makes a crash harmless: the trajectories are committed first, then the store's pin
(:mod:`rbzarr.storage.index.pins`), then the priorities, then the manifest (atomically), so a
manifest exists only with its pin and its data.  Loading checks that the store is there and
that each trajectory it loads still carries the uuid the manifest names, else
:class:`~rbzarr.errors.CheckpointReferenceError` says which.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rbzarr.errors import CheckpointReferenceError, CorruptStoreError, StoreExistsError
from rbzarr.storage.index import format_records
from rbzarr.storage.index.pins import Pin, StorePins
from rbzarr.storage.index.priorities import FOLDER as PRIORITIES
from rbzarr.storage.index.priorities import PriorityFiles
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import INDEX_FILE, METADATA_FILE, Documents

__all__ = [
    "MANIFEST_FILE",
    "Manifest",
    "check_free",
    "drop",
    "open_store",
    "read_manifest",
    "write",
]

MANIFEST_FILE = "checkpoint.json"
MANIFEST_VERSION = 1
# Names at a save path that mean a store or a checkpoint is there already.
_TAKEN = frozenset({MANIFEST_FILE, METADATA_FILE, INDEX_FILE, "index", "trajectories", "zarr.json"})

# A layout for a location and a format name (the buffer's options applied where they fit).
LayoutFactory = Callable[[Location, str], TrajectoryLayout]


@dataclass(frozen=True)
class Manifest:
    """A checkpoint that names a store's trajectories instead of holding copies.

    Parameters
    ----------
    store
        The URL of the zarr store holding the trajectories.
    trajectory_format
        The store's format.
    pin_id
        The store's pin that keeps the trajectories.
    created
        When it was saved (seconds since the epoch).
    documents
        The two documents a copied checkpoint of the same window holds.
    """

    store: str
    trajectory_format: str
    pin_id: str
    created: float
    documents: Documents

    def to_json(self) -> bytes:
        """The manifest file's bytes (compact JSON)."""
        document = {
            "rbzarr_checkpoint": MANIFEST_VERSION,
            "store": self.store,
            "trajectory_format": self.trajectory_format,
            "pin": self.pin_id,
            "created": self.created,
            "metadata": self.documents.metadata,
            "trajectory_index": self.documents.trajectory_index,
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        """Parse and check a manifest file (``where`` names it in errors)."""
        document = read_json(raw, where)
        try:
            version = document["rbzarr_checkpoint"]
            manifest = cls(
                store=str(document["store"]),
                trajectory_format=str(document["trajectory_format"]),
                pin_id=str(document["pin"]),
                created=float(document["created"]),
                documents=Documents(dict(document["metadata"]), dict(document["trajectory_index"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: not a checkpoint manifest: {exc!r}") from exc
        if version != MANIFEST_VERSION:
            raise CorruptStoreError(
                f"{where}: manifest version {version!r}, this rbzarr reads {MANIFEST_VERSION}"
            )
        return manifest

    def index(self, where: str) -> TrajectoryIndex:
        """The checkpoint's index, checked as a copied checkpoint's is."""
        return TrajectoryIndex.from_documents(self.documents, where)


def read_manifest(location: Location) -> Manifest | None:
    """The manifest at ``location`` (a checkpoint's folder); ``None`` when there is none."""
    try:
        raw = location.read_bytes(MANIFEST_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Manifest.from_json(raw, f"{location.url}/{MANIFEST_FILE}")


def check_free(location: Location) -> None:
    """Refuse a save path holding a store or a checkpoint already (one listing).

    Raises
    ------
    StoreExistsError
        ``location`` holds a manifest, a store's documents, index or data.
    """
    taken = sorted(_TAKEN.intersection(location.list_names()))
    if taken:
        raise StoreExistsError(
            f"{location.url} already holds a store or a checkpoint ({', '.join(taken)}); a "
            "checkpoint never overwrites one: choose a new save_path or drop the old "
            "checkpoint first (rbzarr checkpoint drop)"
        )


def write(
    location: Location,
    store: TrajectoryLayout,
    index: TrajectoryIndex,
    metadata: Mapping[str, Any],
    priorities: Mapping[int, Any],
) -> Manifest:
    """Pin ``index``'s committed trajectories in ``store``, then write the manifest at
    ``location`` (``priorities`` by id beside it): three writes plus one per priority file."""
    ids = list(index.id_list)
    pin = Pin.new(location.url, ids, [str(index.entries[i].get("uuid", "")) for i in ids])
    StorePins(store.location).add(pin)
    files = PriorityFiles(location)
    for trajectory_id, values in priorities.items():
        files.write(trajectory_id, values)
    manifest = Manifest(
        store=store.location.url,
        trajectory_format=store.format,
        pin_id=pin.pin_id,
        created=pin.created,
        documents=index.to_documents(store.format, metadata),
    )
    location.write_bytes(manifest.to_json(), MANIFEST_FILE)
    return manifest


def open_store(
    manifest: Manifest, location: Location, open_layout: LayoutFactory
) -> TrajectoryLayout:
    """The layout of the store ``manifest`` (read at ``location``) names.

    Raises
    ------
    CheckpointReferenceError
        No store is there any more.
    """
    where = Location.from_url(
        manifest.store, location.storage_options, follow_links=location.follow_links
    )
    source = open_layout(where, manifest.trajectory_format)
    if not StoreIndex.open(where).exists:
        raise CheckpointReferenceError(
            f"{location.url}: the checkpoint's store {manifest.store} is gone ({where.absence()}); "
            "its trajectories cannot be loaded",
            manifest.store,
        )
    return source


def check_trajectories(source: TrajectoryLayout, index: TrajectoryIndex, where: str) -> None:
    """Check that each of ``index``'s trajectories is in ``source`` and still the one the
    manifest at ``where`` names (its commit marker's uuid): one read per trajectory.

    Raises
    ------
    CheckpointReferenceError
        Some are missing or changed; the message and the error's fields list them.
    """
    missing, changed = [], []
    for trajectory_id in index.id_list:
        attributes = format_records.written_attributes(source, trajectory_id)
        if attributes is None:
            missing.append(trajectory_id)
        elif attributes.get("uuid") != index.entries[trajectory_id].get("uuid"):
            changed.append(trajectory_id)
    if missing or changed:
        parts = [f"missing {missing}" if missing else "", f"changed {changed}" if changed else ""]
        raise CheckpointReferenceError(
            f"{where}: trajectories of the checkpoint's store {source.location.url} are "
            f"{' and '.join(p for p in parts if p)} (gone, or no longer the trajectory the "
            "manifest names); the checkpoint cannot be loaded",
            source.location.url,
            tuple(missing),
            tuple(changed),
        )


def drop(location: Location, manifest: Manifest) -> bool:
    """Delete the manifest at ``location`` (and the priorities beside it), then its pin;
    whether the store still had the pin."""
    # The manifest goes first: a crash in between leaves a pin without a manifest (nothing
    # lost; drop it by id), never a manifest without its pin.
    location.delete(MANIFEST_FILE)
    location.delete(PRIORITIES)
    store = Location.from_url(manifest.store, location.storage_options)
    return StorePins(store).drop(manifest.pin_id)
