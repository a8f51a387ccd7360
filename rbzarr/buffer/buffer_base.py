"""BufferBase: the state a replay buffer coordinates, and the calls that only read or reset it.

It owns the components (index, cache, sampler, store writer), the locks that guard them,
the settings derived from the constructor, the read-only views, ``clear``, ``flush`` and
``close``.  :class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer` adds the calls that move data:
``add_trajectories``, ``sample`` and the checkpoints.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping
from typing import Any, Self

import torch

from rbzarr.buffer import checkpoint
from rbzarr.buffer.background import DEFAULT_TIMEOUT
from rbzarr.buffer.cache import SlotCache
from rbzarr.buffer.commits import StoreWriter
from rbzarr.buffer.index import TrajectoryIndex
from rbzarr.buffer.sampler import WindowSampler
from rbzarr.errors import BufferClosedError
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.location import Location
from rbzarr.storage.registry import layout_class
from rbzarr.trajectory.model import Schema, Trajectory
from rbzarr.trajectory.validated import clone_trajectory

__all__ = ["DEFAULT_FORMAT", "BufferBase"]

DEFAULT_FORMAT = "zarr"


def _materialize(lock: threading.RLock, cache: SlotCache, trajectory_id: int) -> None:
    """Writer thread: the store holds the trajectory; the cache copies its rows now (if it
    still keeps them) and stops sharing the writer's copy, which can then be freed.

    The writer never waits for the buffer: while another thread holds the lock (a sample, a
    checkpoint being saved), the rows stay shared and are copied when first read.
    """
    if lock.acquire(blocking=False):
        try:
            cache.materialize(trajectory_id)
        finally:
            lock.release()


class BufferBase:
    """Components, settings, views and lifecycle of a replay buffer.

    :class:`~rbzarr.buffer.buffer.TrajectoryReplayBuffer` documents the parameters at length.

    Parameters
    ----------
    seed
        Seed of the sampling generator; ``None`` draws nondeterministically.
    enable_cache, cache_size
        With ``auto_save``, keep the last ``cache_size`` trajectories in memory; without
        it the cache holds the whole window and these are ignored.
    sample_window_size
        Sample from the most recent trajectories only; 0 or negative means all.
    auto_save, auto_save_path
        Persist every trajectory in the background under ``auto_save_path`` (a local path
        or fsspec URL), appending to a store already there.
    trajectory_format
        ``"zarr"``, ``"pt"`` or ``"pkl"``; ``None``: the existing store's, else ``"zarr"``.
    storage_options
        fsspec options for every URL.
    max_pending_writes
        Bound of the background write queue.
    layout_options
        Keyword arguments for the layout of ``trajectory_format``.

    Raises
    ------
    ValueError
        ``trajectory_format`` is not a registered format, or ``auto_save`` is set without
        ``auto_save_path``.
    StoreExistsError
        ``auto_save_path`` is a file, or holds a store of another ``trajectory_format``.
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        sample_window_size: int = 100,
        auto_save: bool = False,
        auto_save_path: str | os.PathLike[str] = "",
        trajectory_format: str | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        max_pending_writes: int = 8,
        layout_options: Mapping[str, Any] | None = None,
    ) -> None:
        if trajectory_format is not None:
            layout_class(trajectory_format)  # unknown formats fail here, before anything else
        if auto_save and not os.fspath(auto_save_path):
            raise ValueError("auto_save=True requires auto_save_path (a local path or URL)")
        self.sample_window_size = sample_window_size
        self.auto_save = auto_save
        self.storage_options = dict(storage_options or {})
        self.layout_options = dict(layout_options or {})
        self.trajectory_format = trajectory_format or DEFAULT_FORMAT
        if not auto_save:
            # The cache is the storage: it must hold the whole sampling window.
            capacity: int | None = sample_window_size if sample_window_size > 0 else None
        else:
            capacity = max(cache_size, 0) if enable_cache else 0
        self._cache = SlotCache(capacity)
        self._sampler = WindowSampler(seed)
        self._lock = threading.RLock()  # index, cache, schema, sampler
        self._add_lock = threading.Lock()  # serialises adders, loads, clear and close
        self._closed = False
        location = Location.from_url(auto_save_path, self.storage_options) if auto_save else None
        if location is not None and trajectory_format is None:
            self.trajectory_format = checkpoint.format_at(location) or DEFAULT_FORMAT
        # The format layout_options are meant for (loading may adopt another one).
        self._options_format = self.trajectory_format
        self._store: StoreWriter | None = None
        if location is not None:
            self._store = StoreWriter(
                self._layout(location, self.trajectory_format),
                max_pending_writes=max_pending_writes,
                metadata={"seed": seed},
                # Not a bound method: the writer would keep the whole buffer alive.
                on_committed=functools.partial(_materialize, self._lock, self._cache),
            )
        self._schema: Schema | None = None if self._store is None else self._store.stored_schema
        self._index = TrajectoryIndex(trajectory_counter=self._first_free_id())

    # -- plumbing -----------------------------------------------------------------------
    def _layout(self, location: Location, trajectory_format: str) -> TrajectoryLayout:
        """A layout at ``location``; this buffer's layout options apply to its format only."""
        options = self.layout_options if trajectory_format == self._options_format else {}
        return layout_class(trajectory_format)(location, **options)

    def _first_free_id(self) -> int:
        return 0 if self._store is None else self._store.next_id

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError("the buffer is closed")

    # -- settings -----------------------------------------------------------------------
    @property
    def seed(self) -> int | None:
        """The seed of the sampling generator."""
        return self._sampler.seed

    @property
    def enable_cache(self) -> bool:
        """Whether trajectories are kept in memory."""
        return self._cache.enabled

    @property
    def cache_size(self) -> int:
        """How many trajectories the cache keeps (0 for "all" without ``auto_save``)."""
        return self._cache.capacity or 0

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

    def _set_store_metadata(self) -> None:
        if self._store is not None:
            self._store.set_metadata(seed=self.seed, schema=checkpoint.schema_to_json(self._schema))

    def flush(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every queued write is committed.

        Parameters
        ----------
        timeout
            Seconds to wait at most.

        Raises
        ------
        WriterFailedError
            Writes are still uncommitted after ``timeout`` (the message says how many and
            the last storage error); they stay queued and retried.
        """
        if self._store is not None:
            self._store.flush(timeout)

    def close(self, wait: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Refuse further adds, wait for the queued writes, and stop the writer.

        Parameters
        ----------
        wait
            Wait for the queued writes.  ``False`` does not wait: the writes go on in the
            background, but one that fails is not retried; it and those behind it stay
            uncommitted (not in the store) unless ``close()`` is called again, and are lost
            when the process ends.  Writes uncommitted at the call are warned about
            (:class:`~rbzarr.UncommittedWritesWarning`, with their count and the store).
        timeout
            Seconds to wait at most.

        Raises
        ------
        WriterFailedError
            Writes are still uncommitted after ``timeout``: they stay queued and retried,
            and every later ``close()`` or ``flush()`` waits again and reports the same.
        """
        with self._add_lock:
            self._closed = True
        if self._store is not None:
            self._store.close(timeout, wait)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def clear(self) -> None:
        """Empty the index and the cache, and reset the counters.

        The auto-save store is left as it is: every trajectory written or queued stays
        there, and the id counter continues after the store's ids, so no later add
        overwrites one.  Without ``auto_save`` the counter restarts at 0.
        """
        with self._add_lock, self._lock:
            self._index = TrajectoryIndex(trajectory_counter=self._first_free_id())
            self._cache.clear()
            if self._store is None:
                self._schema = None

    def get_stats(self) -> dict[str, Any]:
        """Counters for logging.

        Returns
        -------
        dict of str to Any
            ``num_trajectories``, ``total_samples``, ``cache_size`` (trajectories cached),
            ``cache_capacity``, ``cache_bytes``, ``sample_window_size``,
            ``trajectory_counter``, ``pending_writes`` and ``write_error`` (the message of
            the error the current write keeps failing with, else ``None``).
        """
        with self._lock:
            error = None if self._store is None else self._store.last_error
            return {
                "num_trajectories": len(self._index),
                "total_samples": self._index.total_samples,
                "cache_size": len(self._cache),
                "cache_capacity": self.cache_size,
                "cache_bytes": self._cache.nbytes,
                "sample_window_size": self.sample_window_size,
                "trajectory_counter": self._index.trajectory_counter,
                "pending_writes": 0 if self._store is None else self._store.pending,
                "write_error": None if error is None else str(error),
            }

    # -- read-only views (rbzarr.buffer.rlinf_compat builds RLinf's names on these) ---
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
        return None if self._store is None else self._store.url

    def trajectory(self, trajectory_id: int) -> Trajectory:
        """The raw ``[T, B, ...]`` trajectory ``trajectory_id`` (copies), from memory or storage.

        Parameters
        ----------
        trajectory_id
            An id in the index.

        Returns
        -------
        Trajectory
            From the cache, the pending writes, or else read from the store.

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
            entry = dict(self._index.entries[trajectory_id])
        assert self._store is not None  # not cached: pending or committed to the store
        pending = self._store.pending_trajectory(trajectory_id)
        if pending is not None:
            return clone_trajectory(pending.trajectory)
        return self._store.layout.read(entry)

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
