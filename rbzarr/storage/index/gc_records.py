"""Collection records: ``gc/<run-id>.json``, a deletion written down before any data goes.

A collection (``rbzarr gc`` offline, or a buffer's ``retention`` as it writes) first writes
a record of the ids it removes (``"state": "intent"``), then takes them out of the index,
then deletes their data.  A crash at any step leaves the record: whoever finishes it
deletes the data of its ids that no index lists any more (ids are never reused, so such
data is garbage).  Offline records are kept, marked ``"done"``; a writer's records name
its slot and are removed once finished, so the folder holds only open work.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index.priorities import FOLDER as PRIORITIES
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import is_temporary_name
from rbzarr.storage.layout import TrajectoryLayout

__all__ = ["FOLDER", "CollectionRecord", "delete_data", "open_records"]

FOLDER = "gc"
RECORD_VERSION = 1
_SUFFIX = ".json"


@dataclass(frozen=True)
class CollectionRecord:
    """One collection's record.

    Parameters
    ----------
    location
        The store's root.
    run_id
        The record's name (32 hex digits).
    ids
        The trajectories the collection removes.
    slot
        The writer slot of the buffer that collected as it wrote; ``None`` for ``rbzarr gc``.
    at
        When the ids left the index (seconds since the epoch): a grace period counts from it.
    """

    location: Location
    run_id: str
    ids: list[int]
    slot: int | None = None
    at: float = field(default_factory=time.time)

    @classmethod
    def new(cls, location: Location, ids: list[int], slot: int | None = None) -> CollectionRecord:
        """A record with a fresh run id, made now."""
        return cls(location, uuid.uuid4().hex, list(ids), slot)

    def write(self, state: str) -> None:
        """Write the record (atomically) in ``state`` (``"intent"`` or ``"done"``)."""
        document = {
            "rbzarr_gc": RECORD_VERSION,
            "id": self.run_id,
            "state": state,
            "at": self.at,
            "ids": self.ids,
        }
        if self.slot is not None:
            document["slot"] = self.slot
        self.location.write_bytes(json.dumps(document).encode(), FOLDER, self.run_id + _SUFFIX)

    def remove(self) -> None:
        """Delete the record (its work is done)."""
        self.location.delete(FOLDER, self.run_id + _SUFFIX)


def open_records(location: Location) -> list[CollectionRecord]:
    """The records not marked ``"done"`` (one listing, one read each), oldest first.

    Raises
    ------
    CorruptStoreError
        A record is malformed.
    """
    found = []
    for name in location.list_names(FOLDER):
        if is_temporary_name(name) or not name.endswith(_SUFFIX):
            continue
        where = f"{location.url}/{FOLDER}/{name}"
        try:
            document = read_json(location.read_bytes(FOLDER, name), where)
        except FileNotFoundError:
            continue  # finished meanwhile
        try:
            state, ids = document["state"], [int(i) for i in document["ids"]]
            slot = None if document.get("slot") is None else int(document["slot"])
            at = float(document.get("at", 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: not a collection record: {exc!r}") from exc
        if state != "done":
            found.append(CollectionRecord(location, name.removesuffix(_SUFFIX), ids, slot, at))
    return sorted(found, key=lambda record: (record.at, record.run_id))


def delete_data(layout: TrajectoryLayout, ids: list[int]) -> None:
    """Delete the data and the priority file of each of ``ids`` (missing ones are fine)."""
    for trajectory_id in ids:
        layout.delete({"trajectory_id": trajectory_id})
        layout.location.delete(PRIORITIES, f"{trajectory_id}.f32")
