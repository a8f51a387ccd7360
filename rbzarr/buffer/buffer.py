"""TrajectoryReplayBuffer: RLinf's trajectory buffer, rebuilt on Zarr.

The buffer is a coordinator.  It validates, takes its lock and delegates: ids and counters
to :class:`~rbzarr.buffer.index.TrajectoryIndex`, draws to
:class:`~rbzarr.buffer.sampler.WindowSampler`,
hot rows to :class:`~rbzarr.buffer.cache.SlotCache`, persistence to the
:class:`~rbzarr.buffer.commits.StoreWriter`, and checkpoints to :mod:`rbzarr.buffer.checkpoint`.
The components, views and lifecycle live in :class:`~rbzarr.buffer.buffer_base.BufferBase`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rbzarr.buffer import checkpoint
from rbzarr.buffer.buffer_base import BufferBase
from rbzarr.buffer.rlinf_compat import RLinfCompatMixin
from rbzarr.errors import EmptyBufferError, TrajectoryListError
from rbzarr.storage import row_reads
from rbzarr.storage.documents import Entry
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.location import Location
from rbzarr.trajectory import tree
from rbzarr.trajectory.model import Trajectory
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["TrajectoryReplayBuffer"]


def _listed(trajectories: object) -> list[Trajectory]:
    """``trajectories`` as a list; refuse what is not a collection of trajectories.

    Raises
    ------
    TrajectoryListError
        ``trajectories`` is a string, bytes, a mapping or not iterable (e.g. one trajectory).
    """
    if isinstance(trajectories, str | bytes | Mapping) or not isinstance(trajectories, Iterable):
        raise TrajectoryListError(
            "add_trajectories takes a list of trajectories, got "
            f"{type(trajectories).__name__}: pass [trajectory] to add one; nothing was added"
        )
    return list(trajectories)


class TrajectoryReplayBuffer(BufferBase, RLinfCompatMixin):
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
        an fsspec URL such as ``s3://bucket/prefix``).  A store already there is appended
        to, never overwritten: new trajectories get ids after every id it holds.
    trajectory_format
        ``"zarr"``, ``"pt"`` or ``"pkl"``; by default the format of the store at
        ``auto_save_path``, else ``"zarr"``.
    storage_options
        Passed to fsspec for every URL (``endpoint_url``, ``key``, ``anon``, ...).
    max_pending_writes
        Bound of the write queue: ``add_trajectories`` waits while it is full, and is
        refused (nothing changed) while it is full and storage is failing.
    layout_options
        Extra keyword arguments for the storage layout (codecs, chunk sizes, ...).

    Raises
    ------
    StoreExistsError
        ``auto_save_path`` is a file, or holds a store of another ``trajectory_format``.
    """

    def add_trajectories(self, trajectories: Iterable[Trajectory]) -> None:
        """Add trajectories in order; all are validated before any state changes.

        The caller may reuse or mutate the tensors as soon as this returns.  With
        ``auto_save``, each trajectory is queued for a background write that is retried
        until it commits.

        Parameters
        ----------
        trajectories
            :class:`~rbzarr.trajectory.model.Trajectory` objects (or any with the same fields).

        Raises
        ------
        InvalidTrajectoryError
            A trajectory is malformed or disagrees with the buffer's schema, or
            ``trajectories`` is not a list of them (:class:`~rbzarr.errors.TrajectoryListError`,
            also a ``TypeError``, e.g. for one trajectory not in a list): nothing changed.
        WriterFailedError
            Storage is failing and the write queue is full: none of these trajectories was
            added (nothing changed); they are accepted again once queued writes commit.
        BufferClosedError
            The buffer is closed.
        """
        trajectories = _listed(trajectories)
        with self._add_lock:
            self._check_open()
            accepted = self._validate_all(trajectories)
            if not accepted:
                return
            if self._store is not None:
                self._store.wait_for_room(len(accepted))
            with self._lock:
                if self._schema is None:
                    self._schema = accepted[0].spec.schema
                    self._set_store_metadata()
                items = [(self._index_entry(t), t) for t in accepted]
                if self._store is None:
                    for entry, trajectory in items:  # the caller's tensors: the cache copies
                        self._cache.put(
                            entry["trajectory_id"],
                            trajectory.flat,
                            trajectory.residue,
                            trajectory.spec.B,
                        )
                    return
                # The one copy was made on validation; the cache shares it with the writer.
                for entry, trajectory in items:
                    self._cache.put_shared(entry["trajectory_id"], trajectory)
                self._store.submit(items)

    def _index_entry(self, trajectory: ValidatedTrajectory) -> dict[str, Any]:
        raw = trajectory.trajectory
        return self._index.new_entry(
            trajectory.spec.shape, raw.max_episode_length, raw.model_weights_id
        )

    def _validate_all(self, trajectories: list[Trajectory]) -> list[ValidatedTrajectory]:
        """Every check of every trajectory, before anything changes (called under
        ``_add_lock``, which every writer of the schema holds)."""
        schema = self._schema
        accepted: list[ValidatedTrajectory] = []
        for position, trajectory in enumerate(trajectories):
            try:
                validated = ValidatedTrajectory.check(
                    trajectory, schema, copy=self._store is not None
                )
                self._cache.check(validated.spec.schema)
                if self._store is not None:
                    self._store.check(validated)
            except ValueError as exc:
                raise type(exc)(f"trajectory {position} of this call: {exc}") from exc
            schema = validated.spec.schema if schema is None else schema
            accepted.append(validated)
        return accepted

    def sample(
        self, num_chunks: int, *, generator: torch.Generator | None = None
    ) -> dict[str, Any]:
        """Sample ``num_chunks`` rows uniformly from the window.

        Parameters
        ----------
        num_chunks
            Rows to draw (clamped to the window's sample count).
        generator
            A CPU ``torch.Generator`` to draw with for this call instead of the buffer's
            own, whose stream is then left untouched (one stream per DataLoader worker or
            rank).  ``None`` draws from the buffer's seeded generator: RLinf's stream.

        Returns
        -------
        dict
            A nested dict of fresh CPU tensors shaped ``[n, ...]``.

        Raises
        ------
        ValueError
            ``num_chunks`` is not positive.
        EmptyBufferError
            The buffer holds no trajectory (a ``RuntimeError``).
        """
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be positive, got {num_chunks}")
        with self._lock:
            window = self._index.window(self.sample_window_size)
            if not window:
                raise EmptyBufferError("cannot sample from an empty buffer: add trajectories first")
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
            pending = {} if self._store is None else self._store.pending_flats(ids.tolist())
            plan = row_reads.plan_misses(
                ids, rows, hit, cached, self._schema, self._index.entries, pending
            )
        layout = None if self._store is None else self._store.layout
        return tree.unflatten(row_reads.read_batch(plan, layout))

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, save_path: str | os.PathLike[str]) -> None:
        """Save the cached trajectories (or, with ``auto_save``, the current window).

        Parameters
        ----------
        save_path
            A new folder or URL; the buffer itself is not changed.

        Raises
        ------
        CheckpointConflictError
            ``save_path`` is the ``auto_save_path``.
        StoreExistsError
            ``save_path`` holds a store already.
        """
        target = self._layout(
            Location.from_url(save_path, self.storage_options), self.trajectory_format
        )
        checkpoint.check_target(target, None if self._store is None else self._store.url)
        # Hold the lock throughout: the saved set is the one at save time, and no concurrent
        # add may evict a cached trajectory half-way through.
        with self._lock:
            if self._store is not None:
                ids = self._index.window(self.sample_window_size)
            else:
                ids = self._cache.ids()
            metadata = {
                "seed": self.seed,
                "schema": checkpoint.schema_to_json(self._schema),
                "sampler": self._sampler.state_dict(),
            }
            checkpoint.save(target, self._index.subset(ids), metadata, self._copy_trajectory)

    def _copy_trajectory(self, target: TrajectoryLayout, entry: Entry) -> None:
        trajectory_id = int(entry["trajectory_id"])
        if self._store is None:
            target.write(entry, self._cache.trajectory(trajectory_id))
            return
        self._store.copy_to(target, entry)

    def load_checkpoint(
        self,
        load_path: str | os.PathLike[str],
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
        *,
        strict: bool = False,
    ) -> None:
        """Replace the buffer's state by a checkpoint's, or by this rank's share of it.

        With ``auto_save``, the store keeps everything it held and gains the loaded
        trajectories it lacks; new ids continue after every id in the store.

        Parameters
        ----------
        load_path
            The checkpoint's folder or URL (its stored format is adopted).
        is_distributed, local_rank, world_size
            Load only this rank's share of the id list.
        strict
            Refuse an RLinf checkpoint that lists ids without data, instead of skipping them
            with a warning.

        Raises
        ------
        CheckpointNotFoundError
            A document or listed data is missing.
        CheckpointConflictError
            A rank's share cannot continue in the shared auto-save store.
        StoreExistsError
            The auto-save store holds other trajectories under the checkpoint's ids.
        """
        location = Location.from_url(load_path, self.storage_options)
        share_of = (local_rank, world_size) if is_distributed else None
        loaded = checkpoint.load(
            location,
            self._layout,
            share_of=share_of,
            warm_capacity=self._cache.capacity,
            strict=strict,
        )
        with self._add_lock:
            self._check_open()
            if self._store is not None:
                self._store.flush()
                self._store.adopt(loaded)
            with self._lock:
                self._adopt(loaded)

    def _adopt(self, loaded: checkpoint.LoadedCheckpoint) -> None:
        self._index.load_state_dict(loaded.share.state_dict())
        self._index.trajectory_counter = max(self._index.trajectory_counter, self._first_free_id())
        self._schema = loaded.schema
        self._cache.load_state_dict(
            {
                "capacity": self._cache.capacity,
                "trajectories": [(i, t.flat, t.residue, t.spec.B) for i, t in loaded.warm],
            }
        )
        self._sampler.load_state_dict({"seed": self.seed, **loaded.sampler})
        if self._store is None:
            self.trajectory_format = loaded.trajectory_format
        self._set_store_metadata()
