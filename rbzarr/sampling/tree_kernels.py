"""The prioritized step compiled with numba: one call draws, one call updates.

:func:`draw` descends the sum tree for every uniform number, maps each leaf to its window
position and row, and computes the importance weights; :func:`update` finds the leaves of
global indices, checks them, sets them and recomputes the blocks above each one.  Both do
what the numpy path (:class:`~rbzarr.sampling.sum_tree.SumTree` and
:class:`~rbzarr.sampling.priorities.WindowPriorities`) does, with every float operation in
the same order, so the two paths build the same tree and draw the same rows with the same
weights for a seed.  (A power is computed by libm here and by numpy's SIMD code there; both
round a float64 power to float32, so the two agree unless a power lands within an ulp of
float64 from a float32 rounding boundary.)

Importing this module imports numba (the ``per`` extra); :mod:`rbzarr.sampling.priorities`
imports it only when a prioritized buffer is made and falls back to numpy without it.  The
kernels are compiled on their first call and cached on disk (``cache=True``), so a later
process loads them instead of compiling again.
"""

from __future__ import annotations

import numba
import numpy as np

from rbzarr.sampling import sum_tree

__all__ = ["FANOUT", "draw", "recompute_range", "update"]

# The tree's fan-out, written here: numba's on-disk cache follows this file's source only,
# so a fan-out taken from sum_tree would stay compiled in after it changed there.
FANOUT = 8
if sum_tree.FANOUT != FANOUT:
    raise ImportError(
        f"rbzarr.sampling.tree_kernels is compiled for a fan-out of {FANOUT}, the sum tree "
        f"has {sum_tree.FANOUT}: change both"
    )

_ROW_BITS = 32
_ROW_MASK = (1 << _ROW_BITS) - 1
_jit = numba.njit(cache=True, nogil=True)


@_jit
def _mass(raw: np.float32, alpha: float, eps: float) -> float:  # pragma: no cover - jitted
    """``(raw + eps) ** alpha`` in float64 rounded to float32; 0 for NaN."""
    if np.isnan(raw):
        return 0.0
    return np.float64(np.float32((np.float64(raw) + eps) ** alpha))


@_jit
def _pairwise(scratch: np.ndarray) -> float:  # pragma: no cover - jitted
    """The sum of ``scratch`` (FANOUT values) by halves added pairwise (in place)."""
    width = FANOUT // 2
    while width >= 1:
        for j in range(width):
            scratch[j] = scratch[j] + scratch[j + width]
        width //= 2
    return scratch[0]


@_jit
def _block(leaves, sums, mins, offsets, block, alpha, eps, eps32, scratch):  # pragma: no cover
    """Recompute node ``block`` of the first level from its leaves."""
    least = np.float32(np.inf)
    first = block * FANOUT
    for k in range(FANOUT):
        raw = leaves[first + k]
        scratch[k] = _mass(raw, alpha, eps)
        if raw + eps32 > 0 and raw < least:
            least = raw
    sums[offsets[0] + block] = _pairwise(scratch)
    mins[offsets[0] + block] = least


@_jit
def _node(sums, mins, offsets, level, node, scratch):  # pragma: no cover - jitted
    """Recompute ``node`` of ``level`` (above the first) from its children."""
    first = offsets[level - 1] + node * FANOUT
    least = np.float32(np.inf)
    for k in range(FANOUT):
        scratch[k] = sums[first + k]
        least = min(least, mins[first + k])
    sums[offsets[level] + node] = _pairwise(scratch)
    mins[offsets[level] + node] = least


@_jit
def recompute_range(leaves, sums, mins, offsets, first, last, alpha, eps):  # pragma: no cover
    """Recompute the first level's nodes ``first..last`` and their parents, level by level."""
    scratch = np.empty(FANOUT)
    eps32 = np.float32(eps)
    for block in range(first, last + 1):
        _block(leaves, sums, mins, offsets, block, alpha, eps, eps32, scratch)
    for level in range(1, len(offsets) - 1):
        first //= FANOUT
        last //= FANOUT
        for node in range(first, last + 1):
            _node(sums, mins, offsets, level, node, scratch)


@_jit
def _search_right(ends, value):  # pragma: no cover - jitted
    """``np.searchsorted(ends, value, side="right")``, without branches to mispredict."""
    low = 0
    length = len(ends)
    while length > 1:
        half = length >> 1
        low = low + half if ends[low + half - 1] <= value else low
        length -= half
    return low + 1 if ends[low] <= value else low


@_jit
def _child(values, first, remaining, leaves, alpha, eps):  # pragma: no cover - jitted
    """The child of the block at ``first`` whose interval holds ``remaining``, what remains
    past the children before it, and its mass (masses from ``leaves`` when set, else sums)."""
    total = 0.0
    for k in range(FANOUT):
        mass = _mass(values[first + k], alpha, eps) if leaves else values[first + k]
        total += mass
        if total > remaining:
            return k, max(remaining - (total - mass), 0.0), mass
    # Rounding put the mass past the last child: take the last child of positive mass.
    child = FANOUT - 1
    for k in range(FANOUT - 1, -1, -1):
        mass = _mass(values[first + k], alpha, eps) if leaves else values[first + k]
        if mass > 0:
            child = k
            break
    total = 0.0
    for k in range(child + 1):
        mass = _mass(values[first + k], alpha, eps) if leaves else values[first + k]
        total += mass
    return child, max(remaining - (total - mass), 0.0), mass


@_jit
def _touch(values, first, nodes):  # pragma: no cover - jitted
    """Read the first child of each of ``nodes`` at once (their cache misses overlap, with
    no branch between them): the sum of what was read."""
    total = 0.0
    for i in range(len(nodes)):
        total += values[first + nodes[i] * FANOUT]
    return total


@_jit
def draw(
    uniform, leaves, sums, mins, offsets, leaf_starts, leaf_positions, alpha, eps, beta
):  # pragma: no cover - jitted
    """Window positions, rows and weights of the leaves holding ``uniform * total``;
    ``ok`` False (and nothing drawn) when the total mass is 0."""
    n = len(uniform)
    positions = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    weights = np.empty(n, dtype=np.float32)
    levels = len(offsets) - 1
    top_first = offsets[levels - 1]
    length = offsets[levels] - top_first
    ends = np.empty(length)
    total = 0.0
    last_positive = 0
    least = np.float32(np.inf)
    for i in range(length):
        total += sums[top_first + i]
        ends[i] = total
        if sums[top_first + i] > 0:
            last_positive = i
        least = min(least, mins[top_first + i])
    if not total > 0:
        return positions, rows, weights, False
    least_mass = _mass(least, alpha, eps)
    # Level by level over all the draws, not draw by draw: the draws' reads of one level
    # are independent, so their cache misses overlap (a draw's own reads form a chain).
    nodes = np.empty(n, dtype=np.int64)
    left = np.empty(n)
    for i in range(n):
        remaining = uniform[i] * total
        node = min(_search_right(ends, remaining), length - 1)
        if sums[top_first + node] == 0:
            node = min(node, last_positive)
        left[i] = max(remaining - (ends[node] - sums[top_first + node]), 0.0)
        nodes[i] = node
    touched = 0.0  # masses and raw priorities are >= 0 (or NaN): never below 0
    for level in range(levels - 2, -1, -1):
        touched += _touch(sums, offsets[level], nodes)
        for i in range(n):
            child, left[i], _ = _child(
                sums, offsets[level] + nodes[i] * FANOUT, left[i], False, alpha, eps
            )
            nodes[i] = nodes[i] * FANOUT + child
    touched += _touch(leaves, 0, nodes)
    if touched < 0:  # never: a use of the values read, so that the reads are kept
        return positions, rows, weights, False
    for i in range(n):
        child, _, mass = _child(leaves, nodes[i] * FANOUT, left[i], True, alpha, eps)
        leaf = nodes[i] * FANOUT + child
        segment = _search_right(leaf_starts, leaf) - 1
        positions[i] = leaf_positions[segment]
        rows[i] = leaf - leaf_starts[segment]
        weights[i] = np.float32((mass / least_mass) ** -beta)
    return positions, rows, weights, True


@_jit
def update(
    index, values, ids, starts, counts, changed, leaves, sums, mins, offsets, alpha, eps
):  # pragma: no cover - jitted
    """Set the leaves of global ``index`` to ``values``: ``(stale, bad, largest)``.

    ``bad`` is the first index past its trajectory's rows (then nothing is set), else -1;
    ``stale`` counts the indices of trajectories not in ``ids``; ``largest`` is the largest
    value set (-1 when none).  ``changed`` marks the trajectories updated.
    """
    n = len(index)
    slots = np.full(n, -1, dtype=np.int64)
    found = np.zeros(n, dtype=np.int64)
    for i in range(n):
        trajectory_id = index[i] >> _ROW_BITS
        row = index[i] & _ROW_MASK
        at = np.searchsorted(ids, trajectory_id)
        if at < len(ids) and ids[at] == trajectory_id:
            if row >= counts[at]:
                return 0, i, -1.0
            slots[i] = starts[at] + row
            found[i] = at
    stale = 0
    largest = -1.0
    for i in range(n):
        if slots[i] < 0:
            stale += 1
        else:
            leaves[slots[i]] = values[i]
            changed[found[i]] = True
            largest = max(largest, np.float64(values[i]))
    scratch = np.empty(FANOUT)
    eps32 = np.float32(eps)
    for i in range(n):
        if slots[i] >= 0:
            block = slots[i] // FANOUT
            _block(leaves, sums, mins, offsets, block, alpha, eps, eps32, scratch)
            for level in range(1, len(offsets) - 1):
                block //= FANOUT
                _node(sums, mins, offsets, level, block, scratch)
    return stale, -1, largest
