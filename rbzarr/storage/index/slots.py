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
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.entry import IndexEntry
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import number_name
from rbzarr.storage.rlinf import documents as store_documents
from rbzarr.storage.rlinf.documents import INDEX_FILE, METADATA_FILE, Documents

if TYPE_CHECKING:
    from rbzarr.storage.index.writer_slot import WriterSlot
    from rbzarr.storage.index.writers import IndexWriter
    from rbzarr.storage.layout import TrajectoryLayout

__all__ = [
    "COMMIT_TIMES",
    "EARLIER",
    "WHOLE_INDEX_BELOW",
    "ID_STRIDE",
    "WRITERS",
    "id_range",
    "earlier_counts",
    "log_documents",
    "read_slot_documents",
    "read_store_documents",
    "read_store_window",
    "slot_has_documents",
    "DocumentSlotFiles",
    "LogSlotFiles",
    "SlotFiles",
    "log_of_documents",
    "slot_files",
    "slot_location",
    "writer_slots",
]

# Reads of the slots a process writes, from its memory: ``{slot: read(last)}`` (``None``
# before the slot's first commit).
HeldSlots = Mapping[int, Callable[[int | None], index_log.SlotIndex | None]]

WRITERS = "writers"
# Ids of slot s are [s * ID_STRIDE, (s + 1) * ID_STRIDE).
ID_STRIDE = 1_000_000_000
# Stores of at most this many trajectories are read whole even by an open with a window.
WHOLE_INDEX_BELOW = 10_000
# Key of a windowed read's index document: the counts of the trajectories it left out.
EARLIER = "rbzarr_earlier"
# Key of a slot's index document: the commit time (seconds since the epoch) of each listed id.
COMMIT_TIMES = "rbzarr_commit_times"


def id_range(slot: int) -> tuple[int, int]:
    """The ``[first, end)`` ids of ``slot``."""
    return slot * ID_STRIDE, (slot + 1) * ID_STRIDE


def slot_location(location: Location, slot: int) -> Location:
    """Where ``slot`` keeps its documents: the root for slot 0, else ``writers/<slot>``."""
    return location if slot == 0 else location.child(WRITERS, str(slot))


def writer_slots(location: Location) -> list[int]:
    """The slots ``s >= 1`` that have a folder under ``writers/``, sorted (one listing)."""
    names = location.list_names(WRITERS)
    slots = (number_name(name) for name in names)
    return sorted(slot for slot in slots if slot is not None and slot >= 1)


def log_documents(state: index_log.SlotIndex, where: str) -> Documents:
    """A slot's documents in RLinf's schema, made from its log (commit times included).

    An id listed twice is read once if both entries agree; two different entries under one
    id (one claiming another's id) are :class:`CorruptStoreError` naming ``where``.
    """
    listed: dict[str, dict[str, Any]] = {}
    for entry, _ in state.entries:
        tid = str(entry["trajectory_id"])
        if listed.setdefault(tid, entry) != entry:
            raise CorruptStoreError(
                f"{where}: the log lists trajectory {tid} twice with different entries (one "
                "claims another's id); run `rbzarr verify` to see which"
            )
    metadata = {
        **state.metadata,
        "size": state.size,
        "total_samples": state.total_samples,
        "trajectory_counter": state.trajectory_counter,
    }
    index = {
        "trajectory_index": {str(e["trajectory_id"]): e for e, _ in state.entries},
        "trajectory_id_list": [e["trajectory_id"] for e, _ in state.entries],
        COMMIT_TIMES: {str(e["trajectory_id"]): t for e, t in state.entries},
    }
    return Documents(metadata, index)


class SlotFiles(ABC):
    """How one writer slot keeps its index: an append-only log, or RLinf's two documents.

    :func:`slot_files` picks the kind from what the slot's folder holds; nothing else asks.

    Parameters
    ----------
    where
        The slot's folder (:func:`slot_location`).
    """

    def __init__(self, where: Location) -> None:
        self.where = where

    @property
    @abstractmethod
    def exists(self) -> bool:
        """Whether the slot has committed anything (a log's is read: it raises as
        :meth:`metadata`)."""

    @abstractmethod
    def metadata(self) -> dict[str, Any] | None:
        """The slot's ``metadata.json`` keys without its index, ``None`` before its first
        complete commit."""

    def probe(self) -> tuple[dict[str, Any] | None, bool]:
        """:meth:`metadata` and :attr:`exists` together, the slot read once where its kind
        allows."""
        metadata = self.metadata()
        return metadata, metadata is not None or self.exists

    @abstractmethod
    def own(self) -> Documents | None:
        """The slot's own documents (a log's made from it), ``None`` if it committed none."""

    @abstractmethod
    def committed(self, last: int | None = None) -> Documents | None:
        """The slot's documents as readers see them (only the last ``last`` entries of a
        log): none until its first commit is complete."""

    @abstractmethod
    def damage(self) -> CorruptStoreError | None:
        """What keeps the slot's index from reading whole (``None``: nothing; RLinf's
        documents are checked where they are read)."""

    @abstractmethod
    def rewrite(self, own: Documents, fixed: Documents, counter: int) -> None:
        """Replace the slot's index by ``fixed`` (a repair of ``own``); the documents
        themselves are written by the caller."""

    @abstractmethod
    def writer(self, layout: TrajectoryLayout, slot: WriterSlot) -> IndexWriter:
        """The writer of this slot's index for ``layout``, which claimed ``slot``."""


class LogSlotFiles(SlotFiles):
    """A slot that keeps its index as a log (:mod:`rbzarr.storage.index.log`)."""

    @property
    def exists(self) -> bool:
        # docstring inherited
        return self.metadata() is not None

    def probe(self) -> tuple[dict[str, Any] | None, bool]:
        # docstring inherited
        metadata = self.metadata()
        return metadata, metadata is not None

    def metadata(self) -> dict[str, Any] | None:
        # docstring inherited
        return index_log.read_slot_metadata(self.where)

    def own(self) -> Documents | None:
        # docstring inherited
        state = index_log.read_slot_index(self.where)
        return log_documents(state, self.where.url) if state.begun else None

    def committed(self, last: int | None = None) -> Documents | None:
        # docstring inherited
        state = index_log.read_slot_index(self.where, last)
        return window_documents(state, self.where, last) if state.begun else None

    def damage(self) -> CorruptStoreError | None:
        # docstring inherited
        try:
            index_log.read_slot_index(self.where)
        except CorruptStoreError as exc:
            return exc
        return None

    def rewrite(self, own: Documents, fixed: Documents, counter: int) -> None:
        # docstring inherited
        listed, metadata = log_of_documents(own, fixed, self.where.url)
        index_log.IndexLog.for_repair(self.where).rewrite(
            listed, counter=counter, metadata=metadata
        )

    def writer(self, layout: TrajectoryLayout, slot: WriterSlot) -> IndexWriter:
        # docstring inherited
        from rbzarr.storage.index.writers import LogWriter  # noqa: PLC0415 (it imports this)

        return LogWriter(layout, slot)


class DocumentSlotFiles(SlotFiles):
    """A slot that keeps RLinf's two documents (a pt / pkl store, or an earlier rbzarr's)."""

    @property
    def exists(self) -> bool:
        # docstring inherited
        return store_documents.documents_exist(self.where)

    def metadata(self) -> dict[str, Any] | None:
        # docstring inherited
        return store_documents.read_metadata(self.where)

    def own(self) -> Documents | None:
        # docstring inherited
        if not store_documents.documents_exist(self.where):
            return None
        return store_documents.read_documents(self.where)

    def committed(self, last: int | None = None) -> Documents | None:
        # docstring inherited
        # The index is written first, the metadata last: a reader never races a commit.
        if not self.where.exists(METADATA_FILE):
            return None
        return store_documents.read_documents(self.where)

    def damage(self) -> CorruptStoreError | None:
        # docstring inherited
        return None

    def rewrite(self, own: Documents, fixed: Documents, counter: int) -> None:
        # docstring inherited
        return None

    def writer(self, layout: TrajectoryLayout, slot: WriterSlot) -> IndexWriter:
        # docstring inherited
        from rbzarr.storage.index.writers import DocumentsWriter  # noqa: PLC0415 (it imports this)

        return DocumentsWriter(layout, slot)


def window_documents(state: index_log.SlotIndex, where: Location, last: int | None) -> Documents:
    """A slot's documents from what a read of its log's last ``last`` entries found."""
    documents = log_documents(state, where.url)
    if last is not None:
        held = sum(int(e["num_samples"]) for e, _ in state.entries)
        documents.trajectory_index[EARLIER] = {
            "size": state.size - len(state.entries),
            "total_samples": state.total_samples - held,
        }
    return documents


def slot_files(location: Location, slot: int, writing: TrajectoryLayout | None = None) -> SlotFiles:
    """The files of ``slot`` of the store at ``location``: the one place that decides
    between the log and RLinf's documents.  A slot that ``writing`` (a layout that claimed
    it) writes keeps a log if that layout takes many writers (a slot of an earlier rbzarr's
    documents is upgraded into one), else RLinf's documents; a slot read keeps a log if
    it holds one."""
    where = slot_location(location, slot)
    keeps_log = index_log.has_log(where) if writing is None else writing.capabilities.many_writers
    return LogSlotFiles(where) if keeps_log else DocumentSlotFiles(where)


def log_of_documents(
    own: Documents, fixed: Documents, where: str
) -> tuple[list[index_log.LogEntry], dict[str, Any]]:
    """The log entries (with the commit times ``own`` records) and metadata of ``fixed``:
    the one conversion of RLinf's documents to a log (an upgrade, or a repair)."""
    index = fixed.trajectory_index
    ids, entries = index.get("trajectory_id_list"), index.get("trajectory_index")
    if not isinstance(ids, list) or not isinstance(entries, dict):
        raise CorruptStoreError(f"{where}/{INDEX_FILE}: malformed index")
    times = own.trajectory_index.get(COMMIT_TIMES, {})
    try:
        listed = [(dict(entries[str(i)]), float(times.get(str(i), 0.0))) for i in ids]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptStoreError(f"{where}/{INDEX_FILE}: malformed index: {exc!r}") from exc
    counters = {"size", "total_samples", "trajectory_counter"}
    return listed, {k: v for k, v in fixed.metadata.items() if k not in counters}


def read_slot_documents(location: Location, slot: int) -> Documents | None:
    """One slot's own documents (from its log when it keeps one), or ``None`` when it has
    committed none."""
    return slot_files(location, slot).own()


def slot_has_documents(location: Location, slot: int) -> bool:
    """Whether ``slot`` has committed anything (a log or documents)."""
    return slot_files(location, slot).exists


def read_store_documents(
    location: Location, last: int | None = None, held: HeldSlots | None = None
) -> Documents:
    """The union of every writer's documents at ``location`` (the root's alone if no slot).

    Parameters
    ----------
    location
        The store's root.
    last
        Read only the last ``last`` trajectories of the union (``None`` or ``<= 0``: all).
        The counters of ``metadata.json`` still cover the whole store, and the index says
        how many trajectories it leaves out under :data:`EARLIER` (see
        :func:`earlier_counts`).  A slot that keeps a log reads ``O(last)`` entries.
    held
        The slots whose log this process writes, read from memory (no file of theirs).

    Returns
    -------
    Documents
        ``metadata.json`` and ``trajectory_index.json``, in RLinf's schema.

    Raises
    ------
    CheckpointNotFoundError
        No writer has committed both documents (the root's missing one is named).
    CorruptStoreError
        A document is malformed, or two writers list the same id.
    StorageUnavailableError
        The backend failed.
    """
    if last is not None and last <= 0:
        last = None
    counts = []  # (size, total_samples) of each slot read
    found: list[tuple[int, Documents]] = []
    for slot in [0, *writer_slots(location)]:
        documents: Documents | None
        if held is not None and slot in held:
            state = held[slot](last)
            where = slot_location(location, slot)
            documents = None if state is None else window_documents(state, where, last)
        else:
            documents = slot_files(location, slot).committed(last)
        if documents is not None:
            found.append((slot, documents))
            if last is not None:
                counts.append(_counts(documents, location.url))
    if not found:
        return store_documents.read_documents(location)
    root = found[0][1] if found[0][0] == 0 else None
    others = found[1:] if root is not None else found
    union = root if not others and root is not None else _union(location.url, root, others)
    if last is None:
        return union
    ids = union.trajectory_index["trajectory_id_list"]
    held = ids[-last:]
    entries = union.trajectory_index["trajectory_index"]
    size = sum(c[0] for c in counts)
    samples = sum(c[1] for c in counts)
    held_samples = _samples(entries, held, location.url)
    index = {
        "trajectory_index": {str(i): entries[str(i)] for i in held},
        "trajectory_id_list": list(held),
        EARLIER: {"size": size - len(held), "total_samples": samples - held_samples},
    }
    metadata = {**union.metadata, "size": size, "total_samples": samples}
    return Documents(metadata, index)


def read_store_window(
    location: Location, window: int | None, held: HeldSlots | None = None
) -> Documents:
    """The documents an open with a sample window of ``window`` trajectories needs.

    A store of at most :data:`WHOLE_INDEX_BELOW` trajectories (or ``window`` ``None`` or
    ``<= 0``) is read whole, as RLinf reads it; a larger one only its last ``window``
    trajectories (:func:`read_store_documents` with ``last``), so the open costs the window,
    not the store.

    Raises
    ------
    CheckpointNotFoundError
        No writer has committed anything.
    CorruptStoreError
        A document or log file is malformed.
    StorageUnavailableError
        The backend failed.
    """
    if window is None or window <= 0:
        return read_store_documents(location, held=held)
    documents = read_store_documents(location, last=window, held=held)
    if earlier_counts(documents.trajectory_index)[0] and (
        int(documents.metadata.get("size", 0)) <= WHOLE_INDEX_BELOW
    ):
        return read_store_documents(location, held=held)
    return documents


def earlier_counts(index: Mapping[str, Any]) -> tuple[int, int]:
    """``(size, total_samples)`` of the trajectories a windowed read left out of ``index``."""
    earlier = index.get(EARLIER)
    if not isinstance(earlier, dict):
        return 0, 0
    return int(earlier["size"]), int(earlier["total_samples"])


def _counts(documents: Documents, where: str) -> tuple[int, int]:
    """``(size, total_samples)`` of a slot's documents (read whole or windowed)."""
    earlier = earlier_counts(documents.trajectory_index)
    entries = documents.trajectory_index.get("trajectory_index", {})
    ids = documents.trajectory_index.get("trajectory_id_list", [])
    if not isinstance(entries, dict) or not isinstance(ids, list):
        raise CorruptStoreError(f"{where}: malformed trajectory index in a writer's document")
    return earlier[0] + len(ids), earlier[1] + _samples(entries, ids, where)


def _samples(entries: Mapping[str, Any], ids: Iterable[Any], where: str) -> int:
    """``num_samples`` summed over ``ids``' entries (a malformed one is a named error)."""
    try:
        return sum(IndexEntry.parse(entries[str(i)], where).num_samples for i in ids)
    except KeyError as exc:
        raise CorruptStoreError(f"{where}: an id listed has no index entry: {exc!r}") from exc


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
