"""The storage seam: :class:`TrajectoryLayout`, the interface every on-disk layout implements.

A layout stores whole trajectories under a :class:`~rbzarr.storage.io.location.Location`.  It
implements six methods (write, read, delete, list, and where a trajectory's data lives);
everything else is derived from them here, once: row reads, copies, describing and
checking.  It holds trajectory data only: the store's index and documents are the
catalog's (:mod:`rbzarr.storage.index`).  Nothing outside a layout asks which format it is;
format names map to classes in :mod:`rbzarr.storage.registry`, which is also where an
existing store is opened.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from tqdm import tqdm

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, StoreExistsError
from rbzarr.shared_doc import shared_doc
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import bytes_by_prefix
from rbzarr.storage.layout_audit import LayoutAudit
from rbzarr.storage.layout_capabilities import LayoutCapabilities
from rbzarr.storage.row_groups import DrawnRows, RowGroups
from rbzarr.trajectory.dtypes import dtype_name, to_numpy

if TYPE_CHECKING:
    import torch

    from rbzarr.storage.rlinf.documents import Entry
    from rbzarr.trajectory.model import Trajectory
    from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["TrajectoryLayout", "check_entry_shape", "field_dtypes"]

# The parameter section several calls share (see :func:`~rbzarr.shared_doc.shared_doc`).
_ENTRY_PARAMETER = """
Parameters
----------
entry
    The trajectory's index entry.
"""


class TrajectoryLayout(ABC):
    """How trajectories are laid out below a location.

    Subclasses implement :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`list_ids`,
    :meth:`trajectory_path` and ``_stored_paths`` (what :meth:`audit` reports), and name
    their ``format``.  Layouts that read single rows without loading a whole trajectory
    override the two row reads, :meth:`read_rows` (one trajectory) and
    :meth:`read_groups_into` (a batch); layouts that find damage cheaper than by decoding
    override ``_missing_parts``, :meth:`describe_keys` and :meth:`fields`.  A layout
    that records its format in the catalog implements
    :class:`~rbzarr.storage.index.format_records.FormatRecords` too.

    Parameters
    ----------
    location
        The store's root.
    """

    format: ClassVar[str]
    # How describe_keys names the encoding of a whole trajectory (default: the format).
    _codec_name: ClassVar[str | None] = None
    # What a layout can do beyond the interface; callers ask this, never the format.
    capabilities: ClassVar[LayoutCapabilities] = LayoutCapabilities()

    def __init__(self, location: Location) -> None:
        self.location = location

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.url!r})"

    # -- what a layout implements ---------------------------------------------------------
    def check_writable(self, trajectory: Trajectory | ValidatedTrajectory) -> None:  # noqa: B027
        """Raise if this layout cannot write ``trajectory`` (a writer calls it before it
        accepts the trajectory, so nothing is queued that cannot be written); nothing here.

        Parameters
        ----------
        trajectory
            A validated trajectory (or a :class:`~rbzarr.trajectory.validated.ValidatedTrajectory`),
            raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        InvalidCodecError
            A codec cannot encode its key, or names a key ``trajectory`` does not have.
        CodecUnavailableError
            A codec's package cannot be imported (an ``ImportError``).
        """

    @abstractmethod
    def write(self, entry: Entry, trajectory: Trajectory | ValidatedTrajectory) -> None:
        """Write every tensor of ``trajectory`` under ``entry['trajectory_id']``.

        The rows are raw and validated here unless ``trajectory`` is a
        :class:`~rbzarr.trajectory.validated.ValidatedTrajectory`.  When this returns, the
        data is complete; an existing trajectory with the same id is replaced.  It does not
        touch the store's index or documents (the catalog's).

        Parameters
        ----------
        entry
            The trajectory's index entry (its ``trajectory_id`` names where data goes).
        trajectory
            The trajectory, raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        InvalidTrajectoryError
            ``trajectory`` is not a valid trajectory.
        UnsafePathError
            The entry would name a path outside the root.
        StorageUnavailableError
            The backend failed.
        """

    def write_many(self, items: Sequence[tuple[Entry, Trajectory | ValidatedTrajectory]]) -> int:
        """Write the first of ``items`` (``(entry, trajectory)`` pairs, as :meth:`write`
        takes them), or several at its head as one unit that is complete or absent;
        returns how many were written.

        Parameters
        ----------
        items
            Trajectories queued to be written, in order (at least one).

        Returns
        -------
        int
            How many of ``items``, from the first, are now complete (at least 1).

        Raises
        ------
        StorageUnavailableError
            The backend failed; none of them is complete.
        """
        self.write(*items[0])
        return 1

    @abstractmethod
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        """Read a whole trajectory (raw rows), optionally only the flat ``keys`` given.

        Parameters
        ----------
        entry
            The trajectory's index entry.
        keys
            Flat keys to read (``"curr_obs/image"``), or ``None`` for every field.

        Returns
        -------
        Trajectory
            Raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing (named in the message).
        CorruptStoreError
            The data is damaged or lacks a key.
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    @shared_doc(entry_parameter=_ENTRY_PARAMETER)
    def delete(self, entry: Entry) -> None:
        """Remove a trajectory's data; missing data is not an error.

        {entry_parameter}

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    def list_ids(self) -> list[int]:
        """Ids of the trajectories that have data here (committed or not), sorted.

        Returns
        -------
        list of int
            The ids, whatever the index lists.

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """

    @abstractmethod
    @shared_doc(entry_parameter=_ENTRY_PARAMETER)
    def trajectory_path(self, entry: Entry) -> tuple[str, ...]:
        """Names (below the root) of the file or directory holding one trajectory.

        {entry_parameter}

        Returns
        -------
        tuple of str
            The path's parts, each a plain name.

        Raises
        ------
        UnsafePathError
            The entry would name a path outside the root.
        """

    @abstractmethod
    def _stored_paths(self) -> dict[str, int]:
        """Every trajectory's data present here, indexed or not: ``{path: trajectory_id}``."""

    # -- rows -----------------------------------------------------------------------------
    def read_rows(
        self, entry: Entry, rows: np.ndarray, keys: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Read flat rows ``rows`` (integers, any order, repeats allowed) of the sampled
        ``keys``, as numpy arrays holding the bits :meth:`read_arrays` holds (``bfloat16`` as
        ``uint16``; :meth:`fields` names the dtypes).

        The default loads the whole trajectory (flattening needs the reference field and T,
        whichever keys are asked for) and converts its tensors; a layout that decodes into
        numpy overrides it, so the read-only tools need no torch.

        Parameters
        ----------
        entry
            The trajectory's index entry.
        rows
            Flat rows ``t * B + b``.
        keys
            Flat keys with ``[T, B, ...]`` rows.

        Returns
        -------
        dict
            ``{key: array[len(rows), ...]}``.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing.
        CorruptStoreError
            The data is damaged or disagrees with the entry's shape.
        IndexError
            A row is outside ``[0, T * B)``.
        """
        import torch  # noqa: PLC0415 (this layout reads tensors)

        flat = torch.from_numpy(np.asarray(rows, dtype=np.int64).reshape(-1))
        return {
            key: to_numpy(value) for key, value in self._read_row_tensors(entry, flat, keys).items()
        }

    def _read_row_tensors(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """:meth:`read_rows` as tensors (``rows``: int64), from the whole trajectory."""
        return self._rows_of(entry, self.read(entry), rows, keys)

    def _rows_of(
        self, entry: Entry, trajectory: Trajectory, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Flat rows ``rows`` of ``keys`` of ``trajectory``, read for ``entry`` (whose shape
        it must have)."""
        from rbzarr.trajectory.flat_view import flatten_trajectory  # noqa: PLC0415 (torch)
        from rbzarr.trajectory.model import validate  # noqa: PLC0415

        spec = validate(trajectory)
        check_entry_shape(entry, list(spec.shape), self.location.url)
        flat = flatten_trajectory(trajectory, spec)
        return {key: flat[key].index_select(0, rows) for key in keys}

    def read_arrays(self, entry: Entry, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """:meth:`read` as numpy arrays (each dtype's bits as
        :func:`~rbzarr.trajectory.dtypes.to_numpy` holds them: ``bfloat16`` as ``uint16``).

        The default converts :meth:`read`'s tensors; a layout that decodes into numpy
        overrides it, so the read-only tools need no torch.

        Parameters
        ----------
        entry
            The trajectory's index entry.
        keys
            Flat keys to read, or ``None`` for every field.

        Returns
        -------
        dict
            ``{key: array}``, raw ``[T(+E), B, ...]`` rows.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing.
        CorruptStoreError
            The data is damaged or lacks a key.
        """
        return {key: to_numpy(value) for key, value in self.read(entry, keys).tensors().items()}

    def read_drawn_into(
        self, drawn: DrawnRows, keys: Sequence[str], out: Mapping[str, torch.Tensor]
    ) -> bool:
        """Read drawn rows by window position into ``out``, if this layout can at once.

        Row ``i`` of ``drawn`` goes to row ``i`` of ``out[key]``.  A layout that keeps what
        it needs of a window's trajectories by position reads the batch with no grouping;
        the default reads nothing and returns ``False``: the caller then groups the rows
        for :meth:`read_groups_into`.

        Parameters
        ----------
        drawn
            The rows: each one's window position and flat row.
        keys
            Flat keys with ``[T, B, ...]`` rows.
        out
            Preallocated ``[n, ...]`` tensors by key, filled in place when read.

        Returns
        -------
        bool
            Whether every row was read.
        """
        return False

    def read_groups_into(
        self, groups: RowGroups, keys: Sequence[str], out: Mapping[str, torch.Tensor]
    ) -> None:
        """Read the rows of several trajectories, grouped as flat arrays, into ``out``.

        Group ``g``'s flat rows go to rows ``positions`` (int64) of ``out[key]``, for every
        key.  The default reads each group's rows from its whole trajectory; layouts that
        read a whole batch at once override it.

        Parameters
        ----------
        groups
            The rows, their batch positions and each trajectory's run of them.
        keys
            Flat keys with ``[T, B, ...]`` rows.
        out
            Preallocated ``[n, ...]`` tensors by key, filled in place.

        Raises
        ------
        CheckpointNotFoundError
            A trajectory's data is missing.
        CorruptStoreError
            A trajectory's data is damaged.
        """
        for entry, rows, positions in groups.requests():
            got = self._read_row_tensors(entry, rows, keys)
            for key in keys:
                if got[key].dtype != out[key].dtype or got[key].shape[1:] != out[key].shape[1:]:
                    raise CorruptStoreError(
                        f"{self.location.url}: trajectory {entry['trajectory_id']}: field "
                        f"{key!r} holds {got[key].dtype} rows of {list(got[key].shape[1:])}, "
                        f"the store's schema says {out[key].dtype} rows of "
                        f"{list(out[key].shape[1:])}"
                    )
                out[key].index_copy_(0, positions, got[key])

    # -- presence and copies --------------------------------------------------------------
    def sample_window(  # noqa: B027  (a hook; most ignore it)
        self, count: int, committed: Sequence[Entry] | None = None
    ) -> None:
        """A hint, when the sample window changes: sampling draws from ``count``
        trajectories, of which ``committed`` (when given) are complete in the store.  A
        layout that keeps trajectories open keeps ``count``; one keeping a local copy of a
        remote store fetches ``committed`` ahead and evicts them last; this one ignores
        both."""

    def stored_bytes(self, entry: Entry) -> int:
        """The bytes the trajectory's data takes in the store (one listing).

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        int
            The sizes of its files (0 where it has none).

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """
        return self.location.tree_bytes(*self.trajectory_path(entry))

    def _contains(self, entry: Entry) -> bool:
        """Whether the trajectory's data is present (its :meth:`trajectory_path` exists)."""
        return self.location.exists(*self.trajectory_path(entry))

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``.

        Between layouts of the same class the objects are copied as they are (fsspec's
        copy, no decoding) once the trajectory has been read here (every check of
        :meth:`read`: nothing unchecked reaches ``target``); otherwise the trajectory is
        read and written again.

        Parameters
        ----------
        target
            The layout to copy into.
        entry
            The trajectory's index entry.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing here.
        StoreExistsError
            ``target`` already holds data at the trajectory's path (nothing is overwritten).
        """
        if not self._contains(entry):
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
        self.read(entry)
        self.location.child(*path).copy_into(target.location.child(*path))

    # -- format knowledge: describing and checking ----------------------------------------
    def audit(self) -> LayoutAudit:
        """This layout's checks of its stored data (what ``verify`` and ``recode`` ask).

        Returns
        -------
        LayoutAudit
            Whether a trajectory is present, the stored paths, the foreign files below one,
            and a trajectory's missing parts.
        """
        return LayoutAudit(
            self._contains,
            self._stored_paths,
            self._foreign_files,
            self._missing_parts,
            self._unneeded_groups,
        )

    def _foreign_files(self, path: str) -> list[str]:
        """Files below the trajectory path ``path`` rbzarr did not write; the default: none."""
        return []

    def _unneeded_groups(self, entries: Mapping[int, Entry]) -> list[str]:
        """Shared groups none of ``entries`` is a member of; the default shares none."""
        return []

    @shared_doc(entry_parameter=_ENTRY_PARAMETER)
    def fields(self, entry: Entry) -> dict[str, str]:
        """Flat field keys of one trajectory (``"rewards"``, ``"curr_obs/image"``), in order,
        with their dtype names (``"float32"``, ``"bfloat16"``).

        The dtype names are what :meth:`read_arrays` does not tell (it holds ``bfloat16`` as
        ``uint16``); ``list(fields(entry))`` names the keys.  The default reads the
        trajectory; layouts with field metadata override it.

        {entry_parameter}

        Returns
        -------
        dict of str to str
            ``{flat key: dtype name}``.
        """
        return field_dtypes(self.read(entry))

    @shared_doc(entry_parameter=_ENTRY_PARAMETER)
    def first_row(
        self, entry: Entry, keys: Sequence[str]
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Row 0 of ``keys`` as :meth:`read_rows` reads it, and :meth:`fields`: what a check
        of the store's schema against the data compares.

        A layout that decodes whole trajectories overrides it to decode one once.

        {entry_parameter}
        keys
            Flat keys with ``[T, B, ...]`` rows.

        Returns
        -------
        tuple of (dict, dict of str to str)
            ``{key: array[1, ...]}`` and ``{flat key: dtype name}``.
        """
        return self.read_rows(entry, np.zeros(1, dtype=np.int64), keys), self.fields(entry)

    def _missing_parts(self, entry: Entry) -> list[str]:
        """Absent parts of a present trajectory; the default: none (decoding checks it)."""
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
                        "codec": self._codec_name or self.format,
                        "raw_bytes": 0,
                        "bytes_on_disk": None,
                    },
                )
                info["raw_bytes"] += tensor.numel() * tensor.element_size()
        return keys, disk


def check_entry_shape(entry: Entry, shape: Sequence[int], where: str) -> None:
    """Raise :class:`CorruptStoreError` (naming ``where``) if ``shape`` is not the entry's."""
    if list(shape) != [int(d) for d in entry["shape"]]:
        raise CorruptStoreError(
            f"{where}: trajectory {entry['trajectory_id']}: its data has shape {list(shape)} "
            f"but the index says {list(entry['shape'])}"
        )


def field_dtypes(trajectory: Trajectory) -> dict[str, str]:
    """The flat keys of ``trajectory``'s tensors, in order, with their dtype names."""
    return {key: dtype_name(value.dtype) for key, value in trajectory.tensors().items()}
