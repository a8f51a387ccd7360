"""Many writers, one store: writer slots, their documents, and the union that readers see.

A store has any number of writers, each holding one *slot*.  Slot 0 is the writer a
single-writer store has always had: it writes the root ``metadata.json`` and
``trajectory_index.json`` exactly as before.  Slot ``s >= 1`` writes its own two documents
under ``writers/<s>/`` and gives its trajectories ids in ``[s * ID_STRIDE, (s + 1) *
ID_STRIDE)``, so no document is written by two writers and no id by two slots.  Every
writer's trajectory data lives where the layout puts it (``trajectories/<id>``).

Readers see the union (:func:`read_store_documents`): the root's trajectories in the
root's order, then the other writers' in the order they were committed (the wall-clock
time each writer records in its index document), the counters recounted over the union.
A slot's index document carries that time per id under :data:`COMMIT_TIMES`; RLinf's keys
are otherwise unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from rbzarr.errors import CorruptStoreError
from rbzarr.storage import documents as store_documents
from rbzarr.storage.documents import INDEX_FILE, METADATA_FILE, Documents
from rbzarr.storage.location import Location

__all__ = [
    "COMMIT_TIMES",
    "ID_STRIDE",
    "WRITERS",
    "id_range",
    "read_slot_documents",
    "read_store_documents",
    "slot_location",
    "store_has_documents",
    "writer_slots",
]

WRITERS = "writers"
# Ids of slot s are [s * ID_STRIDE, (s + 1) * ID_STRIDE).
ID_STRIDE = 1_000_000_000
# Key of a slot's index document: the commit time (seconds since the epoch) of each listed id.
COMMIT_TIMES = "rbzarr_commit_times"


def id_range(slot: int) -> tuple[int, int]:
    """The ``[first, end)`` ids of ``slot``."""
    return slot * ID_STRIDE, (slot + 1) * ID_STRIDE


def slot_location(location: Location, slot: int) -> Location:
    """Where ``slot`` keeps its documents: the root for slot 0, else ``writers/<slot>``."""
    return location if slot == 0 else location.child(WRITERS, str(slot))


def writer_slots(location: Location) -> list[int]:
    """The slots ``s >= 1`` that have a folder under ``writers/``, sorted."""
    if not location.exists(WRITERS):
        return []
    names = location.list_names(WRITERS)
    slots = (int(name) for name in names if name.isdigit() and str(int(name)) == name)
    return sorted(slot for slot in slots if slot >= 1)


def read_slot_documents(location: Location, slot: int) -> Documents | None:
    """One slot's own documents, or ``None`` when it has committed none."""
    where = slot_location(location, slot)
    if not store_documents.documents_exist(where):
        return None
    return store_documents.read_documents(where)


def _committed_slot_documents(location: Location, slot: int) -> Documents | None:
    """A slot's documents as readers see them: none until its first commit is complete
    (the index is written first, the metadata last), so a reader never races it."""
    where = slot_location(location, slot)
    if not where.exists(METADATA_FILE):
        return None
    return store_documents.read_documents(where)


def store_has_documents(location: Location) -> bool:
    """Whether any writer (the root or a slot) has committed documents at ``location``."""
    if store_documents.documents_exist(location):
        return True
    return any(
        store_documents.documents_exist(slot_location(location, s)) for s in writer_slots(location)
    )


def read_store_documents(location: Location) -> Documents:
    """The union of every writer's documents at ``location`` (the root's alone if no slot).

    Raises
    ------
    CheckpointNotFoundError
        No writer has committed both documents (the root's missing one is named).
    CorruptStoreError
        A document is malformed, or two writers list the same id.
    StorageUnavailableError
        The backend failed.
    """
    slots = [(s, _committed_slot_documents(location, s)) for s in writer_slots(location)]
    others = [(s, found) for s, found in slots if found is not None]
    if not others:
        return store_documents.read_documents(location)
    root = (
        store_documents.read_documents(location)
        if store_documents.documents_exist(location)
        else None
    )
    return _union(location.url, root, others)


def _union(where: str, root: Documents | None, others: list[tuple[int, Documents]]) -> Documents:
    """The root's ids in its order, then the slots' merged by commit time."""
    entries: dict[str, Any] = {}
    id_list: list[int] = []
    counter = 0
    if root is not None:
        _take(
            where,
            entries,
            id_list,
            root.trajectory_index,
            root.trajectory_index.get("trajectory_id_list", []),
        )
        counter = int(root.metadata.get("trajectory_counter", 0))
    streams = [_timed_ids(where, slot, found) for slot, found in others]
    merged = [trajectory_id for _, _, trajectory_id in heapq.merge(*streams)]
    for _, found in others:
        listed = set(found.trajectory_index.get("trajectory_id_list", []))
        _take(where, entries, id_list, found.trajectory_index, [i for i in merged if i in listed])
        counter = max(counter, int(found.metadata.get("trajectory_counter", 0)))
    base = root.metadata if root is not None else others[0][1].metadata
    samples = sum(int(entries[str(i)]["num_samples"]) for i in id_list)
    metadata = {
        **base,
        "size": len(id_list),
        "total_samples": samples,
        "trajectory_counter": max(counter, max(id_list, default=-1) + 1),
    }
    return Documents(metadata, {"trajectory_index": entries, "trajectory_id_list": id_list})


def _timed_ids(where: str, slot: int, found: Documents) -> list[tuple[float, int, int]]:
    """``(commit time, slot, id)`` of a slot's ids, in its own order (times never decrease)."""
    index = found.trajectory_index
    ids = index.get("trajectory_id_list", [])
    times = index.get(COMMIT_TIMES, {})
    if not isinstance(ids, list) or not isinstance(times, dict):
        raise CorruptStoreError(f"{where}/{WRITERS}/{slot}/{INDEX_FILE}: malformed index")
    timed = []
    latest = 0.0
    for trajectory_id in ids:
        latest = max(latest, float(times.get(str(trajectory_id), latest)))
        timed.append((latest, slot, int(trajectory_id)))
    return timed


def _take(
    where: str,
    entries: dict[str, Any],
    id_list: list[int],
    index: dict[str, Any],
    ids: Iterable[Any],
) -> None:
    """Append ``ids`` with their entries from ``index``; an id listed twice is corruption."""
    raw = index.get("trajectory_index", {})
    if not isinstance(raw, dict):
        raise CorruptStoreError(f"{where}: malformed trajectory index in a writer's document")
    for trajectory_id in ids:
        key = str(int(trajectory_id))
        if key in entries:
            raise CorruptStoreError(
                f"{where}: trajectory {key} is listed by two writers' {INDEX_FILE}"
            )
        if key not in raw:
            raise CorruptStoreError(
                f"{where}: trajectory_id_list names id {key} that has no index entry"
            )
        entries[key] = raw[key]
        id_list.append(int(trajectory_id))
