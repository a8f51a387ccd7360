"""The read-only view of a store: :func:`open_buffer` and :class:`BufferView`.

The view trusts only the index (``trajectory_index.json``); episodes are cut as
:mod:`rbzarr.analysis.episodes` describes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Container, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from rbzarr.analysis.episodes import Episode, EpisodeTracker
from rbzarr.analysis.steps import episode_fields, read_steps
from rbzarr.buffer.local_cache_settings import LocalCacheSettings
from rbzarr.sampling.front import SamplingFront
from rbzarr.sampling.priorities import PrioritizedReplay
from rbzarr.sampling.reader import StoreReader
from rbzarr.shared_doc import shared_doc
from rbzarr.storage.index.priorities import PriorityChanges, PriorityFiles
from rbzarr.storage.index.schema import check_schema, schema_from_json
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import known_formats, layout_class, open_store
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.trajectory.model import Schema, Trajectory, validate
from rbzarr.trajectory.steps import DONES, continuing_runs

if TYPE_CHECKING:
    from rbzarr.storage.zarr.layout import ZarrLayout

__all__ = ["BufferView", "open_buffer"]

# Parameter texts several of the view's calls share (see :func:`~rbzarr.shared_doc.shared_doc`).
_ID_PARAMETER = """
trajectory_id
    A committed id.
"""
_READ_PARAMETERS = """
keys
    Flat keys to read; ``None`` reads every field.
progress
    Show a tqdm bar on stderr.
"""


def open_buffer(
    url: str | os.PathLike[str] | Location,
    storage_options: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    sample_window_size: int = 0,
    refresh_interval: float | None = None,
    local_cache_dir: str | os.PathLike[str] | None = None,
    local_cache_bytes: int | None = None,
    on_damaged: str = "raise",
    trajectories: Container[int] | None = None,
    follow_links: bool = False,
    prioritized: PrioritizedReplay | None = None,
    layout_options: Mapping[str, Mapping[str, Any]] | None = None,
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
    local_cache_dir, local_cache_bytes
        For a zarr store on an object store: keep whole shards in this local directory, up
        to ``local_cache_bytes`` (default 16 GiB), and read them from there (as for
        :class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer`).  Ignored for other stores.
    on_damaged
        ``"raise"`` or ``"skip"``: what :meth:`BufferView.sample` and
        :meth:`BufferView.sample_sequences` do with a damaged trajectory, as for the buffer
        (``"skip"`` drops it from the view's index, also after a refresh).
    trajectories
        The ids the view keeps of those the store lists (a buffer's own, for its DataLoader
        workers); ``None`` (default): all of them.
    follow_links
        Read a local store through symbolic links inside it: only for a trusted store whose
        folders were linked on purpose.  Without it a path through such a link raises
        :class:`~rbzarr.errors.UnsafePathError` (the store's root itself may be a link).
    prioritized
        Draw by the priorities stored with the window's trajectories (as the writing
        buffer's last ``flush()`` left them; re-read at each refresh): see
        docs/priorities.md.  ``None``: uniformly.
    layout_options
        Keyword arguments of the store's layout by format name (those of the stored format
        apply), e.g. ``{"zarr": {"range_gap": 0}}`` to read only the asked rows' bytes from
        an object store.  Not kept when the view is pickled.

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
    ValueError
        ``local_cache_bytes`` is not positive, or is given without ``local_cache_dir``, or
        ``on_damaged`` is not ``"raise"`` or ``"skip"``.
    """
    cache = LocalCacheSettings.of(local_cache_dir, local_cache_bytes)
    extra = layout_options or {}
    options = {
        name: {**cache.layout_options(layout_class(name)), **extra.get(name, {})}
        for name in known_formats()
    }
    location = Location.from_url(url, storage_options, follow_links=follow_links)
    layout, documents = open_store(location, storage_options, options, window=sample_window_size)
    return BufferView(
        layout,
        documents,
        seed=seed,
        sample_window_size=sample_window_size,
        refresh_interval=refresh_interval,
        on_damaged=on_damaged,
        trajectories=trajectories,
        prioritized=prioritized,
    )


class BufferView(SamplingFront):
    """A read-only view of a store's committed trajectories; build it with :func:`open_buffer`.

    A view pickles as its URL, options, window and generator state; unpickling opens the
    store again (in the new process: S3 clients are never shared across a fork or spawn).

    Parameters
    ----------
    layout
        The store's layout, opened read-only.
    documents
        Its ``metadata.json`` and ``trajectory_index.json``, as just read.
    seed, sample_window_size, refresh_interval, on_damaged, trajectories, prioritized
        As for :func:`open_buffer`.

    Raises
    ------
    ValueError
        ``refresh_interval`` is negative (or NaN), or ``on_damaged`` is unknown.
    CorruptStoreError
        The index is malformed, or of a newer format than this rbzarr knows.
    """

    def __init__(
        self,
        layout: TrajectoryLayout,
        documents: Documents,
        *,
        seed: int | None = None,
        sample_window_size: int = 0,
        refresh_interval: float | None = None,
        on_damaged: str = "raise",
        trajectories: Container[int] | None = None,
        prioritized: PrioritizedReplay | None = None,
    ) -> None:
        url = layout.location.url
        self._reader = StoreReader(
            TrajectoryIndex(),
            layout,
            seed=seed,
            window_size=sample_window_size,
            on_damaged=on_damaged,
            where=url,
            empty=f"{url}: no committed trajectory to sample from",
            prioritized=prioritized,
        )
        self._kept = trajectories
        if refresh_interval is not None and not refresh_interval >= 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.layout = layout
        self.refresh_interval = refresh_interval
        self._schema: Schema | None = None
        self._priority_changes = PriorityChanges(layout.location)
        self._priorities_read: set[int] = set()  # the window of the last read
        self._set_documents(documents)

    def _set_documents(self, documents: Documents) -> None:
        self._documents = documents
        index = TrajectoryIndex.from_documents(documents, self.url)
        kept = self._kept
        if kept is not None:
            index = index.subset(i for i in index.id_list if i in kept)
        self._index = self._reader.index = index
        # on_damaged="skip": the damaged ones stay dropped
        self._index.remove(self._reader.damaged.dropped)
        self._read_priorities()
        self._read_at = time.monotonic()

    def _read_priorities(self) -> None:
        """With ``prioritized``: the stored priorities of the window's trajectories that
        changed since the last read (by the store's change record) or entered the window."""
        priorities = self._reader.priorities
        if priorities is None:
            return
        window = self._index.window(self.sample_window_size)
        changes = self._priority_changes
        changed = changes.changed()
        if changed is None:
            wanted = window
        else:
            wanted = [i for i in window if i in changed or i not in self._priorities_read]
        stored = PriorityFiles(self.layout.location).read_all(
            self._index.entries[i] for i in wanted
        )  # a failed read changes nothing: the next refresh reads them again
        if changed is None:
            priorities.clear()
        priorities.offer(stored)
        self._reader.sync_priorities()
        changes.read()
        self._priorities_read = set(window)

    def state_dict(self) -> dict[str, Any]:
        """The view's sampling state: ``{"sampler": ...}`` (seed and generator state).

        Returns
        -------
        dict of str to Any
            ``{"sampler": WindowSampler.state_dict(), "sequences": ...}``, JSON-ready.
        """
        reader = self._reader
        return {"sampler": reader.rows.state_dict(), "sequences": reader.sequences.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`: the next draws continue that stream.

        Parameters
        ----------
        state
            A dict from :meth:`state_dict` (of this view or another one).
        """
        self._reader.rows.load_state_dict(state["sampler"])
        self._reader.sequences.load_state_dict(state.get("sequences"), self._reader.rows.seed)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def on_damaged(self) -> str:
        """What sampling does with a damaged trajectory: ``"raise"`` or ``"skip"``."""
        return self._reader.damaged.policy

    @property
    def damaged_trajectories(self) -> list[int]:
        """The ids ``on_damaged="skip"`` dropped from the view's index, sorted."""
        return sorted(self._reader.damaged.dropped)

    @property
    def url(self) -> str:
        """The store's location."""
        return self.layout.location.url

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options the store was opened with (a copy)."""
        return dict(self.layout.location.storage_options)

    @property
    def format(self) -> str:
        """The store's layout: ``"zarr"``, ``"pt"`` or ``"pkl"``."""
        return self.layout.format

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of ``metadata.json``."""
        return dict(self._documents.metadata)

    @property
    def ids(self) -> list[int]:
        """Committed trajectory ids, in the index's (insertion) order."""
        return list(self._index.id_list)

    @property
    def entries(self) -> dict[int, dict[str, Any]]:
        """Index entries by id (copies)."""
        return {i: dict(self._index.entries[i]) for i in self._index.id_list}

    @property
    def total_samples(self) -> int:
        """``T * B`` summed over the committed trajectories."""
        return self._index.total_samples

    def refresh(self) -> None:
        """Re-read the index, picking up trajectories committed since the view was opened."""
        store = StoreIndex.assumed(self.layout.location)
        self._set_documents(store.read(self.sample_window_size))

    @property
    def prioritized(self) -> PrioritizedReplay | None:
        """The prioritized replay settings (``None``: uniform draws)."""
        priorities = self._reader.priorities
        return None if priorities is None else priorities.settings

    def _sampling_reader(self) -> StoreReader:
        """The reader :meth:`sample` and :meth:`sample_sequences` draw from, refreshed."""
        return self._ready()

    def _ready(self) -> StoreReader:
        """The reader, after a refresh when the index is older than the interval."""
        interval = self.refresh_interval
        if interval is not None and time.monotonic() - self._read_at >= interval:
            self.refresh()
        self._reader.schema = self.schema()
        return self._reader

    def schema(self) -> Schema:
        """Sampled keys (in batch order) with their dtype names and trailing shapes.

        From ``metadata.json`` when rbzarr wrote the store, else from its first trajectory.

        Returns
        -------
        Schema
            Flat key to ``(dtype name, trailing shape)``; empty for an empty store without
            a recorded schema.
        """
        if self._schema is None:
            schema = schema_from_json(self._documents.metadata.get("schema"))
            if schema is not None and self._index.id_list:
                last = self._index.id_list[-1]
                check_schema(schema, self.layout, self._index.entries[last])
            if schema is None and self._index.id_list:
                schema = validate(self.trajectory(self._index.id_list[0])).schema
            if schema is None:
                return {}
            self._schema = schema
        return dict(self._schema)

    @shared_doc(trajectory_id=_ID_PARAMETER)
    def entry(self, trajectory_id: int) -> dict[str, Any]:
        """The index entry of ``trajectory_id``.

        Parameters
        ----------
        {trajectory_id}

        Returns
        -------
        dict of str to Any
            RLinf's entry keys (``num_samples``, ``shape``, ...) and rbzarr's ``uuid`` (a
            copy).

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        """
        if trajectory_id not in self._index.entries or trajectory_id not in self._index.id_list:
            raise KeyError(f"{self.url}: trajectory {trajectory_id} is not in the index")
        return self._index.entries[trajectory_id].to_json()

    def keys(self) -> list[str]:
        """Flat field keys (``"rewards"``, ``"curr_obs/image"``) of the first trajectory.

        Returns
        -------
        list of str
            In the trajectory's field order; empty when the index lists nothing.
        """
        if not self._index.id_list:
            return []
        return list(self.layout.fields(self.entry(self._index.id_list[0])))

    @shared_doc(trajectory_id=_ID_PARAMETER)
    def trajectory(self, trajectory_id: int, keys: Sequence[str] | None = None) -> Trajectory:
        """Read one committed trajectory (raw rows), optionally only the flat ``keys``.

        Parameters
        ----------
        {trajectory_id}
        keys
            Flat keys to read; ``None`` reads every field.

        Returns
        -------
        Trajectory
            The raw ``[T(+E), B, ...]`` rows, reset rows included.

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        """
        return self.layout.read(self.entry(trajectory_id), keys)

    def __reduce__(self) -> tuple[Any, ...]:
        options = {
            "seed": self._reader.rows.seed,
            "sample_window_size": self.sample_window_size,
            "refresh_interval": self.refresh_interval,
            "on_damaged": self.on_damaged,
            "trajectories": self._kept,
            "prioritized": self.prioritized,
        }
        return (_reopen, (self.url, self.storage_options, options, self.state_dict()["sampler"]))

    def __repr__(self) -> str:
        return f"BufferView({self.url!r}, format={self.format!r}, trajectories={len(self)})"

    @shared_doc(read_parameters=_READ_PARAMETERS)
    def iter_trajectories(
        self, keys: Sequence[str] | None = None, progress: bool = False
    ) -> Iterator[tuple[int, Trajectory]]:
        """Yield ``(trajectory_id, trajectory)`` in index order, reading one at a time.

        Parameters
        ----------
        {read_parameters}

        Yields
        ------
        tuple of (int, Trajectory)
            Each committed id with its raw trajectory.
        """
        for trajectory_id in tqdm(self.ids, desc="trajectories", disable=not progress):
            yield trajectory_id, self.trajectory(trajectory_id, keys)

    @shared_doc(read_parameters=_READ_PARAMETERS)
    def iter_steps(
        self, keys: Sequence[str] | None = None, progress: bool = False
    ) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yield ``(trajectory_id, steps)`` in index order: each field's ``T`` time steps.

        Parameters
        ----------
        {read_parameters}

        Yields
        ------
        tuple of (int, dict of str to torch.Tensor)
            Each committed id with its ``[T, ...]`` fields by flat key, the reset rows of
            ``dones``-like fields dropped.
        """
        for trajectory_id in tqdm(self.ids, desc="trajectories", disable=not progress):
            yield trajectory_id, read_steps(self.layout, self.entry(trajectory_id), keys)

    def run_continues(self, across_trajectories: bool = True) -> list[bool]:
        """Per id of :attr:`ids`: whether the next trajectory continues its run.

        Parameters
        ----------
        across_trajectories
            ``False`` makes every trajectory a run of its own.

        Returns
        -------
        list of bool
            One flag per id, in index order (:func:`rbzarr.trajectory.steps.continues` of it and
            the next id); the last is always false.
        """
        entries = [self._index.entries[i] for i in self._index.id_list]
        return continuing_runs(entries, across_trajectories)

    @shared_doc(read_parameters=_READ_PARAMETERS)
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
        {read_parameters}
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
            per_env = episode_fields(steps, self.entry(trajectory_id), carried, self.url)
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
        layout = self._zarr_layout()  # a clear error if not zarr
        groups = {i: layout.data_group(self.entry(i)) for i in self.ids}
        import dask.array as da  # noqa: PLC0415 (optional dependency)

        found = {}
        for i, (group, place) in groups.items():
            array = da.from_zarr(group[key])
            if place is not None:  # a pack member: its slice of the pack's rows
                rows = array.shape[0] // place.members
                array = array[place.member * rows : (place.member + 1) * rows]
            found[i] = array
        return found

    @shared_doc(trajectory_id=_ID_PARAMETER)
    def zarr_group(self, trajectory_id: int) -> Any:
        """The read-only Zarr group of one trajectory (zarr layout only).

        Parameters
        ----------
        {trajectory_id}

        Returns
        -------
        zarr.Group
            The trajectory's group, one array per field; a small trajectory written in a
            pack (:mod:`rbzarr.storage.zarr.packs`) has its entry in its group's attributes
            and its rows in its pack's arrays (:meth:`dask_arrays` and
            :meth:`xarray_dataset` read them).

        Raises
        ------
        KeyError
            The index does not list ``trajectory_id``.
        ValueError
            The store is not in the zarr layout.
        """
        return self._zarr_layout().zarr_group(self.entry(trajectory_id))

    def _zarr_layout(self) -> ZarrLayout:
        """This view's layout, which must be zarr's.

        Raises
        ------
        ValueError
            The store is not in the zarr layout.
        """
        from rbzarr.storage.zarr.layout import ZarrLayout  # noqa: PLC0415 (zarr, when asked)

        if not isinstance(self.layout, ZarrLayout):
            raise ValueError(
                f"{self.layout.location.url}: Zarr groups, dask arrays and xarray datasets "
                f"need the zarr layout, this store is {self.layout.format!r}; convert it with "
                "`rbzarr export SRC DST --format zarr`"
            )
        return self.layout

    @shared_doc(trajectory_id=_ID_PARAMETER)
    def xarray_dataset(self, trajectory_id: int) -> Any:
        """One trajectory as a lazy ``xarray.Dataset``, one variable per flat key.

        Dimensions are the arrays' ``dimension_names`` (``time``, ``env``, then per-key
        names; reset-row fields use ``time_with_resets``).  Needs a trajectory written by
        zarr layout 2 and the ``analysis`` extra (xarray, dask).

        Parameters
        ----------
        {trajectory_id}

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
        # a clear error if the store is not zarr; a group written before consolidating its
        # arrays' documents has a document per subgroup and array
        trajectory_group, place = self._zarr_layout().data_group(entry)
        consolidated = trajectory_group.metadata.consolidated_metadata is not None
        fields = list(self.layout.fields(entry))
        folder = self.layout.location.child(*trajectory_group.path.split("/"))
        store = folder.zarr_store(read_only=True)
        parts = []
        for group in sorted({key.rpartition("/")[0] for key in fields}):
            try:
                data = xarray.open_zarr(store, group=group or None, consolidated=consolidated)
            except KeyError as exc:  # layout-1 arrays carry no dimension names
                raise ValueError(
                    f"{self.url}: trajectory {trajectory_id} has no dimension names (layout 1); "
                    "convert it with `rbzarr export SRC DST --format zarr`"
                ) from exc
            parts.append(
                data.rename({name: f"{group}/{name}" if group else name for name in data.data_vars})
            )
        dataset = xarray.merge(parts, combine_attrs="drop")[fields]
        if place is None:
            return dataset
        # A pack member: its slice of every first dimension (time, time_with_resets).
        first = {dataset[key].dims[0] for key in fields if dataset[key].dims}
        share = {dim: dataset.sizes[dim] // place.members for dim in first}
        return dataset.isel(
            {dim: slice(place.member * n, (place.member + 1) * n) for dim, n in share.items()}
        )


def _reopen(
    url: str, storage_options: dict[str, Any], options: dict[str, Any], sampler: dict[str, Any]
) -> BufferView:
    """Unpickle a :class:`BufferView`: open the store again, restore the generator."""
    view = open_buffer(url, storage_options, **options)
    view.load_state_dict({"sampler": sampler})
    return view
