"""Store consistency (``rbzarr verify``): does the data match the index, is every byte readable?

Do not repair a store while a buffer writes to it: the trajectory being written is an
orphan until its commit.

A path through a symbolic link inside a local store is reported (``unsafe_path``), never
followed; with ``follow_links`` it is followed for reading, but a repair still never deletes
or writes through a link (it reports what it left).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rbzarr.errors import (
    CheckpointNotFoundError,
    CodecUnavailableError,
    CorruptStoreError,
    RbzarrError,
    StorageUnavailableError,
    UnsafePathError,
)
from rbzarr.storage.index import format_records
from rbzarr.storage.index import log as index_log
from rbzarr.storage.index.entry import IndexEntry, count
from rbzarr.storage.index.pins import FOLDER as PINS
from rbzarr.storage.index.priorities import FOLDER as PRIORITIES
from rbzarr.storage.index.priorities import file_name as priority_file
from rbzarr.storage.index.schema import schema_from_json
from rbzarr.storage.index.slots import (
    LogSlotFiles,
    id_range,
    read_slot_documents,
    slot_files,
    slot_location,
    writer_slots,
)
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import is_temporary_name, number_name
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import open_store
from rbzarr.storage.rlinf.documents import (
    INDEX_FILE,
    METADATA_FILE,
    Documents,
    Finding,
    write_documents,
)
from rbzarr.storage.zarr.layout import ROOT_UNWRITTEN
from rbzarr.trajectory import tree
from rbzarr.trajectory.fields import check_field_names
from rbzarr.trajectory.shapes import Schema, check_shapes

__all__ = ["Problem", "VerifyReport", "verify_store"]

# What reading a damaged trajectory can raise: rbzarr's errors, decode failures from the
# codecs (RuntimeError), bad metadata (ValueError, KeyError, TypeError) and I/O (OSError).
_READ_ERRORS = (RbzarrError, ValueError, KeyError, TypeError, RuntimeError, OSError)
# The metadata keys a salvaged log must keep (what a user set, and the format).
KEPT_METADATA = ("trajectory_format", "schema", "seed")
# How a repair fixes a problem: rewrite the documents, delete rbzarr's own leftover, or
# (with drop_damaged) drop the trajectory from the index.
REWRITE, DELETE, DROP = "rewrite_documents", "delete", "drop_from_index"
TRAJECTORIES = "trajectories"
# A slot's index log that cannot be read whole: repair keeps what reads, in order.
SALVAGE = "salvage_log"


@dataclass(frozen=True)
class Problem:
    """One inconsistency: its ``kind``, the path below the root, and a message."""

    kind: str
    path: str
    message: str
    trajectory_id: int | None = None
    repair: str = ""

    @property
    def repairable(self) -> bool:
        """Whether ``repair=True`` fixes this problem by itself."""
        return self.repair in (REWRITE, DELETE, SALVAGE)


@dataclass
class VerifyReport:
    """Outcome of :func:`verify_store`: the problems left, the ones repaired, and notes:
    states that are no problem (nothing lost) but that a repair or the next writer tidies."""

    url: str
    format: str | None
    trajectories: int = 0
    problems: list[Problem] = field(default_factory=list)
    repaired: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem remains."""
        return not self.problems

    @property
    def dropped_ids(self) -> list[int]:
        """Ids removed from the index because their data could not be read."""
        return [
            p.trajectory_id
            for p in self.repaired
            if p.repair == DROP and p.trajectory_id is not None
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what ``rbzarr verify --json`` prints)."""
        return {
            "url": self.url,
            "format": self.format,
            "trajectories": self.trajectories,
            "ok": self.ok,
            "problems": [asdict(p) for p in self.problems],
            "repaired": [asdict(p) for p in self.repaired],
            "notes": [asdict(p) for p in self.notes],
            "dropped_ids": self.dropped_ids,
        }


def verify_store(
    url: str | Location,
    storage_options: Mapping[str, Any] | None = None,
    repair: bool = False,
    drop_damaged: bool = False,
    *,
    follow_links: bool = False,
) -> VerifyReport:
    """Check the store at ``url`` (see the module docs); with ``repair``, fix what is safe.

    ``follow_links`` reads a local store through symbolic links inside it (a trusted store
    whose folders were linked on purpose); a repair never deletes or writes through one.
    """
    if drop_damaged and not repair:
        raise ValueError("drop_damaged needs repair=True (it changes the index)")
    location = Location.from_url(url, storage_options, follow_links=follow_links)
    report = VerifyReport(url=location.url, format=None)
    damaged_logs = _check_logs(location)
    if damaged_logs and repair:
        for damaged in damaged_logs:
            _salvage_log(location.without_links(), damaged)
            report.repaired.append(damaged)
    elif damaged_logs:
        report.problems.extend(damaged_logs)
        return report
    loaded = _load_index(location, report)
    if loaded is None:
        return report
    layout, documents, index = loaded
    report.format = layout.format
    report.trajectories = len(index)
    _check_metadata(documents, index, report)
    schema = _check_schema(documents, report)
    for found in _check_root_documents(layout, documents):
        root = Problem(found.kind, found.path, found.message, repair=REWRITE)
        unwritten = found.kind == ROOT_UNWRITTEN and not repair
        if unwritten and isinstance(slot_files(layout.location, 0), LogSlotFiles):
            # A writer stopped before closing (SIGINT, a crash): its commits are in the log.
            message = (
                f"{found.message}: a writer was stopped before it closed; nothing is lost "
                "(its commits are in the index log); the next writer to commit writes them "
                "when it closes, or `rbzarr verify --repair` does now"
            )
            report.notes.append(replace(root, message=message))
        else:
            report.problems.append(root)
    for trajectory_id in index.id_list:
        problem = _check_trajectory(layout, index.entries[trajectory_id], schema)
        if problem is not None:
            report.problems.append(problem)
    report.problems.extend(_orphans(layout, index))
    store = StoreIndex.assumed(layout.location)
    report.problems.extend(_check_priorities(store, index))
    report.problems.extend(_check_pins(store, index))
    if repair:
        # Repairs go through a location that never follows a link, whatever was asked.
        strict, _ = open_store(location.without_links())
        _repair(strict, report, drop_damaged)
    return report


def _load_index(
    location: Location, report: VerifyReport
) -> tuple[TrajectoryLayout, Documents, TrajectoryIndex] | None:
    if not StoreIndex.open(location).exists:
        raise CheckpointNotFoundError(
            f"{location.url}: no {METADATA_FILE} or {INDEX_FILE}: {location.absence()}"
        )
    try:
        layout, documents = open_store(location)
        index = TrajectoryIndex.from_documents(documents, location.url, keep_repeated_once=True)
    except UnsafePathError as exc:
        report.problems.append(Problem("unsafe_path", "", _one_line(exc)))
        return None
    except (CheckpointNotFoundError, CorruptStoreError, ValueError) as exc:
        kind = "missing_document" if isinstance(exc, FileNotFoundError) else "unreadable_document"
        report.problems.append(Problem(kind, "", _one_line(exc)))
        return None
    return layout, documents, index


def _check_logs(location: Location) -> list[Problem]:
    """A problem per writer slot whose index log does not read whole."""
    problems = []
    for slot in [0, *writer_slots(location)]:
        damage = slot_files(location, slot).damage()
        if damage is not None:
            path = "/".join(p for p in ("" if slot == 0 else f"writers/{slot}", "index") if p)
            problems.append(Problem("damaged_log", path, _one_line(damage), slot, SALVAGE))
    return problems


def _salvage_log(location: Location, problem: Problem) -> None:
    """Rewrite a damaged log with the entries that still read (records up to the first
    unreadable one), and with the complete trajectories of the slot that it lost (a zarr
    trajectory group's attributes hold its entry)."""
    slot = problem.trajectory_id or 0
    where = slot_location(location, slot)
    entries, counter, metadata = index_log.salvage(where)
    listed = {int(e["trajectory_id"]) for e, _ in entries}
    first, end = id_range(slot)
    lost = []
    for name in location.list_names(TRAJECTORIES):
        tid = number_name(name)
        if tid is None or not first <= tid < end or tid in listed:
            continue
        entry = _group_entry(location, name)
        if entry is not None:
            lost.append((entry, 0.0))
    entries = sorted([*entries, *lost], key=lambda item: int(item[0]["trajectory_id"]))
    counter = max([counter, *(int(e["trajectory_id"]) + 1 for e, _ in lost)])
    # A repair never changes a store's format nor loses its schema or seed: what the slot's
    # own files lost, another writer's metadata still holds; only a zarr store keeps a log.
    for other in [0, *writer_slots(location)]:
        if other == slot or all(key in metadata for key in KEPT_METADATA):
            continue
        with contextlib.suppress(CorruptStoreError, FileNotFoundError, CheckpointNotFoundError):
            found = index_log.read_slot_metadata(slot_location(location, other)) or {}
            metadata = {**found, **metadata}
    metadata.setdefault("trajectory_format", "zarr")
    index_log.IndexLog.for_repair(where).rewrite(entries, counter=counter, metadata=metadata)


def _group_entry(location: Location, name: str) -> dict[str, Any] | None:
    """The index entry a complete zarr trajectory group holds in its attributes, or None
    when it holds none that every reader would accept: the document read within the
    bounds of every document, the entry checked as every reader checks one (a group that
    fails is left unlisted: an orphan the report names)."""
    where = f"{location.url}/{TRAJECTORIES}/{name}/zarr.json"
    try:
        document = read_json(location.read_bytes(TRAJECTORIES, name, "zarr.json"), where)
        attrs = document["attributes"]
        entry = IndexEntry.parse(attrs, where, count(name))
    except (FileNotFoundError, CorruptStoreError, ValueError, KeyError, TypeError):
        return None
    return entry.to_json() if "fields" in attrs else None


def _check_schema(documents: Documents, report: VerifyReport) -> Schema | None:
    """The metadata's schema (``None`` if it records none or it is unreadable: reported)."""
    try:
        return schema_from_json(documents.metadata.get("schema"))
    except CorruptStoreError as exc:
        report.problems.append(Problem("unreadable_schema", METADATA_FILE, _one_line(exc)))
        return None


def _check_metadata(documents: Documents, index: TrajectoryIndex, report: VerifyReport) -> None:
    listed = documents.trajectory_index.get("trajectory_id_list", [])
    if len(index.id_list) != len(listed):
        report.problems.append(
            Problem(
                "duplicate_ids",
                INDEX_FILE,
                f"trajectory_id_list names {len(listed) - len(index.id_list)} ids more than "
                "once (readers refuse it; the repair keeps one of each)",
                repair=REWRITE,
            )
        )
    metadata = documents.metadata
    expected = {"size": len(index), "total_samples": index.total_samples}
    for key, value in expected.items():
        if key in metadata and metadata[key] != value:
            report.problems.append(
                Problem(
                    "metadata_mismatch",
                    METADATA_FILE,
                    f"{key} is {metadata[key]!r} but the index implies {value}",
                    repair=REWRITE,
                )
            )


def _check_trajectory(
    layout: TrajectoryLayout, entry: IndexEntry, schema: Schema | None
) -> Problem | None:
    """The first thing wrong with one indexed trajectory's data, or ``None``."""
    trajectory_id = int(entry["trajectory_id"])
    path = "/".join(layout.trajectory_path(entry))

    def damaged(kind: str, message: str) -> Problem:
        return Problem(kind, path, message, trajectory_id, repair=DROP)

    try:
        audit = layout.audit()
        if not audit.contains(entry):
            return damaged("missing_data", "indexed but its data is missing")
        missing = audit.missing_parts(entry)
        if missing:
            return damaged("missing_chunks", "; ".join(missing))
        shape = _decoded_shape(layout, entry, schema)
    except UnsafePathError as exc:
        return Problem("unsafe_path", path, _one_line(exc), trajectory_id)
    except StorageUnavailableError:
        raise  # the store is unreachable: that says nothing about this trajectory
    except CodecUnavailableError as exc:  # this process cannot decode it: not damage
        message = f"{_one_line(exc)}; never dropped (--drop-damaged keeps it): verify again"
        return Problem(
            "codec_unavailable", path, f"{message} where the codec is installed", trajectory_id
        )
    except _READ_ERRORS as exc:
        return damaged("unreadable_data", _one_line(exc))
    if shape != list(entry["shape"]):
        return damaged(
            "shape_mismatch", f"index entry shape {list(entry['shape'])}, data shape {shape}"
        )
    return None


def _decoded_shape(layout: TrajectoryLayout, entry: IndexEntry, schema: Schema | None) -> list[int]:
    """The shape of one trajectory, every byte of it decoded (into numpy: a zarr store's
    check imports no torch) and its fields checked as a trajectory's are (names, ``T``
    and ``B``, ``schema``)."""
    arrays = layout.read_arrays(entry)
    check_field_names(tree.unflatten(arrays))
    shapes = {key: tuple(value.shape) for key, value in arrays.items()}
    dtypes = layout.fields(entry)
    return list(check_shapes(shapes, dtypes.__getitem__, schema).shape)


def _orphans(layout: TrajectoryLayout, index: TrajectoryIndex) -> list[Problem]:
    expected = {"/".join(layout.trajectory_path(index.entries[i])) for i in index.id_list}
    problems = [
        Problem("temp_file", name, "leftover temporary file of an interrupted write", None, DELETE)
        for name in layout.location.list_names()
        if is_temporary_name(name)
    ]
    try:
        stored = layout.audit().stored_paths()
    except UnsafePathError as exc:
        return [*problems, Problem("unsafe_path", "", _one_line(exc))]
    try:
        unneeded = layout.audit().unneeded_groups(index.entries)
    except UnsafePathError as exc:
        return [*problems, Problem("unsafe_path", "", _one_line(exc))]
    orphans: list[tuple[str, int | None, str]] = [
        (group, None, "a pack none of whose members is listed") for group in unneeded
    ]
    orphans += [
        (path, trajectory_id, "trajectory data not listed in the index")
        for path, trajectory_id in sorted(stored.items(), key=lambda item: item[1])
        if path not in expected
    ]
    for path, trajectory_id, what in orphans:
        try:
            foreign = layout.audit().foreign_files(path)
        except UnsafePathError as exc:
            problems.append(Problem("unsafe_path", path, _one_line(exc), trajectory_id))
            continue
        if foreign:
            message = (
                f"{what}, holding files rbzarr did not write ({', '.join(foreign[:3])}): "
                "left for you to remove"
            )
            problems.append(Problem("orphan", path, message, trajectory_id))
        else:
            problems.append(Problem("orphan", path, what, trajectory_id, DELETE))
    return problems


def _check_priorities(store: StoreIndex, index: TrajectoryIndex) -> list[Problem]:
    """A problem per listed trajectory whose priority file is damaged (the repair deletes
    it: its rows take the largest priority, as those of a trajectory without one)."""
    problems = []
    for trajectory_id in index.id_list:
        try:
            store.priorities.read(index.entries[trajectory_id])
        except CorruptStoreError as exc:
            path = f"{PRIORITIES}/{priority_file(trajectory_id)}"
            problems.append(
                Problem("damaged_priorities", path, _one_line(exc), trajectory_id, DELETE)
            )
    return problems


def _check_pins(store: StoreIndex, index: TrajectoryIndex) -> list[Problem]:
    """A problem if the pins do not read, and one per pin naming trajectories the index no
    longer lists as it names them (the checkpoint that holds the pin cannot load)."""
    try:
        pins = store.pins.all()
    except CorruptStoreError as exc:
        return [Problem("unreadable_pin", PINS, _one_line(exc))]
    problems = []
    for pin in pins:
        entries = index.entries
        lost = [
            trajectory_id
            for trajectory_id, uuid in zip(pin.ids, pin.uuids, strict=True)
            if trajectory_id not in entries or entries[trajectory_id].uuid != uuid
        ]
        if lost:
            message = (
                f"the checkpoint {pin.checkpoint} pins trajectories {lost[:10]} that the index "
                "no longer lists as it names them: that checkpoint cannot load; `rbzarr "
                f"checkpoint drop STORE --pin {pin.pin_id}` unpins it"
            )
            problems.append(Problem("pinned_missing", f"{PINS}/{pin.pin_id}.json", message))
    return problems


def _repair(layout: TrajectoryLayout, report: VerifyReport, drop_damaged: bool) -> None:
    # Re-read the index just before deleting: never remove data committed meanwhile.
    documents = StoreIndex.assumed(layout.location).read()
    index = TrajectoryIndex.from_documents(documents, layout.location.url, keep_repeated_once=True)
    committed = {"/".join(layout.trajectory_path(index.entries[i])) for i in index.id_list}
    remaining: list[Problem] = []
    rewrite = False
    dropped: set[int] = set()
    for problem in report.problems:
        if problem.repair == REWRITE:
            rewrite = True
        elif problem.repair == DELETE and problem.path not in committed:
            try:
                layout.location.delete(*problem.path.split("/"))
            except UnsafePathError as exc:
                remaining.append(Problem("unsafe_path", problem.path, _one_line(exc)))
                continue
        elif problem.repair == DROP and drop_damaged and problem.trajectory_id is not None:
            dropped.add(problem.trajectory_id)
        else:
            remaining.append(problem)
            continue
        report.repaired.append(problem)
    report.problems = remaining
    if not (rewrite or dropped):
        return
    for slot in [0, *writer_slots(layout.location)]:
        own = read_slot_documents(layout.location, slot)
        if own is None:
            continue
        own_index = TrajectoryIndex.from_documents(
            own, layout.location.url, keep_repeated_once=True
        )
        fixed = _documents_without(own, own_index, dropped)
        try:
            _rewrite_slot(layout, slot, own, own_index, fixed)
        except UnsafePathError as exc:
            where = "" if slot == 0 else f"writers/{slot}"
            report.problems.append(Problem("unsafe_path", where, _one_line(exc)))

    _delete_dropped(layout, report, index, dropped)


def _rewrite_slot(
    layout: TrajectoryLayout,
    slot: int,
    own: Documents,
    own_index: TrajectoryIndex,
    fixed: Documents,
) -> None:
    """Write one writer's fixed index: its log (if it keeps one) and its documents."""
    slot_files(layout.location, slot).rewrite(own, fixed, own_index.trajectory_counter)
    if slot == 0:
        format_records.write_documents(layout, fixed)
    else:
        write_documents(slot_location(layout.location, slot), fixed)


def _delete_dropped(
    layout: TrajectoryLayout, report: VerifyReport, index: TrajectoryIndex, dropped: set[int]
) -> None:
    """Remove the data of trajectories the index stopped listing (files rbzarr did not write
    stay, reported as orphans)."""
    # A dropped trajectory's data is an orphan now: it goes as orphans go (after the index
    # -- the log of a zarr store, the documents of a pt / pkl one -- stopped listing it), so
    # a plain verify that follows is clean: its group, and the packs whose last listed
    # member it was.
    paths: list[tuple[str, int | None]] = []
    for dropped_id in sorted(dropped):
        StoreIndex.assumed(layout.location).priorities.delete(dropped_id)
        paths.append(("/".join(layout.trajectory_path(index.entries[dropped_id])), dropped_id))
    kept = {i: entry for i, entry in index.entries.items() if i not in dropped}
    try:
        paths += [(group, None) for group in layout.audit().unneeded_groups(kept)]
    except UnsafePathError as exc:
        report.problems.append(Problem("unsafe_path", "", _one_line(exc)))
    for path, trajectory_id in paths:
        try:
            if not layout.location.exists(*path.split("/")):
                continue
            # The index listed it: a file at ``path`` itself is rbzarr's, damaged or not.
            foreign = [name for name in layout.audit().foreign_files(path) if name != path]
        except UnsafePathError as exc:
            report.problems.append(Problem("unsafe_path", path, _one_line(exc), trajectory_id))
            continue
        if foreign:
            message = (
                "dropped from the index, holding files rbzarr did not write "
                f"({', '.join(foreign[:3])}): left for you to remove"
            )
            report.problems.append(Problem("orphan", path, message, trajectory_id))
        else:
            layout.location.delete(*path.split("/"))


def _check_root_documents(layout: TrajectoryLayout, documents: Documents) -> list[Finding]:
    """The layout's copies of the root documents (only the root writer's, with many)."""
    if not writer_slots(layout.location):
        return format_records.check_documents(layout, documents)
    root = read_slot_documents(layout.location, 0)
    return [] if root is None else format_records.check_documents(layout, root)


def _documents_without(
    documents: Documents, index: TrajectoryIndex, dropped: set[int]
) -> Documents:
    """The documents with ``dropped`` left out and the metadata recounted from the index.

    The index document is written before the metadata: a crash between the two leaves the
    metadata behind it, never ahead.  The id counter is kept, so a dropped id is never reused.
    """
    kept = index.subset([i for i in index.id_list if i not in dropped])
    metadata = {
        **documents.metadata,
        "size": len(kept),
        "total_samples": kept.total_samples,
        "trajectory_counter": index.trajectory_counter,
    }
    trajectory_index = {
        **documents.trajectory_index,
        "trajectory_index": {str(i): kept.entries[i].to_json() for i in kept.id_list},
        "trajectory_id_list": list(kept.id_list),
    }
    return Documents(metadata, trajectory_index)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
