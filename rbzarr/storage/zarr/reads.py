"""Reading trajectories of the zarr layout: whole or by sampled rows, either version.

:class:`ZarrReads` is the reading half of :class:`~rbzarr.storage.zarr.layout.ZarrLayout`
(which adds writing).  It owns the layout's :class:`~rbzarr.storage.zarr.open.TrajectoryOpener`
(the zarr store and the cache of opened trajectories): a batch of trajectories opens in one
round, then only the bytes holding the asked-for rows are read
(:mod:`rbzarr.storage.zarr.rows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from zarr.abc.store import Store
from zarr.core.sync import sync

from rbzarr.storage.backends import translate_errors
from rbzarr.storage.documents import Entry
from rbzarr.storage.location import Location
from rbzarr.storage.zarr import chunks as chunk_io
from rbzarr.storage.zarr import rows as zarr_rows
from rbzarr.storage.zarr import sharded
from rbzarr.storage.zarr.inspect import ZarrInspection
from rbzarr.storage.zarr.open import TRAJECTORIES, TrajectoryOpener
from rbzarr.storage.zarr.remote import IOStats
from rbzarr.trajectory.dtypes import from_numpy
from rbzarr.trajectory.model import Trajectory, trajectory_from_raw

__all__ = ["ZarrReads"]


class ZarrReads(ZarrInspection):
    """The zarr layout's reads; :class:`~rbzarr.storage.zarr.layout.ZarrLayout` adds writes.

    Parameters
    ----------
    location
        The store's root.
    store
        A zarr store rooted at ``location``, or ``None`` to open ``location.zarr_store()``.
    handle_cache_size
        How many trajectories keep their opened handles (least recently used go).
    io_stats
        Counts the requests and bytes of layout-2 reads; a fresh
        :class:`~rbzarr.storage.zarr.remote.IOStats` when ``None``.
    """

    def __init__(
        self,
        location: Location,
        store: Store | None,
        handle_cache_size: int,
        io_stats: IOStats | None,
    ) -> None:
        super().__init__(location)
        self.io_stats = IOStats() if io_stats is None else io_stats
        self._opener = TrajectoryOpener(location, store, handle_cache_size, self.io_stats)

    def stored_version(self, entry: Entry) -> int:
        """The layout version a committed trajectory is stored in.

        Parameters
        ----------
        entry
            The trajectory's index entry.

        Returns
        -------
        int
            2 for a group with a layout description (shards), else 1.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory is missing or its write never finished.
        CorruptStoreError
            Its metadata is damaged.
        """
        opened = self._opener.open_many([entry])[0]
        return 2 if isinstance(opened, sharded.ShardedTrajectory) else 1

    def list_ids(self) -> list[int]:
        """Ids of the trajectory groups below ``trajectories/`` (committed or not), sorted.

        Returns
        -------
        list of int
            Names that are canonical decimal integers; anything else is ignored.

        Raises
        ------
        StorageUnavailableError
            The backend failed.
        """
        with translate_errors(self.location.url, "listing"):
            names = sync(self._list_names(TRAJECTORIES))
        return sorted(int(name) for name in names if name.isdigit() and str(int(name)) == name)

    async def _list_names(self, prefix: str) -> list[str]:
        return [name async for name in self._opener.store().list_dir(prefix)]

    # -- reading ------------------------------------------------------------------------
    def read(self, entry: Entry, keys: Sequence[str] | None = None) -> Trajectory:
        """Read a whole trajectory (raw rows), optionally only the flat ``keys`` given.

        Parameters
        ----------
        entry
            The trajectory's index entry (supplies ``max_episode_length`` and
            ``model_weights_id``).
        keys
            Flat keys to read, or ``None`` for every field.

        Returns
        -------
        Trajectory
            Raw ``[T(+E), B, ...]`` rows in their stored dtypes.

        Raises
        ------
        CheckpointNotFoundError
            The trajectory is missing or its write never finished.
        CorruptStoreError
            Its data is damaged or lacks a key.
        StorageUnavailableError
            The backend failed.
        """
        opened = self._opener.open_many([entry])[0]
        wanted = list(opened.dtypes) if keys is None else list(keys)
        zarr_rows.check_keys(opened, wanted, self.location.url)
        arrays = zarr_rows.zarr_arrays(opened, wanted)
        with translate_errors(self.location.url, "reading"):
            values = dict(
                zip(
                    arrays,
                    sync(chunk_io.gather(*(chunk_io.read_whole(a) for a in arrays.values()))),
                    strict=True,
                )
            )
            if isinstance(opened, sharded.ShardedTrajectory):
                described = [key for key in wanted if key not in arrays]
                values.update(sharded.read_whole_shards(self._opener.location(), opened, described))
        fields = {key: from_numpy(np.asarray(values[key]), opened.dtypes[key]) for key in wanted}
        return trajectory_from_raw(
            fields,
            max_episode_length=int(entry.get("max_episode_length", 0)),
            model_weights_id=str(entry.get("model_weights_id", "")),
        )

    def read_rows(
        self, entry: Entry, rows: torch.Tensor, keys: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """Read flat rows ``rows`` (int64, any order, repeats allowed) of the sampled ``keys``.

        Only the bytes holding the rows are read (layout 1: the chunks holding them, each
        once).

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
            The trajectory is missing or its write never finished.
        CorruptStoreError
            Its data is damaged or lacks a key.
        ValueError
            A key has no ``[T, B]`` rows.
        IndexError
            A row is outside ``[0, T * B)``.
        StorageUnavailableError
            The backend failed.
        """
        return self.read_rows_many([(entry, rows)], keys)[0]

    def read_rows_many(
        self, requests: Sequence[tuple[Entry, torch.Tensor]], keys: Sequence[str]
    ) -> list[dict[str, torch.Tensor]]:
        """:meth:`read_rows` for several trajectories, all read in one round.

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
            A trajectory is missing or its write never finished.
        CorruptStoreError
            A trajectory's data is damaged or lacks a key.
        ValueError
            A key has no ``[T, B]`` rows.
        IndexError
            A row is outside its trajectory's ``[0, T * B)``.
        """
        opened = self._opener.open_many([entry for entry, _ in requests])
        results = []
        for (entry, rows), handles in zip(requests, opened, strict=True):
            zarr_rows.check_keys(handles, keys, self.location.url, sampled=True)
            count = int(torch.as_tensor(rows).numel())
            out = {
                key: torch.empty((count, *handles.shape(key)[2:]), dtype=handles.dtypes[key])
                for key in keys
            }
            self.read_rows_into([(entry, rows, torch.arange(count))], keys, out)
            results.append(out)
        return results

    def read_rows_into(
        self,
        requests: Sequence[tuple[Entry, torch.Tensor, torch.Tensor]],
        keys: Sequence[str],
        out: Mapping[str, torch.Tensor],
    ) -> None:
        """Read rows of several trajectories into preallocated blocks, in one round.

        Each request ``(entry, rows, positions)`` puts flat rows ``rows`` of the trajectory
        into rows ``positions`` (int64) of ``out[key]``, for every key; at most one gather
        (or one batch of byte ranges) per (trajectory, key), every row at its final place.

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
            A trajectory is missing or its write never finished.
        CorruptStoreError
            A trajectory's data is damaged or lacks a key.
        ValueError
            A key has no ``[T, B]`` rows.
        IndexError
            A row is outside its trajectory's ``[0, T * B)``.
        StorageUnavailableError
            The backend failed.
        """
        opened = self._opener.open_many([entry for entry, _, _ in requests])
        with translate_errors(self.location.url, "reading"):
            zarr_rows.read_rows_into(
                self._opener.location(), opened, requests, keys, out, self.io_stats
            )
