"""A sum tree over raw priorities: proportional draws and minima, in numpy.

The leaves are the raw priorities ``p`` (float32, ``NaN`` where no row is); a row's mass is
``(p + eps) ** alpha`` computed in float64 and rounded to float32 (0 for an empty leaf).
Above the leaves, each level holds, per block of :data:`FANOUT` nodes below, the block's
total mass (float64, summed pairwise in one fixed order) and the least raw priority among
its rows of positive mass (float32, ``inf`` when none).  Masses are computed from the leaves
whenever a block above them is recomputed, never accumulated: the sums do not drift however
many updates are made.  The levels live in two flat arrays (:attr:`SumTree.sums`,
:attr:`SumTree.mins`) cut at :attr:`SumTree.offsets`, so compiled code
(:mod:`rbzarr.sampling.tree_kernels`) works on the same memory.

The methods here are the numpy path: a few numpy calls per level on ``[n, FANOUT]``
gathers.  Every sum and comparison is made in the order the compiled kernels make it, so
both paths give the same tree, the same draws and the same weights.  A draw finds its node
of the top level (at most :data:`SCAN` nodes, searched whole) and descends by comparing
each mass to the running sums of the children (4 levels for 10^7 rows, 3 for 10^6).
Memory: the leaves (4 bytes a row) plus about 1.7 bytes a row for the levels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FANOUT", "SCAN", "SumTree", "block_sums", "masses"]

# Children per node: a step computes a power per child of each leaf block it touches
# (``FANOUT`` per update, about half per draw), so blocks are small; the levels above the
# leaves then hold about 1.7 bytes a row.
FANOUT = 8
# A level this small is searched whole (one cumsum and searchsorted) instead of descended.
SCAN = 8192


def _padded(length: int) -> int:
    """``length`` rounded up to whole blocks of :data:`FANOUT` (at least one block)."""
    return max(-(-length // FANOUT), 1) * FANOUT


def masses(raw: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """``(raw + eps) ** alpha`` in float64 rounded to float32; 0 where ``raw`` is NaN."""
    mass = np.power(raw.astype(np.float64) + eps, alpha).astype(np.float32)
    return np.where(np.isnan(raw), np.float32(0.0), mass)


def block_sums(children: np.ndarray) -> np.ndarray:
    """Per row of ``children`` (``[n, FANOUT]`` float64), its sum: halves added pairwise."""
    while children.shape[1] > 1:
        half = children.shape[1] // 2
        children = children[:, :half] + children[:, half:]
    return children[:, 0]


class SumTree:
    """Masses ``(p + eps) ** alpha`` of ``capacity`` raw priorities, their sums and minima.

    Parameters
    ----------
    capacity
        Leaves (rows); every leaf starts empty.
    alpha, eps
        The mass of a raw priority ``p`` is ``(p + eps) ** alpha``.
    kernels
        :mod:`rbzarr.sampling.tree_kernels` to recompute ranges with compiled code, or
        ``None`` for numpy.
    """

    def __init__(self, capacity: int, alpha: float, eps: float, kernels: Any = None) -> None:
        self.kernels = kernels
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.capacity = int(capacity)
        self.leaves = np.full(_padded(self.capacity), np.nan, dtype=np.float32)
        # Level 0 sums blocks of leaves, each level above blocks of the one below, up to
        # the first of at most SCAN nodes: find searches that one whole.
        lengths = []
        length = len(self.leaves) // FANOUT
        while True:
            lengths.append(_padded(length))
            if length <= SCAN:
                break
            length = -(-length // FANOUT)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.sums = np.zeros(int(self.offsets[-1]), dtype=np.float64)
        self.mins = np.full(int(self.offsets[-1]), np.inf, dtype=np.float32)

    def level_sums(self, level: int) -> np.ndarray:
        """The sums of one level (a view)."""
        return self.sums[self.offsets[level] : self.offsets[level + 1]]

    def level_mins(self, level: int) -> np.ndarray:
        """The minima of one level (a view)."""
        return self.mins[self.offsets[level] : self.offsets[level + 1]]

    @property
    def levels(self) -> int:
        """Levels above the leaves."""
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        """Bytes held by the leaves and the levels."""
        return self.leaves.nbytes + self.sums.nbytes + self.mins.nbytes + self.offsets.nbytes

    @property
    def total(self) -> float:
        """The total mass."""
        return float(self.level_sums(self.levels - 1).sum())

    @property
    def least(self) -> float:
        """The least raw priority of positive mass (``inf`` when every mass is 0)."""
        return float(self.level_mins(self.levels - 1).min())

    def mass(self, raw: np.ndarray) -> np.ndarray:
        """``(raw + eps) ** alpha`` (float32, as the tree sums them); 0 where ``raw`` is NaN."""
        return masses(raw, self.alpha, self.eps)

    def _least(self, raw: np.ndarray) -> np.ndarray:
        """Per row of ``raw`` (``[n, FANOUT]``), its least value of positive mass (else ``inf``)."""
        positive = np.where(raw + np.float32(self.eps) > 0, raw, np.float32(np.inf))
        return np.ascontiguousarray(positive.T).min(axis=0)  # ~10x a min along axis 1

    def set(self, leaves: np.ndarray, raw: np.ndarray) -> None:
        """Set ``leaves`` (int64) to ``raw`` (``NaN``: empty) and recompute the blocks above."""
        if len(leaves) == 0:
            return
        self.leaves[leaves] = raw
        self.recompute(leaves // FANOUT)

    def set_range(self, start: int, raw: np.ndarray) -> None:
        """Set the contiguous leaves from ``start`` to ``raw`` and recompute the blocks above."""
        if len(raw) == 0:
            return
        self.leaves[start : start + len(raw)] = raw
        self._recompute_range(start // FANOUT, (start + len(raw) - 1) // FANOUT)

    def rebuild(self) -> None:
        """Recompute every level from the leaves."""
        self._recompute_range(0, len(self.leaves) // FANOUT - 1)

    def _recompute_range(self, first: int, last: int) -> None:
        """Recompute the first level's nodes ``first..last`` and their parents."""
        if self.kernels is not None:
            self.kernels.recompute_range(
                self.leaves, self.sums, self.mins, self.offsets, first, last, self.alpha, self.eps
            )
            return
        for level in range(self.levels):
            self._recompute_level(level, np.arange(first, last + 1, dtype=np.int64))
            first, last = first // FANOUT, last // FANOUT

    def recompute(self, blocks: np.ndarray) -> None:
        """Recompute the nodes ``blocks`` of the first level, then their parents up to the root."""
        for level in range(self.levels):
            self._recompute_level(level, blocks)
            blocks = blocks // FANOUT

    def _recompute_level(self, level: int, nodes: np.ndarray) -> None:
        """Recompute ``nodes`` of ``level`` from the leaves or the level below."""
        if level == 0:
            children = self.leaves.reshape(-1, FANOUT)[nodes]
            self.level_sums(0)[nodes] = block_sums(self.mass(children).astype(np.float64))
            self.level_mins(0)[nodes] = self._least(children)
            return
        below = self.level_sums(level - 1).reshape(-1, FANOUT)[nodes]
        self.level_sums(level)[nodes] = block_sums(below)
        least = self.level_mins(level - 1).reshape(-1, FANOUT)[nodes]
        self.level_mins(level)[nodes] = np.ascontiguousarray(least.T).min(axis=0)

    def find(self, uniform: np.ndarray) -> np.ndarray:
        """The leaf holding each ``uniform * total`` (``uniform`` float64 in ``[0, 1)``).

        A leaf of mass ``m`` is found for the masses of one interval of length ``m``, so
        uniform draws find each leaf with probability ``m / total``.  The descent starts
        at the top level (at most :data:`SCAN` nodes), found with one ``searchsorted`` over
        its cumulative sums (cheaper than descending small levels one by one).
        """
        top = self.level_sums(self.levels - 1)
        ends = np.cumsum(top)
        remaining = uniform * ends[-1]
        nodes = np.minimum(np.searchsorted(ends, remaining, side="right"), len(top) - 1)
        if not top[nodes].all():  # rounding went past the last node of positive mass
            nodes = np.minimum(nodes, np.flatnonzero(top > 0)[-1])
        remaining -= ends[nodes] - top[nodes]
        np.maximum(remaining, 0.0, out=remaining)
        for below in range(self.levels - 2, -1, -1):
            children = self.level_sums(below).reshape(-1, FANOUT)[nodes]
            nodes = nodes * FANOUT + _child(children, remaining)
        children = self.mass(self.leaves.reshape(-1, FANOUT)[nodes]).astype(np.float64)
        return nodes * FANOUT + _child(children, remaining)


def _child(children: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Per row of ``children`` (masses), the child whose interval holds ``remaining``, which
    is reduced by the masses before it (in place)."""
    ends = np.cumsum(children, axis=1)  # running sums, in the compiled kernel's order
    below = ends <= remaining[:, None]  # True up to the child, then False
    child = np.argmin(below, axis=1)
    over = np.flatnonzero(below[:, -1])
    if len(over):
        # Rounding put a mass past the last child: take the last child of positive mass.
        child[over] = FANOUT - 1 - np.argmax(children[over, ::-1] > 0, axis=1)
    rows = np.arange(len(child))
    remaining -= ends[rows, child] - children[rows, child]
    np.maximum(remaining, 0.0, out=remaining)
    return child
