"""A sum tree over raw priorities: proportional draws and minima, vectorised in numpy.

The leaves are the raw priorities ``p`` (float32, ``NaN`` where no row is); a row's mass is
``(p + eps) ** alpha`` (0 for an empty leaf or a zero mass).  Above the leaves, each level
holds, per block of :data:`FANOUT` nodes below, the block's total mass (float64) and the
least raw priority among its rows of positive mass (float32, ``inf`` when none).  Masses are
computed from the leaves whenever a block above them is recomputed, never accumulated: the
sums do not drift however many updates are made.

Every operation is a few numpy calls per level on ``[n, FANOUT]`` gathers: an update of
``n`` leaves recomputes their blocks level by level, a draw finds its node of the top level
(at most :data:`_SCAN` nodes, searched whole) and descends by comparing each mass to the
cumulative sums of the children (3 levels for 10^7 rows, 2 for 10^6).
Memory: the leaves (4 bytes a row) plus about 0.8 bytes a row for the levels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FANOUT", "SumTree"]

# Children per node: 16 keeps 10^7 rows at 6 levels and each level's gather small.
FANOUT = 16
_UPPER = np.triu(np.ones((FANOUT, FANOUT)))
_ONES = np.ones(FANOUT)
# A level this small is searched whole (one cumsum and searchsorted) instead of descended.
_SCAN = 8192


def _padded(length: int) -> int:
    """``length`` rounded up to whole blocks of :data:`FANOUT` (at least one block)."""
    return max(-(-length // FANOUT), 1) * FANOUT


class SumTree:
    """Masses ``(p + eps) ** alpha`` of ``capacity`` raw priorities, their sums and minima.

    Parameters
    ----------
    capacity
        Leaves (rows); every leaf starts empty.
    alpha, eps
        The mass of a raw priority ``p`` is ``(p + eps) ** alpha``.
    """

    def __init__(self, capacity: int, alpha: float, eps: float) -> None:
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.capacity = int(capacity)
        self.leaves = np.full(_padded(self.capacity), np.nan, dtype=np.float32)
        # sums[0] sums blocks of leaves, each level above blocks of the one below, up to
        # the first of at most _SCAN nodes: find searches that one whole.
        self.sums: list[np.ndarray] = []
        self.mins: list[np.ndarray] = []
        length = len(self.leaves) // FANOUT
        while True:
            self.sums.append(np.zeros(_padded(length), dtype=np.float64))
            self.mins.append(np.full(_padded(length), np.inf, dtype=np.float32))
            if length <= _SCAN:
                break
            length = -(-length // FANOUT)

    @property
    def nbytes(self) -> int:
        """Bytes held by the leaves and the levels."""
        levels = [*self.sums, *self.mins]
        return self.leaves.nbytes + sum(level.nbytes for level in levels)

    @property
    def total(self) -> float:
        """The total mass."""
        return float(self.sums[-1].sum())

    @property
    def least(self) -> float:
        """The least raw priority of positive mass (``inf`` when every mass is 0)."""
        return float(self.mins[-1].min())

    def mass(self, raw: np.ndarray) -> np.ndarray:
        """``(raw + eps) ** alpha`` (float32, as the tree sums them); 0 where ``raw`` is NaN."""
        masses = np.power(raw + np.float32(self.eps), np.float32(self.alpha), dtype=np.float32)
        return np.fmax(masses, np.float32(0.0))  # fmax takes the 0 over NaN

    def _least(self, raw: np.ndarray) -> np.ndarray:
        """Per row of ``raw`` (``[n, FANOUT]``), its least value of positive mass (else ``inf``)."""
        positive = np.where(raw + np.float32(self.eps) > 0, raw, np.float32(np.inf))
        return np.ascontiguousarray(positive.T).min(axis=0)  # ~10x a min along axis 1

    def set(self, leaves: np.ndarray, raw: np.ndarray) -> None:
        """Set ``leaves`` (int64) to ``raw`` (``NaN``: empty) and recompute the blocks above."""
        if len(leaves) == 0:
            return
        self.leaves[leaves] = raw
        self._recompute(leaves // FANOUT)

    def set_range(self, start: int, raw: np.ndarray) -> None:
        """Set the contiguous leaves from ``start`` to ``raw`` and recompute the blocks above."""
        if len(raw) == 0:
            return
        self.leaves[start : start + len(raw)] = raw
        first, last = start // FANOUT, (start + len(raw) - 1) // FANOUT
        self._recompute(np.arange(first, last + 1, dtype=np.int64))

    def rebuild(self) -> None:
        """Recompute every level from the leaves."""
        self._recompute(np.arange(len(self.leaves) // FANOUT, dtype=np.int64))

    def _recompute(self, blocks: np.ndarray) -> None:
        """Recompute the nodes ``blocks`` of the first level, then their parents up to the root."""
        children = self.leaves.reshape(-1, FANOUT)[blocks]
        self.sums[0][blocks] = self.mass(children).astype(np.float64) @ _ONES
        self.mins[0][blocks] = self._least(children)
        for level in range(1, len(self.sums)):
            blocks = blocks // FANOUT
            self.sums[level][blocks] = self.sums[level - 1].reshape(-1, FANOUT)[blocks] @ _ONES
            below = self.mins[level - 1].reshape(-1, FANOUT)[blocks]
            self.mins[level][blocks] = np.ascontiguousarray(below.T).min(axis=0)

    def find(self, uniform: np.ndarray) -> np.ndarray:
        """The leaf holding each ``uniform * total`` (``uniform`` float64 in ``[0, 1)``).

        A leaf of mass ``m`` is found for the masses of one interval of length ``m``, so
        uniform draws find each leaf with probability ``m / total``.  The descent starts
        at the top level (at most :data:`_SCAN` nodes), found with one ``searchsorted`` over
        its cumulative sums (cheaper than descending small levels one by one).
        """
        level = len(self.sums) - 1
        ends = np.cumsum(self.sums[level])
        remaining = uniform * ends[-1]
        top = self.sums[level]
        nodes = np.minimum(np.searchsorted(ends, remaining, side="right"), len(top) - 1)
        if not top[nodes].all():  # rounding went past the last node of positive mass
            nodes = np.minimum(nodes, np.flatnonzero(top > 0)[-1])
        remaining -= ends[nodes] - top[nodes]
        np.maximum(remaining, 0.0, out=remaining)
        for below in range(level - 1, -1, -1):
            nodes = nodes * FANOUT + _child(self.sums[below].reshape(-1, FANOUT)[nodes], remaining)
        children = self.mass(self.leaves.reshape(-1, FANOUT)[nodes]).astype(np.float64)
        return nodes * FANOUT + _child(children, remaining)


def _child(children: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Per row of ``children`` (masses), the child whose interval holds ``remaining``, which
    is reduced by the masses before it (in place)."""
    ends = children @ _UPPER  # cumulative sums (a small matmul: ~5x numpy's cumsum here)
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
