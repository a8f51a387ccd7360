"""The storage seam: one small ABC that every on-disk layout implements.

A layout stores whole trajectories under a :class:`~rbzarr.storage.location.Location` and
reads them back, whole or by flat rows.  It owns its format: the two JSON documents of a
store (``metadata.json`` and ``trajectory_index.json``), where each trajectory's data lives
(:meth:`TrajectoryLayout.trajectory_path`, :meth:`TrajectoryLayout.stored_paths`), and how to
describe and check it (:meth:`TrajectoryLayout.describe_keys`,
:meth:`TrajectoryLayout.missing_parts`, :meth:`TrajectoryLayout.check_documents`).  Copying,
exporting, summarising and verifying are written once on top of these methods, and nothing
outside a layout asks which format it is.  Format names map to classes in
:mod:`rbzarr.storage.registry`, which is also where an existing store is opened.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from tqdm import tqdm

from rbzarr.dtypes import dtype_name
from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, StoreExistsError
from rbzarr.flat_view import flatten_trajectory
from rbzarr.storage.location import Location
from rbzarr.trajectory import Trajectory, validate

if TYPE_CHECKING:
    from rbzarr.validated import ValidatedTrajectory

__all__ = [
    "INDEX_FILE",
    "METADATA_FILE",
    "Documents",
    "Finding",
    "TrajectoryLayout",
    "bytes_by_prefix",
    "check_entry_shape",
    "read_documents",
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


@dataclass(frozen=True)
class Finding:
    """Something a layout found wrong with its own data: a kind, a path, a message.

    ``path`` is ``/``-joined below the store's root (``""`` for the store itself).
    """

    kind: str
    path: str
    message: str


class TrajectoryLayout(ABC):
    """How trajectories are laid out below a location.

    Subclasses implement :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`list_ids`,
    :meth:`trajectory_path` and :meth:`stored_paths`.  Layouts that can read single rows
    without loading a whole trajectory override :meth:`read_rows` / :meth:`read_rows_many`;
    layouts that keep more than the two documents (the zarr layout mirrors them in its root
    group) or that can find damage cheaper than by decoding override :meth:`check_documents`,
    :meth:`missing_parts`, :meth:`describe_keys` and :meth:`field_names`.

    Parameters
    ----------
    location
        The store's root.
    """

    format: ClassVar[str]
    # How describe_keys names the encoding of a whole trajectory (default: the format).
    codec_name: ClassVar[str | None] = None

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

    @abstractmethod
    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        """Names (below the root) of the file or directory holding one trajectory.

        Raises :class:`~rbzarr.errors.UnsafePathError` when the entry would name a path
        outside the root.
        """

    @abstractmethod
    def stored_paths(self) -> dict[str, int]:
        """Every trajectory's data present here, indexed or not: ``{path: trajectory_id}``.

        Paths are ``/``-joined below the root, as :meth:`trajectory_path` names them.
        """

    def foreign_files(self, path: str) -> list[str]:
        """Files at or below the trajectory path ``path`` that rbzarr did not write.

        A repair deletes an orphan only when this is empty: a user's file that happens to
        lie there is never removed.  Names are relative to ``path``.
        """
        return []

    def contains(self, entry: Entry) -> bool:
        """Whether the trajectory's data is present."""
        return self.location.exists(*self.trajectory_path(entry))

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``.

        Between layouts of the same class the objects are copied as they are (fsspec's
        copy, no decoding); otherwise the trajectory is read and written again.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing here.
        StoreExistsError
            ``target`` already holds data at the trajectory's path (nothing is overwritten).
        """
        if not self.contains(entry):
            raise CheckpointNotFoundError(
                f"{self.location.url}: trajectory {entry['trajectory_id']} is indexed but its "
                "data is missing"
            )
        if type(target) is not type(self):
            target.write(entry, self.read(entry))
            return
        path = self.trajectory_path(entry)
        if target.location.exists(*path):
            raise StoreExistsError(
                f"{target.location.url}/{'/'.join(path)} already exists; a copy never "
                "overwrites data"
            )
        self.location.child(*path).copy_into(target.location.child(*path))

    # -- format knowledge: describing and checking ----------------------------------------
    def field_names(self, entry: Entry) -> list[str]:
        """Flat field keys of one trajectory (``"rewards"``, ``"curr_obs/image"``), in order.

        The default reads the trajectory; layouts with field metadata override it.
        """
        return list(self.read(entry).tensors())

    def missing_parts(self, entry: Entry) -> list[str]:
        """Parts of a present trajectory that are absent (one message each).

        For damage that decoding would not reveal, such as a Zarr chunk that reads as fill
        values when it is missing.  The default finds nothing: decoding checks the rest.
        """
        return []

    def check_documents(self, documents: Documents) -> list[Finding]:
        """Copies of ``documents`` this layout keeps that disagree with them.

        Each finding is repaired by writing the documents again
        (:meth:`write_documents`).  The default keeps no copies.
        """
        return []

    def describe_keys(
        self, entries: Iterable[Entry], sizes: Mapping[str, int], progress: bool = False
    ) -> tuple[dict[str, dict[str, Any]], int]:
        """Per-key layout and sizes of the trajectories ``entries``; see ``rbzarr info``.

        Parameters
        ----------
        entries
            Index entries of the trajectories to describe.
        sizes
            Size of every file below the root, by ``/``-joined path.
        progress
            Show a progress bar on stderr.

        Returns
        -------
        tuple of (dict, int)
            ``{key: {"dtype", "shape", "chunks", "shards", "codec", "raw_bytes",
            "bytes_on_disk"}}`` (the first trajectory's dtype, shape and chunking; bytes
            summed) and the bytes on storage of all the trajectories' data.  The default
            reads every trajectory; its per-key ``bytes_on_disk`` is ``None`` (one file
            holds all keys).
        """
        totals = bytes_by_prefix(sizes)
        keys: dict[str, dict[str, Any]] = {}
        disk = 0
        for entry in tqdm(list(entries), desc="info", unit="traj", disable=not progress):
            disk += totals.get("/".join(self.trajectory_path(entry)), 0)
            for name, tensor in self.read(entry).tensors().items():
                info = keys.setdefault(
                    name,
                    {
                        "dtype": dtype_name(tensor.dtype),
                        "shape": list(tensor.shape),
                        "chunks": None,
                        "shards": None,
                        "codec": self.codec_name or self.format,
                        "raw_bytes": 0,
                        "bytes_on_disk": None,
                    },
                )
                info["raw_bytes"] += tensor.numel() * tensor.element_size()
        return keys, disk

    def zarr_group(self, entry: Entry) -> Any:
        """The read-only Zarr group of one trajectory.

        Raises
        ------
        ValueError
            This layout does not store Zarr groups (only the zarr layout does).
        """
        raise ValueError(
            f"{self.location.url}: Zarr groups and dask arrays need the zarr layout, this "
            f"store is {self.format!r}; convert it with `rbzarr export SRC DST --format zarr`"
        )

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


def bytes_by_prefix(sizes: Mapping[str, int]) -> dict[str, int]:
    """Total size below every one- and two-part prefix of ``sizes``' paths.

    A file counts as its own prefix, so ``totals["trajectory_3_.pt"]`` is a file's size and
    ``totals["trajectories/3"]`` the size of a directory's files.
    """
    totals: dict[str, int] = defaultdict(int)
    for path, size in sizes.items():
        parts = path.split("/")
        for depth in {1, min(2, len(parts))}:
            totals["/".join(parts[:depth])] += size
    return dict(totals)


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
