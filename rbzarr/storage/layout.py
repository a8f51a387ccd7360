"""The storage seam: one small ABC that every on-disk layout implements.

A layout stores whole trajectories under a :class:`~rbzarr.storage.location.Location` and
reads them back, whole or by flat rows.  It also owns the two JSON documents that describe a
store (``metadata.json`` and ``trajectory_index.json``).  Copying, exporting and verifying
are written once on top of this interface; the buffer never asks which format it holds.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError
from rbzarr.storage.location import Location
from rbzarr.trajectory import Trajectory, flatten_trajectory, validate

if TYPE_CHECKING:
    from rbzarr.validated import ValidatedTrajectory

__all__ = [
    "INDEX_FILE",
    "METADATA_FILE",
    "Documents",
    "check_entry_shape",
    "TrajectoryLayout",
    "layout_class",
    "read_documents",
    "stored_format",
    "register_layout",
]

METADATA_FILE = "metadata.json"
INDEX_FILE = "trajectory_index.json"

# An index entry: {"uuid", "trajectory_id", "num_samples", "shape", "max_episode_length",
# "model_weights_id"} (JSON-ready values).
Entry = Mapping[str, Any]


@dataclass(frozen=True)
class Documents:
    """The two JSON documents of a store, as plain dicts in RLinf's schema."""

    metadata: dict[str, Any]
    trajectory_index: dict[str, Any]


class TrajectoryLayout(ABC):
    """How trajectories are laid out below a location.

    Subclasses implement :meth:`write`, :meth:`read`, :meth:`delete` and :meth:`list_ids`;
    those that can read single rows without loading a whole trajectory override
    :meth:`read_rows` and set ``supports_row_reads``.
    """

    format: ClassVar[str]
    supports_row_reads: ClassVar[bool] = False

    def __init__(self, location: Location) -> None:
        self.location = location

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.url!r})"

    # -- trajectories -------------------------------------------------------------------
    @abstractmethod
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Write every tensor of ``trajectory`` (raw rows; validated unless it is a
        :class:`~rbzarr.validated.ValidatedTrajectory`) under ``entry['trajectory_id']``.

        When this returns, the data is complete; an existing trajectory with the same id is
        replaced.  It does not touch the JSON documents (see :meth:`write_documents`).
        """

    @abstractmethod
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        """Read a whole trajectory (raw rows), optionally only the flat ``keys`` given.

        Missing data raises :class:`~rbzarr.errors.CheckpointNotFoundError` naming it.
        """

    def read_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Read flat rows ``rows`` (int64, any order, repeats allowed) of the sampled ``keys``.

        Returns ``{key: tensor[len(rows), ...]}``.  The default loads the whole trajectory
        (flattening needs the reference field and T, whichever keys are asked for).
        """
        trajectory = self.read(entry)
        spec = validate(trajectory)
        check_entry_shape(entry, list(spec.shape), self.location.url)
        flat = flatten_trajectory(trajectory, spec)
        return {key: flat[key].index_select(0, rows) for key in keys}

    def read_rows_many(
        self, requests: Sequence[tuple[Entry, torch.Tensor]], keys: Sequence[str]
    ) -> list[dict[str, torch.Tensor]]:
        """:meth:`read_rows` for several trajectories; layouts may fetch them concurrently."""
        return [self.read_rows(entry, rows, keys) for entry, rows in requests]

    def read_rows_into(
        self,
        requests: Sequence[tuple[Entry, torch.Tensor, torch.Tensor]],
        keys: Sequence[str],
        out: Mapping[str, torch.Tensor],
    ) -> None:
        """Read rows of several trajectories into preallocated blocks.

        Each request ``(entry, rows, positions)`` puts flat rows ``rows`` of the trajectory
        into rows ``positions`` (int64) of ``out[key]``, for every key.  The default goes
        through :meth:`read_rows_many`.
        """
        values = self.read_rows_many([(entry, rows) for entry, rows, _ in requests], keys)
        for (_, _, positions), got in zip(requests, values, strict=True):
            for key in keys:
                out[key].index_copy_(0, positions, got[key])

    @abstractmethod
    def delete(self, entry: Entry) -> None:
        """Remove a trajectory's data; missing data is not an error."""

    @abstractmethod
    def list_ids(self) -> list[int]:
        """Ids of the trajectories that have data here (committed or not), sorted."""

    def trajectory_path(self, entry: Entry) -> tuple[str, ...] | None:
        """Names (below the root) of the file or directory holding one trajectory.

        Layouts that keep a trajectory in one place return it, which lets
        :meth:`copy_to` copy objects without decoding them; ``None`` disables that.
        """
        return None

    def contains(self, entry: Entry) -> bool:
        """Whether the trajectory's data is present."""
        path = self.trajectory_path(entry)
        if path is None:
            return int(entry["trajectory_id"]) in self.list_ids()
        return self.location.exists(*path)

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``: object by object when both layouts are of
        the same kind, else by decoding and re-encoding it."""
        if not self.contains(entry):
            raise CheckpointNotFoundError(
                f"{self.location.url}: trajectory {entry['trajectory_id']} is indexed but its "
                "data is missing"
            )
        path = self.trajectory_path(entry)
        if type(target) is type(self) and path is not None:
            target.location.delete(*path)
            self.location.child(*path).copy_tree(target.location.child(*path))
        else:
            target.write(entry, self.read(entry))

    # -- documents ----------------------------------------------------------------------
    def write_documents(self, documents: Documents) -> Documents:
        """Commit: write the index, then the metadata, each atomically.

        Call only after every trajectory the index lists is completely written.  Returns
        the documents as written (a layout may add what describes its format).
        """
        self.location.write_bytes(_dump(documents.trajectory_index), INDEX_FILE)
        self.location.write_bytes(_dump(documents.metadata), METADATA_FILE)
        return documents

    def read_documents(self) -> Documents:
        """Read both documents; a missing one raises ``CheckpointNotFoundError`` naming it."""
        return read_documents(self.location)

    def listed_ids(self) -> list[int] | None:
        """Ids the index document lists, or ``None`` when there is no index document."""
        if not self.location.exists(INDEX_FILE):
            return None
        ids = _read_json(self.location, INDEX_FILE).get("trajectory_id_list")
        if not isinstance(ids, list):
            raise CorruptStoreError(f"{self.location.url}/{INDEX_FILE}: no trajectory_id_list")
        return ids

    def holds_data(self) -> bool:
        """Whether anything would be overwritten here: an index listing trajectories, or
        (without an index) a metadata document or trajectory data."""
        listed = self.listed_ids()
        return bool(listed) or (listed is None and (self.has_documents() or bool(self.list_ids())))

    def has_documents(self) -> bool:
        """Whether a store already exists here (either JSON document present)."""
        return self.location.exists(METADATA_FILE) or self.location.exists(INDEX_FILE)


def check_entry_shape(entry: Entry, shape: Sequence[int], where: str) -> None:
    """Raise :class:`CorruptStoreError` when data of ``shape`` disagrees with its entry."""
    if list(shape) != [int(d) for d in entry["shape"]]:
        raise CorruptStoreError(
            f"{where}: trajectory {entry['trajectory_id']}: its data has shape {list(shape)} "
            f"but the index says {list(entry['shape'])}"
        )


def stored_format(documents: Documents) -> str:
    """The layout a store's metadata names; RLinf's default ``"pt"`` when it names none."""
    return str(documents.metadata.get("trajectory_format", "pt"))


def read_documents(location: Location) -> Documents:
    """Read a store's two documents, whatever its layout.

    A missing one raises :class:`CheckpointNotFoundError`, an unparsable one
    :class:`CorruptStoreError`; both name the file.
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


_LAYOUTS: dict[str, Callable[..., TrajectoryLayout]] = {}


def register_layout(name: str, factory: Callable[..., TrajectoryLayout]) -> None:
    """Make a layout available under ``trajectory_format=name``."""
    _LAYOUTS[name] = factory


def layout_class(name: str) -> Callable[..., TrajectoryLayout]:
    """The layout registered for ``name``; unknown formats raise ``ValueError``."""
    # Importing the layout modules registers them.
    from rbzarr.storage import file_layout, zarr_layout  # noqa: F401, PLC0415

    try:
        return _LAYOUTS[name]
    except KeyError:
        raise ValueError(
            f"unknown trajectory_format {name!r}; expected one of {sorted(_LAYOUTS)}"
        ) from None
