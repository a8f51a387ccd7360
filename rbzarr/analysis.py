"""Offline analysis: a read-only view of a store, its trajectories, episodes and statistics.

:func:`open_buffer` opens any rbzarr store or checkpoint (zarr, pt or pkl layout; a local
path or an fsspec URL) without a writer.  The view trusts only the index: it lists the
committed trajectories of ``trajectory_index.json`` and nothing else, and :meth:`BufferView.
refresh` re-reads the index to pick up trajectories committed since.

**Episodes** are cut as :mod:`rbzarr.episodes` describes.  Episodes do not continue across
trajectories: the steps after the last done of a trajectory form an *incomplete* episode
(``Episode.done`` is false), which statistics leave out.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tqdm import tqdm

from rbzarr import tree
from rbzarr.checkpoint import schema_from_json
from rbzarr.episodes import (
    DONES,
    REWARDS,
    Episode,
    complete_episodes,
    episode_segments,
    time_steps,
)
from rbzarr.index import TrajectoryIndex
from rbzarr.sampler import WindowSampler
from rbzarr.storage.layout import Documents, TrajectoryLayout
from rbzarr.storage.location import Location
from rbzarr.storage.registry import open_store
from rbzarr.storage.row_reads import plan_misses, read_batch
from rbzarr.trajectory import Schema, Trajectory, validate

__all__ = ["BufferView", "RunningStats", "compute_stats", "open_buffer"]


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


class BufferView:
    """A read-only view of a store's committed trajectories; see :func:`open_buffer`.

    A view pickles as its URL, options, window and generator state; unpickling opens the
    store again (in the new process: S3 clients are never shared across a fork or spawn).
    """

    def __init__(
        self,
        layout: TrajectoryLayout,
        documents: Documents,
        *,
        seed: int | None = None,
        sample_window_size: int = 0,
        refresh_interval: float | None = None,
    ) -> None:
        if refresh_interval is not None and not refresh_interval >= 0:
            raise ValueError(f"refresh_interval must be >= 0 seconds, got {refresh_interval}")
        self.layout = layout
        self.sample_window_size = sample_window_size
        self.refresh_interval = refresh_interval
        self._sampler = WindowSampler(seed)
        self._schema: Schema | None = None
        self._set_documents(documents)

    def _set_documents(self, documents: Documents) -> None:
        self._documents = documents
        self._index = TrajectoryIndex.from_documents(documents, self.url)
        self._read_at = time.monotonic()

    def __reduce__(self) -> tuple[Any, ...]:
        options = {
            "seed": self._sampler.seed,
            "sample_window_size": self.sample_window_size,
            "refresh_interval": self.refresh_interval,
        }
        return (_reopen, (self.url, self.storage_options, options, self._sampler.state_dict()))

    def __repr__(self) -> str:
        return f"BufferView({self.url!r}, format={self.format!r}, trajectories={len(self)})"

    def __len__(self) -> int:
        return len(self._index)

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
        self._set_documents(self.layout.read_documents())

    def sample(
        self, num_chunks: int, *, generator: torch.Generator | None = None
    ) -> dict[str, Any]:
        """Sample ``num_chunks`` committed rows, as ``TrajectoryReplayBuffer.sample`` does.

        The draw is the buffer's (uniform over the window's rows, the same output keys,
        order and dtypes); every row is read from storage.  ``generator`` replaces the
        view's own generator for this call.  With a ``refresh_interval`` the index is
        re-read first when it is older than that.

        Raises
        ------
        ValueError
            ``num_chunks`` is not positive.
        RuntimeError
            The index lists no trajectory.
        """
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        interval = self.refresh_interval
        if interval is not None and time.monotonic() - self._read_at >= interval:
            self.refresh()
        window = self._index.window(self.sample_window_size)
        if not window:
            raise RuntimeError(f"{self.url}: no committed trajectory to sample from")
        counts = self._index.sample_counts(window)
        positions, rows = self._sampler.draw(num_chunks, counts, generator)
        ids = torch.tensor(window, dtype=torch.int64)[positions]
        nothing_cached = torch.zeros(len(ids), dtype=torch.bool)
        plan = plan_misses(ids, rows, nothing_cached, {}, self.schema(), self._index.entries, {})
        return tree.unflatten(read_batch(plan, self.layout))

    def schema(self) -> Schema:
        """Sampled keys (in batch order) with their dtype names and trailing shapes.

        From ``metadata.json`` when rbzarr wrote the store, else from its first trajectory.
        """
        if self._schema is None:
            schema = schema_from_json(self._documents.metadata.get("schema"))
            if schema is None and self._index.id_list:
                schema = validate(self.trajectory(self._index.id_list[0])).schema
            if schema is None:
                return {}
            self._schema = schema
        return dict(self._schema)

    def entry(self, trajectory_id: int) -> dict[str, Any]:
        """The index entry of ``trajectory_id``; ``KeyError`` if the index does not list it."""
        if trajectory_id not in self._index.entries or trajectory_id not in self._index.id_list:
            raise KeyError(f"{self.url}: trajectory {trajectory_id} is not in the index")
        return self._index.entries[trajectory_id]

    def keys(self) -> list[str]:
        """Flat field keys (``"rewards"``, ``"curr_obs/image"``) of the first trajectory."""
        if not self._index.id_list:
            return []
        return self.layout.field_names(self.entry(self._index.id_list[0]))

    def trajectory(self, trajectory_id: int, keys: Sequence[str] | None = None) -> Trajectory:
        """Read one committed trajectory (raw rows), optionally only the flat ``keys``."""
        return self.layout.read(self.entry(trajectory_id), keys)

    def iter_trajectories(
        self, keys: Sequence[str] | None = None, progress: bool = False
    ) -> Iterator[tuple[int, Trajectory]]:
        """Yield ``(trajectory_id, trajectory)`` in index order, reading one at a time.

        ``progress`` shows a tqdm bar on stderr.
        """
        for trajectory_id in tqdm(self.ids, desc="trajectories", disable=not progress):
            yield trajectory_id, self.trajectory(trajectory_id, keys)

    def iter_episodes(self, keys: Sequence[str] | None = None) -> Iterator[Episode]:
        """Yield every episode (see the module docs), trajectory by trajectory, env by env.

        ``keys`` limits the fields read (``dones`` is always read); ``None`` reads all.
        """
        wanted = None if keys is None else list(dict.fromkeys([*keys, DONES]))
        for trajectory_id, trajectory in self.iter_trajectories(wanted):
            T, B = self.entry(trajectory_id)["shape"][:2]
            steps = {
                key: time_steps(value, T)
                for key, value in trajectory.tensors().items()
                if value.dim() >= 2 and value.shape[1] == B
            }
            if DONES not in steps:
                raise ValueError(f"{self.url}: trajectory {trajectory_id} has no 'dones' field")
            for env, start, length, done in episode_segments(steps[DONES]):
                fields = {key: value[start : start + length, env] for key, value in steps.items()}
                yield Episode(trajectory_id, env, start, length, done, fields)

    def dask_arrays(self, key: str) -> dict[int, Any]:
        """Lazy dask arrays over the Zarr array ``key`` of every committed trajectory.

        Each is the raw ``[T(+E), B, ...]`` array (reset rows of ``dones`` included),
        chunked like the store; ``bfloat16`` fields appear as their ``uint16`` bits.
        Needs the zarr layout and the ``analysis`` extra (dask).
        """
        groups = {i: self.zarr_group(i) for i in self.ids}  # a clear error if not zarr
        import dask.array as da  # noqa: PLC0415 (optional dependency)

        return {i: da.from_zarr(group[key]) for i, group in groups.items()}

    def zarr_group(self, trajectory_id: int) -> Any:
        """The read-only Zarr group of one trajectory (zarr layout only; else ValueError)."""
        return self.layout.zarr_group(self.entry(trajectory_id))


def _reopen(
    url: str, storage_options: dict[str, Any], options: dict[str, Any], sampler: dict[str, Any]
) -> BufferView:
    """Unpickle a :class:`BufferView`: open the store again, restore the generator."""
    view = open_buffer(url, storage_options, **options)
    view._sampler.load_state_dict(sampler)
    return view


class RunningStats:
    """Count, mean, population std, min and max of a stream of tensors (float64).

    Batches merge with Chan et al.'s parallel update, so the result does not depend on how
    the values are split.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def update(self, values: torch.Tensor) -> None:
        """Add every element of ``values``."""
        x = values.detach().reshape(-1).to(torch.float64)
        n = int(x.numel())
        if n == 0:
            return
        mean = float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self._m2 += m2 + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))

    @property
    def std(self) -> float:
        """Population standard deviation (``ddof=0``)."""
        return math.sqrt(self._m2 / self.count) if self.count else math.nan

    def to_dict(self) -> dict[str, Any]:
        """``{"count", "mean", "std", "min", "max"}``; the last four are ``None`` if empty."""
        if not self.count:
            return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
        return {
            "count": self.count,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }


def compute_stats(
    view: BufferView, keys: Sequence[str] | None = None, progress: bool = False
) -> dict[str, Any]:
    """Per-key statistics and episode returns / lengths, streaming trajectory by trajectory.

    Statistics run over every element of a key's time steps (reset rows excluded); complex
    fields are not supported.  Episodes (module docs) need ``dones``; returns need
    ``rewards``; incomplete episodes are counted but not in the statistics.

    Returns
    -------
    dict
        ``{"trajectories", "total_samples", "keys": {key: RunningStats.to_dict()},
        "episodes": {"complete", "incomplete", "length", "return"} or None}``.
    """
    available = view.keys()
    wanted = available if keys is None else list(keys)
    unknown = [key for key in wanted if key not in available]
    if unknown:
        raise ValueError(f"{view.url}: unknown keys {unknown}; the store has {available}")
    extra = [key for key in (REWARDS, DONES) if key in available and key not in wanted]
    per_key = {key: RunningStats() for key in wanted}
    lengths, returns = RunningStats(), RunningStats()
    incomplete = 0
    for trajectory_id, trajectory in view.iter_trajectories([*wanted, *extra], progress):
        T = int(view.entry(trajectory_id)["shape"][0])
        steps = {key: time_steps(value, T) for key, value in trajectory.tensors().items()}
        for key in wanted:
            per_key[key].update(steps[key])
        if DONES not in steps:
            continue
        for length, episode_return in complete_episodes(steps):
            lengths.update(torch.tensor([length]))
            if episode_return is not None:
                returns.update(torch.tensor([episode_return]))
        incomplete += sum(not done for *_, done in episode_segments(steps[DONES]))
    episodes = None
    if DONES in available:
        episodes = {
            "complete": lengths.count,
            "incomplete": incomplete,
            "length": lengths.to_dict(),
            "return": returns.to_dict() if REWARDS in available else None,
        }
    return {
        "trajectories": len(view),
        "total_samples": view.total_samples,
        "keys": {key: stats.to_dict() for key, stats in per_key.items()},
        "episodes": episodes,
    }
