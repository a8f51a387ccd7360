"""RowCache: a FIFO cache of flattened trajectories in preallocated cells.

Every key has one tensor ``[cells, max_rows, ...]``; a trajectory occupies one cell.  A batch
of cached rows is then one ``index_select`` per key over the flattened cell tensor, whatever
the mix of trajectories.  Cells are allocated lazily and grow (in count up to the capacity,
and in rows when a longer trajectory arrives).

A trajectory the store committer holds a private copy of is cached *shared*
(:meth:`RowCache.put_shared`): it takes its place in the FIFO order at once, and its rows are
copied into a cell only when the writer is done with that copy (:meth:`RowCache.materialize`)
or when they are first read, whichever comes first.  One that is evicted before either is
never copied, and ``add_trajectories`` copies each trajectory once, not twice.

A trajectory added by reference (another writer committed it to the store) is *reserved*
(:meth:`RowCache.reserve`): it takes its FIFO place at once, as a trajectory added by value
would, but holds nothing and counts as not cached until its rows are first read from the
store and handed in (:meth:`RowCache.fill`).  From then on the cache is the one a buffer
that added the same trajectories by value has.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

import torch

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.trajectory.dtypes import dtype_name
from rbzarr.trajectory.flat_view import Residue, join_trajectory
from rbzarr.trajectory.model import Schema, Trajectory
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["RowCache"]

# The cell of a shared trajectory whose rows are not copied into the cells yet.
_NOT_COPIED = -1
# The cell of a reserved (referenced) trajectory whose rows are not read yet.
_NOT_READ = -2


class RowCache:
    """FIFO cache of flat trajectories; ``capacity=None`` keeps all, 0 none; not thread-safe."""

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 or None, got {capacity}")
        self.capacity = capacity
        # id -> cell (_NOT_COPIED while shared), insertion order
        self._cell_of: OrderedDict[int, int] = OrderedDict()
        self._shared: dict[int, ValidatedTrajectory] = {}  # ids whose rows are not copied yet
        self._reserved: set[int] = set()  # referenced ids whose rows are not read yet
        self._schema: Schema | None = None  # what the cells hold, from the first trajectory
        self._rows: dict[int, int] = {}
        self._residues: dict[int, Residue] = {}
        self._width: dict[int, int] = {}  # id -> B, to rebuild raw trajectories
        self._storage: dict[str, torch.Tensor] = {}
        self._free: list[int] = []
        # Counts the changes of any id's cell (a put, a fill, a copy, an eviction, a clear):
        # cells looked up at one version stay true while it holds.
        self.version = 0

    def __len__(self) -> int:
        return len(self._cell_of) - len(self._reserved)

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._cell_of and trajectory_id not in self._reserved

    def ids(self) -> list[int]:
        """Cached ids, oldest first (a new list; reserved ones not read yet left out)."""
        return [i for i in self._cell_of if i not in self._reserved]

    @property
    def has_reserved(self) -> bool:
        """Whether any reserved trajectory is not read yet."""
        return bool(self._reserved)

    def reserved(self, trajectory_ids: list[int]) -> list[int]:
        """Those of ``trajectory_ids`` reserved and not read yet (each once, in order)."""
        return [i for i in dict.fromkeys(trajectory_ids) if i in self._reserved]

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds: its cells plus the tensors of shared trajectories."""
        # A shared trajectory's tensors are the writer's copy until its commit, but the
        # cache may keep them alive after it.
        cells = sum(t.numel() * t.element_size() for t in self._storage.values())
        shared = sum(
            value.numel() * value.element_size()
            for trajectory in self._shared.values()
            for value in trajectory.trajectory.tensors().values()
        )
        return cells + shared

    @property
    def enabled(self) -> bool:
        """Whether the cache keeps anything (its capacity is not 0)."""
        return self.capacity != 0

    def check(self, schema: Schema) -> None:
        """Refuse rows of ``schema`` (keys matched by name) that do not fit the cells."""
        expected = self._schema  # read once: release() may reset it from another thread
        if expected is None:
            return
        if set(schema) != set(expected):
            raise InvalidTrajectoryError(
                f"cache schema mismatch: expected keys {list(expected)}, got {list(schema)}"
            )
        for key, (dtype, shape) in schema.items():
            held, held_shape = expected[key]
            if (dtype, tuple(shape)) != (held, tuple(held_shape)):
                raise InvalidTrajectoryError(
                    f"field {key!r}: cache holds {held} rows of shape {tuple(held_shape)}, "
                    f"got {dtype} {tuple(shape)}"
                )

    def put(
        self, trajectory_id: int, flat: dict[str, torch.Tensor], residue: Residue, width: int
    ) -> list[int]:
        """Copy a flat trajectory into a cell; return the ids evicted to make room."""
        if not self.enabled:
            return []
        schema = {
            key: (dtype_name(rows.dtype), tuple(rows.shape[1:])) for key, rows in flat.items()
        }
        self.check(schema)
        evicted = self._make_room(schema)
        self._copy_in(trajectory_id, flat, residue, width)
        return evicted

    def put_shared(self, trajectory_id: int, trajectory: ValidatedTrajectory) -> list[int]:
        """Cache the committer's unchanging copy without copying it; return the evicted ids."""
        if not self.enabled:
            return []
        self.check(trajectory.spec.schema)
        evicted = self._make_room(trajectory.spec.schema)
        self._cell_of[trajectory_id] = _NOT_COPIED
        self.version += 1
        self._shared[trajectory_id] = trajectory
        return evicted

    def reserve(self, trajectory_id: int) -> list[int]:
        """Take a FIFO place for a trajectory whose rows come later (:meth:`fill`); return
        the ids evicted to make room."""
        if not self.enabled:
            return []
        evicted = self._evict_for_one()
        self._cell_of[trajectory_id] = _NOT_READ
        self.version += 1
        self._reserved.add(trajectory_id)
        return evicted

    def fill(
        self, trajectory_id: int, flat: dict[str, torch.Tensor], residue: Residue, width: int
    ) -> None:
        """Copy the rows of a reserved trajectory, just read, into its cell (its FIFO place
        kept); an id not reserved (evicted since) is left out."""
        if trajectory_id not in self._reserved:
            return
        schema = {
            key: (dtype_name(rows.dtype), tuple(rows.shape[1:])) for key, rows in flat.items()
        }
        self.check(schema)
        if self._schema is None:
            self._schema = schema
        self._copy_in(trajectory_id, flat, residue, width)
        self._reserved.discard(trajectory_id)

    def materialize(self, trajectory_id: int) -> None:
        """Copy the rows of a shared trajectory into its cell and stop sharing it."""
        trajectory = self._shared.get(trajectory_id)
        if trajectory is not None:
            # Stop sharing only once copied: a failed copy leaves a consistent shared entry.
            self._copy_in(trajectory_id, trajectory.flat, trajectory.residue, trajectory.spec.B)
            del self._shared[trajectory_id]

    def _materialize_all(self, trajectory_ids: list[int]) -> None:
        if not self._shared:  # the common case: nothing shared, nothing to look up
            return
        for trajectory_id in [i for i in trajectory_ids if i in self._shared]:
            self.materialize(trajectory_id)

    def _make_room(self, schema: Schema) -> list[int]:
        """Evict the oldest until one more trajectory fits; remember the first schema."""
        if self._schema is None:
            self._schema = dict(schema)
        return self._evict_for_one()

    def _evict_for_one(self) -> list[int]:
        """Evict the oldest until one more trajectory has a place."""
        evicted: list[int] = []
        if self.capacity is not None:
            while len(self._cell_of) >= self.capacity:
                evicted.append(self._evict_oldest())
        return evicted

    def _copy_in(
        self, trajectory_id: int, flat: dict[str, torch.Tensor], residue: Residue, width: int
    ) -> None:
        """Copy ``flat`` into a free cell (an id already listed keeps its FIFO place)."""
        rows = int(next(iter(flat.values())).shape[0])
        cell = self._claim_cell(flat, rows)
        for key, cells in self._storage.items():
            cells[cell, :rows].copy_(flat[key])
        self._cell_of[trajectory_id] = cell
        self.version += 1
        self._rows[trajectory_id] = rows
        self._residues[trajectory_id] = _copy_residue(residue)
        self._width[trajectory_id] = width

    def _evict_oldest(self) -> int:
        oldest, cell = self._cell_of.popitem(last=False)
        self.version += 1
        if cell == _NOT_COPIED:
            self._shared.pop(oldest, None)
            return oldest
        if cell == _NOT_READ:
            self._reserved.discard(oldest)
            return oldest
        del self._rows[oldest], self._residues[oldest], self._width[oldest]
        self._free.append(cell)
        return oldest

    def _claim_cell(self, flat: dict[str, torch.Tensor], rows: int) -> int:
        allocated = next(iter(self._storage.values())).shape[0] if self._storage else 0
        if not self._free:
            # Every allocated cell is taken: double them (up to the capacity).
            wanted = max(1, allocated * 2)
            if self.capacity is not None:
                wanted = min(wanted, self.capacity)
            self._free.extend(range(wanted - 1, allocated - 1, -1))
            allocated = wanted
        self._grow(allocated, max(rows, self._max_rows), flat)
        return self._free.pop()

    @property
    def _max_rows(self) -> int:
        return next(iter(self._storage.values())).shape[1] if self._storage else 0

    def _grow(self, cells: int, max_rows: int, flat: dict[str, torch.Tensor]) -> None:
        for key, tensor in flat.items():
            old = self._storage.get(key)
            if old is not None and old.shape[0] >= cells and old.shape[1] >= max_rows:
                continue
            new = torch.empty((cells, max_rows, *tensor.shape[1:]), dtype=tensor.dtype)
            if old is not None:
                new[: old.shape[0], : old.shape[1]].copy_(old)
            self._storage[key] = new

    def cells(self, trajectory_ids: list[int]) -> torch.Tensor:
        """The cell of each id (``-1`` where not cached), copying shared ones in first."""
        self._materialize_all(trajectory_ids)
        # map with dict.get runs in C: ~10x a comprehension for a batch's ids.
        found = list(map(self._cell_of.get, trajectory_ids, itertools.repeat(-1)))
        return torch.tensor(found, dtype=torch.int64).clamp_(min=-1)

    def gather(self, cells: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``rows`` of the cached trajectories in ``cells``: one ``index_select`` per key."""
        flat_index = cells * self._max_rows + rows
        return {
            key: cells_tensor.view(-1, *cells_tensor.shape[2:]).index_select(0, flat_index)
            for key, cells_tensor in self._storage.items()
        }

    def field_rows(self, trajectory_id: int, key: str) -> torch.Tensor:
        """The flat rows ``[T*B, ...]`` of one key of a cached trajectory (a view, not a copy)."""
        shared = self._shared.get(trajectory_id)
        if shared is not None:
            return shared.flat[key]
        cell, rows = self._cell_of[trajectory_id], self._rows[trajectory_id]
        return self._storage[key][cell, :rows]

    def trajectory(self, trajectory_id: int) -> Trajectory:
        """The raw ``[T, B, ...]`` trajectory rebuilt from its cell (copies)."""
        self.materialize(trajectory_id)
        cell, rows = self._cell_of[trajectory_id], self._rows[trajectory_id]
        flat = {key: cells[cell, :rows].clone() for key, cells in self._storage.items()}
        return join_trajectory(flat, self._residues[trajectory_id], self._width[trajectory_id])

    def state_dict(self) -> dict[str, Any]:
        """``{"capacity", "trajectories": [(id, flat, residue, B), ...]}``, oldest first."""
        self._materialize_all(list(self._shared))
        trajectories = []
        for trajectory_id, cell in self._cell_of.items():
            if cell == _NOT_READ:
                continue
            rows = self._rows[trajectory_id]
            flat = {key: cells[cell, :rows].clone() for key, cells in self._storage.items()}
            residue = _copy_residue(self._residues[trajectory_id])
            trajectories.append((trajectory_id, flat, residue, self._width[trajectory_id]))
        return {"capacity": self.capacity, "trajectories": trajectories}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the content by :meth:`state_dict`'s; this cache's capacity applies."""
        self.clear()
        for trajectory_id, flat, residue, width in state["trajectories"]:
            self.put(trajectory_id, flat, residue, width)

    def clear(self) -> None:
        """Drop every trajectory and free the cells."""
        self._cell_of.clear()
        self.version += 1
        self._shared.clear()
        self._reserved.clear()
        self._schema = None
        self._rows.clear()
        self._residues.clear()
        self._width.clear()
        self._storage.clear()
        self._free.clear()


def _copy_residue(residue: Residue) -> Residue:
    return Residue(
        reset_rows={k: v.clone() for k, v in residue.reset_rows.items()},
        unsampled={k: v.clone() for k, v in residue.unsampled.items()},
        max_episode_length=residue.max_episode_length,
        model_weights_id=residue.model_weights_id,
    )
