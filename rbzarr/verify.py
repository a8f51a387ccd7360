"""Store consistency: does the data match the index, and can every committed byte be read?

:func:`verify_store` checks, in order:

- both JSON documents parse and describe a well-formed index (otherwise nothing else can be
  trusted, and the check stops there);
- ``size`` / ``total_samples`` of ``metadata.json`` agree with the index, and (zarr) the root
  group's attributes mirror the two documents;
- every indexed trajectory has its data, every chunk of every array exists (a missing Zarr
  chunk would otherwise read as zeros), the data decodes, and its shape matches the entry;
- no trajectory data or temporary file lies in the store without an index entry (orphans,
  left by a crash between writing data and committing the index).

``repair=True`` deletes orphans and temporary files only; it never touches data the index
lists.  Do not repair a store while a buffer is writing to it: the trajectory being written
is an orphan until its commit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, RbzarrError
from rbzarr.index import TrajectoryIndex
from rbzarr.storage.file_layout import FileLayout
from rbzarr.storage.layout import (
    INDEX_FILE,
    METADATA_FILE,
    Documents,
    TrajectoryLayout,
    layout_class,
    stored_format,
)
from rbzarr.storage.layout import read_documents as read_store_documents
from rbzarr.storage.location import Location
from rbzarr.storage.zarr_layout import ROOT_ATTR, TRAJECTORIES, ZarrLayout
from rbzarr.summary import data_path
from rbzarr.trajectory import validate

__all__ = ["Problem", "VerifyReport", "verify_store"]

# What reading a damaged trajectory can raise: rbzarr's errors, decode failures from the
# codecs (RuntimeError), bad metadata (ValueError, KeyError, TypeError) and I/O (OSError).
_READ_ERRORS = (RbzarrError, ValueError, KeyError, TypeError, RuntimeError, OSError)
# Problems fixed by rewriting the documents from the index rather than by deleting data.
_DOCUMENT_KINDS = frozenset({"metadata_mismatch", "root_attrs_mismatch"})
_TEMP_NAME = re.compile(r".+\.tmp-[0-9a-f]{32}")


@dataclass(frozen=True)
class Problem:
    """One inconsistency: its ``kind``, the path below the root, and a message."""

    kind: str
    path: str
    message: str
    trajectory_id: int | None = None
    repairable: bool = False


@dataclass
class VerifyReport:
    """Outcome of :func:`verify_store`: the problems left and the ones repaired."""

    url: str
    format: str | None
    trajectories: int = 0
    problems: list[Problem] = field(default_factory=list)
    repaired: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem remains."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what ``rbzarr verify --json`` prints)."""
        return {
            "url": self.url,
            "format": self.format,
            "trajectories": self.trajectories,
            "ok": self.ok,
            "problems": [asdict(p) for p in self.problems],
            "repaired": [asdict(p) for p in self.repaired],
        }


def verify_store(
    url: str | Location,
    storage_options: Mapping[str, Any] | None = None,
    repair: bool = False,
) -> VerifyReport:
    """Check the store at ``url`` (see the module docs); with ``repair``, remove orphans.

    Raises
    ------
    CheckpointNotFoundError
        Nothing at ``url`` looks like a store (no JSON document and no trajectory data).
    """
    location = Location.from_url(url, storage_options)
    report = VerifyReport(url=location.url, format=None)
    loaded = _load_index(location, report)
    if loaded is None:
        return report
    layout, documents, index = loaded
    report.format = layout.format
    report.trajectories = len(index)
    _check_metadata(documents, index, report)
    if isinstance(layout, ZarrLayout):
        _check_root_attrs(location, documents, report)
    for trajectory_id in index.id_list:
        _check_trajectory(layout, index.entries[trajectory_id], report)
    report.problems.extend(_orphans(layout, index))
    if repair:
        _repair(layout, report)
    return report


def _load_index(
    location: Location, report: VerifyReport
) -> tuple[TrajectoryLayout, Mapping[str, Any], TrajectoryIndex] | None:
    present = [name for name in (METADATA_FILE, INDEX_FILE) if location.exists(name)]
    if not present:
        raise CheckpointNotFoundError(
            f"{location.url}: no {METADATA_FILE} or {INDEX_FILE}: not an rbzarr or RLinf store"
        )
    try:
        documents = read_store_documents(location)
        layout = layout_class(stored_format(documents))(location)
        index = TrajectoryIndex.from_documents(documents, location.url)
    except (CheckpointNotFoundError, CorruptStoreError, ValueError) as exc:
        kind = "missing_document" if isinstance(exc, FileNotFoundError) else "unreadable_document"
        report.problems.append(Problem(kind, "", _one_line(exc)))
        return None
    return layout, {"metadata": documents.metadata, "index": documents.trajectory_index}, index


def _check_metadata(
    documents: Mapping[str, Any], index: TrajectoryIndex, report: VerifyReport
) -> None:
    metadata = documents["metadata"]
    expected = {"size": len(index), "total_samples": index.total_samples}
    for key, value in expected.items():
        if key in metadata and metadata[key] != value:
            report.problems.append(
                Problem(
                    "metadata_mismatch",
                    METADATA_FILE,
                    f"{key} is {metadata[key]!r} but the index implies {value}",
                    repairable=True,
                )
            )


def _check_root_attrs(
    location: Location, documents: Mapping[str, Any], report: VerifyReport
) -> None:
    try:
        root = json.loads(location.read_bytes("zarr.json"))
        mirror = root.get("attributes", {}).get(ROOT_ATTR)
    except (FileNotFoundError, ValueError, AttributeError) as exc:
        report.problems.append(
            Problem("root_attrs_mismatch", "zarr.json", _one_line(exc), repairable=True)
        )
        return
    expected = {"metadata": documents["metadata"], "trajectory_index": documents["index"]}
    if mirror != expected:
        report.problems.append(
            Problem(
                "root_attrs_mismatch",
                "zarr.json",
                f"root attributes {ROOT_ATTR!r} do not mirror {METADATA_FILE} and {INDEX_FILE}",
                repairable=True,
            )
        )


def _check_trajectory(
    layout: TrajectoryLayout, entry: dict[str, Any], report: VerifyReport
) -> None:
    trajectory_id = int(entry["trajectory_id"])
    path = "/".join(data_path(layout, entry))
    if not layout.contains(entry):
        report.problems.append(
            Problem("missing_data", path, "indexed but its data is missing", trajectory_id)
        )
        return
    try:
        missing = _missing_chunks(layout, trajectory_id)
        if missing:
            report.problems.append(
                Problem("missing_chunks", path, "; ".join(missing), trajectory_id)
            )
            return
        trajectory = layout.read(entry)
        shape = list(validate(trajectory).shape)
    except _READ_ERRORS as exc:
        report.problems.append(Problem("unreadable_data", path, _one_line(exc), trajectory_id))
        return
    if shape != list(entry["shape"]):
        report.problems.append(
            Problem(
                "shape_mismatch",
                path,
                f"index entry shape {list(entry['shape'])}, data shape {shape}",
                trajectory_id,
            )
        )


def _missing_chunks(layout: TrajectoryLayout, trajectory_id: int) -> list[str]:
    """Arrays of a zarr trajectory with fewer stored chunks than their grid has."""
    if not isinstance(layout, ZarrLayout):
        return []
    import zarr  # noqa: PLC0415

    store = layout.location.zarr_store(read_only=True)
    group = zarr.open_group(store=store, path=f"{TRAJECTORIES}/{trajectory_id}", mode="r")
    return [
        f"array {name!r} stores {node.nchunks_initialized} of {node.nchunks} chunks"
        for name, node in group.members(max_depth=None)
        if isinstance(node, zarr.Array) and node.nchunks_initialized != node.nchunks
    ]


def _orphans(layout: TrajectoryLayout, index: TrajectoryIndex) -> list[Problem]:
    location = layout.location
    expected = {"/".join(data_path(layout, index.entries[i])) for i in index.id_list}
    problems = [
        Problem("temp_file", name, "leftover temporary file of an interrupted write", None, True)
        for name in location.list_names()
        if _TEMP_NAME.fullmatch(name)
    ]
    if isinstance(layout, ZarrLayout):
        found = [
            (f"{TRAJECTORIES}/{name}", int(name))
            for name in location.list_names(TRAJECTORIES)
            if name.isdigit()
        ]
    elif isinstance(layout, FileLayout):
        pattern = re.compile(rf"trajectory_(\d+)_.*\.{re.escape(layout.suffix)}", re.DOTALL)
        matches = (pattern.fullmatch(name) for name in location.list_names())
        found = [(match.group(0), int(match.group(1))) for match in matches if match]
    else:
        found = []
    problems.extend(
        Problem("orphan", path, "trajectory data not listed in the index", trajectory_id, True)
        for path, trajectory_id in found
        if path not in expected
    )
    return problems


def _repair(layout: TrajectoryLayout, report: VerifyReport) -> None:
    # Re-read the index just before deleting: never remove data committed meanwhile.
    documents = layout.read_documents()
    index = TrajectoryIndex.from_documents(documents, layout.location.url)
    committed = {"/".join(data_path(layout, index.entries[i])) for i in index.id_list}
    remaining = []
    stale_documents = False
    for problem in report.problems:
        if problem.kind in _DOCUMENT_KINDS:
            stale_documents = True
            report.repaired.append(problem)
        elif problem.repairable and problem.path not in committed:
            layout.location.delete(*problem.path.split("/"))
            report.repaired.append(problem)
        else:
            remaining.append(problem)
    report.problems = remaining
    if stale_documents:
        # The index is the commit point: a crash between the document writes leaves the
        # metadata (and zarr's root attributes) behind it, never ahead.
        metadata = {
            **documents.metadata,
            "size": len(index),
            "total_samples": index.total_samples,
            "trajectory_counter": index.trajectory_counter,
        }
        layout.write_documents(Documents(metadata, documents.trajectory_index))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
