"""Offline analysis: a read-only view of a store, its trajectories, episodes and samples.

:func:`open_buffer` opens any rbzarr store or checkpoint (zarr, pt or pkl layout; a local
path or an fsspec URL) without a writer.  The view trusts only the index: it lists the
committed trajectories of ``trajectory_index.json`` and nothing else, and
:meth:`BufferView.refresh` re-reads the index to pick up trajectories committed since.

**Episodes** are cut as :mod:`rbzarr.analysis.episodes` describes: an episode that runs from one
trajectory into the next (consecutive ids, same ``B``) is one episode; one still running
where its run ends is *incomplete* (``Episode.done`` is false).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tqdm import tqdm

from rbzarr.analysis.episodes import DONES, Episode, EpisodeTracker, continues, time_steps
from rbzarr.analysis.view_base import ViewBase
from rbzarr.storage.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.trajectory.model import Trajectory

__all__ = ["BufferView", "open_buffer"]


def open_buffer(
    url: str | os.PathLike[str] | Location,
    storage_options: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    sample_window_size: int = 0,
    refresh_interval: float | None = None,
) -> BufferView:
    """Open the store or checkpoint at ``url`` read-only.

    Parameters
    ----------
    url
        A local path or an fsspec URL (``s3://bucket/prefix``) of a zarr, pt or pkl store.
    storage_options
        fsspec options (``endpoint_url``, ``key``, ``anon``, ...).
    seed
        Seed of the view's own sampling generator (:meth:`BufferView.sample`); ``None``
        seeds it nondeterministically.
    sample_window_size
        :meth:`BufferView.sample` draws from the last ``sample_window_size`` committed
        trajectories; 0 or negative means all of them.
    refresh_interval
        Seconds: :meth:`BufferView.sample` first re-reads the index when the view's last
        read is older than this (0: before every sample), so a view of a live store picks
        up new commits.  ``None`` (default): only :meth:`BufferView.refresh` re-reads it.

    Returns
    -------
    BufferView
        The view, with the index as read now.

    Raises
    ------
    CheckpointNotFoundError
        ``metadata.json`` or ``trajectory_index.json`` is missing (not a store).
    CorruptStoreError
        A document is unparsable or the index is malformed.
    """
    layout, documents = open_store(url, storage_options)
    return BufferView(
        layout,
        documents,
        seed=seed,
        sample_window_size=sample_window_size,
        refresh_interval=refresh_interval,
    )


class BufferView(ViewBase):
    """A read-only view of a store's committed trajectories; see :func:`open_buffer`.

    A view pickles as its URL, options, window and generator state; unpickling opens the
    store again (in the new process: S3 clients are never shared across a fork or spawn).

    Parameters
    ----------
    layout
        The store's layout, opened read-only.
    documents
        Its two documents, as just read.
    seed, sample_window_size, refresh_interval
        As for :func:`open_buffer`.

    Raises
    ------
    ValueError
        ``refresh_interval`` is negative.
    CorruptStoreError
        The index is malformed, or of a newer format than this rbzarr knows.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        options = {
            "seed": self._sampler.seed,
            "sample_window_size": self.sample_window_size,
            "refresh_interval": self.refresh_interval,
        }
        return (_reopen, (self.url, self.storage_options, options, self.state_dict()["sampler"]))

    def __repr__(self) -> str:
        return f"BufferView({self.url!r}, format={self.format!r}, trajectories={len(self)})"

    def iter_trajectories(
        self, keys: Sequence[str] | None = None, progress: bool = False
    ) -> Iterator[tuple[int, Trajectory]]:
        """Yield ``(trajectory_id, trajectory)`` in index order, reading one at a time.

        Parameters
        ----------
        keys
            Flat keys to read; ``None`` reads every field.
        progress
            Show a tqdm bar on stderr.

        Yields
        ------
        tuple of (int, Trajectory)
            Each committed id with its raw trajectory.
        """
        for trajectory_id in tqdm(self.ids, desc="trajectories", disable=not progress):
            yield trajectory_id, self.trajectory(trajectory_id, keys)

    def iter_steps(
        self, keys: Sequence[str] | None = None, progress: bool = False
    ) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yield ``(trajectory_id, steps)`` in index order: each field's ``T`` time steps.

        Parameters
        ----------
        keys
            Flat keys to read; ``None`` reads every field.
        progress
            Show a tqdm bar on stderr.

        Yields
        ------
        tuple of (int, dict of str to torch.Tensor)
            Each committed id with its ``[T, ...]`` fields by flat key, the reset rows of
            ``dones``-like fields dropped.
        """
        for trajectory_id, trajectory in self.iter_trajectories(keys, progress):
            T = int(self.entry(trajectory_id)["shape"][0])
            yield trajectory_id, {k: time_steps(v, T) for k, v in trajectory.tensors().items()}

    def run_continues(self, across_trajectories: bool = True) -> list[bool]:
        """Per id of :attr:`ids`: whether the next trajectory continues its run.

        Parameters
        ----------
        across_trajectories
            ``False`` makes every trajectory a run of its own.

        Returns
        -------
        list of bool
            One flag per id, in index order (:func:`rbzarr.analysis.episodes.continues` of it and
            the next id); the last is always false.
        """
        entries = [self._index.entries[i] for i in self._index.id_list]
        return [
            across_trajectories and i + 1 < len(entries) and continues(entry, entries[i + 1])
            for i, entry in enumerate(entries)
        ]

    def iter_steps_and_episodes(
        self,
        keys: Sequence[str] | None = None,
        progress: bool = False,
        across_trajectories: bool = True,
        episode_keys: Sequence[str] | None = None,
    ) -> Iterator[tuple[int, dict[str, torch.Tensor], list[Episode]]]:
        """:meth:`iter_steps`, with the episodes that end in (or are cut by) each trajectory.

        Episodes carry the ``[T, B, ...]`` fields among ``episode_keys`` (default: ``keys``;
        ``dones`` is always read); see :mod:`rbzarr.analysis.episodes` for how they are cut and
        followed across a run.

        Parameters
        ----------
        keys
            Flat keys to read; ``None`` reads every field.
        progress
            Show a tqdm bar on stderr.
        across_trajectories
            Follow episodes into the next trajectory of their run; ``False`` cuts them at
            trajectory boundaries.
        episode_keys
            Flat keys the episodes carry; ``None``: every per-environment field read.

        Yields
        ------
        tuple of (int, dict of str to torch.Tensor, list of Episode)
            Each committed id, its time steps (as :meth:`iter_steps`) and the episodes
            that end in it.

        Raises
        ------
        ValueError
            A trajectory has no ``dones`` field.
        """
        wanted = None if keys is None else list(dict.fromkeys([*keys, DONES]))
        carried = None if episode_keys is None else {*episode_keys, DONES}
        tracker = EpisodeTracker()
        runs = self.run_continues(across_trajectories)
        for (trajectory_id, steps), run_continues in zip(
            self.iter_steps(wanted, progress), runs, strict=True
        ):
            B = int(self.entry(trajectory_id)["shape"][1])
            per_env = {
                k: v
                for k, v in steps.items()
                if v.dim() >= 2 and v.shape[1] == B and (carried is None or k in carried)
            }
            if DONES not in per_env:
                raise ValueError(f"{self.url}: trajectory {trajectory_id} has no 'dones' field")
            yield trajectory_id, steps, tracker.feed(trajectory_id, per_env, run_continues)

    def iter_episodes(
        self, keys: Sequence[str] | None = None, across_trajectories: bool = True
    ) -> Iterator[Episode]:
        """Yield every episode, in the order they end (see :mod:`rbzarr.analysis.episodes`).

        Parameters
        ----------
        keys
            Flat keys to read (``dones`` is always read); ``None`` reads all.
        across_trajectories
            ``False`` cuts episodes at trajectory boundaries.

        Yields
        ------
        Episode
            Complete episodes, and incomplete ones where their run ends.

        Raises
        ------
        ValueError
            A trajectory has no ``dones`` field.
        """
        for _, _, episodes in self.iter_steps_and_episodes(keys, False, across_trajectories):
            yield from episodes

    def dask_arrays(self, key: str) -> dict[int, Any]:
        """Lazy dask arrays over the Zarr array ``key`` of every committed trajectory.

        Each is the raw ``[T(+E), B, ...]`` array (reset rows of ``dones`` included),
        chunked like the store; ``bfloat16`` fields appear as their ``uint16`` bits.
        Needs the zarr layout and the ``analysis`` extra (dask).

        Parameters
        ----------
        key
            A flat key, e.g. ``"rewards"`` or ``"curr_obs/image"``.

        Returns
        -------
        dict of int to dask.array.Array
            One lazy array per committed id, in index order.

        Raises
        ------
        ValueError
            The store is not in the zarr layout.
        """
        groups = {i: self.zarr_group(i) for i in self.ids}  # a clear error if not zarr
        import dask.array as da  # noqa: PLC0415 (optional dependency)

        return {i: da.from_zarr(group[key]) for i, group in groups.items()}

    def zarr_group(self, trajectory_id: int) -> Any:
        """The read-only Zarr group of one trajectory (zarr layout only).

        Parameters
        ----------
        trajectory_id
            A committed id.

        Returns
        -------
        zarr.Group
            The trajectory's group, one array per field.

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        ValueError
            The store is not in the zarr layout.
        """
        return self.layout.zarr_group(self.entry(trajectory_id))

    def xarray_dataset(self, trajectory_id: int) -> Any:
        """One trajectory as a lazy ``xarray.Dataset``, one variable per flat key.

        Dimensions are the arrays' ``dimension_names`` (``time``, ``env``, then per-key
        names; reset-row fields use ``time_with_resets``).  Needs a trajectory written by
        zarr layout 2 and the ``analysis`` extra (xarray, dask).

        Parameters
        ----------
        trajectory_id
            A committed id.

        Returns
        -------
        xarray.Dataset
            Lazy variables named by flat key, in the trajectory's field order.

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        ValueError
            The store is not in the zarr layout, or the trajectory was written by layout 1
            (its arrays carry no dimension names).
        """
        import xarray  # noqa: PLC0415 (optional dependency)

        entry = self.entry(trajectory_id)
        self.layout.zarr_group(entry)  # a clear error if the store is not zarr
        fields = self.layout.field_names(entry)
        root = self.layout.trajectory_path(entry)
        store = self.layout.location.zarr_store(read_only=True)
        parts = []
        for group in sorted({key.rpartition("/")[0] for key in fields}):
            path = "/".join(part for part in (*root, group) if part)
            try:
                data = xarray.open_zarr(store, group=path, consolidated=False)
            except KeyError as exc:  # layout-1 arrays carry no dimension names
                raise ValueError(
                    f"{self.url}: trajectory {trajectory_id} has no dimension names (layout 1); "
                    "convert it with `rbzarr export SRC DST --format zarr`"
                ) from exc
            parts.append(
                data.rename({name: f"{group}/{name}" if group else name for name in data.data_vars})
            )
        return xarray.merge(parts, combine_attrs="drop")[fields]


def _reopen(
    url: str, storage_options: dict[str, Any], options: dict[str, Any], sampler: dict[str, Any]
) -> BufferView:
    """Unpickle a :class:`BufferView`: open the store again, restore the generator."""
    view = open_buffer(url, storage_options, **options)
    view.load_state_dict({"sampler": sampler})
    return view
