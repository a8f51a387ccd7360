"""Proportional prioritized replay over a window: the settings and the window's priorities.

:class:`PrioritizedReplay` holds ``alpha``, ``beta`` and ``eps``.  :class:`WindowPriorities`
holds a raw priority per row of the window's trajectories, in one :class:`~.sum_tree.SumTree`
where each trajectory has a contiguous segment of leaves (allocated as trajectories enter,
emptied as they leave; the tree is compacted when its end is reached).  A row is drawn with
probability ``(p + eps) ** alpha / sum``; its importance weight is ``(N * P) ** -beta``
normalised by the largest one, which is ``(P / P_min) ** -beta``.

A row's *global index* is ``trajectory_id * 2**32 + row`` (the flat row ``t * B + b``):
it names the row whatever the window, so an update for a row that left the window is
recognised as stale and ignored.  New rows enter at the largest priority set so far
(1.0 before any).

A step is one call into compiled code per draw and per update
(:mod:`~rbzarr.sampling.tree_kernels`, with numba installed: the ``per`` extra), or a few
numpy calls per tree level without it; both paths give the same draws, weights and tree.
No I/O: the owner hands in priorities read from the store (:meth:`WindowPriorities.offer`)
and takes out those to write (:meth:`WindowPriorities.unsaved`).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rbzarr.errors import EmptyBufferError
from rbzarr.sampling.sum_tree import SumTree

__all__ = [
    "ROW_BITS",
    "PrioritizedReplay",
    "WindowPriorities",
    "global_index",
    "split_index",
]

# A global index keeps the flat row in its low 32 bits.
ROW_BITS = 32
_ROW_MASK = (1 << ROW_BITS) - 1
# Capacity of the first tree, in rows.
_FIRST_CAPACITY = 1 << 12
# Whether numba can be imported (found without importing it: that costs ~0.3 s).
NUMBA_FOUND = importlib.util.find_spec("numba") is not None


def global_index(ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The global index ``id * 2**32 + row`` of each row (int64)."""
    return (ids.to(torch.int64) << ROW_BITS) | rows.to(torch.int64)


def split_index(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The trajectory ids and flat rows of global indices."""
    return index >> ROW_BITS, index & _ROW_MASK


@dataclass
class PrioritizedReplay:
    """Proportional prioritized replay: draw row ``i`` with probability ``P(i)``.

    ``P(i) = (p_i + eps) ** alpha / sum_j (p_j + eps) ** alpha`` over the window's rows;
    importance weights ``(N * P(i)) ** -beta`` are normalised by the largest, so the
    weight of the least probable row is 1.

    Parameters
    ----------
    alpha
        How much priorities count (0: uniform), ``>= 0``.
    beta
        Importance-weight exponent, ``>= 0`` (may be changed between draws, e.g. annealed
        to 1).
    eps
        Added to every priority, ``>= 0`` (a row of priority 0 is still drawn when > 0).

    Raises
    ------
    ValueError
        A value is negative or not finite.
    """

    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite float >= 0, got {value!r}")
            setattr(self, name, float(value))


def check_priorities(index: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """``index`` (int64) and ``priorities`` (float32) as flat arrays of one length.

    Raises
    ------
    ValueError
        Lengths differ, an index is negative, or a priority is negative or not finite.
    """
    idx = np.asarray(torch.as_tensor(index).detach().cpu().numpy()).reshape(-1)
    values = np.asarray(torch.as_tensor(priorities).detach().cpu().numpy()).reshape(-1)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers (sample's info['index']), got {idx.dtype}")
    if values.size == 1 and idx.size != 1:
        values = np.broadcast_to(values, idx.shape)
    if len(idx) != len(values):
        raise ValueError(f"got {len(idx)} indices but {len(values)} priorities")
    values = values.astype(np.float64)
    if not np.isfinite(values).all() or (values < 0).any():
        bad = values[~np.isfinite(values) | (values < 0)][:3].tolist()
        raise ValueError(f"priorities must be finite and >= 0, got {bad}: nothing was updated")
    if (idx < 0).any():
        raise ValueError(f"indices must be >= 0, got {idx[idx < 0][:3].tolist()}")
    return idx.astype(np.int64), values.astype(np.float32)


class WindowPriorities:
    """The raw priority of every row of the window, in a sum tree (call under the owner's lock).

    Parameters
    ----------
    settings
        ``alpha``, ``beta`` and ``eps``.
    compiled
        Draw and update with the compiled kernels (numba); ``None``: when numba imports.
    saves
        The owner saves what :meth:`unsaved` hands out: a trajectory that leaves the window
        with updates not yet taken keeps them until they are (else they are dropped).
    """

    def __init__(
        self, settings: PrioritizedReplay, compiled: bool | None = None, saves: bool = False
    ) -> None:
        self.saves = saves
        self.settings = settings
        self.max_priority = 1.0
        self.stale_updates = 0
        self._kernels = _kernels(compiled)
        self._tree = SumTree(_FIRST_CAPACITY, settings.alpha, settings.eps, self._kernels)
        self._head = 0  # next free leaf
        self._window: list[int] = []
        self._synced: Sequence[int] = self._window
        self._segments: dict[int, tuple[int, int]] = {}  # id -> (first leaf, rows)
        self._offered: dict[int, np.ndarray] = {}  # read from the store, not yet in the window
        self._unsaved: set[int] = set()
        self._updated: set[int] = set()  # of _unsaved: by updates (not only entered)
        self._departed: dict[int, np.ndarray] = {}  # left the window with updates unsaved
        self._newest = -1  # the largest id the window has held
        self._lookup = _Lookup.of({}, [])
        self._changed = np.zeros(1, dtype=bool)  # per id of the lookup: updated, unsaved

    # -- the window ---------------------------------------------------------------------
    def sync(self, ids: Sequence[int], counts: Sequence[int] | torch.Tensor) -> None:
        """Follow the window ``ids`` (oldest first, ``counts`` rows each): rows that left it
        are forgotten, new ones enter with their offered priorities or the largest so far."""
        if ids is self._synced or list(ids) == self._window:
            return
        if isinstance(counts, torch.Tensor):
            counts = counts.tolist()
        present = set(ids)
        self._fold_changed()  # the updates of those leaving count
        for gone in [i for i in self._segments if i not in present]:
            if self.saves and gone in self._updated:
                self._departed[gone] = self.values(gone)
            start, rows = self._segments.pop(gone)
            self._tree.set_range(start, np.full(rows, np.nan, dtype=np.float32))
            self._unsaved.discard(gone)
            self._updated.discard(gone)
        new = [(i, int(c)) for i, c in zip(ids, counts, strict=True) if i not in self._segments]
        needed = sum(c for _, c in new)
        if self._head + needed > self._tree.capacity:
            self._compact(needed)
        for trajectory_id, rows in new:
            offered = self._entering(trajectory_id, rows)
            self._segments[trajectory_id] = (self._head, rows)
            self._tree.set_range(self._head, offered)
            self._head += rows
        self._newest = max([self._newest, *ids])
        self._window = list(ids)
        self._synced = ids  # the caller's list: the same object again is the same window
        self._offered = {i: p for i, p in self._offered.items() if i not in present}
        self._lookup = _Lookup.of(self._segments, self._window)
        self._changed = np.zeros(len(self._lookup.starts), dtype=bool)

    def _entering(self, trajectory_id: int, rows: int) -> np.ndarray:
        """The priorities a trajectory enters with: its unsaved ones if it left with them,
        those offered from the store, else the largest so far."""
        departed = self._departed.pop(trajectory_id, None)
        if departed is not None and len(departed) == rows:
            self._unsaved.add(trajectory_id)
            self._updated.add(trajectory_id)
            return departed
        offered = self._offered.pop(trajectory_id, None)
        if offered is not None and len(offered) == rows:
            return offered
        self._unsaved.add(trajectory_id)
        return np.full(rows, self.max_priority, dtype=np.float32)

    def returning(self, ids: Iterable[int]) -> list[int]:
        """Those of ``ids`` (a window) that the window held before and would now enter with
        no priorities in memory: their stored ones should be offered first."""
        known = (self._segments, self._offered, self._departed)
        return [i for i in ids if i <= self._newest and not any(i in k for k in known)]

    def _fold_changed(self) -> None:
        """Move the lookup's changed marks into :attr:`_unsaved` (ids still in the window)."""
        marked = self._lookup.ids[np.flatnonzero(self._changed[: len(self._lookup.ids)])]
        updated = [i for i in marked.tolist() if i in self._segments]
        self._unsaved.update(updated)
        self._updated.update(updated)
        self._changed[:] = False

    def _compact(self, needed: int) -> None:
        """Move the held segments to the start of a tree with room for ``needed`` more rows."""
        live = sum(rows for _, rows in self._segments.values())
        # A quarter more than needed: compacting costs the live rows once per quarter of
        # them added (amortised, 4 leaf copies a row), and memory stays near 1.25x.
        capacity = (live + needed) * 5 // 4 + _FIRST_CAPACITY
        tree = SumTree(capacity, self.settings.alpha, self.settings.eps, self._kernels)
        head = 0
        segments: dict[int, tuple[int, int]] = {}
        for trajectory_id, (start, rows) in self._segments.items():
            tree.leaves[head : head + rows] = self._tree.leaves[start : start + rows]
            segments[trajectory_id] = (head, rows)
            head += rows
        tree.rebuild()
        self._tree, self._segments, self._head = tree, segments, head

    def offer(self, priorities: Mapping[int, np.ndarray]) -> None:
        """Priorities read from the store: a trajectory in the window takes them now (when
        they fit its rows), the others as they enter (an empty array: none stored)."""
        for trajectory_id, values in priorities.items():
            segment = self._segments.get(trajectory_id)
            if segment is None:
                self._offered[trajectory_id] = values
            elif len(values) == segment[1] and trajectory_id not in self._updated:
                self._tree.set_range(segment[0], values)
                self._unsaved.discard(trajectory_id)
            if len(values):
                self.max_priority = max(self.max_priority, float(np.max(values)))

    def clear(self) -> None:
        """Forget every row, offered and unsaved priority (the largest priority stays)."""
        self.sync([], [])
        self._offered, self._departed, self._newest = {}, {}, -1

    # -- updates ------------------------------------------------------------------------
    def update(self, index: np.ndarray, priorities: np.ndarray) -> int:
        """Set the priorities of global ``index`` rows; those outside the window are ignored.

        Returns the count ignored (also added to :attr:`stale_updates`).

        Raises
        ------
        ValueError
            A row is past its trajectory's rows: nothing was updated.
        """
        if self._kernels is not None:
            tree, lookup = self._tree, self._lookup
            stale, bad, largest = self._kernels.update(
                index, priorities, lookup.ids, lookup.starts, lookup.counts, self._changed,
                tree.leaves, tree.sums, tree.mins, tree.offsets, tree.alpha, tree.eps,
            )  # fmt: skip
            if bad >= 0:
                self._refuse_past_rows(int(index[bad]))
            self.max_priority = max(self.max_priority, largest)
        else:
            stale = self._update_numpy(index, priorities)
        self.stale_updates += stale
        return stale

    def _update_numpy(self, index: np.ndarray, priorities: np.ndarray) -> int:
        """:meth:`update` with numpy: the count of stale indices."""
        ids, rows = split_index(index)
        position, known = self._lookup.find(ids)
        starts, counts = self._lookup.starts[position], self._lookup.counts[position]
        beyond = known & (rows >= counts)
        if beyond.any():
            self._refuse_past_rows(int(index[np.flatnonzero(beyond)[0]]))
        self._tree.set(starts[known] + rows[known], priorities[known])
        if known.any():
            self.max_priority = max(self.max_priority, float(priorities[known].max()))
            self._changed[position[known]] = True
        return int(len(index) - known.sum())

    def _refuse_past_rows(self, bad: int) -> None:
        """Raise for global index ``bad``, past its trajectory's rows.

        Raises
        ------
        ValueError
            Always.
        """
        trajectory_id, row = bad >> ROW_BITS, bad & _ROW_MASK
        rows = self._segments[trajectory_id][1]
        raise ValueError(
            f"index {bad} names row {row} of trajectory {trajectory_id}, which has {rows} "
            "rows: nothing was updated"
        )

    def get(self, index: np.ndarray) -> np.ndarray:
        """The raw priorities of global ``index`` rows (float32; NaN outside the window)."""
        ids, rows = split_index(index)
        position, known = self._lookup.find(ids)
        known &= rows < self._lookup.counts[position]
        out = np.full(len(index), np.nan, dtype=np.float32)
        out[known] = self._tree.leaves[self._lookup.starts[position[known]] + rows[known]]
        return out

    # -- draws --------------------------------------------------------------------------
    def draw(
        self, n: int, generator: torch.Generator, beta: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw ``n`` rows: each one's window position, flat row and importance weight.

        Raises
        ------
        EmptyBufferError
            Every row of the window has mass 0.
        """
        beta = self.settings.beta if beta is None else beta
        uniform = torch.rand(n, generator=generator, dtype=torch.float64).numpy()
        tree, lookup = self._tree, self._lookup
        if self._kernels is not None:
            positions, rows, weights, drawn = self._kernels.draw(
                uniform, tree.leaves, tree.sums, tree.mins, tree.offsets, lookup.leaf_starts,
                lookup.leaf_positions, tree.alpha, tree.eps, beta,
            )  # fmt: skip
        elif drawn := tree.total > 0:
            leaves = tree.find(uniform)
            segment = np.searchsorted(lookup.leaf_starts, leaves, side="right") - 1
            positions = lookup.leaf_positions[segment]
            rows = leaves - lookup.leaf_starts[segment]
            weights = self.weights(leaves, beta).numpy()
        if not drawn:
            raise EmptyBufferError(
                "every row of the window has priority 0 (and eps is 0): nothing to draw"
            )
        return torch.from_numpy(positions), torch.from_numpy(rows), torch.from_numpy(weights)

    def weights(self, leaves: np.ndarray, beta: float | None = None) -> torch.Tensor:
        """Importance weights ``(P / P_min) ** -beta`` of ``leaves`` (float32)."""
        beta = self.settings.beta if beta is None else beta
        least = self._tree.mass(np.array([self._tree.least], dtype=np.float32))
        mass = self._tree.mass(self._tree.leaves[leaves]).astype(np.float64)
        ratio = mass / least.astype(np.float64)
        return torch.from_numpy(np.power(ratio, -beta).astype(np.float32))

    def leaf_of(self, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The leaves of window ``positions`` and flat ``rows``."""
        return self._lookup.window_starts[positions] + rows

    def masses(self) -> np.ndarray:
        """The mass of every row of the window, in window order (float64; for strict draws)."""
        parts = [self._segments[i] for i in self._window]
        leaves = np.concatenate([np.arange(s, s + r) for s, r in parts]) if parts else np.zeros(0)
        return self._tree.mass(self._tree.leaves[leaves.astype(np.int64)])

    # -- what is stored -----------------------------------------------------------------
    def values(self, trajectory_id: int) -> np.ndarray:
        """A copy of the raw priorities of a trajectory in the window (float32)."""
        start, rows = self._segments[trajectory_id]
        return self._tree.leaves[start : start + rows].copy()

    def held(self, ids: Iterable[int]) -> dict[int, np.ndarray]:
        """Copies of the raw priorities of those of ``ids`` in the window."""
        return {i: self.values(i) for i in ids if i in self._segments}

    def unsaved(self) -> dict[int, np.ndarray]:
        """Copies of the priorities changed since last taken, those of trajectories that
        left the window with changes too (now counted as saved)."""
        self._fold_changed()
        taken = {**self._departed, **self.held(sorted(self._unsaved))}
        self._unsaved, self._updated, self._departed = set(), set(), {}
        return taken

    def unsave(self, values: Mapping[int, np.ndarray]) -> None:
        """Count ``values`` (taken from :meth:`unsaved`) as changed again: their write failed."""
        for trajectory_id, taken in values.items():
            if trajectory_id in self._segments:
                self._unsaved.add(trajectory_id)
                self._updated.add(trajectory_id)
            elif self.saves:
                self._departed.setdefault(trajectory_id, taken)

    @property
    def compiled(self) -> bool:
        """Whether draws and updates run the compiled kernels (else numpy)."""
        return self._kernels is not None

    @property
    def tree(self) -> SumTree:
        """The sum tree (to read: the owner changes it through this object)."""
        return self._tree

    @property
    def nbytes(self) -> int:
        """Bytes the priorities hold in memory."""
        return self._tree.nbytes

    def state(self) -> dict[str, Any]:
        """JSON-ready: the largest priority and the stale updates counted."""
        return {"max_priority": self.max_priority, "stale_updates": self.stale_updates}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (values that are not finite numbers ``>= 0`` are ignored)."""
        largest = state.get("max_priority")
        if isinstance(largest, int | float) and math.isfinite(largest) and largest >= 0:
            self.max_priority = float(largest)
        stale = state.get("stale_updates")
        if isinstance(stale, int) and not isinstance(stale, bool) and stale >= 0:
            self.stale_updates = stale


def _kernels(compiled: bool | None) -> Any:
    """:mod:`~rbzarr.sampling.tree_kernels` (numba imported) when ``compiled`` asks for it
    (``None``: when numba imports), else ``None``: numpy."""
    if compiled is False or (compiled is None and not NUMBA_FOUND):
        return None
    try:
        from rbzarr.sampling import tree_kernels  # noqa: PLC0415 - numba costs ~0.3 s
    except ImportError:
        if compiled:
            raise
        return None
    return tree_kernels


@dataclass(frozen=True)
class _Lookup:
    """Vectorised maps of the window: ids to leaves, leaves to window positions."""

    ids: np.ndarray  # sorted trajectory ids
    starts: np.ndarray  # first leaf of each (by sorted id)
    counts: np.ndarray  # rows of each
    leaf_starts: np.ndarray  # first leaves, sorted
    leaf_positions: np.ndarray  # window position of each segment (by leaf_starts)
    window_starts: np.ndarray  # first leaf of each window position

    @classmethod
    def of(cls, segments: Mapping[int, tuple[int, int]], window: Sequence[int]) -> _Lookup:
        ids = np.array(sorted(segments), dtype=np.int64)
        starts = np.array([segments[i][0] for i in ids.tolist()], dtype=np.int64)
        counts = np.array([segments[i][1] for i in ids.tolist()], dtype=np.int64)
        window_starts = np.array([segments[i][0] for i in window], dtype=np.int64)
        order = np.argsort(window_starts, kind="stable")
        return cls(
            ids=ids,
            starts=np.append(starts, 0),
            counts=np.append(counts, 0),
            leaf_starts=window_starts[order],
            leaf_positions=order.astype(np.int64),
            window_starts=window_starts,
        )

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each id's position in :attr:`ids` (``len(ids)`` where absent) and whether present."""
        position = np.searchsorted(self.ids, ids)
        position = np.minimum(position, len(self.ids))
        known = np.zeros(len(ids), dtype=bool)
        inside = position < len(self.ids)
        known[inside] = self.ids[position[inside]] == ids[inside]
        return np.where(known, position, len(self.ids)), known
