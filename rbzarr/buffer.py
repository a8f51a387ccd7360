"""TrajectoryReplayBuffer: RLinf's trajectory buffer, rebuilt on Zarr.

The buffer is a coordinator.  It validates, takes its lock and delegates: ids and counters
to :class:`~rbzarr.index.TrajectoryIndex`, draws to :class:`~rbzarr.sampler.WindowSampler`,
hot rows to :class:`~rbzarr.cache.TrajectoryCache`, persistence to a
:class:`~rbzarr.storage.layout.TrajectoryLayout` through the
:class:`~rbzarr.writer.BackgroundWriter`, and checkpoints to :mod:`rbzarr.checkpoint`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from rbzarr import checkpoint, tree
from rbzarr.cache import TrajectoryCache
from rbzarr.compat import RLinfCompatMixin
from rbzarr.errors import BufferClosedError, StoreExistsError
from rbzarr.index import TrajectoryIndex
from rbzarr.sampler import WindowSampler
from rbzarr.storage import row_reads
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.trajectory import (
    Schema,
    Trajectory,
    TrajectorySpec,
    as_trajectory,
    split_trajectory,
    trajectory_from_raw,
    validate,
)
from rbzarr.writer import BackgroundWriter

__all__ = ["TrajectoryReplayBuffer"]


class TrajectoryReplayBuffer(RLinfCompatMixin):
    """A trajectory-level replay buffer with window sampling, a FIFO cache and async writes.

    Parameters
    ----------
    seed
        Seed of the sampling generator; ``None`` draws nondeterministically.
    enable_cache, cache_size
        Keep the last ``cache_size`` trajectories in memory.  Without ``auto_save`` the
        cache *is* the storage: it is always on and holds ``sample_window_size``
        trajectories (all of them when that is 0).
    sample_window_size
        Sample from the most recent trajectories only; 0 or negative means all.
    auto_save, auto_save_path
        Persist every trajectory asynchronously under ``auto_save_path`` (a local path or
        an fsspec URL such as ``s3://bucket/prefix``).  An existing store there is never
        overwritten: call :meth:`load_checkpoint` on it first to append to it.
    trajectory_format
        ``"zarr"`` (default), ``"pt"`` or ``"pkl"``.
    storage_options
        Passed to fsspec for every URL (``endpoint_url``, ``key``, ``anon``, ...).
    max_pending_writes
        Bound of the write queue; ``add_trajectories`` blocks while it is full.
    layout_options
        Extra keyword arguments for the storage layout (codecs, chunk sizes, ...).
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        sample_window_size: int = 100,
        auto_save: bool = False,
        auto_save_path: str | os.PathLike[str] = "",
        trajectory_format: str = "zarr",
        *,
        storage_options: Mapping[str, Any] | None = None,
        max_pending_writes: int = 8,
        layout_options: Mapping[str, Any] | None = None,
    ) -> None:
        layout_class(trajectory_format)  # unknown formats fail here, before anything else
        if auto_save and not os.fspath(auto_save_path):
            raise ValueError("auto_save=True requires auto_save_path (a local path or URL)")
        self.seed = seed
        self.trajectory_format = trajectory_format
        self.sample_window_size = sample_window_size
        self.auto_save = auto_save
        self.storage_options = dict(storage_options or {})
        self.layout_options = dict(layout_options or {})
        if not auto_save:
            # The cache is the storage: it must hold the whole sampling window.
            enable_cache = True
            cache_size = sample_window_size
        self.enable_cache = enable_cache
        self.cache_size = cache_size if enable_cache else 0
        self._cache_enabled = not auto_save or self.cache_size > 0
        self._cache = TrajectoryCache(self.cache_size if self.cache_size > 0 else None)
        self._index = TrajectoryIndex()
        self._sampler = WindowSampler(seed)
        self._schema: Schema | None = None
        self._pending: dict[int, Trajectory] = {}
        self._lock = threading.RLock()
        self._add_lock = threading.Lock()
        self._closed = False
        self._store: TrajectoryLayout | None = None
        self._persisted = TrajectoryIndex()
        self._store_claimed = False
        self._writer = BackgroundWriter(max_pending=max_pending_writes)
        if auto_save:
            self._store = self._open_layout(auto_save_path)

    # -- plumbing -----------------------------------------------------------------------
    def _open_layout(
        self, url: str | os.PathLike[str], trajectory_format: str | None = None
    ) -> TrajectoryLayout:
        """A layout at ``url``; this buffer's layout options apply to its own format only."""
        fmt = trajectory_format or self.trajectory_format
        options = self.layout_options if fmt == self.trajectory_format else {}
        return layout_class(fmt)(Location.from_url(url, self.storage_options), **options)

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError("the buffer is closed")

    def _metadata_extra(self) -> dict[str, Any]:
        return {"seed": self.seed, "schema": checkpoint.schema_to_json(self._schema)}

    # -- RLinf API ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    @property
    def size(self) -> int:
        """Number of trajectories in the index."""
        return len(self._index)

    @property
    def total_samples(self) -> int:
        """Number of samples (``T * B`` summed) in the index."""
        with self._lock:
            return self._index.total_samples

    @property
    def trajectory_counter(self) -> int:
        """The id the next trajectory will get."""
        return self._index.trajectory_counter

    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> None:
        """Add trajectories in order; all are validated before any state changes.

        The caller may reuse or mutate the tensors as soon as this returns.
        """
        self._check_open()
        trajectories = list(trajectories)
        # Adders queue their writes in id order; the writer may need ``_lock`` to commit,
        # so a full queue must never block while ``_lock`` is held.
        with self._add_lock:
            with self._lock:
                self._writer.check()
                specs = self._validate_all(trajectories)
                if self._store is not None and specs:
                    self._claim_store()
                tasks = [self._add_one(t, s) for t, s in zip(trajectories, specs, strict=True)]
            for task in tasks:
                if task is not None:
                    self._writer.submit(task)

    def _validate_all(self, trajectories: list[Trajectory]) -> list[TrajectorySpec]:
        schema = self._schema
        specs: list[TrajectorySpec] = []
        for position, given in enumerate(trajectories):
            try:
                # RLinf's own Trajectory (or any object with its fields) is read by field name.
                trajectory = trajectories[position] = as_trajectory(given)
                spec = validate(trajectory, schema)
                if self._store is not None:
                    # pt/pkl put model_weights_id in a file name: refuse it now, not in the writer.
                    self._store.trajectory_path(
                        {"trajectory_id": 0, "model_weights_id": trajectory.model_weights_id}
                    )
            except ValueError as exc:
                raise type(exc)(f"trajectory {position} of this call: {exc}") from exc
            schema = spec.schema
            specs.append(spec)
        return specs

    def _claim_store(self) -> None:
        """Refuse a store holding committed data this buffer has not loaded; else claim it.

        A claimed store is committed empty at once, so a crash during the first write
        leaves a store that can be loaded or written again, not one that is refused.
        """
        store = self._store
        assert store is not None
        if self._store_claimed:
            return
        if store.holds_data():
            raise StoreExistsError(
                f"{store.location.url} already holds a store that this buffer has not "
                "loaded; call load_checkpoint() on it first to append, or choose a new path"
            )
        self._store_claimed = True
        store.write_documents(
            self._persisted.to_documents(self.trajectory_format, self._metadata_extra())
        )

    def _add_one(self, trajectory: Trajectory, spec: TrajectorySpec) -> Callable[[], None] | None:
        """Update index and cache; return the write task to queue, if persisting."""
        self._schema = spec.schema
        entry = self._index.new_entry(
            spec.shape, trajectory.max_episode_length, trajectory.model_weights_id
        )
        flat, residue = split_trajectory(trajectory, spec)
        if self._cache_enabled:
            self._cache.put(entry["trajectory_id"], flat, residue, spec.B)
        if self._store is not None:
            owned = _clone(trajectory)
            self._pending[entry["trajectory_id"]] = owned
            return lambda: self._persist(entry, owned)
        return None

    def _persist(self, entry: dict[str, Any], trajectory: Trajectory) -> None:
        """Writer thread: data first, then the documents that list it (commit last)."""
        assert self._store is not None
        self._store.write(entry, trajectory)
        trajectory_id = entry["trajectory_id"]
        persisted = self._persisted
        if trajectory_id not in persisted.entries:
            persisted.entries[trajectory_id] = dict(entry)
            persisted.id_list.append(trajectory_id)
        persisted.trajectory_counter = max(persisted.trajectory_counter, trajectory_id + 1)
        with self._lock:
            extra = self._metadata_extra()
            # The data is complete and readable from the store from here on.
            self._pending.pop(trajectory_id, None)
        # With more writes queued behind this one, the last of them commits for all: one
        # index rewrite per burst instead of one per trajectory.
        if self._writer.pending <= 1:
            self._store.write_documents(persisted.to_documents(self.trajectory_format, extra))

    def sample(
        self, num_chunks: int, *, generator: torch.Generator | None = None
    ) -> dict[str, Any]:
        """Sample ``num_chunks`` rows uniformly from the window; see ``docs/behaviour.md``.

        Parameters
        ----------
        num_chunks
            Rows to draw (clamped to the window's total).
        generator
            A CPU ``torch.Generator`` to draw with for this call instead of the buffer's
            own, whose stream is then left untouched (one stream per DataLoader worker or
            rank).  ``None`` draws from the buffer's seeded generator: RLinf's stream.

        Returns
        -------
        dict
            A nested dict of fresh CPU tensors shaped ``[n, ...]``.
        """
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        with self._lock:
            window = self._index.window(self.sample_window_size)
            if not window:
                raise RuntimeError("cannot sample from an empty buffer: add trajectories first")
            positions, rows = self._sampler.draw(
                num_chunks, self._index.sample_counts(window), generator
            )
            slots = self._cache.slots(window)[positions]
            hit = slots >= 0
            if bool(hit.all()):
                return tree.unflatten(self._cache.gather(slots, rows))
            cached = self._cache.gather(slots[hit], rows[hit]) if bool(hit.any()) else {}
            ids = torch.tensor(window, dtype=torch.int64)[positions]
            assert self._schema is not None
            plan = row_reads.plan_misses(
                ids, rows, hit, cached, self._schema, self._index.entries, self._pending
            )
        return tree.unflatten(row_reads.read_batch(plan, self._store))

    def flush(self) -> None:
        """Wait until every queued write is committed; retries a failed write."""
        self._writer.flush()

    def close(self, wait: bool = True) -> None:
        """Flush and stop the writer; idempotent.  Later adds raise ``BufferClosedError``."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()

    def __enter__(self) -> TrajectoryReplayBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def clear(self) -> None:
        """Empty the index, the cache and the counters.

        With ``auto_save`` the store is emptied too (after pending writes finish), so it
        keeps mirroring the buffer.
        """
        self._writer.flush()
        with self._lock:
            self._index = TrajectoryIndex()
            self._cache.clear()
            self._schema = None
            self._pending.clear()
            if self._store is not None and self._store_claimed:
                self._store.location.delete()
                self._persisted = TrajectoryIndex()

    def get_stats(self) -> dict[str, Any]:
        """Counters for logging."""
        with self._lock:
            return {
                "num_trajectories": len(self._index),
                "total_samples": self._index.total_samples,
                "cache_size": len(self._cache),
                "cache_capacity": self.cache_size,
                "cache_bytes": self._cache.nbytes,
                "sample_window_size": self.sample_window_size,
                "trajectory_counter": self._index.trajectory_counter,
                "pending_writes": self._writer.pending,
            }

    # -- read-only views (rbzarr.compat builds RLinf's names on these) -------------------
    @property
    def trajectory_ids(self) -> list[int]:
        """Ids in the index, in insertion order (a copy)."""
        with self._lock:
            return list(self._index.id_list)

    @property
    def index_entries(self) -> dict[int, dict[str, Any]]:
        """The index entry of every listed trajectory, by id, in insertion order (copies)."""
        with self._lock:
            return {i: dict(self._index.entries[i]) for i in self._index.id_list}

    @property
    def generator(self) -> torch.Generator:
        """The generator :meth:`sample` draws from."""
        return self._sampler.generator

    @property
    def store_url(self) -> str | None:
        """The auto-save store's path or URL; ``None`` without ``auto_save``."""
        return None if self._store is None else self._store.location.url

    def trajectory(self, trajectory_id: int) -> Trajectory:
        """The raw ``[T, B, ...]`` trajectory ``trajectory_id`` (copies), from memory or storage.

        Raises
        ------
        KeyError
            If ``trajectory_id`` is not in the index.
        """
        with self._lock:
            if trajectory_id not in self._index.entries:
                raise KeyError(f"trajectory {trajectory_id} is not in the buffer")
            if trajectory_id in self._cache:
                return self._cache.trajectory(trajectory_id)
            pending = self._pending.get(trajectory_id)
            if pending is not None:
                return _clone(pending)
            entry = dict(self._index.entries[trajectory_id])
        assert self._store is not None  # not cached, not pending: committed to the store
        return self._store.read(entry)

    def release_cache(self) -> None:
        """Free the cached trajectories; with ``auto_save`` they are read from storage.

        Without ``auto_save`` the cache holds the only copy, so the buffer is emptied as by
        :meth:`clear`.
        """
        if self._store is None:
            self.clear()
            return
        with self._lock:
            self._cache.clear()

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, save_path: str | os.PathLike[str]) -> None:
        """Save the cached trajectories (or, with ``auto_save``, the current window)."""
        checkpoint.save(self, save_path)

    def load_checkpoint(
        self,
        load_path: str | os.PathLike[str],
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Replace the buffer's state by a checkpoint's, or by this rank's share of it."""
        checkpoint.load(self, load_path, is_distributed, local_rank, world_size)


def _clone(trajectory: Trajectory) -> Trajectory:
    fields = {k: v.detach().clone() for k, v in trajectory.tensors().items()}
    return trajectory_from_raw(fields, trajectory.max_episode_length, trajectory.model_weights_id)
