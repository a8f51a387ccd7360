"""Every layout's behaviour written once, on top of the six methods a layout implements.

A layout stores whole trajectories under a :class:`~rbzarr.storage.location.Location` and
reads them back, whole or by flat rows.  It owns its format: the two JSON documents of a
store (:class:`~rbzarr.storage.documents.StoreDocuments`), where each trajectory's data
lives and how it is written and read (:class:`~rbzarr.storage.layout_core.LayoutCore`), and
how to describe and check it (:meth:`TrajectoryLayout.describe_keys`,
:meth:`TrajectoryLayout.missing_parts`, :meth:`~StoreDocuments.check_documents`).  Copying,
exporting, summarising and verifying are written once on top of these methods, and nothing
outside a layout asks which format it is.  Format names map to classes in
:mod:`rbzarr.storage.registry`, which is also where an existing store is opened.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from tqdm import tqdm

from rbzarr.errors import CheckpointNotFoundError, CorruptStoreError, StoreExistsError
from rbzarr.storage.documents import Entry
from rbzarr.storage.layout_core import LayoutCore
from rbzarr.trajectory.dtypes import dtype_name
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

__all__ = ["TrajectoryLayout", "bytes_by_prefix", "check_entry_shape"]


class TrajectoryLayout(LayoutCore):
    """How trajectories are laid out below a location.

    Subclasses implement :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`list_ids`,
    :meth:`trajectory_path` and :meth:`stored_paths` (see
    :class:`~rbzarr.storage.layout_core.LayoutCore`).  Layouts that can read single rows
    without loading a whole trajectory override :meth:`read_rows` / :meth:`read_rows_many`;
    layouts that keep more than the two documents (the zarr layout mirrors them in its root
    group) or that can find damage cheaper than by decoding override :meth:`check_documents`,
    :meth:`missing_parts`, :meth:`describe_keys` and :meth:`field_names`.

    Parameters
    ----------
    location
        The store's root.
    """

    # How describe_keys names the encoding of a whole trajectory (default: the format).
    codec_name: ClassVar[str | None] = None

    # -- rows -----------------------------------------------------------------------------
    def read_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Read flat rows ``rows`` (int64, any order, repeats allowed) of the sampled ``keys``.

        The default loads the whole trajectory (flattening needs the reference field and T,
        whichever keys are asked for).

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
            ``{key: tensor[len(rows), ...]}``.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory's data is missing.
        CorruptStoreError
            The data is damaged or disagrees with the entry's shape.
        IndexError
            A row is outside ``[0, T * B)``.
        """
        trajectory = self.read(entry)
        spec = validate(trajectory)
        check_entry_shape(entry, list(spec.shape), self.location.url)
        flat = flatten_trajectory(trajectory, spec)
        return {key: flat[key].index_select(0, rows) for key in keys}

    def read_rows_many(
        self, requests: Sequence[tuple[Entry, torch.Tensor]], keys: Sequence[str]
    ) -> list[dict[str, torch.Tensor]]:
        """:meth:`read_rows` for several trajectories; layouts may fetch them concurrently.

        Parameters
        ----------
        requests
            ``(entry, rows)`` per trajectory.
        keys
            Flat keys with ``[T, B, ...]`` rows.

        Returns
        -------
        list of dict
            ``{key: tensor[len(rows), ...]}`` per request, in order.

        Raises
        ------
        CheckpointNotFoundError
            A trajectory's data is missing.
        CorruptStoreError
            A trajectory's data is damaged.
        """
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

        Parameters
        ----------
        requests
            ``(entry, rows, positions)`` per trajectory.
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
        values = self.read_rows_many([(entry, rows) for entry, rows, _ in requests], keys)
        for (_, _, positions), got in zip(requests, values, strict=True):
            for key in keys:
                out[key].index_copy_(0, positions, got[key])

    def foreign_files(self, path: str) -> list[str]:
        """Files at or below the trajectory path ``path`` that rbzarr did not write.

        A repair deletes an orphan only when this is empty: a user's file that happens to
        lie there is never removed.  The default finds none.

        Parameters
        ----------
        path
            A trajectory path from :meth:`stored_paths`.

        Returns
        -------
        list of str
            The foreign files, relative to ``path``.
        """
        return []

    def contains(self, entry: Entry) -> bool:
        """Whether the trajectory's data is present.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        bool
            Whether its :meth:`trajectory_path` exists.
        """
        return self.location.exists(*self.trajectory_path(entry))

    def copy_to(self, target: TrajectoryLayout, entry: Entry) -> None:
        """Copy one trajectory into ``target``.

        Between layouts of the same class the objects are copied as they are (fsspec's
        copy, no decoding); otherwise the trajectory is read and written again.

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

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        list of str
            The flat keys.
        """
        return list(self.read(entry).tensors())

    def missing_parts(self, entry: Entry) -> list[str]:
        """Parts of a present trajectory that are absent (one message each).

        For damage that decoding would not reveal, such as a Zarr chunk that reads as fill
        values when it is missing.  The default finds nothing: decoding checks the rest.

        Parameters
        ----------
        entry
            The index entry of a trajectory whose data is present.

        Returns
        -------
        list of str
            One message per missing part.
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

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        zarr.Group
            The group (only the zarr layout has one).

        Raises
        ------
        ValueError
            This layout does not store Zarr groups (only the zarr layout does).
        """
        raise ValueError(
            f"{self.location.url}: Zarr groups and dask arrays need the zarr layout, this "
            f"store is {self.format!r}; convert it with `rbzarr export SRC DST --format zarr`"
        )

    # -- presence -------------------------------------------------------------------------
    def holds_data(self) -> bool:
        """Whether anything would be overwritten here.

        Returns
        -------
        bool
            ``True`` for an index listing trajectories or, without an index, a metadata
            document or trajectory data.

        Raises
        ------
        CorruptStoreError
            The index document is damaged.
        """
        listed = self.listed_ids()
        return bool(listed) or (listed is None and (self.has_documents() or bool(self.list_ids())))


def check_entry_shape(entry: Entry, shape: Sequence[int], where: str) -> None:
    """Refuse data whose shape disagrees with its index entry.

    Parameters
    ----------
    entry
        The trajectory's index entry.
    shape
        The ``[T, B]`` shape found in the data.
    where
        Names the store in errors.

    Raises
    ------
    CorruptStoreError
        ``shape`` differs from ``entry["shape"]``.
    """
    if list(shape) != [int(d) for d in entry["shape"]]:
        raise CorruptStoreError(
            f"{where}: trajectory {entry['trajectory_id']}: its data has shape {list(shape)} "
            f"but the index says {list(entry['shape'])}"
        )


def bytes_by_prefix(sizes: Mapping[str, int]) -> dict[str, int]:
    """Total size below every one- and two-part prefix of ``sizes``' paths.

    A file counts as its own prefix, so ``totals["trajectory_3_.pt"]`` is a file's size and
    ``totals["trajectories/3"]`` the size of a directory's files.

    Parameters
    ----------
    sizes
        File sizes in bytes by ``/``-joined path below the root.

    Returns
    -------
    dict
        Total bytes by prefix.
    """
    totals: dict[str, int] = defaultdict(int)
    for path, size in sizes.items():
        parts = path.split("/")
        for depth in {1, min(2, len(parts))}:
            totals["/".join(parts[:depth])] += size
    return dict(totals)
