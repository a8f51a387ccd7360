"""The handles and row plans of a sampling window's trajectories, by window position.

A batch from disk touches ~230 trajectories: finding each one's handles (its handle key,
the LRU) and row plan cost more than the gathers.  A :class:`WindowTable` keeps them in
arrays indexed by the trajectory's position in the window, so that a batch takes its
groups' handles and plans with one numpy index each, with no per-trajectory Python.

A table is valid for one window (the list of entries the sampler drew from, held: its
identity names the window), one tuple of keys and one version of the handle cache.  A new
window (adds, evictions, ``clear()``, ids removed), a write, delete or eviction of a
handle, or a fork that drops the handles: the next batch starts a new table, filled again
slot by slot as batches draw (the cost follows the batches, not the window).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from rbzarr.storage.rlinf.documents import Entry
from rbzarr.storage.zarr.regions import Region
from rbzarr.storage.zarr.rows import RowPlans
from rbzarr.storage.zarr.sharded import ShardedTrajectory

__all__ = ["WindowTable"]


class WindowTable:
    """Handles, row plans and plan numbers of the trajectories of one window, by position."""

    def __init__(
        self, window: Sequence[Entry], keys: tuple[str, ...], version: Hashable, width: int
    ) -> None:
        self.window = window
        self.keys = keys
        self.version = version
        self._handles = np.empty(len(window), dtype=object)
        self._plans = np.empty(len(window), dtype=object)
        self._numbers = np.zeros((len(window), width), dtype=np.int64)
        self._filled = np.zeros(len(window), dtype=bool)

    def serves(self, window: Sequence[Entry], keys: tuple[str, ...], version: Hashable) -> bool:
        """Whether this table holds the trajectories of ``window`` read for ``keys``."""
        return self.window is window and self.keys == keys and self.version == version

    def take(self, slots: np.ndarray) -> tuple[Sequence[ShardedTrajectory], RowPlans] | None:
        """The handles and row plans of window positions ``slots``; ``None`` unless all are
        filled."""
        if not self._filled[slots].all():
            return None
        return self._handles[slots], (self._plans[slots], self._numbers[slots])

    def numbers(self, slots: np.ndarray) -> np.ndarray | None:
        """The plan numbers of window positions ``slots``, a row each; ``None`` unless all
        are filled."""
        if not self._filled[slots].all():
            return None
        return self._numbers[slots]

    def regions(self, slot: int) -> tuple[Region | None, ...]:
        """The region of each key of the (filled) window position ``slot``."""
        regions: tuple[Region | None, ...] = self._plans[slot].regions
        return regions

    def fill(
        self, slots: np.ndarray, opened: Sequence[ShardedTrajectory], planned: RowPlans
    ) -> None:
        """Keep the handles and row plans of window positions ``slots``."""
        plans, numbers = planned
        self._handles[slots] = _objects(opened)
        self._plans[slots] = _objects(plans)
        self._numbers[slots] = numbers
        self._filled[slots] = True  # last: a reader in another thread sees whole slots


def _objects(items: Sequence[object]) -> np.ndarray:
    """``items`` as a 1-d object array (never a deeper one numpy might guess)."""
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array
