"""The rows a buffer holds in memory, as its reader sees them: the cache and pending writes.

The reader calls these under the buffer's lock, except :meth:`BufferRows.fill`, which reads
the trajectories added by reference that a draw met whole from the store, without it (the
batch itself reads their rows from the store, as misses).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from rbzarr.buffer.cache import RowCache
from rbzarr.buffer.commits import StoreCommitter
from rbzarr.sampling.sampler import Window
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.model import Schema
from rbzarr.trajectory.steps import DONES
from rbzarr.trajectory.validated import ValidatedTrajectory

__all__ = ["BufferRows"]

_UNKNOWN = -3  # a window position whose cache cell is not looked up yet


class BufferRows:
    """A buffer's cache and (with ``auto_save``) its committer's pending writes."""

    def __init__(
        self, cache: RowCache, committer: StoreCommitter | None, lock: threading.RLock
    ) -> None:
        self._cache = cache
        self._committer = committer
        self._lock = lock
        self._warmed: tuple[int, ...] = ()
        self._warmed_window: Window | None = None
        self._cells_window: Window | None = None
        self._cells_version = -1
        self._cells = np.empty(0, dtype=np.int64)

    def drawing(self, window: Window) -> None:
        """Tell the store which trajectories form the window, when it changed."""
        if window is self._warmed_window:  # the same window object: the same ids
            return
        self._warmed_window = window
        if self._committer is not None and tuple(window.ids) != self._warmed:
            self._warmed = tuple(window.ids)
            self._committer.warm(window.entries)

    def caching(self) -> bool:
        """Whether the cache holds any trajectory (when not, a draw looks nothing up)."""
        return len(self._cache) > 0

    def cells(self, window: Window, positions: torch.Tensor) -> torch.Tensor:
        """The cache cell of the trajectory at each window position (``-1``: not cached, or
        reserved and not read yet), looked up once per window and cache version, as batches
        draw the positions (the cost follows the batches, not the window)."""
        if window is not self._cells_window or self._cells_version != self._cache.version:
            self._cells_window, self._cells_version = window, self._cache.version
            self._cells = np.full(len(window.ids), _UNKNOWN, dtype=np.int64)
        slots = positions.numpy()
        found = self._cells[slots]
        unknown = found == _UNKNOWN
        if unknown.any():
            missing = np.unique(slots[unknown])
            ids = list(map(window.ids.__getitem__, missing.tolist()))
            self._cells[missing] = self._cache.cells(ids).numpy()
            # The lookup copied shared trajectories into cells: only those just looked up.
            self._cells_version = self._cache.version
            found = self._cells[slots]
        return torch.from_numpy(found)

    def gather(self, cells: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows of cached trajectories."""
        return self._cache.gather(cells, rows)

    def pending(self, ids: Sequence[int]) -> Mapping[int, Mapping[str, torch.Tensor]]:
        """The flat rows of those of ``ids`` still being written."""
        return {} if self._committer is None else self._committer.pending_flats(ids)

    def dones(self, trajectory_id: int) -> torch.Tensor | None:
        """The step ``dones`` of a cached or pending trajectory; ``None`` for a stored one."""
        if trajectory_id in self._cache:
            return self._cache.field_rows(trajectory_id, DONES)
        pending = self.pending([trajectory_id])
        return pending[trajectory_id][DONES] if trajectory_id in pending else None

    def reserved(self, window: Window, positions: torch.Tensor) -> list[Entry]:
        """The entries of the reserved trajectories (added by reference, not read yet) drawn."""
        if not self._cache.has_reserved:
            return []
        drawn = [window.ids[p] for p in torch.unique(positions).tolist()]
        return [dict(window.index.entries[i]) for i in self._cache.reserved(drawn)]

    def fill(self, entries: Sequence[Entry], schema: Schema | None) -> None:
        """Read ``entries`` whole from the store into their cache places (without the lock)."""
        assert self._committer is not None  # only a store's trajectories are reserved
        for entry in entries:
            read = ValidatedTrajectory.check(self._committer.layout.read(entry), schema)
            with self._lock:  # one evicted since is left out
                self._cache.fill(int(entry["trajectory_id"]), read.flat, read.residue, read.spec.B)
